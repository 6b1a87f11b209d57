"""Structured output, tool calls and embeddings of `handformer serve`, on tiny random models:

- JSON schemas are checked before they are compiled (JSON pointers, unsupported keywords, limits),
  and the checker agrees with `jsonschema` on what is a valid schema;
- every token's bytes (character, byte-level BPE and SentencePiece vocabularies) spell the text;
- constrained decoding: each row of one batch follows its own schema; a reply that stops validates
  (`jsonschema`), one cut by max_tokens is a prefix the grammar accepts; logprobs are those of the
  constrained distribution;
- response_format on chat and completions, whole and streamed; tool calls in the ChatML (Qwen) and
  Llama 3.1 formats, forced by tool_choice, parsed, streamed, sent back with role "tool", with the
  official `openai` client and with langchain-openai's `ChatOpenAI.bind_tools` (never loading a
  tiktoken encoding); every bad input is one 400 naming the field;
- embeddings equal to the same computation done by hand."""

from __future__ import annotations

import base64
import json
import math
import os
import signal
import threading

import httpx
import pytest
import torch
from helpers import require_module
from serve_helpers import Server, make_lm_run

from handformer.data.token_bytes import token_bytes
from handformer.data.tokenizer import Tokenizer
from handformer.generation import grammar as grammar_module
from handformer.generation.engine import Engine, Row, SamplingOptions
from handformer.generation.grammar import Grammar, Vocabulary
from handformer.generation.json_schema import MAX_SCHEMA_BYTES, SchemaError, check_schema
from handformer.generation.tool_calls import CHATML, LLAMA3, TEMPLATES, Tool
from handformer.serve.app import create_app
from handformer.serve.engine import BatchEngine, Sequence
from handformer.serve.registry import load_served_models
from handformer.tasks.lm.chat import chat

INSTALL = "pip install -e '.[dev]' (structured output's grammar engine and its test tools are dev dependencies)"
require_module("llguidance", INSTALL)
jsonschema = require_module("jsonschema", INSTALL)
openai = require_module("openai", INSTALL)

pytestmark = pytest.mark.usefixtures("one_thread")

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
          "required": ["name", "age", "tags"], "additionalProperties": False}
FLAGS = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": ["null", "number"]}},
         "required": ["ok", "n"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
                                                    "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}},
                                       "required": ["zone"], "additionalProperties": False}}}
USER = [{"role": "user", "content": "What is the weather in Oslo?"}]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, one_thread):
    root = tmp_path_factory.mktemp("structured")
    own = (TEMPLATES / "chatml_tools.jinja").read_text()
    return {"story": make_lm_run(root / "story", max_positions=2048),
            "llama": make_lm_run(root / "llama", max_positions=2048, markup="llama3", seed=2),
            "own": make_lm_run(root / "own", max_positions=2048, template=own, seed=3)}


@pytest.fixture(scope="module")
def models(runs):
    return load_served_models([str(p) for p in runs.values()])


@pytest.fixture(scope="module")
def server(models):
    s = Server(create_app(models))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60)


# --- schemas ----------------------------------------------------------------------------------

VALID = [PERSON, FLAGS, {}, {"type": "object", "properties": {"a": True}}, {"anyOf": [{"type": "string"}, {}]},
         {"$defs": {"x": {"type": "integer"}}, "$ref": "#/$defs/x"}, {"prefixItems": [{"type": "string"}]}]
INVALID = [
    ({"type": "objekt"}, "/type"), ({"type": "object", "properties": {"a": {"type": 3}}}, "/properties/a/type"),
    ({"properties": []}, "/properties"), ({"required": "a"}, "/required"), ({"maxLength": -1}, "/maxLength"),
    ({"anyOf": []}, "/anyOf"), ({"items": [{"type": "string"}]}, "/items"),
    ({"minimum": "0"}, "/minimum"), ({"pattern": 5}, "/pattern"), ({"multipleOf": 0}, "/multipleOf"),
    ({"properties": {"a/b": {"anyOf": [{"type": "nul"}]}}}, "/properties/a~1b/anyOf/0/type"),
    ({"allOf": [5]}, "/allOf/0"), ({"required": ["a", "a"]}, "/required")]


def test_the_schema_checker_agrees_with_jsonschema_and_names_the_pointer():
    for schema in VALID:
        jsonschema.Draft202012Validator.check_schema(schema)
        check_schema(schema)
    for schema, pointer in INVALID:
        with pytest.raises(jsonschema.SchemaError):
            jsonschema.Draft202012Validator.check_schema(schema)
        with pytest.raises(SchemaError) as err:
            check_schema(schema)
        assert err.value.pointer == pointer and pointer in err.value.message, (schema, err.value.message)
    with pytest.raises(SchemaError, match="enum must be a non-empty list"):  # valid, but nothing matches it
        check_schema({"enum": []})


def test_unsupported_keywords_and_sizes_are_refused_by_name():
    with pytest.raises(SchemaError) as err:
        check_schema({"type": "object", "properties": {"a": {"not": {}}, "b": {"type": "array", "uniqueItems": True}}})
    assert err.value.unsupported == ["/properties/a/not", "/properties/b/uniqueItems"]
    assert "not, uniqueItems" in err.value.message
    with pytest.raises(SchemaError, match="over the limit"):
        check_schema({"enum": ["x" * MAX_SCHEMA_BYTES]})
    deep: dict = {}
    for _ in range(40):
        deep = {"items": deep}
    with pytest.raises(SchemaError, match="more than 32 deep"):
        check_schema(deep)


# --- token bytes ------------------------------------------------------------------------------

def test_token_bytes_spell_the_text_of_every_kind_of_vocabulary():
    from tokenizers import SentencePieceBPETokenizer

    text = 'the {"name": "é 中"} fox\n' * 5
    for kind in ("char", "bpe"):
        tok = Tokenizer.train(kind, [text * 20], 300)
        pieces = token_bytes(tok)
        assert b"".join(pieces[i] for i in tok.encode(text)).decode() == text
        assert all(pieces[i] is None for i in tok.special_ids)
    sp = SentencePieceBPETokenizer()
    sp.train_from_iterator([text * 20], vocab_size=120, special_tokens=["<unk>"], show_progress=False)
    tok = Tokenizer(sp._tokenizer)
    pieces = token_bytes(tok)
    spelled = b"".join(pieces[i] for i in tok.encode(text)).decode()
    assert spelled.lstrip(" ") == text.replace("\n", "\n")  # a leading "▁" is a leading space


# --- constrained decoding in the engine -------------------------------------------------------

def _fresh_accepts(grammar: Grammar, tokens: list[int], stop: set[int]) -> bool:
    """Whether a fresh matcher of `grammar` accepts `tokens` (a stop token ends them)."""
    matcher = grammar.matcher.deep_copy()
    return all(matcher.consume_token(t) for t in tokens if t not in stop)


def test_each_row_of_a_batch_follows_its_own_schema(models):
    run = models["story"].lm
    vocab = Vocabulary(run.tokenizer, run.model.cfg.vocab_size, run.tokens.eos_ids)
    grammars = [Grammar.json_schema(vocab, s) for s in (PERSON, FLAGS)]
    stop = set(run.tokens.eos_ids)
    rows = [Row([run.tokens.bos_id, 5], (200, 12)[i % 2 if i < 4 else 0], SamplingOptions(temperature=1.0, seed=i),
                frozenset(stop), processors=(grammars[i % 2].constraint(stop),)) for i in range(6)]
    with torch.inference_mode():
        engine = Engine(run.model)
        engine.add(rows)
        engine.run()
    for i, row in enumerate(rows):
        text = run.tokenizer.decode(row.tokens)
        if row.finish_reason == "stop":
            jsonschema.validate(json.loads(text), (PERSON, FLAGS)[i % 2])
        else:  # cut by max_tokens: a prefix the grammar accepts
            assert row.finish_reason == "length" and _fresh_accepts(grammars[i % 2], row.tokens, stop)
    assert {r.finish_reason for r in rows} == {"stop", "length"}


def test_logprobs_are_those_of_the_constrained_distribution(models):
    """At each step of a constrained sample the token's log-probability and the top ones are those of
    softmax(logits / T) over the tokens the grammar allows there, recomputed from a plain forward and a
    fresh matcher given the tokens before; the steps checked include one with several tokens allowed,
    where temperature and renormalization show."""
    run = models["story"].lm
    vocab = Vocabulary(run.tokenizer, run.model.cfg.vocab_size, run.tokens.eos_ids)
    grammar = Grammar.json_schema(vocab, FLAGS)
    prompt, stop = [run.tokens.bos_id, 7], run.tokens.eos_ids
    row = Row(prompt, 12, SamplingOptions(temperature=0.8, seed=0, top_logprobs=3), frozenset(stop),
              processors=(grammar.constraint(stop),))
    with torch.inference_mode():
        engine = Engine(run.model)
        choices = engine.add([row])
        engine.run(choices.append)
        logits = run.model(torch.tensor([prompt + row.tokens])).logits[0, len(prompt) - 1:]  # (steps+, V)
    assert [c.token for c in choices] == row.tokens
    several = 0
    for i, choice in enumerate(choices):
        state = grammar.constraint(stop)
        state.sync(row.tokens[:i])
        allowed = state.allowed()
        expected = torch.log_softmax((logits[i] / 0.8).masked_fill(~allowed, float("-inf")), -1)
        assert math.isclose(choice.logprob, float(expected[choice.token]), abs_tol=1e-4), (i, choice.token)
        assert [t for t, _ in choice.top] == expected.topk(min(3, int(allowed.sum()))).indices.tolist(), i
        assert all(allowed[t] for t, _ in choice.top)  # the masked-out tokens have no probability
        several += int(allowed.sum()) >= 2
    assert row.tokens[0] == run.tokenizer.encode("{")[0] and several >= 1, (several, row.tokens)


class Collect:
    """A serve sink that keeps a sequence's tokens and how it ended."""

    def __init__(self) -> None:
        self.tokens, self.reason, self.ended = [], None, threading.Event()

    def token(self, token_id, logprob, top, is_stop_token) -> bool:
        self.tokens.append((token_id, logprob))
        return False

    def finish(self, reason: str) -> None:
        self.reason = reason
        self.ended.set()

    def fail(self, message: str, status: int = 500) -> None:
        self.reason = f"failed {status}: {message}"
        self.ended.set()


def _served_tokens(run, grammars) -> list[tuple[list, str]]:
    """Six seeded sequences through serve's engine, batched, four of them constrained."""
    stop = frozenset(run.tokens.eos_ids)
    sinks = [Collect() for _ in range(6)]
    engine = BatchEngine(run.model, threading.Lock(), max_batch=4)
    for i, sink in enumerate(sinks):
        constraint = grammars[i % 2].constraint(stop) if i < 4 else None
        options = SamplingOptions(temperature=1.0, seed=i, top_logprobs=0 if i == 1 else None)
        engine.submit(Sequence([run.tokens.bos_id, 5 + i], (200, 9)[i % 2], options, stop, sink, constraint))
    engine.start()
    try:
        assert all(sink.ended.wait(60) for sink in sinks)
    finally:
        engine.stop()
    return [(sink.tokens, sink.reason) for sink in sinks]


def test_masks_prepared_in_the_background_give_the_same_tokens(models, monkeypatch):
    """Constraint.prepare computes the next mask on the grammar thread while the next forward runs;
    the tokens, log-probabilities and endings are those of masks computed in the step."""
    run = models["story"].lm
    vocab = Vocabulary(run.tokenizer, run.model.cfg.vocab_size, run.tokens.eos_ids)
    grammars = [Grammar.json_schema(vocab, s) for s in (PERSON, FLAGS)]
    threads, words = set(), grammar_module.Constraint._words
    monkeypatch.setattr(grammar_module.Constraint, "_words",
                        lambda self: (threads.add(threading.current_thread().name), words(self))[1])
    prepared = _served_tokens(run, grammars)
    assert any(name.startswith("handformer-grammar") for name in threads)  # the masks were prepared
    monkeypatch.setattr(grammar_module.Constraint, "prepare", None)  # the engine then never calls it
    threads.clear()
    assert _served_tokens(run, grammars) == prepared
    assert threads == {"handformer-engine"}  # every mask computed in its step
    assert {reason for _, reason in prepared} == {"stop", "length"}
    for i, (tokens, reason) in enumerate(prepared[:4]):
        if reason == "stop":
            jsonschema.validate(json.loads(run.tokenizer.decode([t for t, _ in tokens])), (PERSON, FLAGS)[i % 2])


def test_a_forked_child_starts_its_own_grammar_thread():
    """The parent's grammar thread is not in a forked child: a mask job there runs on a new one
    instead of waiting for ever."""
    assert grammar_module.grammar_thread().submit(int).result() == 0  # the parent's thread runs
    pid = os.fork()
    if pid == 0:
        signal.alarm(10)  # never hang the test run
        os._exit(grammar_module.grammar_thread().submit(lambda: 7).result())
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 7


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_refused_tokens_are_masked_as_masked_fill_masks_them(dtype):
    logits = torch.randn(1000).to(dtype)
    refused = torch.rand(1000) < 0.7
    out = grammar_module.refuse(logits, refused.numpy())
    assert out.dtype == dtype and torch.equal(out, logits.masked_fill(refused, float("-inf")))
    assert not torch.equal(logits, out)  # a copy: the logits given are left as they were


# --- response_format over HTTP ----------------------------------------------------------------

def _schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema, "strict": True}}


def test_response_format_on_chat_and_completions_whole_and_streamed(client):
    chat = client.chat.completions.create(model="story", messages=USER, response_format=_schema_format(PERSON),
                                          n=3, seed=4, max_tokens=200, temperature=0.9)
    for choice in chat.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), PERSON)
    assert len({c.message.content for c in chat.choices}) > 1  # seed + i: different replies
    streamed = client.chat.completions.create(model="story", messages=USER, response_format=_schema_format(PERSON),
                                              seed=4, max_tokens=200, temperature=0.9, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == chat.choices[0].message.content
    text = client.completions.create(model="story", prompt="the", max_tokens=100, seed=1,
                                     extra_body={"response_format": {"type": "json_object"}}).choices[0]
    assert text.finish_reason == "stop" and isinstance(json.loads(text.text), dict)


def test_a_schema_sent_again_is_not_compiled_again(client, server, monkeypatch):
    from handformer.serve import structured

    compiled = []
    build = Grammar.json_schema.__func__
    monkeypatch.setattr(Grammar, "json_schema",
                        classmethod(lambda cls, *args, **kw: (compiled.append(args[1]), build(cls, *args, **kw))[1]))
    again = {"type": "object", "properties": {"again": {"type": "boolean"}}, "required": ["again"],
             "additionalProperties": False}
    replies = [client.chat.completions.create(model="story", messages=USER, response_format=_schema_format(again),
                                              seed=seed, max_tokens=30).choices[0].message.content
               for seed in (0, 1, 0)]
    assert compiled == [again]  # once for the three requests
    assert replies[0] == replies[2]  # the same seed: the same reply from the kept grammar
    for reply in replies:
        jsonschema.validate(json.loads(reply), again)
    monkeypatch.setattr(structured, "GRAMMARS_KEPT", 2)
    kept = server.app.state.structured["story"]._grammars
    for i in range(3):
        client.chat.completions.create(model="story", messages=USER, max_tokens=30, seed=0, response_format=(
            _schema_format({"type": "object", "properties": {f"k{i}": {"type": "null"}}, "required": [f"k{i}"]})))
    assert [json.loads(text)["properties"] for _, text in kept] == [{"k1": {"type": "null"}}, {"k2": {"type": "null"}}]


def test_a_reply_cut_by_max_tokens_is_a_prefix_the_grammar_accepts(client, models):
    run = models["story"].lm
    out = client.completions.create(model="story", prompt="the", max_tokens=12, seed=0,
                                    extra_body={"response_format": _schema_format(PERSON)}).choices[0]
    assert out.finish_reason == "length" and out.text.startswith('{"name": "')
    vocab = Vocabulary(run.tokenizer, run.model.cfg.vocab_size, run.tokens.eos_ids)
    assert _fresh_accepts(Grammar.json_schema(vocab, PERSON), run.tokenizer.encode(out.text), set())


SCHEMA_PARAM = "response_format.json_schema.schema"
BAD_FORMATS = [
    ({"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object", "properties": {
        "a": {"type": "strin"}}}}}, SCHEMA_PARAM, "not a valid JSON Schema at /properties/a/type"),
    (_schema_format({"type": "object", "if": {}, "properties": {"x": {"contains": {}}}}), SCHEMA_PARAM,
     "cannot enforce: contains, if (at /if, /properties/x/contains)"),
    (_schema_format({"enum": ["x" * (MAX_SCHEMA_BYTES + 1)]}), SCHEMA_PARAM, "over the limit of 65536"),
    (_schema_format({"type": "string", "format": "weird"}), SCHEMA_PARAM, "Unknown format: weird"),
    (_schema_format({"$ref": "#/$defs/nowhere"}), SCHEMA_PARAM, "does not exist"),
    ({"type": "json_schema", "json_schema": {"name": "r"}}, SCHEMA_PARAM, "must be a JSON schema"),
    ({"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}, "response_format.json_schema.name",
     "name must be a name"),
    ({"type": "xml"}, "response_format", '{"type": "json_object"}'),
]


@pytest.mark.parametrize("fmt, param, message", BAD_FORMATS, ids=[b[2][:24] for b in BAD_FORMATS])
def test_a_bad_response_format_is_a_400_naming_it(server, fmt, param, message):
    for path, body in (("/v1/chat/completions", {"messages": USER}), ("/v1/completions", {"prompt": "x"})):
        r = post(server, path, {"model": "story", **body, "response_format": fmt})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == param and message in error["message"], error


def test_a_missing_grammar_engine_is_a_400_naming_the_pip_command(server, monkeypatch):
    def missing():
        raise grammar_module.GrammarEngineMissing(f"structured output needs llguidance: {grammar_module.INSTALL}")

    monkeypatch.setattr(grammar_module, "llguidance", missing)
    fresh = {"type": "object", "properties": {"never_compiled": {"type": "null"}}}  # no kept grammar serves it
    r = post(server, "/v1/chat/completions", {"model": "story", "messages": USER,
                                              "response_format": _schema_format(fresh)})
    assert r.status_code == 400 and "pip install 'handformer[serve]'" in r.json()["error"]["message"]
    assert r.json()["error"]["code"] == "grammar_engine_missing"


def test_a_schema_the_vocabulary_cannot_write_fails_its_request_with_a_400(server):
    body = {"model": "story", "messages": USER, "max_tokens": 50, "seed": 0,
            "response_format": _schema_format({"enum": ["日本"]})}  # the run's characters have no 日
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == 400 and "cannot write what the schema asks for" in r.json()["error"]["message"]
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=30) as s:
        last = [line for line in s.iter_lines() if line.startswith("data: ")][-1]
    assert "cannot write" in json.loads(last.removeprefix("data: "))["error"]["message"]
    assert post(server, "/v1/chat/completions", {**body, "response_format": None}).status_code == 200


def test_the_largest_schema_admitted_decodes_and_one_over_the_engines_limits_is_a_400(server, models, monkeypatch):
    run = models["story"].lm
    vocab = Vocabulary(run.tokenizer, run.model.cfg.vocab_size, run.tokens.eos_ids)
    wide = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(1999)}}  # 2,000 subschemas
    constraint = Grammar.json_schema(vocab, wide).constraint(run.tokens.eos_ids)
    start = run.tokenizer.encode('{"p1')
    for i, token in enumerate(start):  # every alternative at the first key is held in the parser's row
        assert constraint(start[:i], torch.zeros(vocab.size))[token].isfinite(), (i, constraint.error)
    constraint(start, torch.zeros(vocab.size))
    assert constraint.error is None
    monkeypatch.setitem(grammar_module.LIMITS, "max_items_in_row", 100)
    body = {"model": "story", "messages": USER, "max_tokens": 20, "seed": 0, "response_format": _schema_format(
        {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(60)}})}
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith("the schema is over the grammar engine's limits (Current row has ")
    assert "send a smaller schema" in r.json()["error"]["message"] and r.json()["error"]["code"] == "schema_over_limits"
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=30) as s:
        events = [json.loads(line.removeprefix("data: ")) for line in s.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    assert events[-1]["error"]["code"] == "schema_over_limits"  # the stream ends with the error
    assert all(e["choices"][0]["finish_reason"] is None for e in events[:-1])  # never a "stop"


# --- tool calls -------------------------------------------------------------------------------

def _arguments(call) -> dict:
    return json.loads(call.function.arguments)


@pytest.mark.parametrize("model", ["story", "llama", "own"])
def test_a_forced_tool_call_is_valid_for_its_parameters(client, model):
    named = {"type": "function", "function": {"name": "get_time"}}
    for choice, parallel in (("required", False), (named, False), ("required", True)):
        reply = client.chat.completions.create(model=model, messages=USER, tools=[WEATHER, TIME], tool_choice=choice,
                                               parallel_tool_calls=parallel, seed=1, max_tokens=300)
        out = reply.choices[0]
        assert out.finish_reason == "tool_calls" and out.message.content is None, out
        calls = out.message.tool_calls
        assert calls and (parallel or len(calls) == 1)
        for call in calls:
            tool = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
            jsonschema.validate(_arguments(call), tool["function"]["parameters"])
            assert call.id.startswith("call_") and call.type == "function"
        if choice is named:
            assert [c.function.name for c in calls] == ["get_time"]
        stream = list(client.chat.completions.create(
            model=model, messages=USER, tools=[WEATHER, TIME], tool_choice=choice, parallel_tool_calls=parallel,
            seed=1, max_tokens=300, stream=True))
        deltas = [tc for c in stream for tc in c.choices[0].delta.tool_calls or []]
        assert [(d.index, d.function.name, d.function.arguments) for d in deltas] == [
            (i, c.function.name, c.function.arguments) for i, c in enumerate(calls)]
        assert stream[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("model", ["story", "llama"])
def test_a_forced_tool_call_cut_by_max_tokens_is_a_call_when_whole_else_nothing(client, model):
    """Cut after its JSON (only the closing marker missing): the call, finish_reason "length".
    Cut inside its JSON: no tool_calls and content null, never the markup as text."""
    def ask(max_tokens: int, stream: bool = False):
        return client.chat.completions.create(model=model, messages=USER, tools=[WEATHER], tool_choice="required",
                                              seed=1, max_tokens=max_tokens, stream=stream)

    whole = ask(300)
    (call,) = whole.choices[0].message.tool_calls
    closing = len("\n</tool_call>") if model == "story" else 0  # one token a character
    cuts = ([(whole.usage.completion_tokens - closing, [call.function.arguments])] if closing else []) + [
        (whole.usage.completion_tokens - closing - 2, [])]
    for max_tokens, arguments in cuts:
        out = ask(max_tokens).choices[0]
        assert out.finish_reason == "length" and out.message.content is None, out
        assert [c.function.arguments for c in out.message.tool_calls or []] == arguments
        chunks = list(ask(max_tokens, stream=True))
        deltas = [tc for c in chunks for tc in c.choices[0].delta.tool_calls or []]
        assert [d.function.arguments for d in deltas] == arguments
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == ""
        assert chunks[-1].choices[0].finish_reason == "length"


def test_the_tool_call_formats_render_and_read_back(models, runs):
    from handformer.generation.chat_template import load_chat_template
    from handformer.generation.tool_calls import tool_template

    for name, fmt, marker in (("story", CHATML, "<tools>"), ("llama", LLAMA3, "Environment: ipython"),
                              ("own", CHATML, "<tools>")):
        own = load_chat_template(runs[name])
        got, template = tool_template(own, models[name].lm.tokenizer)
        assert got is fmt and (template is own) == (name == "own")
        history = USER + [{"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "5 C"}]
        text = template.render(history, True, [WEATHER])
        assert marker in text and '"city": "Oslo"' in text and "5 C" in text
    tools = [Tool("get_weather", None, {})]
    parser = CHATML.parser(tools, parallel=True)
    reply = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>\nx'
    pieces = [parser.feed(reply[i:i + 3]) for i in range(0, len(reply), 3)] + [parser.finish()]
    assert "".join(p[0] for p in pieces) == "Let me look.x"
    assert [c.arguments for p in pieces for c in p[1]] == [{"city": "Rome"}]
    parser = LLAMA3.parser(tools, parallel=False)
    assert parser.feed('{"name": "get_weather", "parameters": {"a": 1}}; {"name": "get_weather", "parameters": {}}') \
        == ("", [])
    content, calls = parser.finish()
    assert content == "" and [c.arguments for c in calls] == [{"a": 1}]  # without parallel: the first call
    parser = CHATML.parser(tools, parallel=True)
    assert parser.feed("<tool_call>\nnot json\n</tool_call>") == ("<tool_call>\nnot json\n</tool_call>", [])


def test_the_tool_template_is_found_once_per_model(server, monkeypatch):
    """Finding a model's tool template reads its vocabulary and compiles Jinja: done on its first
    request with tools and kept, whether it found one or why there is none."""
    from handformer.serve import app as app_module

    found, calls = app_module.tool_template, []
    monkeypatch.setattr(app_module, "tool_template", lambda *a: (calls.append(a), found(*a))[1])
    kept = server.app.state.tool_templates
    kept.pop("story", None)
    body = {"model": "story", "messages": USER, "tools": [WEATHER], "max_tokens": 2, "seed": 0}
    assert [post(server, "/v1/chat/completions", body).status_code for _ in range(3)] == [200] * 3
    assert len(calls) == 1 and kept["story"][1].source == found(*calls[0])[1].source

    def refuse(own, tokenizer):
        calls.append(own)
        raise ValueError("no tool format here")

    monkeypatch.setattr(app_module, "tool_template", refuse)
    kept.pop("story")
    for _ in range(2):
        error = post(server, "/v1/chat/completions", body).json()["error"]
        assert error["param"] == "tools" and error["message"] == "'story' cannot take tools: no tool format here"
    assert len(calls) == 2  # once more for the refusal, kept too
    kept.pop("story")


def expected_answer(models, runs, name: str, body: dict) -> tuple[str, list[int], tuple[str | None, list, str]]:
    """What serve must answer to a chat `body` with tools and tool_choice "auto" (no grammar): its
    prompt rendered by the run's tool template, sampled by `generate` with the body's seed, read
    back by the format's parser -> (prompt, its ids, (content, [(name, arguments)], finish_reason))."""
    from handformer.generation.chat import stop_ids_for
    from handformer.generation.chat_template import load_chat_template
    from handformer.generation.generate import generate
    from handformer.generation.tool_calls import tool_template
    from handformer.serve.openai_schema import parse_chat

    run = models[name].lm
    req = parse_chat({"model": name, **body})
    fmt, template = tool_template(load_chat_template(runs[name]), run.tokenizer)
    prompt = template.render(req.messages, True, [t.as_template_data() for t in req.tools])
    ids = run.tokenizer.encode_with_special_tokens(prompt)
    stop = stop_ids_for(run.tokenizer, run.tokens.eos_ids, template)
    new = generate(run.model, [ids], req.max_tokens, temperature=body.get("temperature", 1.0),
                   seed=body["seed"], stop_tokens=stop)[0]
    stopped = new[-1] in stop
    parser = fmt.parser(req.tools, req.parallel_tool_calls)
    text, calls = parser.feed(run.tokenizer.hf.decode(new[:-1] if stopped else new, skip_special_tokens=True))
    rest, more = parser.finish()
    calls = [(c.name, c.arguments) for c in calls + more]
    reason = "tool_calls" if calls and stopped else "stop" if stopped else "length"
    return prompt, ids, ((text + rest) or (None if calls else ""), calls, reason)


def test_a_tool_round_trip_with_the_openai_client(client, models, runs):
    first = client.chat.completions.create(model="story", messages=USER, tools=[WEATHER], tool_choice="required",
                                           seed=2, max_tokens=300).choices[0].message
    (call,) = first.tool_calls
    history = USER + [first.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": call.id, "content": "5 C and sunny"}]
    answer = client.chat.completions.create(model="story", messages=history, tools=[WEATHER], seed=2, max_tokens=30)
    prompt, ids, want = expected_answer(models, runs, "story", {"messages": history, "tools": [WEATHER], "seed": 2,
                                                        "max_tokens": 30})
    got = answer.choices[0]
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in got.message.tool_calls or []]
    assert (got.message.content, calls, got.finish_reason) == want
    assert answer.usage.prompt_tokens == len(ids)
    assert "<tool_response>\n5 C and sunny\n</tool_response>" in prompt  # the result was rendered
    assert json.dumps({"name": "get_weather", "arguments": json.loads(call.function.arguments)}) in prompt
    auto = client.chat.completions.create(model="story", messages=USER, tools=[WEATHER], tool_choice="none",
                                          seed=2, max_tokens=5)
    plain = chat(models["story"].lm, run_dir=runs["story"]).encode(USER)  # the run's own template, no tools
    assert auto.choices[0].message.tool_calls is None and auto.usage.prompt_tokens == len(plain)


def test_a_round_trip_with_langchain(server, models, runs, monkeypatch):
    """An agent framework's client: ChatOpenAI(...).bind_tools, forced call -> tool result -> answer."""
    langchain_openai = require_module("langchain_openai", INSTALL)
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from pydantic import BaseModel, ConfigDict, Field

    tiktoken = require_module("tiktoken", INSTALL)

    def no_download(*args, **kwargs):
        raise AssertionError("tiktoken must not be asked for an encoding (it would download it)")

    monkeypatch.setattr(tiktoken, "get_encoding", no_download)
    monkeypatch.setattr(tiktoken, "encoding_for_model", no_download)

    class City(BaseModel):
        model_config = ConfigDict(extra="forbid")
        city: str = Field(max_length=8)

    @tool(args_schema=City)
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    sent = []  # the bodies langchain sends

    def record(request: httpx.Request) -> None:
        sent.append(json.loads(request.read()))

    llm = langchain_openai.ChatOpenAI(model="story", base_url=server.url + "/v1", api_key="unused", seed=3,
                                      max_tokens=200, max_retries=0,
                                      http_client=httpx.Client(event_hooks={"request": [record]}))
    forced = llm.bind_tools([get_weather], tool_choice="get_weather", strict=True)
    messages = [HumanMessage("What is the weather in Oslo?")]
    ai = forced.invoke(messages)
    (call,) = ai.tool_calls
    assert call["name"] == "get_weather" and len(call["args"]["city"]) <= 8
    messages += [ai, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]
    answer = llm.bind_tools([get_weather], strict=True).invoke(messages)
    prompt, _, (content, calls, reason) = expected_answer(models, runs, "story", sent[-1])
    assert "<tool_response>\nsunny in " + call["args"]["city"] in prompt  # the tool's result went back
    assert (answer.content, [(c["name"], c["args"]) for c in answer.tool_calls]) == (content or "", calls)
    assert answer.response_metadata["finish_reason"] == reason
    chunks = list(forced.stream([HumanMessage("What is the weather in Oslo?")]))
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole = whole + chunk
    assert [c["name"] for c in whole.tool_calls] == ["get_weather"]


TOOL_ERRORS = [
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name", "two functions named 'get_weather'"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools[0].function.parameters",
     "the JSON schema of the function's arguments"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "not among tools (get_weather)"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "obj"}}}]},
     "tools[0].function.parameters", "at /type"),
    ({"tools": [{"type": "function", "function": {"name": "bad name", "parameters": {}}}]},
     "tools[0].function.name", "1 to 64 letters"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0]", '"type": "function"'),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", '"auto", "none", "required"'),
    ({"messages": USER + [{"role": "assistant", "tool_calls": [{"id": "x", "type": "function", "function": {
        "name": "f", "arguments": "{not json"}}]}]}, "messages[1].tool_calls[0].function.arguments",
     "a JSON object written as a string"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages[0].tool_calls",
     "only an assistant message"),
]


@pytest.mark.parametrize("extra, param, message", TOOL_ERRORS, ids=[e[1] for e in TOOL_ERRORS])
def test_bad_tools_are_400s_naming_the_field(server, extra, param, message):
    r = post(server, "/v1/chat/completions", {"model": "story", "messages": USER, **extra})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and message in error["message"], error


# --- embeddings -------------------------------------------------------------------------------

def _by_hand(model, ids: list[int], pooling: str) -> torch.Tensor:
    """The output head's input at every position, for the text alone: pooled and normalised."""
    seen = []
    hook = model.lm_head.register_forward_hook(lambda module, args, out: seen.append(args[0]))
    try:
        with torch.no_grad():
            model(torch.tensor([ids]))
    finally:
        hook.remove()
    hidden = seen[0][0]  # (T, D)
    pooled = hidden.mean(0) if pooling == "mean" else hidden[-1]
    return torch.nn.functional.normalize(pooled.float(), dim=-1)


def test_embeddings_equal_the_computation_done_by_hand(client, server, models):
    run = models["story"].lm
    texts = ["the quick brown fox", "I am", "Hello, who are you? 0123456789"]
    ids = [[run.tokens.bos_id] + run.tokenizer.encode(t) for t in texts]
    out = client.embeddings.create(model="story", input=texts)  # the client asks for base64
    assert [d.index for d in out.data] == [0, 1, 2] and out.usage.prompt_tokens == sum(map(len, ids))
    for d, i in zip(out.data, ids):
        torch.testing.assert_close(torch.tensor(d.embedding), _by_hand(run.model, i, "mean"), atol=1e-5, rtol=1e-4)
    floats = post(server, "/v1/embeddings", {"model": "story", "input": ids[1], "encoding_format": "float",
                                             "pooling": "last"}).json()["data"][0]["embedding"]
    torch.testing.assert_close(torch.tensor(floats), _by_hand(run.model, ids[1], "last"), atol=1e-5, rtol=1e-4)
    short = post(server, "/v1/embeddings", {"model": "story", "input": texts[0], "dimensions": 8,
                                            "encoding_format": "base64"}).json()["data"][0]["embedding"]
    vector = torch.frombuffer(bytearray(base64.b64decode(short)), dtype=torch.float32)
    expected = torch.nn.functional.normalize(_by_hand(run.model, ids[0], "mean")[:8], dim=-1)
    torch.testing.assert_close(vector, expected, atol=1e-5, rtol=1e-4)


EMBED_ERRORS = [
    ({"input": []}, "input", "empty list"), ({"input": ""}, "input", "empty string"),
    ({"input": "x" * 2100}, "input", "longer than the model's context of 2048"),
    ({"input": "x", "dimensions": 33}, "dimensions", "over the model's width of 32"),
    ({"input": [5, 10 ** 6]}, "input", "outside the vocabulary"), ({"input": 3}, "input", "a non-empty string"),
    ({"input": "x", "encoding_format": "hex"}, "encoding_format", '"float" or "base64"'),
    ({"input": "x", "pooling": "max"}, "pooling", '"mean" or "last"'),
]


@pytest.mark.parametrize("extra, param, message", EMBED_ERRORS, ids=[e[2][:20] for e in EMBED_ERRORS])
def test_bad_embedding_requests_are_400s(server, extra, param, message):
    r = post(server, "/v1/embeddings", {"model": "story", **extra})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and message in error["message"], error
