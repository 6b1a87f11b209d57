"""The Responses API, Anthropic's Messages API and thinking of `handformer serve`, met by client
libraries nobody here wrote, on tiny random runs (one with a Qwen3-style template that thinks):

- the official `openai` client's responses.create / .stream / .parse, a function tool's round trip
  through previous_response_id, the store's 404 and bounds;
- the OpenAI Agents SDK on its default Responses path with a function tool (tracing off), and
  pydantic-ai's OpenAIResponsesModel with a tool and a structured output;
- the `anthropic` client's messages.create / .stream, a tool round trip, count_tokens, stop
  reasons, its error shape and `x-api-key`;
- thinking: the reasoning apart from the answer on each API, a budget that ends the section and
  leaves the answer room, reasoning_effort "none" that turns it off.

No test reaches past the loopback: a fixture refuses every other connection, so a client that
phones home fails instead."""

from __future__ import annotations

import json
import socket
import time
from typing import Annotated, Literal

import httpx
import pytest
import torch
from helpers import require_module
from serve_helpers import Server, make_lm_run, pace_steps, qwen3_template, seed_by_default

from handformer.generation.chat_template import ChatTemplate
from handformer.serve.app import create_app
from handformer.serve.registry import load_served_models
from handformer.serve.thinking import (
    CLOSING,
    ThinkingBudget,
    ThinkingFormat,
    ThinkingSplitter,
    capped_budget,
    template_closing,
)
from handformer.tasks.speedrun_chat.reasoning_stages import CHAT_TEMPLATE as REASONING_TEMPLATE

INSTALL = "pip install -e '.[dev]' (the client libraries the server is tested with are dev dependencies)"
require_module("llguidance", INSTALL)
openai = require_module("openai", INSTALL)

pytestmark = pytest.mark.usefixtures("one_thread", "loopback_only")
KEY = "test-key"
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6}},
                          "required": ["city"], "additionalProperties": False}}
USER = "What is the weather in Oslo?"


@pytest.fixture(scope="module")
def loopback_only():
    """Every connection to an address other than the loopback is refused."""
    real = socket.socket.connect, socket.socket.connect_ex

    def local(address) -> bool:
        host = address[0] if isinstance(address, tuple) else None
        return host is None or host in ("127.0.0.1", "::1", "localhost") or host.startswith("127.")

    def connect(self, address):
        if not local(address):
            raise ConnectionRefusedError(f"this test may not connect to {address!r}")
        return real[0](self, address)

    def connect_ex(self, address):
        if not local(address):
            raise ConnectionRefusedError(f"this test may not connect to {address!r}")
        return real[1](self, address)

    socket.socket.connect, socket.socket.connect_ex = connect, connect_ex
    yield
    socket.socket.connect, socket.socket.connect_ex = real


@pytest.fixture(scope="module")
def server(tmp_path_factory, one_thread, loopback_only):
    root = tmp_path_factory.mktemp("apis")
    runs = [make_lm_run(root / "story", max_positions=2048),
            make_lm_run(root / "qwen3", max_positions=2048, template=qwen3_template(), thinking=True, seed=4)]
    with pytest.MonkeyPatch.context() as patch:
        seed_by_default(patch)  # the Messages API sends no seed: its replies are the same every run
        s = Server(create_app(load_served_models([str(r) for r in runs]), api_key=KEY))
        yield s
        s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def anthropic():
    """Anthropic's client library, imported by the tests that use it (2 s: not at collection, in
    both workers)."""
    return require_module("anthropic", INSTALL)


@pytest.fixture(scope="module")
def claude(server, anthropic):
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)


def test_the_fixture_refuses_connections_past_the_loopback():
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("192.0.2.1", 443), timeout=1):
        pass


# --- the Responses API --------------------------------------------------------------------------

def test_responses_create_and_stream_agree_and_the_store_continues_them(client, server):
    first = client.responses.create(model="story", input=USER, instructions="Be brief.", max_output_tokens=12,
                                    temperature=0)
    assert first.status == "incomplete" and first.incomplete_details.reason == "max_output_tokens"
    assert first.usage.output_tokens == 12 and first.output_text
    with client.responses.stream(model="story", input=USER, instructions="Be brief.", max_output_tokens=12,
                                 temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert final.output_text == first.output_text and final.usage.output_tokens == 12
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert {"response.content_part.added", "response.output_text.done", "response.content_part.done",
            "response.output_item.done"} <= set(kinds) and kinds[-1] == "response.completed"
    assert final.status == "incomplete"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == first.output_text
    follow = client.responses.create(model="story", input="And tomorrow?", previous_response_id=first.id,
                                     max_output_tokens=2, temperature=0)
    # the conversation so far (without the instructions, which are not carried) was the prompt
    prompt = (f"<|im_start|>user\n{USER}<|im_end|>\n<|im_start|>assistant\n{first.output_text}<|im_end|>\n"
              "<|im_start|>user\nAnd tomorrow?<|im_end|>\n<|im_start|>assistant\n")
    tokenizer = server.app.state.models["story"].lm.tokenizer
    assert follow.usage.input_tokens == len(tokenizer.encode_with_special_tokens(prompt))
    assert client.responses.retrieve(first.id).output_text == first.output_text
    with pytest.raises(openai.NotFoundError, match="no response 'resp_nope' is stored"):
        client.responses.create(model="story", input="x", previous_response_id="resp_nope")
    kept = server.app.state.responses.store
    kept.max_age_s = 0.0  # every stored response is now too old
    time.sleep(0.01)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    kept.max_age_s = 3600.0


def test_a_function_call_round_trip_and_a_parsed_answer(client):
    from pydantic import BaseModel, Field

    called = client.responses.create(model="story", input=USER, tools=[WEATHER], tool_choice="required",
                                     max_output_tokens=300, temperature=0)
    (call,) = [item for item in called.output if item.type == "function_call"]
    assert call.name == "get_weather" and set(json.loads(call.arguments)) == {"city"}
    answer = client.responses.create(model="story", previous_response_id=called.id, tools=[WEATHER],
                                     input=[{"type": "function_call_output", "call_id": call.call_id,
                                             "output": "5 C"}], max_output_tokens=3, temperature=0)
    whole = [{"role": "user", "content": USER}, {"type": "function_call", "call_id": call.call_id,
                                                 "name": call.name, "arguments": call.arguments},
             {"type": "function_call_output", "call_id": call.call_id, "output": "5 C"}]
    again = client.responses.create(model="story", input=whole, tools=[WEATHER], max_output_tokens=3,
                                    temperature=0)
    assert answer.usage.input_tokens == again.usage.input_tokens and answer.output_text == again.output_text

    class City(BaseModel):
        name: Annotated[str, Field(max_length=8)]
        sunny: bool

    parsed = client.responses.parse(model="story", input=USER, text_format=City, max_output_tokens=200,
                                    temperature=0.7)
    assert isinstance(parsed.output_parsed, City)


def test_the_agents_sdk_calls_a_function_tool_on_its_responses_path(server):
    agents = require_module("agents", INSTALL)
    agents.set_tracing_disabled(True)
    seen = []

    @agents.function_tool
    def get_weather(city: Literal["oslo", "rome"]) -> str:
        """The weather in a city."""
        seen.append(city)
        return "5 C"

    model = agents.OpenAIResponsesModel("story", openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=KEY,
                                                                    max_retries=0))
    # a random model's free text ends at max_tokens, which the SDK takes for a failed turn: the run
    # stops at the tool's output
    agent = agents.Agent(name="weather", instructions="Answer briefly.", tools=[get_weather], model=model,
                         tool_use_behavior="stop_on_first_tool",
                         model_settings=agents.ModelSettings(tool_choice="required", max_tokens=300, temperature=0))
    result = agents.Runner.run_sync(agent, USER, max_turns=2)
    assert len(seen) == 1 and result.final_output == "5 C"
    assert [item.type for item in result.new_items] == ["tool_call_item", "tool_call_output_item"]
    with pytest.raises(agents.exceptions.ModelBehaviorError, match="incomplete"):  # cut by max_tokens
        agents.Runner.run_sync(agents.Agent(name="plain", model=model, model_settings=agents.ModelSettings(
            max_tokens=3, temperature=0)), USER)


def test_pydantic_ai_with_the_responses_model(server):
    require_module("pydantic_ai", INSTALL)
    from pydantic import BaseModel, Field
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    class Weather(BaseModel):
        city: Literal["oslo", "rome"]
        celsius: Annotated[int, Field(ge=-50, le=50)]

    model = OpenAIResponsesModel("story", provider=OpenAIProvider(base_url=server.url + "/v1", api_key=KEY))
    agent = Agent(model, output_type=Weather, model_settings={"max_tokens": 200, "temperature": 0.5})
    result = agent.run_sync(USER)
    assert isinstance(result.output, Weather)
    plain = Agent(model, model_settings={"max_tokens": 5, "temperature": 0}).run_sync(USER)
    assert isinstance(plain.output, str)


def test_bad_responses_bodies_are_400s_naming_the_field(server):
    ok = {"model": "story", "input": "hi", "max_output_tokens": 2}
    for extra, param in (({"input": 3}, "input"), ({"input": [{"role": "wizard", "content": "x"}]}, "input[0].role"),
                         ({"tools": [{"type": "web_search"}]}, "tools[0]"), ({"temperature": 3}, "temperature"),
                         ({"reasoning": {"effort": "huge"}}, "reasoning"), ({"frobnicate": 1}, "frobnicate"),
                         ({"text": {"format": {"type": "xml"}}}, "text.format"), ({"background": True}, "background"),
                         ({"text": {"format": {"type": "json_schema", "name": "r", "schema": {"type": "strin"}}}},
                          "text.format.schema")):
        response = httpx.post(server.url + "/v1/responses", json={**ok, **extra},
                              headers={"Authorization": f"Bearer {KEY}"})
        assert response.status_code == 400 and response.json()["error"]["param"] == param, (extra, response.text)
    ignored = {"include": [], "store": False, "parallel_tool_calls": True, "metadata": {"a": "b"},
               "truncation": "disabled", "service_tier": "auto"}
    response = httpx.post(server.url + "/v1/responses", json={**ok, **ignored}, headers={"Authorization": f"Bearer {KEY}"})
    assert response.status_code == 200 and response.json()["metadata"] == {"a": "b"}


# --- Anthropic's Messages API -------------------------------------------------------------------

MESSAGES = [{"role": "user", "content": USER}]
# this anthropic client has no temperature argument; older ones and Claude Code send one
GREEDY = {"temperature": 0}
TOOL = {"name": "get_weather", "description": "The weather in a city.", "input_schema": WEATHER["parameters"]}


def test_messages_create_stream_and_count_tokens(claude):
    reply = claude.messages.create(model="story", system="Be brief.", messages=MESSAGES, max_tokens=12,
                                   extra_body=GREEDY)
    assert reply.stop_reason == "max_tokens" and reply.usage.output_tokens == 12
    with claude.messages.stream(model="story", system="Be brief.", messages=MESSAGES, max_tokens=12,
                                extra_body=GREEDY) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert final.content[0].text == reply.content[0].text and final.stop_reason == "max_tokens"
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert {"content_block_start", "content_block_delta", "content_block_stop"} <= set(kinds)
    counted = claude.messages.count_tokens(model="story", system="Be brief.", messages=MESSAGES)
    assert counted.input_tokens == reply.usage.input_tokens
    stop = reply.content[0].text[3:5]
    stopped = claude.messages.create(model="story", system="Be brief.", messages=MESSAGES, max_tokens=12,
                                     extra_body=GREEDY, stop_sequences=[stop])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == stop
    assert stopped.content[0].text == reply.content[0].text[:3]


def test_a_tool_round_trip_with_the_anthropic_client(claude):
    first = claude.messages.create(model="story", messages=MESSAGES, tools=[TOOL], max_tokens=300,
                                   tool_choice={"type": "tool", "name": "get_weather"}, extra_body=GREEDY)
    (use,) = first.content
    assert first.stop_reason == "tool_use" and use.type == "tool_use" and set(use.input) == {"city"}
    history = MESSAGES + [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
                          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                        "content": "5 C"}]}]
    answer = claude.messages.create(model="story", messages=history, tools=[TOOL], max_tokens=3, extra_body=GREEDY)
    counted = claude.messages.count_tokens(model="story", messages=history, tools=[TOOL])
    assert answer.usage.input_tokens == counted.input_tokens > first.usage.input_tokens
    with claude.messages.stream(model="story", messages=MESSAGES, tools=[TOOL], max_tokens=300,
                                tool_choice={"type": "any"}, extra_body=GREEDY) as stream:
        streamed = stream.get_final_message()
    assert streamed.content[0].input == use.input and streamed.stop_reason == "tool_use"


def test_an_unknown_route_asks_for_the_key_before_its_404(server, client, claude, anthropic):
    """With a key, a route this server lacks (batches, files) is a 401 to a caller without the key,
    as from OpenAI's server (the 404 lists every route); with the key, a 404 naming the path and
    the routes there are, in the shape of the path's API. A wrong method: 401, then 405."""
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="guess", max_retries=0).batches.list()
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server.url, api_key="guess", max_retries=0).messages.batches.list()
    with pytest.raises(openai.NotFoundError, match=r"no route /v1/files; this server has .*POST /v1/responses"):
        client.files.list()
    with pytest.raises(anthropic.NotFoundError, match=r"no route /v1/messages/batches; .*POST /v1/messages,"):
        claude.messages.batches.list()
    assert httpx.get(server.url + "/v1/responses", timeout=10).status_code == 401
    assert httpx.get(server.url + "/v1/responses", headers={"x-api-key": KEY}, timeout=10).status_code == 405


def test_messages_errors_come_in_anthropics_shape(claude, server, anthropic):
    with pytest.raises(anthropic.BadRequestError) as err:
        claude.messages.create(model="story", messages=MESSAGES, max_tokens=5, extra_body={"temperature": 1.5})
    assert err.value.body == {"type": "error", "error": {"type": "invalid_request_error", "message": (
        "temperature must be a number >= 0 and <= 1 (0 = greedy), got 1.5")}}
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0).messages.create(
            model="story", messages=MESSAGES, max_tokens=5)
    for body, word in (({"model": "story", "messages": MESSAGES}, "max_tokens"),
                       ({"model": "story", "messages": [{"role": "system", "content": "x"}], "max_tokens": 5},
                        "messages[0]"),
                       ({"model": "story", "messages": MESSAGES, "max_tokens": 5, "thinking": {"type": "on"}},
                        "thinking"),
                       ({"model": "story", "max_tokens": 5, "messages": [{"role": "user", "content": [
                           {"type": "tool_result", "tool_use_id": "toolu_1", "content": "5 C"}]}]},
                        "a tool_result's tool_use_id 'toolu_1' matches no earlier tool_use block (there is none)")):
        response = httpx.post(server.url + "/v1/messages", json=body,
                              headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"})
        assert response.status_code == 400 and response.json()["error"]["message"].startswith(word), response.text


# --- thinking -----------------------------------------------------------------------------------

def test_the_splitter_reads_reasoning_apart_from_the_answer_in_any_chunking():
    for opened, text in ((True, "\nI think.\n</think>\n\nHello"), (False, "<think>\nI think.\n</think>\n\nHello"),
                         (False, "\n<think>I think.</think>Hello")):
        for size in (1, 2, 3, 50):
            splitter = ThinkingSplitter(opened)
            pieces = [splitter.feed(text[i:i + size]) for i in range(0, len(text), size)] + [splitter.finish()]
            assert ("".join(p[0] for p in pieces), "".join(p[1] for p in pieces)) == ("I think.", "Hello")
    splitter = ThinkingSplitter(False)
    assert splitter.feed("<b>Hi") == ("", "<b>Hi") and splitter.finish() == ("", "")


def test_the_budget_masks_the_end_then_forces_the_closing():
    fmt = ThinkingFormat(start_id=1, end_id=2, closing=(3, 2, 3))
    budget = ThinkingBudget(fmt, budget=2, opened=True, stop_ids=frozenset({0}))
    logits = torch.zeros(5)
    assert budget([], logits)[0] == float("-inf") and budget([4], logits)[4] == 0  # thinking: no end token
    assert [int(budget(t, logits).argmax()) for t in ([4, 4], [4, 4, 3], [4, 4, 3, 2])] == [3, 2, 3]
    assert budget([4, 4, 3, 2, 3], logits)[0] == float("-inf")  # the answer's first token is no end
    assert torch.equal(budget([4, 4, 3, 2, 3, 4], logits), logits)  # then the answer is free
    assert torch.equal(budget([4, 2], logits), logits)  # the section ended on its own
    assert capped_budget(1024, 40, 4) == 26 and capped_budget(None, 40, 4) == 26 and capped_budget(5, 40, 4) == 5


def test_reasoning_on_each_api_within_its_budget(client, claude, server):
    chat = client.chat.completions.create(model="qwen3", messages=MESSAGES, max_tokens=40, reasoning_effort="minimal",
                                          seed=1)
    message = chat.choices[0].message
    reasoning = chat.usage.completion_tokens_details.reasoning_tokens
    assert message.reasoning_content and message.content and "<think>" not in message.content
    assert 0 < reasoning <= capped_budget(64, 40, 4) + 2  # the budget, "\n</think>"
    off = client.chat.completions.create(model="qwen3", messages=MESSAGES, max_tokens=5, reasoning_effort="none",
                                         seed=1)
    assert getattr(off.choices[0].message, "reasoning_content", None) is None
    assert off.usage.prompt_tokens == chat.usage.prompt_tokens + 4  # "<think>\n" became "<think>\n\n</think>\n\n"
    response = client.responses.create(model="qwen3", input=USER, max_output_tokens=40,
                                       reasoning={"effort": "low"})
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.output[0].content[0].text and response.usage.output_tokens_details.reasoning_tokens > 0
    reply = claude.messages.create(model="qwen3", messages=MESSAGES, max_tokens=30,
                                   thinking={"type": "enabled", "budget_tokens": 6})
    tokenizer = server.app.state.models["qwen3"].lm.tokenizer
    thought = len(tokenizer.encode_with_special_tokens(reply.content[0].thinking))
    assert reply.content[0].type == "thinking" and thought <= 6
    assert thought < 6 or [b.type for b in reply.content] == ["thinking", "text"]  # forced: an answer follows
    with claude.messages.stream(model="qwen3", messages=MESSAGES, max_tokens=30,
                                thinking={"type": "enabled", "budget_tokens": 6}) as stream:
        deltas = {e.delta.type for e in stream if e.type == "content_block_delta"}
        final = stream.get_final_message()
    assert {"thinking_delta", "text_delta"} <= deltas and final.content[0].type == "thinking"
    plain = claude.messages.create(model="qwen3", messages=MESSAGES, max_tokens=5)  # no `thinking`: none
    assert all(b.type == "text" for b in plain.content)
    assert plain.usage.input_tokens == reply.usage.input_tokens + 4  # the closed section "<think>\n\n</think>\n\n"


def test_the_forced_closing_is_the_templates_own():
    """A spent budget forces what the template writes from `</think>` on: Qwen3's "\\n</think>\\n\\n",
    the reasoning preset's "\\n</think>\\n" (forced Qwen3's, its GRPO model answered 2156 + 1796 with
    "352" after reasoning to 3952); a template whose prompt never closes the section, Qwen3's."""
    assert template_closing(ChatTemplate(qwen3_template())) == "\n</think>\n\n"
    assert template_closing(ChatTemplate(REASONING_TEMPLATE)) == "\n</think>\n"
    assert template_closing(ChatTemplate("{% for m in messages %}{{ m['content'] }}{% endfor %}<think>")) == CLOSING


def test_a_budget_spent_ends_the_section_and_the_answer_follows(client, server):
    """The reasoning is the budget's tokens, then "\n</think>\n\n" is forced and the answer follows."""
    budget = capped_budget(64, 40, 4)  # the closing "\n</think>\n\n" is 4 tokens here
    chat = client.chat.completions.create(model="qwen3", messages=MESSAGES, max_tokens=40, reasoning_effort="minimal",
                                          seed=3)
    assert chat.usage.completion_tokens_details.reasoning_tokens == budget + 2
    tokenizer = server.app.state.models["qwen3"].lm.tokenizer
    assert len(tokenizer.encode_with_special_tokens(chat.choices[0].message.reasoning_content)) == budget
    assert chat.choices[0].message.content


# --- a client that leaves -----------------------------------------------------------------------

@pytest.mark.parametrize("route,body", [
    ("/v1/responses", {"input": USER, "max_output_tokens": 1500}),
    ("/v1/messages", {"messages": MESSAGES, "max_tokens": 1500}),
    ("/v1/messages", {"messages": MESSAGES, "max_tokens": 1500, "stream": True})])
def test_a_request_whose_client_leaves_leaves_the_batch(server, monkeypatch, route, body):
    engine = server.app.state.engines["story"]
    pace_steps(monkeypatch, server)
    # greedy from this prompt does not write the end token: the row decodes until the client leaves
    data = json.dumps({"model": "story", "temperature": 0, **body}).encode()
    before = engine.steps
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(f"POST {route} HTTP/1.1\r\nHost: x\r\nx-api-key: {KEY}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    start = time.monotonic()
    while not (engine.running == 1 and engine.steps > before + 5):  # its tokens are flowing
        assert time.monotonic() - start < 20, "the request never decoded"
        time.sleep(0.002)
    sock.close()
    closed_at = engine.steps
    while engine.running or engine.sequences:
        assert time.monotonic() - start < 20, "the row stayed in the batch after its client left"
        time.sleep(0.002)
    assert engine.steps - closed_at <= 10
