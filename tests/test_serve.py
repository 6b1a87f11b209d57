"""`handformer serve` through a real uvicorn server on a free port, spoken to with the official
`openai` client and with plain HTTP: completions and chat (whole and streamed) equal to
`handformer generate` / `handformer chat` for the same seed, n choices seeded seed + i, stop strings,
logprobs from the sampled distribution, usage, 16 concurrent streaming clients, a client that
disconnects mid-stream, every bad input, the API key, CORS, translations and the command line."""

from __future__ import annotations

import contextlib
import gc
import io
import json
import math
import threading
import time
import weakref

import httpx
import pytest
import torch
from helpers import require_module
from serve_helpers import Server, make_lm_run, make_translation_run

from handformer import cli
from handformer.generation.generate import generate, max_new_tokens_for
from handformer.serve.app import create_app
from handformer.serve.registry import load_served_models
from handformer.tasks.lm.chat import chat
from handformer.tasks.translation.translator import Translator

openai = require_module("openai", "pip install -e '.[dev]' (the official OpenAI client is a dev dependency)")

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, one_thread):
    root = tmp_path_factory.mktemp("serve")
    return {"story": make_lm_run(root / "story"), "base": make_lm_run(root / "base", chat=False, seed=1),
            "dates": make_translation_run(root / "dates")}


@pytest.fixture(scope="module")
def models(runs):
    return load_served_models([str(runs["story"]), f"plain={runs['base']}", str(runs["dates"])])


@pytest.fixture(scope="module")
def server(models):
    s = Server(create_app(models, max_body_bytes=64 * 1024))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def cli_generate(run_dir, prompt: str, *args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["generate", str(run_dir), "--prompt", prompt, *args]) == 0
    return out.getvalue().rstrip("\n")


# --- the OpenAI routes, against generate and chat -----------------------------------------------


def test_models_lists_every_run_under_its_id(client):
    cards = {m.id: m for m in client.models.list()}
    assert set(cards) == {"story", "plain", "dates"}
    assert cards["story"].owned_by == "handformer" and cards["story"].model_extra["task"] == "lm"
    assert cards["dates"].model_extra["task"] == "translation"
    assert client.models.retrieve("plain").model_extra["chat"] is False


@pytest.mark.parametrize("options", [
    dict(temperature=0.0, seed=None), dict(temperature=1.0, seed=3), dict(temperature=0.8, top_p=0.9, seed=11),
    dict(temperature=1.3, top_k=5, seed=7)], ids=["greedy", "t1", "top_p", "top_k"])
def test_completion_equals_handformer_generate_for_the_same_seed(client, runs, options):
    prompt = "the quick brown"
    args = ["--max-new-tokens", "24", "--temperature", str(options["temperature"])]
    args += ["--seed", str(options["seed"])] if options["seed"] is not None else []
    args += ["--top-p", str(options["top_p"])] if "top_p" in options else []
    args += ["--top-k", str(options["top_k"])] if "top_k" in options else []
    expected = cli_generate(runs["story"], prompt, *args)
    extra = {"top_k": options["top_k"]} if "top_k" in options else {}
    kwargs = dict(model="story", prompt=prompt, max_tokens=24, temperature=options["temperature"],
                  top_p=options.get("top_p", 1.0), extra_body=extra)
    if options["seed"] is not None:
        kwargs["seed"] = options["seed"]
    whole = client.completions.create(**kwargs)
    assert prompt + whole.choices[0].text == expected
    streamed = "".join(c.choices[0].text for c in client.completions.create(**kwargs, stream=True))
    assert streamed == whole.choices[0].text


def test_chat_equals_handformer_chat_for_the_same_seed(client, models, runs):
    messages = [{"role": "system", "content": "Be a fox."}, {"role": "user", "content": "Hello, who are you?"}]
    session = chat(models["story"].lm, run_dir=runs["story"], system="Be a fox.", temperature=0.9, seed=5,
                   max_new_tokens=30)
    expected = session.send("Hello, who are you?")
    reply = client.chat.completions.create(model="story", messages=messages, temperature=0.9, seed=5,
                                           max_tokens=30)
    assert reply.choices[0].message.content == expected and reply.choices[0].message.role == "assistant"
    assert reply.usage.prompt_tokens == len(session.encode(messages))
    chunks = list(client.chat.completions.create(model="story", messages=messages, temperature=0.9, seed=5,
                                                 max_tokens=30, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == reply.choices[0].finish_reason


def test_chat_max_tokens_defaults_to_the_end_token_or_the_context(client, models, runs):
    """Without max_tokens a reply runs until an end token or the end of the context: one seed of
    each kind (found with generate, which the server must equal), each reply's text, finish_reason
    and usage exact."""
    run = models["story"].lm
    messages = [{"role": "user", "content": "hi"}]
    session = chat(run, run_dir=runs["story"], temperature=2.0)  # its template and end tokens
    ids = session.encode(messages)
    room = max_new_tokens_for(len(ids), run.model.cfg.max_positions)
    found: dict[str, tuple[int, list[int]]] = {}
    for seed in range(200):
        new = generate(run.model, [ids], room, temperature=2.0, seed=seed, stop_tokens=session.stop_ids)[0]
        found.setdefault("stop" if new[-1] in session.stop_ids else "length", (seed, new))
        if len(found) == 2:
            break
    assert set(found) == {"stop", "length"}, found.keys()
    for reason, (seed, new) in found.items():
        reply = client.chat.completions.create(model="story", messages=messages, temperature=2.0, seed=seed)
        text = session.decode(new[:-1] if reason == "stop" else new)
        assert (reply.choices[0].finish_reason, reply.choices[0].message.content) == (reason, text)
        assert reply.usage.completion_tokens == len(new) and reply.usage.prompt_tokens == len(ids)
        if reason == "length":  # ran to the end of the context: the last token is never fed back
            assert len(ids) + len(new) == run.model.cfg.max_positions + 1


def test_completion_max_tokens_defaults_to_16_and_usage_counts_tokens(client, models):
    run = models["story"].lm
    out = client.completions.create(model="story", prompt="the lazy dog", temperature=0)
    new = generate(run.model, [[run.tokens.bos_id] + run.tokenizer.encode("the lazy dog")], 16, temperature=0,
                   stop_tokens=run.tokens.eos_ids)[0]
    assert out.usage.prompt_tokens == 1 + len("the lazy dog")
    assert out.usage.completion_tokens == len(new) <= 16
    assert out.choices[0].finish_reason == ("stop" if new[-1] in run.tokens.eos_ids else "length")


def test_n_choices_use_seed_plus_i(client):
    many = client.completions.create(model="story", prompt="Hello", max_tokens=12, n=3, seed=40)
    alone = [client.completions.create(model="story", prompt="Hello", max_tokens=12, seed=40 + i).choices[0].text
             for i in range(3)]
    assert [c.index for c in many.choices] == [0, 1, 2]
    assert [c.text for c in many.choices] == alone
    assert len(set(alone)) > 1
    assert many.usage.prompt_tokens == 6  # the prompt is counted once
    chunks = list(client.completions.create(model="story", prompt="Hello", max_tokens=12, n=3, seed=40, stream=True,
                                            stream_options={"include_usage": True}))
    assert ["".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == i)
            for i in range(3)] == alone
    assert chunks[-1].choices == [] and chunks[-1].usage == many.usage


def test_a_list_of_prompts_and_token_id_prompts(client, models):
    run = models["story"].lm
    ids = [run.tokens.bos_id] + run.tokenizer.encode("the fox")
    out = client.completions.create(model="story", prompt=["the fox", "I am"], max_tokens=8, n=2, seed=1)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    by_ids = client.completions.create(model="story", prompt=ids, max_tokens=8, seed=1)
    assert by_ids.choices[0].text == out.choices[0].text


def test_stop_strings_are_excluded_and_end_with_finish_reason_stop(client):
    options = dict(model="story", prompt="the", max_tokens=30, temperature=0.7)
    seed, free = next((seed, text) for seed in range(50) if len(
        text := client.completions.create(**options, seed=seed).choices[0].text) > 9)
    stop = free[5:7]
    cut = free[:free.index(stop)]
    out = client.completions.create(**options, seed=seed, stop=[stop, "@@"])
    assert out.choices[0].text == cut and out.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(**options, seed=seed, stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == cut and chunks[-1].choices[0].finish_reason == "stop"


def test_logprobs_come_from_the_sampled_distribution(client, models):
    run = models["story"].lm
    prompt = [run.tokens.bos_id] + run.tokenizer.encode("the quick")
    with torch.no_grad():
        logits = run.model(torch.tensor([prompt])).logits[0, -1].float()
    out = client.completions.create(model="story", prompt="the quick", max_tokens=6, logprobs=3, temperature=0.7,
                                    seed=2, extra_body={"top_k": 4}).choices[0]
    lp = out.logprobs
    assert "".join(lp.tokens) == out.text and len(lp.top_logprobs[0]) == 3
    filtered = torch.topk(logits / 0.7, 4)
    expected = torch.log_softmax(filtered.values, -1)  # the 4 survivors of top-k, at temperature 0.7
    first = run.tokenizer.hf.id_to_token(int(filtered.indices[0]))
    assert math.isclose(lp.top_logprobs[0][first], float(expected[0]), abs_tol=1e-4)
    survivors = [run.tokenizer.hf.id_to_token(int(i)) for i in filtered.indices]
    assert lp.tokens[0] in survivors  # sampled among the top-k, with its probability there
    assert math.isclose(lp.token_logprobs[0], float(expected[survivors.index(lp.tokens[0])]), abs_tol=1e-4)
    greedy = client.chat.completions.create(model="story", messages=[{"role": "user", "content": "x"}],
                                            temperature=0, max_tokens=4, logprobs=True, top_logprobs=2)
    content = greedy.choices[0].logprobs.content
    assert "".join(c.token for c in content) == greedy.choices[0].message.content
    assert all(len(c.top_logprobs) == 2 and c.top_logprobs[0].logprob >= c.logprob - 1e-6 for c in content)
    assert content[0].bytes == list(content[0].token.encode())


# --- load: 16 concurrent clients, disconnects, a free event loop ---------------------------------


def test_16_concurrent_streaming_clients_get_what_each_gets_alone(client, server, models, monkeypatch):
    run = models["story"].lm
    prompts = [("the quick brown fox", "Hello", "I am", "who are you")[i % 4] + str(i) for i in range(16)]
    settings = [dict(temperature=(0.0, 0.8, 1.2, 1.0)[i % 4], seed=100 + i, max_tokens=20 + i) for i in range(16)]
    alone = [generate(run.model, [[run.tokens.bos_id] + run.tokenizer.encode(p)], s["max_tokens"],
                      temperature=s["temperature"], seed=s["seed"], stop_tokens=run.tokens.eos_ids)[0]
             for p, s in zip(prompts, settings)]
    expected = [run.tokenizer.decode(new) for new in alone]
    # Every request runs 3 tokens or more, so none has ended before the last ones join the batch
    # (the first admitted get their first token and one step before the others are prefilled).
    assert min(map(len, alone)) >= 3
    engine = server.app.state.engines["story"]
    largest = engine.largest_batch
    engine.engine.largest_batch = 0  # counted by the decoding engine it drives
    results: list[str | None] = [None] * 16
    # The engine's forward passes wait until all 16 requests are in, so they are batched
    # together however the 16 threads happen to be scheduled.
    gate, submitted = threading.Lock(), []
    submit = engine.submit
    monkeypatch.setattr(engine, "submit", lambda seq: (submit(seq), submitted.append(seq)))  # once queued
    monkeypatch.setattr(engine, "lock", gate)

    def one(i: int) -> None:
        stream = client.completions.create(model="story", prompt=prompts[i], stream=True, **settings[i])
        results[i] = "".join(c.choices[0].text for c in stream)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    with gate:
        for t in threads:
            t.start()
        _wait(lambda: len(submitted) == 16)
    for t in threads:
        t.join(60)
    assert results == expected
    assert engine.largest_batch == 16  # decoded together, not one after another
    engine.engine.largest_batch = max(largest, engine.largest_batch)


def _wait(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


class PacedLock:
    """Stands in for a model's lock: each forward pass of the engine waits for a permit."""

    def __init__(self) -> None:
        self.permits = threading.Semaphore(0)
        self.entered = 0  # forward passes started, the one waiting for a permit included

    def __enter__(self) -> None:
        self.entered += 1
        self.permits.acquire()

    def __exit__(self, *exc) -> None:
        pass


@pytest.fixture
def paced(server, monkeypatch):
    """The story engine, paced by the test, and every sequence submitted to it."""
    engine, lock = server.app.state.engines["story"], PacedLock()
    submitted = []
    submit = engine.submit
    monkeypatch.setattr(engine, "submit", lambda seq: (submitted.append(seq), submit(seq)))
    monkeypatch.setattr(engine, "lock", lock)
    yield engine, lock, submitted
    lock.permits.release(1000)
    _wait(lambda: not engine.rows and not engine.waiting)


@pytest.fixture(scope="module")
def long_seed(client) -> int:
    """A seed whose sample of "the" runs 20 tokens without an end token."""
    return next(seed for seed in range(100) if client.completions.create(
        model="story", prompt="the", max_tokens=20, seed=seed).choices[0].finish_reason == "length")


def test_a_client_that_disconnects_mid_stream_leaves_the_batch(server, long_seed, paced):
    engine, lock, submitted = paced
    body = {"model": "story", "prompt": "the", "max_tokens": 80, "stream": True, "seed": long_seed}
    with httpx.Client(timeout=10) as http:
        with http.stream("POST", server.url + "/v1/completions", json=body) as response:
            lock.permits.release(3)  # the prompt and two steps: three tokens
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            _wait(lambda: submitted and submitted[0].generated == 3)
            # the engine waits at its next forward pass (the fourth): past the point where it drops
            # cancelled rows, so the one cancelled now stays until the step after
            _wait(lambda: lock.entered == 4)
            response.close()  # the client goes away mid-stream
            _wait(lambda: submitted[0].cancelled)
            # while the engine waits, the event loop is free: the server still answers
            assert http.get(server.url + "/v1/models").status_code == 200
    assert engine.rows == submitted  # still in the batch, until the next step
    lock.permits.release(1)
    _wait(lambda: not engine.rows)  # gone at the next step, without another token
    assert submitted[0].generated == 3 and not submitted[0].done


def test_a_dropped_stream_lets_go_of_its_sequence_without_the_cycle_collector(server, long_seed, paced):
    """A stream the client drops ends in a CancelledError that anyio keeps in a reference cycle
    with the stream's frames; the stream's frame holds none of its sequences, so a sequence (its
    row, grammar and sink) is freed as soon as the engine drops it, the collector off."""
    engine, lock, submitted = paced
    body = {"model": "story", "prompt": "the", "max_tokens": 80, "stream": True, "seed": long_seed}
    gc.collect()
    gc.disable()
    try:
        with httpx.Client(timeout=10) as http:
            with http.stream("POST", server.url + "/v1/completions", json=body) as response:
                lock.permits.release(3)
                lines = response.iter_lines()  # kept: a dropped line iterator closes the connection
                assert next(line for line in lines if line.startswith("data: "))
                _wait(lambda: submitted and submitted[0].generated == 3)
                response.close()  # the client goes away mid-stream
                _wait(lambda: submitted[0].cancelled)
        sequence = weakref.ref(submitted.pop())
        lock.permits.release(1)
        _wait(lambda: not engine.rows)  # the engine has dropped the row
        _wait(lambda: sequence() is None)
    finally:
        gc.enable()


def test_an_abandoned_non_streaming_request_leaves_the_batch(server, paced):
    import socket

    engine, lock, submitted = paced
    body = json.dumps({"model": "story", "prompt": "the", "max_tokens": 80, "seed": 0}).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as raw:
        raw.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        _wait(lambda: submitted)  # the request is in the engine, waiting for its forward pass
    # the client has gone away without an answer
    _wait(lambda: submitted[0].cancelled)  # the server noticed that the client left
    lock.permits.release(1)
    _wait(lambda: not engine.rows and not engine.waiting)
    assert submitted[0].generated <= 1


# --- bad input ----------------------------------------------------------------------------------

CHAT = {"model": "story", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "story", "prompt": "hi"}
BAD = [
    ("/v1/completions", b'{"model": "story", "prompt": ', 400, None, "not valid JSON"),
    ("/v1/completions", b"[1, 2]", 400, None, "must be a JSON object"),
    ("/v1/completions", b'{"model": "story", "prompt": "x", "temperature": NaN}', 400, None, "not valid JSON"),
    ("/v1/completions", {**COMPLETION, "model": "gpt-4"}, 404, "model", "does not exist"),
    ("/v1/chat/completions", {**CHAT, "model": "nope"}, 404, "model", "does not exist"),
    ("/v1/completions", {"prompt": "x"}, 400, "model", "model must be a non-empty string"),
    ("/v1/completions", {**COMPLETION, "temperature": "hot"}, 400, "temperature", "a number >= 0"),
    ("/v1/completions", {**COMPLETION, "temperature": -0.5}, 400, "temperature", "a number >= 0"),
    ("/v1/completions", {**COMPLETION, "top_p": 0}, 400, "top_p", "in (0, 1]"),
    ("/v1/chat/completions", {**CHAT, "top_p": 1.5}, 400, "top_p", "in (0, 1]"),
    ("/v1/completions", {**COMPLETION, "top_k": 0}, 400, "top_k", "an integer >= 1"),
    ("/v1/completions", {**COMPLETION, "max_tokens": "5"}, 400, "max_tokens", "an integer >= 1"),
    ("/v1/completions", {**COMPLETION, "max_tokens": 0}, 400, "max_tokens", "an integer >= 1"),
    ("/v1/completions", {**COMPLETION, "n": 1.5}, 400, "n", "an integer from 1 to 64"),
    ("/v1/completions", {**COMPLETION, "stream": "yes"}, 400, "stream", "true or false"),
    ("/v1/completions", {**COMPLETION, "stop": 5}, 400, "stop", "a non-empty string or a list"),
    ("/v1/completions", {**COMPLETION, "seed": "1"}, 400, "seed", "an integer"),
    ("/v1/completions", {**COMPLETION, "logprobs": 50}, 400, "logprobs", "from 0 to 20"),
    ("/v1/completions", {**COMPLETION, "prompt": []}, 400, "prompt", "prompt must be a string"),
    ("/v1/completions", {**COMPLETION, "prompt": [5, 999]}, 400, "prompt", "outside the vocabulary"),
    ("/v1/completions", {**COMPLETION, "max_tokens": 200}, 400, "max_tokens", "lower max_tokens to at most 94"),
    ("/v1/completions", {**COMPLETION, "prompt": "x" * 100}, 400, "prompt", "longer than the model's context of 96"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "y" * 100}]}, 400, "messages",
     "longer than the model's context"),
    ("/v1/chat/completions", {**CHAT, "messages": []}, 400, "messages", "non-empty list"),
    ("/v1/chat/completions", {**CHAT, "messages": "hi"}, 400, "messages", "non-empty list"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"content": "hi"}]}, 400, "messages[0].role",
     "messages[0].role must be one of system, developer"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role",
     'got "wizard"'),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user"}]}, 400, "messages[0].content",
     "messages[0].content is required"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": None}]}, 400, "messages[0].content",
     "messages[0].content is required"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "assistant", "content": None}]}, 400,
     "messages[0].content", "only an assistant message with tool_calls may leave it out"),
    ("/v1/chat/completions", {**CHAT, "prompt_cache_key": "x"}, 400, "prompt_cache_key",
     "unrecognized request argument(s): prompt_cache_key"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": 3}]}, 400, "messages[0].content",
     "must be a string"),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 2}, 400, "top_logprobs", "needs logprobs: true"),
    ("/v1/chat/completions", {**CHAT, "model": "plain"}, 400, "model", "no chat template"),
    ("/v1/chat/completions", {**CHAT, "model": "dates"}, 400, "model", "use /v1/translations"),
    ("/v1/completions", {**COMPLETION, "frequency_penalty": 0.5}, 400, "frequency_penalty", "not supported"),
    ("/v1/completions", {**COMPLETION, "file": "/etc/passwd"}, 400, "file", "unrecognized request argument"),
    ("/v1/translations", {"model": "story", "input": "x"}, 400, "model", "use /v1/completions"),
    ("/v1/translations", {"model": "dates", "input": ""}, 400, "input", "non-empty string"),
    ("/v1/translations", {"model": "dates", "input": "x", "beam_size": 0}, 400, "beam_size", "from 1 to 16"),
    ("/v1/completions", b"x" * (64 * 1024 + 1), 413, None, "over the limit of 65536 bytes"),
    ("/v1/nowhere", {}, 404, None, "no route /v1/nowhere"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "hi"}, {
        "role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c2", "content": "5"}]}, 400, "messages[2].tool_call_id",
     "messages[2].tool_call_id 'c2' matches no tool call: the earlier calls are 'c1'; send the assistant"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "tool", "tool_call_id": "c1", "content": "5"}]}, 400,
     "messages[0].tool_call_id", "no earlier assistant message has tool_calls"),
]


@pytest.mark.parametrize("path, body, status, param, message", BAD,
                         ids=[f"{i}-{b[2]}-{b[3] or b[4][:20]}" for i, b in enumerate(BAD)])
def test_bad_input_gets_an_openai_error_with_the_right_status(server, path, body, status, param, message):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.post(server.url + path, content=content, headers={"Content-Type": "application/json"},
                          timeout=10)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert message in error["message"] and error["param"] == param
    assert "Traceback" not in response.text


def test_a_body_over_the_limit_without_a_length_header_is_cut_off(server):
    def chunks():
        for _ in range(80):
            yield b"x" * 1024

    response = httpx.post(server.url + "/v1/completions", content=chunks(), timeout=10)
    assert response.status_code == 413


def test_the_openai_client_raises_its_own_errors(client, models):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="missing", prompt="x")
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model="story", messages=[{"role": "user", "content": "x"}], temperature=-1)
    run = models["story"].lm  # and the same client is answered normally after its errors
    (token,) = generate(run.model, [[run.tokens.bos_id] + run.tokenizer.encode("x")], 1, temperature=0)[0]
    out = client.completions.create(model="story", prompt="x", max_tokens=1, temperature=0).choices[0]
    stopped = token in run.tokens.eos_ids
    assert (out.finish_reason, out.text) == (("stop", "") if stopped else ("length", run.tokenizer.decode([token])))


# --- security -----------------------------------------------------------------------------------


def test_the_api_key_guards_every_api_route_and_the_playground_routes(models):
    s = Server(create_app(models, api_key="s3cret"))
    try:
        for method, path in [("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                             ("POST", "/v1/translations"), ("GET", "/v1/models/story")]:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"}):
                r = httpx.request(method, s.url + path, headers=headers, json=COMPLETION, timeout=10)
                assert r.status_code == 401, (path, headers)
                assert r.json()["error"]["code"] == "invalid_api_key"
        # the playground's routes too (the page itself holds no model data)
        assert httpx.get(s.url + "/playground/api/models", timeout=10).status_code == 401
        assert httpx.get(s.url + "/playground/api/models", headers={"Authorization": "Bearer s3cret"},
                         timeout=10).status_code == 200
        ok = openai.OpenAI(base_url=s.url + "/v1", api_key="s3cret", max_retries=0)
        assert ok.completions.create(model="story", prompt="x", max_tokens=2).usage.completion_tokens >= 1
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=s.url + "/v1", api_key="guess", max_retries=0).models.list()
    finally:
        s.stop()


def test_cors_is_off_unless_an_origin_is_given(server, models):
    preflight = {"Origin": "http://example.com", "Access-Control-Request-Method": "POST"}
    assert "access-control-allow-origin" not in httpx.options(server.url + "/v1/completions", headers=preflight).headers
    s = Server(create_app(models, cors_origins=["http://example.com"]))
    try:
        r = httpx.options(s.url + "/v1/completions", headers=preflight)
        assert r.headers["access-control-allow-origin"] == "http://example.com"
    finally:
        s.stop()


# --- translations -------------------------------------------------------------------------------


def test_translations_use_the_beam_size(server, runs):
    translator = Translator.load(runs["dates"])
    texts = ["the first of may", "twenty twenty"]
    for beam in (1, 3):
        r = httpx.post(server.url + "/v1/translations", json={"model": "dates", "input": texts, "beam_size": beam},
                       timeout=30).json()
        assert [d["text"] for d in r["data"]] == translator.translate(texts, beam=beam)
        assert r["beam_size"] == beam and r["usage"]["prompt_tokens"] > 0


# --- the command line ---------------------------------------------------------------------------


def test_cli_serve_binds_localhost_by_default_and_warns_for_other_hosts(runs, monkeypatch, capsys):
    import uvicorn

    calls = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets: calls.append(sockets[0].getsockname()))
    monkeypatch.setenv("HANDFORMER_API_KEY", "from-env")
    assert cli.build_parser().parse_args(["serve", "run"]).port == 8000
    assert cli.main(["serve", str(runs["story"]), "--port", "0"]) == 0
    assert calls[-1][0] == "127.0.0.1"
    err = capsys.readouterr().err
    assert "warning" not in err and "(API key required)" in err
    monkeypatch.delenv("HANDFORMER_API_KEY")
    assert cli.main(["serve", str(runs["story"]), "--host", "0.0.0.0", "--port", "0"]) == 0
    err = capsys.readouterr().err
    assert "warning: serving on 0.0.0.0, reachable from other machines by anyone: set --api-key" in err


@pytest.mark.parametrize("args, message", [
    (["{story}", "{story}"], "model id 'story' is given twice"),
    (["{story}", "--port", "70000"], "--port must be from 0 to 65535"),
    (["{story}", "--api-key", " "], "--api-key is empty"),
    (["{story}/nothing"], "nothing"),
])
def test_cli_serve_errors_are_one_line(runs, capsys, args, message):
    args = [a.format(story=runs["story"]) for a in args]
    assert cli.main(["serve", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err



@pytest.mark.slow  # a fresh process imports torch: ~4-8 s (the in-process CLI tests above are the smoke)
def test_the_serve_command_runs_a_real_server_and_stops_cleanly(runs):
    """`python -m handformer serve` in its own process: the key from the environment, then Ctrl-C
    (a graceful shutdown, exit code 0, no traceback)."""
    import os
    import signal
    import subprocess
    import sys

    from serve_helpers import free_port

    env = {**os.environ, "HANDFORMER_API_KEY": "k3y", "OMP_NUM_THREADS": "1"}
    for _ in range(5):  # a free port can be taken by another program before the server binds it: retry
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "handformer", "serve", f"tiny={runs['story']}", "--port",
                                 str(port), "--log-level", "warning"], env=env, stderr=subprocess.PIPE, text=True)
        url = f"http://127.0.0.1:{port}"
        _wait(lambda proc=proc, url=url: proc.poll() is not None or _answers(url), timeout=60)
        if proc.poll() is None:
            break
        assert "address already in use" in proc.stderr.read().lower()
    try:
        assert httpx.get(url + "/v1/models").status_code == 401
        api = openai.OpenAI(base_url=url + "/v1", api_key="k3y", max_retries=0)
        assert [m.id for m in api.models.list()] == ["tiny"]
        assert api.completions.create(model="tiny", prompt="the", max_tokens=3).usage.completion_tokens >= 1
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert f"serving tiny (lm) on http://127.0.0.1:{port}/v1 (API key required)" in err and "Traceback" not in err


def _answers(url: str) -> bool:
    try:
        httpx.get(url + "/v1/models", timeout=1)
        return True
    except httpx.HTTPError:
        return False


def test_characters_a_char_tokenizer_never_saw_are_answered_and_noted_once_in_the_log(server, caplog):
    """As `handformer generate` notes them on stderr: each request is answered (a client's own text,
    an agent framework's instructions, holds characters a small model never met), and the server's
    log names each new character once, with the field it came in."""
    bodies = [("/v1/completions", {**COMPLETION, "prompt": "the fox ζ€", "max_tokens": 1}),
              ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "hi"}, {
                  "role": "user", "content": "€ Ж"}], "max_tokens": 1}),
              ("/v1/embeddings", {"model": "story", "input": ["the fox", "fox Ж ζ"]})]
    with caplog.at_level("WARNING", logger="handformer.serve"):
        for path, body in bodies:
            assert httpx.post(server.url + path, json=body, timeout=10).status_code == 200
    notes = [r.getMessage() for r in caplog.records if "never saw" in r.getMessage()]
    assert notes == ["story, prompt: the run's character tokenizer never saw 'ζ', '€'; the model reads <unk> "
                     "for each (it knows the characters of its training text only)",
                     "story, messages[1].content: the run's character tokenizer never saw 'Ж'; the model reads "
                     "<unk> for each (it knows the characters of its training text only)"], notes
