"""`handformer serve` held under bad input and load, through a real uvicorn server:

- each /v1 route's body schema (handformer/serve/request_schemas.py) is what the route accepts:
  bodies drawn from it are answered, bodies it refuses are 400s;
- a fuzz run: 2,000 bodies (20,000 in the slow test) drawn from the schemas and mutated outside
  them (wrong types, huge and negative numbers, odd unicode, deep nesting, missing and extra
  fields, broken JSON): every answer a JSON error with a 4xx (in Anthropic's shape under
  /v1/messages) or a valid reply, never a 5xx or a traceback, and the server answers as before
  afterwards; the Responses and Messages routes get at least 300 bodies each, half of them on a
  run that thinks;
- a soak: 200 requests from 16 clients, streamed and whole, with schemas and tools, a third of
  the streams dropped mid-way: no 5xx, and every request gets its own text (each request's
  expected text, seeded, is known beforehand)."""

from __future__ import annotations

import json
import random
import threading
import time

import httpx
import pytest
from fuzz_bodies import Draw, is_valid, mutate
from helpers import require_module
from serve_helpers import Server, make_lm_run, make_translation_run, qwen3_template

from handformer.serve.app import create_app
from handformer.serve.registry import load_served_models
from handformer.serve.request_schemas import REQUEST_SCHEMAS

require_module("jsonschema", "pip install -e '.[dev]'")
require_module("llguidance", "pip install -e '.[dev]'")

pytestmark = pytest.mark.usefixtures("one_thread")

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 4}}, "required": ["city"],
    "additionalProperties": False}}}
SMALL_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                "additionalProperties": False}


def small(lo: int, hi: int):
    return lambda rng: rng.randint(lo, hi)


# What a valid body holds where the schema cannot know the server: its models, its vocabulary,
# its context; and few tokens, so 2,000 bodies run in seconds.
CAPS = {
    "/v1/completions": {"model": "story", "max_tokens": small(1, 3), "n": small(1, 2), "best_of": None,
                        "prompt": lambda rng: rng.choice(["the fox", "", [1, 5, 6], ["hi", [2, 3]]])},
    "/v1/chat/completions": {
        "model": "story", "max_tokens": small(1, 3), "max_completion_tokens": small(1, 3), "n": small(1, 2),
        "messages": lambda rng: rng.choice([
            [{"role": "user", "content": "hi"}],
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "x"}]}],
            [{"role": "user", "content": "w?"}, {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "a"}'}}]},
             {"role": "tool", "tool_call_id": "c1", "content": "5 C"}]]),
        "tools": lambda rng: rng.choice([None, [TOOL]]), "tool_choice": None, "top_logprobs": None,
        "response_format": lambda rng: rng.choice([None, {"type": "json_object"}, {"type": "text"}, {
            "type": "json_schema", "json_schema": {"name": "r", "schema": SMALL_SCHEMA}}])},
    "/v1/embeddings": {"model": "story", "dimensions": small(1, 32),
                       "input": lambda rng: rng.choice(["the fox", ["a", "b c"], [1, 2, 3], [[4, 5], "x"]])},
    "/v1/translations": {"model": "dates", "beam_size": small(1, 2),
                         "input": lambda rng: rng.choice(["the first of may", ["one", "two"]])},
    "/v1/responses": {
        "model": lambda rng: rng.choice(["story", "thinks"]), "max_output_tokens": small(1, 3),
        "previous_response_id": None, "tool_choice": None, "parameters": TOOL["function"]["parameters"],
        "schema": SMALL_SCHEMA, "arguments": '{"city": "a"}',
        "tools": lambda rng: rng.choice([None, [{"type": "function", "name": "get_weather"}]])},
}
PROMPT_CAPS = {
    "model": lambda rng: rng.choice(["story", "thinks"]), "tool_choice": None, "thinking": None,
    "input_schema": TOOL["function"]["parameters"], "schema": SMALL_SCHEMA, "input": {"city": "a"},
    "tools": lambda rng: rng.choice([None, [{"name": "get_weather", "input_schema": TOOL["function"]["parameters"]}]])}
CAPS["/v1/messages"] = PROMPT_CAPS | {"max_tokens": small(1, 3)}
CAPS["/v1/messages/count_tokens"] = PROMPT_CAPS
NEW_ROUTES = ("/v1/responses", "/v1/messages", "/v1/messages/count_tokens")


def answer_earlier_tool_uses(body: dict, rng: random.Random) -> None:
    """A tool_result answers a tool_use drawn before it (a reference the schema cannot state): its id
    becomes one of theirs, or, with none before it, the block becomes text."""
    used = []
    for message in body.get("messages", []):
        blocks = message.get("content") if isinstance(message.get("content"), list) else []
        for j, block in enumerate(blocks):
            if block.get("type") == "tool_use":
                used.append(block["id"])
            elif block.get("type") == "tool_result":
                if used:
                    block["tool_use_id"] = rng.choice(used)
                else:
                    blocks[j] = {"type": "text", "text": "x"}


def draw_valid(route: str, rng: random.Random) -> dict:
    body = Draw(rng, CAPS[route]).value(REQUEST_SCHEMAS[route])
    body = {k: v for k, v in body.items() if v is not None or k in ("stop", "seed", "user")}
    if route == "/v1/chat/completions" and body.get("tools") and rng.random() < 0.5:
        body["tool_choice"] = rng.choice(["auto", "none", "required", {"type": "function", "function": {
            "name": "get_weather"}}])
    if route == "/v1/chat/completions" and body.get("logprobs") and rng.random() < 0.5:
        body["top_logprobs"] = rng.randint(0, 3)
    if route == "/v1/responses" and body.get("tools") and rng.random() < 0.5:
        body["tool_choice"] = rng.choice(["auto", "none", "required", {"type": "function", "name": "get_weather"}])
    if route.startswith("/v1/messages") and rng.random() < 0.5:
        body["thinking"] = rng.choice([{"type": "disabled"}, {"type": "adaptive"}, {"type": "enabled", "budget_tokens": 1}])
        if body["thinking"]["type"] == "enabled" and "max_tokens" in body:
            body["max_tokens"] = max(body["max_tokens"], 2)  # the budget is below max_tokens
    if route.startswith("/v1/messages"):
        answer_earlier_tool_uses(body, rng)
    if route.startswith("/v1/messages") and body.get("tools") and rng.random() < 0.5:
        body["tool_choice"] = rng.choice([{"type": "auto"}, {"type": "any"}, {"type": "none"},
                                          {"type": "tool", "name": "get_weather"}])
    assert is_valid(REQUEST_SCHEMAS[route], body), body
    return body


@pytest.fixture(scope="module")
def server(tmp_path_factory, one_thread):
    root = tmp_path_factory.mktemp("fuzz")
    models = load_served_models([str(make_lm_run(root / "story", max_positions=1024)),
                                 str(make_lm_run(root / "thinks", max_positions=1024, template=qwen3_template(),
                                                 thinking=True)),
                                 str(make_translation_run(root / "dates"))])
    s = Server(create_app(models, max_body_bytes=256 * 1024))
    yield s
    s.stop()


LAST_EVENTS = {"/v1/responses": ("response.completed", "error"), "/v1/messages": ("message_stop", "error")}


def check_answer(route: str, response: httpx.Response, stream: bool) -> None:
    """A 4xx with OpenAI's error JSON (Anthropic's under /v1/messages), or a 200 with a reply (a
    stream of chunks ending [DONE], or the route's last event)."""
    assert response.status_code < 500 and "Traceback" not in response.text, response.text[:500]
    anthropic = route.startswith("/v1/messages")
    if response.status_code != 200:
        body = response.json()
        error = body["error"]
        assert set(error) == ({"type", "message"} if anthropic else {"message", "type", "param", "code"})
        assert error["message"] and (body["type"] == "error" if anthropic else True)
        return
    if not stream:
        kinds = {"/v1/responses": "response", "/v1/messages": "message"}
        if route == "/v1/messages/count_tokens":
            assert isinstance(response.json()["input_tokens"], int)
        elif route in kinds:
            assert response.json()[{"/v1/responses": "object", "/v1/messages": "type"}[route]] == kinds[route]
        else:
            assert response.json()["object"] in ("text_completion", "chat.completion", "list"), response.text[:300]
        return
    events = [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]
    if route in LAST_EVENTS:
        assert json.loads(events[-1])["type"] in LAST_EVENTS[route], events[-3:]
        assert all(json.loads(e)["type"] != "error" for e in events[:-1])
        return
    assert events[-1] == "[DONE]" or "error" in json.loads(events[-1]), events[-3:]
    for event in events[:-1]:
        chunk = json.loads(event)
        assert "error" not in chunk or chunk["error"]["type"] != "server_error", chunk


def send(http: httpx.Client, server: Server, route: str, body: dict | bytes) -> tuple[httpx.Response, bool]:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    stream = isinstance(body, dict) and body.get("stream") is True
    return http.post(server.url + route, content=content, headers={"Content-Type": "application/json"}), stream


def few_tokens(route: str, body: dict | bytes) -> dict | bytes:
    """A chat body whose mutation left it without a token limit runs to the end of the context:
    valid, and slow; it gets 3 tokens. So does a Responses or Messages body with a limit above 3,
    which these routes cut to the context rather than refuse."""
    if route == "/v1/chat/completions" and isinstance(body, dict) and body.get("max_tokens") is None \
            and body.get("max_completion_tokens") is None:
        body["max_tokens"] = 3
    name = {"/v1/responses": "max_output_tokens", "/v1/messages": "max_tokens"}.get(route)
    if name and isinstance(body, dict):
        value = body.get(name)
        if value is None and name == "max_output_tokens" or isinstance(value, int) and not isinstance(
                value, bool) and value > 3:
            body[name] = 3
            thinking = body.get("thinking")
            if isinstance(thinking, dict) and isinstance(thinking.get("budget_tokens"), int):
                thinking["budget_tokens"] = min(thinking["budget_tokens"], 2)
    return body


def reference(http: httpx.Client, server: Server) -> str:
    body = {"model": "story", "prompt": "the quick", "max_tokens": 8, "seed": 5, "temperature": 0.9}
    return http.post(server.url + "/v1/completions", json=body).json()["choices"][0]["text"]


def fuzz(server: Server, count: int, seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    routes = sorted(REQUEST_SCHEMAS)
    weights = [1.4 if route in NEW_ROUTES else 1.0 for route in routes]  # >= 300 of 2,000 each
    seen = {"valid": 0, "refused": 0, "mutated": 0} | dict.fromkeys(routes, 0)
    with httpx.Client(timeout=60) as http:
        before = reference(http, server)
        for _ in range(count):
            route = rng.choices(routes, weights)[0]
            seen[route] += 1
            body = draw_valid(route, rng)
            if rng.random() < 0.35:
                response, stream = send(http, server, route, body)
                assert response.status_code == 200, (route, body, response.text[:300])  # the schema's bodies
                seen["valid"] += 1
            else:
                body = few_tokens(route, mutate(body, rng))
                response, stream = send(http, server, route, body)
                if not is_valid(REQUEST_SCHEMAS[route], body if not isinstance(body, bytes) else None):
                    assert response.status_code in (400, 413), (route, body, response.text[:300])
                    seen["refused"] += 1
                seen["mutated"] += 1
            check_answer(route, response, stream)
        assert http.get(server.url + "/v1/models").status_code == 200
        assert reference(http, server) == before  # alive and answering as before
    deadline = time.monotonic() + 10
    for engine in server.app.state.engines.values():
        while engine.rows or engine.waiting:
            assert time.monotonic() < deadline, "rows were left in the batch"
            time.sleep(0.01)
    return seen


def test_the_schemas_refuse_what_the_routes_refuse():
    """A few bodies each way, named: the schema and the route agree on them."""
    from fuzz_bodies import Validator

    chat = REQUEST_SCHEMAS["/v1/chat/completions"]
    ok = {"model": "story", "messages": [{"role": "user", "content": "hi"}]}
    for body in (ok, {**ok, "top_logprobs": 2, "logprobs": True}, {**ok, "tools": [TOOL], "tool_choice": "required"},
                 {**ok, "max_tokens": None, "stop": ["a"], "seed": -(2 ** 63)},
                 {**ok, "messages": [{"role": "developer", "content": "x"}], "store": True, "metadata": {"a": "b"}}):
        assert Validator(chat).is_valid(body), body
    for body in ({**ok, "top_logprobs": 2}, {**ok, "n": 65}, {**ok, "max_tokens": 1.0}, {**ok, "temperature": True},
                 {**ok, "messages": [{"role": "user", "content": "x", "tool_calls": [
                     {"function": {"name": "f", "arguments": "{}"}}]}]}, {**ok, "extra": 1},
                 {**ok, "messages": [{"role": "", "content": "x"}]}, {**ok, "stop": []},
                 {**ok, "messages": [{"role": "wizard", "content": "x"}]}, {**ok, "messages": [{"role": "user"}]}):
        assert not Validator(chat).is_valid(body), body


def test_1000_fuzzed_bodies_get_a_4xx_json_error_or_a_valid_reply(server):
    seen = fuzz(server, 1000, seed=0)
    assert seen["valid"] > 250 and seen["refused"] > 400, seen
    assert all(seen[route] >= 150 for route in NEW_ROUTES), seen


@pytest.mark.slow
def test_20000_fuzzed_bodies_get_a_4xx_json_error_or_a_valid_reply(server):
    seen = fuzz(server, 20000, seed=1)
    assert seen["valid"] > 5000 and seen["refused"] > 8000, seen


# --- the soak ---------------------------------------------------------------------------------

def soak_requests(count: int, rng: random.Random) -> list[tuple[str, dict]]:
    """`count` requests over a dozen kinds (plain, n > 1, stop strings, a schema, a forced tool call,
    logprobs), each with its own seed."""
    kinds = []
    for k in range(12):
        seed = 1000 + k
        if k % 4 == 0:
            kinds.append(("/v1/completions", {"model": "story", "prompt": f"the {k}", "max_tokens": 12, "seed": seed,
                                              "n": 1 + k % 3}))
        elif k % 4 == 1:
            kinds.append(("/v1/chat/completions", {"model": "story", "messages": [{"role": "user", "content": f"x{k}"}],
                                                   "max_tokens": 40, "seed": seed, "response_format": {
                                                       "type": "json_schema", "json_schema": {
                                                           "name": "r", "schema": SMALL_SCHEMA}}}))
        elif k % 4 == 2:
            kinds.append(("/v1/chat/completions", {"model": "story", "messages": [{"role": "user", "content": f"w{k}"}],
                                                   "max_tokens": 60, "seed": seed, "tools": [TOOL],
                                                   "tool_choice": "required"}))
        else:
            kinds.append(("/v1/completions", {"model": "story", "prompt": f"I am {k}", "max_tokens": 10, "seed": seed,
                                              "stop": ["e"], "logprobs": 2}))
    return [kinds[rng.randrange(len(kinds))] for _ in range(count)]


def reply_of(data: dict) -> list:
    """What a request was answered with: each choice's text or message."""
    out = []
    for c in data["choices"]:
        if "text" in c:
            out.append(c["text"])
        else:
            calls = c["message"].get("tool_calls") or []
            out.append((c["message"]["content"], [(t["function"]["name"], t["function"]["arguments"]) for t in calls]))
    return out


def streamed_reply(lines: list[str]) -> tuple[list, bool]:
    """The same from a stream's chunks (texts and calls per choice), and whether it ended."""
    texts: dict[int, str] = {}
    calls: dict[int, list] = {}
    chat = False
    for line in lines:
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line.removeprefix("data: "))
        assert "error" not in chunk, chunk
        for c in chunk["choices"]:
            if "delta" in c:
                chat = True
                texts[c["index"]] = texts.get(c["index"], "") + (c["delta"].get("content") or "")
                calls.setdefault(c["index"], []).extend(
                    (t["function"]["name"], t["function"]["arguments"]) for t in c["delta"].get("tool_calls") or [])
            else:
                texts[c["index"]] = texts.get(c["index"], "") + c["text"]
    done = bool(lines) and lines[-1] == "data: [DONE]"
    if chat:
        return [(texts[i] or None, calls.get(i, [])) for i in sorted(texts)], done
    return [texts[i] for i in sorted(texts)], done


def is_prefix(got: list, want: list) -> bool:
    """A stream cut short: what came of each choice begins what the whole reply holds."""
    def text(x):
        return x if isinstance(x, str) else (x[0] or "")

    return all(i < len(want) and text(want[i]).startswith(text(g)) for i, g in enumerate(got))


def soak(server: Server, count: int, clients: int, seed: int) -> None:
    rng = random.Random(seed)
    requests = soak_requests(count, rng)
    expected = {}
    with httpx.Client(timeout=60) as http:
        for route, body in {json.dumps(r): r for r in requests}.values():
            response = http.post(server.url + route, json=body)
            assert response.status_code == 200, response.text
            expected[json.dumps((route, body))] = reply_of(response.json())
    plan = [(route, body, rng.random() < 0.5, rng.random() < 0.33) for route, body in requests]
    failures: list[str] = []
    lock = threading.Lock()

    def client(k: int) -> None:
        with httpx.Client(timeout=60) as http:
            for i in range(k, len(plan), clients):
                route, body, stream, drop = plan[i]
                want = expected[json.dumps((route, body))]
                try:
                    if not stream:
                        response = http.post(server.url + route, json=body)
                        ok = response.status_code == 200 and reply_of(response.json()) == want
                    else:
                        with http.stream("POST", server.url + route, json={**body, "stream": True}) as response:
                            ok = response.status_code == 200
                            lines = []
                            for line in response.iter_lines():
                                lines.append(line)
                                if drop and len(lines) >= 4:
                                    break  # the client goes away mid-stream
                        got, done = streamed_reply([line for line in lines if line])
                        ok = ok and (got == want if done else is_prefix(got, want))
                except Exception as err:  # noqa: BLE001 - reported below with the request
                    ok, response = False, err
                if not ok:
                    with lock:
                        failures.append(f"{route} {body} stream={stream}: {getattr(response, 'text', response)}")

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not failures, failures[:3]
    engine = server.app.state.engines["story"]
    deadline = time.monotonic() + 10
    while engine.rows or engine.waiting:  # every dropped stream's rows have left the batch
        assert time.monotonic() < deadline, ("rows were left in the batch", [
            (s.prompt[-5:], s.generated, s.max_tokens, s.cancelled, s.row.finish_reason) for s in engine.rows],
            len(engine.waiting), engine.engine.live)
        time.sleep(0.01)


def test_a_soak_of_200_requests_from_16_clients_with_disconnects(server):
    soak(server, 200, 16, seed=0)
