"""The playground's routes (handformer/serve/playground.py) over plain HTTP, and the model work behind
them (playground_lookups.py) pinned against the project's own functions: a playground generation is
`generate` for the same seed, its distributions are the logits it sampled from, its attention is the
model's explicit attention path, its translation is `Translator.translate`."""

import json
from pathlib import Path

import pytest
import torch
from helpers import make_translation_run

from handformer.config import CausalLMConfig
from handformer.data.special_tokens import SpecialTokens
from handformer.data.tokenizer import Tokenizer
from handformer.generation.generate import generate
from handformer.generation.sampling import SamplingOptions, filter_logits
from handformer.models.causal_lm import CausalLM
from handformer.serve import playground_lookups as lookups
from handformer.serve.app import create_app
from handformer.serve.registry import load_served_models
from handformer.tasks.lm.run import save_lm_run

pytestmark = pytest.mark.usefixtures("one_thread")

LM_TEXT = "once upon a time <b>there</b> was a tiny model & its \"tokens\""


def make_lm_run(run_dir: Path) -> Path:
    """A random 2-layer, 2-head character model; its logits are scaled up so the distributions are
    not flat, and "." ends a generation."""
    tok = Tokenizer.train_char([LM_TEXT + "."])
    torch.manual_seed(0)
    cfg = CausalLMConfig(vocab_size=tok.vocab_size, d_model=16, n_heads=2, d_ff=32, n_layers=2,
                         max_positions=48, dropout=0.0)
    model = CausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(8)
    eos = tok.encode(".")[0]
    save_lm_run(run_dir, model, tok, SpecialTokens(None, eos, tok.pad_id))
    return run_dir


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("playground")
    make_lm_run(root / "tiny")
    make_translation_run(root / "dates")
    return load_served_models([f"story={root / 'tiny'}", str(root / "dates")])


@pytest.fixture(scope="module")
def client(models):
    from fastapi.testclient import TestClient

    return TestClient(create_app(models))


def events(response) -> list[dict]:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    chunks = response.text.split("\n\n")
    assert chunks[-1] == ""
    return [json.loads(c.removeprefix("data: ")) for c in chunks[:-1]]


# --- the model work ----------------------------------------------------------------------------

@pytest.mark.parametrize("settings", [dict(temperature=0), dict(temperature=0.8, top_k=5, seed=3),
                                      dict(temperature=1.3, top_p=0.7, seed=11), dict(seed=5)])
def test_a_generation_is_generate_for_the_same_seed_and_keeps_the_logits_it_sampled_from(models, settings):
    run = models["story"].lm
    ids = lookups.prompt_ids(run, "once upon")
    seed = settings.pop("seed", 0)
    expected = generate(run.model, [ids], 12, seed=seed, stop_tokens=run.tokens.eos_ids, **settings)[0]
    gen = lookups.Generation(run, ids, 12, SamplingOptions(seed=seed, **settings))
    steps = []
    while not gen.done:
        steps.append(gen.step())
    assert [t for t, _ in steps] == expected == gen.new
    assert gen.finish_reason == ("stop" if expected[-1] in run.tokens.eos_ids else "length")
    with torch.no_grad():  # the kept logits are the model's at each position, without a cache
        full = run.model(torch.tensor([ids + expected[:-1]])).logits[0, len(ids) - 1:]  # (n, V)
    torch.testing.assert_close(torch.stack([logits for _, logits in steps]), full, atol=1e-5, rtol=1e-5)
    assert gen.text() == run.tokenizer.decode(ids + expected)[len(run.tokenizer.decode(ids)):]


def test_a_distribution_is_sent_sorted_with_ties_by_id_and_rebuilds_every_logit(models):
    tok = models["story"].lm.tokenizer
    logits = torch.tensor([0.5, 2.0, 0.5, float("-inf"), 2.0, -1.0] + [0.0] * (tok.vocab_size - 6))
    dist = lookups.distribution(logits, tok)
    assert [c["id"] for c in dist["top"][:5]] == [1, 4, 0, 2, 6]  # descending; equal logits by id
    assert [c["token"] for c in dist["top"][:2]] == tok.tokens([1, 4])
    probs = torch.softmax(logits, -1)
    assert [c["p"] for c in dist["top"]] == pytest.approx([float(probs[c["id"]]) for c in dist["top"]], abs=1e-7)
    assert [c["logit"] for c in dist["top"]][:6] == [2.0, 2.0, 0.5, 0.5, 0.0, 0.0]
    rebuilt = lookups.sorted_logits(dist)
    assert len(rebuilt) == dist["vocab_size"] == tok.vocab_size and dist["tail"] == []
    assert torch.equal(rebuilt, torch.sort(logits, descending=True).values)  # -inf included
    json.dumps(dist, allow_nan=False)


def test_a_large_vocabulary_sends_its_tail_as_groups_of_close_logits():
    class Tok:
        def tokens(self, ids):
            return [f"t{i}" for i in ids]

    logits = torch.randn(50_000, generator=torch.Generator().manual_seed(0)) * 3
    dist = lookups.distribution(logits, Tok())
    values = torch.sort(logits, descending=True).values
    everything = lookups.sorted_logits(dist)
    assert len(everything) == 50_000 and torch.equal(everything[:lookups.EXACT_RANKS],
                                                     values[:lookups.EXACT_RANKS])
    assert sum(n for _, n in dist["tail"]) == 50_000 - lookups.EXACT_RANKS
    means = [m for m, _ in dist["tail"]]
    assert means == sorted(means, reverse=True)
    rebuilt = everything[lookups.EXACT_RANKS:]
    assert (rebuilt - values[lookups.EXACT_RANKS:]).abs().max() < lookups.TAIL_BIN
    # the probabilities the page computes from the groups stay close at any temperature
    for t in (0.5, 1.0, 2.0):
        exact = torch.softmax(values.double() / t, 0)[:20]
        approx = torch.softmax(torch.cat([values[:lookups.EXACT_RANKS], rebuilt]).double() / t, 0)[:20]
        torch.testing.assert_close(approx, exact, rtol=2e-3, atol=0)


def test_attention_row_is_the_last_row_of_the_explicit_attention_path(models):
    run = models["story"].lm
    ids = lookups.prompt_ids(run, "a tiny model")
    row = lookups.attention_row(run, ids, 5)
    with torch.no_grad():
        out = run.model(torch.tensor([ids[:6]]), need_weights=True)
    assert row["tokens"] == run.tokenizer.tokens(ids[:6])
    for layer, weights in zip(row["layers"], out.attentions):
        torch.testing.assert_close(torch.tensor(layer, dtype=torch.float64), weights[0, :, -1].double(), atol=1e-5, rtol=0)
        assert all(abs(sum(head) - 1) < 1e-4 for head in layer)


# --- the routes --------------------------------------------------------------------------------

def test_the_page_is_served_with_a_policy_that_forbids_other_hosts(client):
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    assert "http://" not in r.text and "https://" not in r.text and "<script src" not in r.text
    assert client.get("/playground/api/models").json() == {"models": [
        {"id": "story", "task": "lm", "vocab_size": 30, "context": 48, "n_layers": 2, "n_heads": 2,
         "bos": False, "chat": False},
        {"id": "dates", "task": "translation", "vocab_size": 24, "context": 64, "n_layers": 2, "n_heads": 2,
         "beam": 1}]}


def test_generate_streams_each_token_with_its_distribution(client, models):
    run = models["story"].lm
    body = {"model": "story", "prompt": "once <b>", "max_tokens": 6, "temperature": 0.9, "top_k": 8,
            "top_p": 0.95, "seed": 7}
    start, *tokens, done = events(client.post("/playground/api/generate", json=body))
    ids = run.tokenizer.encode("once <b>")
    expected = generate(run.model, [ids], 6, temperature=0.9, top_k=8, top_p=0.95, seed=7,
                        stop_tokens=run.tokens.eos_ids)[0]
    assert start == {"type": "start", "ids": ids, "tokens": run.tokenizer.tokens(ids), "seed": 7,
                     "temperature": 0.9, "top_k": 8, "top_p": 0.95}
    assert [e["id"] for e in tokens] == expected
    assert [e["token"] for e in tokens] == run.tokenizer.tokens(expected)
    for event in tokens:  # the sampled token survives the filters of the distribution sent with it
        dist = event["distribution"]
        logits = lookups.sorted_logits(dist)
        kept = torch.isfinite(filter_logits(logits, 0.9, 8, 0.95))
        assert event["id"] in [c["id"] for c, k in zip(dist["top"], kept) if k]
        rank = [c["id"] for c in dist["top"]].index(event["id"])
        p = torch.softmax(filter_logits(logits, 0.9, 8, 0.95), -1)[rank]
        assert event["probability"] == pytest.approx(float(p), abs=1e-6)
    assert done == {"type": "done", "finish_reason": "stop" if expected[-1] in run.tokens.eos_ids else "length",
                    "text": tokens[-1]["text"], "ids": ids + expected}


def test_generate_without_a_seed_sends_the_seed_it_drew(client):
    """The seed in the start event of an unseeded request is the one it sampled with: sent back, it
    replays that very stream (tokens, distributions, text)."""
    body = {"model": "story", "prompt": "a", "max_tokens": 8, "temperature": 1.0}
    unseeded = events(client.post("/playground/api/generate", json=body))
    drawn = unseeded[0]["seed"]
    replay = events(client.post("/playground/api/generate", json={**body, "seed": drawn}))
    assert isinstance(drawn, int) and len(unseeded) == len(replay) > 2
    assert replay == unseeded


def test_attention_explorer_and_translate_routes(client, models):
    run = models["story"].lm
    ids = run.tokenizer.encode("once upon")
    row = client.post("/playground/api/attention", json={"model": "story", "ids": ids, "position": 3}).json()
    assert row["position"] == 3 and len(row["layers"]) == 2 and len(row["layers"][0][0]) == 4
    last = client.post("/playground/api/attention", json={"model": "story", "ids": ids}).json()
    assert last["position"] == len(ids) - 1
    html = client.post("/playground/api/explorer", json={"model": "story", "ids": ids, "split": 4}).json()["html"]
    assert "handformer playground: attention" in html and '"split":4' in html
    zh = client.post("/playground/api/explorer", json={"model": "story", "ids": ids, "split": 4,
                                                       "lang": "zh"}).json()["html"]
    assert '<html lang="zh">' in zh and "层和头都从 0 开始计数" in zh and "handformer playground：注意力" in zh
    assert "Layers and heads are counted from 0" not in zh

    translator = models["dates"].translator
    for beam in (1, 3):
        out = client.post("/playground/api/translate", json={"model": "dates", "text": "the first of may",
                                                             "beam": beam}).json()
        assert out["output"] == translator.translate(["the first of may"], beam=beam)[0]
    assert len(out["cross"]) == 2 and len(out["cross"][0]) == 2
    assert len(out["cross"][0][0]) == len(out["output_tokens"])
    assert len(out["cross"][0][0][0]) == len(out["source_tokens"])
    assert '"views":[{"name":"cross"' in out["explorer"]
    zh = client.post("/playground/api/translate", json={"model": "dates", "text": "the first of may",
                                                        "lang": "zh"}).json()["explorer"]
    assert '<html lang="zh">' in zh and '"label":"交叉注意力"' in zh and '"output_label":"译文"' in zh


@pytest.mark.parametrize("route, body, status, message", [
    ("generate", "{not json", 400, "not valid JSON"),
    ("generate", "[1, 2]", 400, "must be a JSON object"),
    ("generate", {"model": "nope", "prompt": "a"}, 404, "unknown model 'nope'; served: story, dates"),
    ("generate", {"model": "dates", "prompt": "a"}, 400, "is a translation run; use it from the Translate tab"),
    ("generate", {"prompt": "a"}, 400, "model must be a model id"),
    ("generate", {"model": "story", "prompt": 3}, 400, "prompt must be a string"),
    ("generate", {"model": "story", "prompt": ""}, 400, "prompt is empty"),
    ("generate", {"model": "story", "prompt": "a" * 49}, 400, "prompt is 49 tokens but the model's context is 48"),
    ("generate", {"model": "story", "prompt": "a", "max_tokens": 49}, 400, "max_tokens must be an integer from 1 to 48"),
    ("generate", {"model": "story", "prompt": "a", "max_tokens": 0}, 400, "max_tokens must be an integer from 1 to 48"),
    ("generate", {"model": "story", "prompt": "a", "max_tokens": "5"}, 400, "max_tokens must be an integer"),
    ("generate", {"model": "story", "prompt": "a", "temperature": -1}, 400, "temperature must be a number >= 0"),
    ("generate", {"model": "story", "prompt": "a", "temperature": "hot"}, 400, "temperature must be a number"),
    ("generate", {"model": "story", "prompt": "a", "temperature": True}, 400, "temperature must be a number"),
    ("generate", {"model": "story", "prompt": "a", "top_k": 0}, 400, "top_k must be an integer >= 1"),
    ("generate", {"model": "story", "prompt": "a", "top_p": 0}, 400, "top_p must be a number in (0, 1]"),
    ("generate", {"model": "story", "prompt": "a", "top_p": 1.5}, 400, "top_p must be a number in (0, 1]"),
    ("generate", {"model": "story", "prompt": "a", "seed": 1.5}, 400, "seed must be an integer"),
    ("generate", {"model": "story", "prompt": "a", "temp": 1}, 400, "unrecognized request argument(s): temp"),
    ("attention", {"model": "story", "ids": []}, 400, "ids must be a non-empty list"),
    ("attention", {"model": "story", "ids": [1, "2"]}, 400, "ids must be a non-empty list"),
    ("attention", {"model": "story", "ids": [1, 30]}, 400, "ids holds 30, outside the vocabulary [0, 30)"),
    ("attention", {"model": "story", "ids": [1] * 49}, 400, "ids has 49 tokens but the model's context is 48"),
    ("attention", {"model": "story", "ids": [1, 2], "position": 2}, 400, "position must be an integer in [0, 2)"),
    ("attention", {"model": "dates", "ids": [1, 2]}, 400, "is a translation run"),
    ("explorer", {"model": "story", "ids": [1, 2], "split": 3}, 400, "split must be a position in [0, 2]"),
    ("explorer", {"model": "story", "ids": [1, 2], "lang": "fr"}, 400, "lang must be one of en, zh"),
    ("translate", {"model": "dates", "text": " "}, 400, "text is empty"),
    ("translate", {"model": "dates"}, 400, "text must be a string"),
    ("translate", {"model": "dates", "text": "may", "beam": 0}, 400, "beam must be an integer from 1"),
    ("translate", {"model": "dates", "text": "may", "beam": 17}, 400, "beam must be an integer from 1"),
    ("translate", {"model": "story", "text": "may"}, 400, "is a lm run; use it from the Generate tab"),
    ("translate", "x" * ((1 << 20) + 1), 413, "over the limit of 1048576 bytes"),
])
def test_bad_input_gets_a_json_error_naming_the_problem(client, route, body, status, message):
    kwargs = {"content": body} if isinstance(body, str) else {"json": body}
    r = client.post(f"/playground/api/{route}", **kwargs)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert message in error["message"]
    assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")


def test_a_client_that_goes_away_stops_its_generation(models, monkeypatch):
    """The real server (uvicorn on a port it was handed): after the client closes the stream, no
    more steps start; and a step in progress does not hold up other requests (it runs in a worker
    thread). The steps are paced by the test, so nothing depends on how fast the machine is."""
    import threading
    import time

    import httpx
    from serve_helpers import Server

    from handformer.serve import playground

    def wait(condition) -> None:
        deadline = time.monotonic() + 20
        while not condition():
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.002)

    permits, steps = threading.Semaphore(0), []
    step = lookups.Generation.step

    def paced_step(self):
        steps.append(self)
        assert permits.acquire(timeout=30)
        return step(self)

    monkeypatch.setattr(lookups.Generation, "step", paced_step)
    ended = threading.Event()  # the server's event stream has finished
    stream = playground.stream

    async def watched(*args):
        try:
            async for event in stream(*args):
                yield event
        finally:
            ended.set()

    monkeypatch.setattr(playground, "stream", watched)
    app = create_app(models)
    left = threading.Event()  # the server has read the client's disconnect

    async def watching_app(scope, receive, send):
        async def watched_receive():
            message = await receive()
            if message["type"] == "http.disconnect":
                left.set()
            return message

        await app(scope, watched_receive, send)

    server = Server(watching_app)
    server.app = app
    try:
        body = {"model": "story", "prompt": "a", "max_tokens": 40, "temperature": 0}
        with httpx.stream("POST", f"{server.url}/playground/api/generate", json=body, timeout=30) as r:
            lines = (line for line in r.iter_lines() if line)
            assert json.loads(next(lines).removeprefix("data: "))["type"] == "start"
            permits.release(3)
            for _ in range(3):
                assert json.loads(next(lines).removeprefix("data: "))["type"] == "token"
            wait(lambda: len(steps) == 4)  # the fourth step waits for its permit, in a worker thread
            listed = httpx.get(f"{server.url}/playground/api/models", timeout=10)  # not queued behind it
            assert listed.status_code == 200
        wait(left.is_set)  # the client has gone; only now may the step in progress finish
        permits.release(1)
        wait(ended.is_set)
        assert len(steps) == 4  # no step began after the client left
    finally:
        permits.release(100)
        server.stop()


def test_with_an_api_key_every_route_but_the_page_needs_it(models):
    from fastapi.testclient import TestClient

    client = TestClient(create_app(models, api_key="s3cret"))
    assert client.get("/").status_code == 200  # the page holds no model data; it asks for the key
    body = {"model": "story", "ids": [1, 2]}
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic s3cret"},
                    {"Authorization": "s3cret"}):
        for r in (client.get("/playground/api/models", headers=headers),
                  client.post("/playground/api/attention", json=body, headers=headers)):
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            assert r.json()["error"]["type"] == "authentication_error"
            assert "API key" in r.json()["error"]["message"]
    good = {"Authorization": "Bearer s3cret"}
    assert client.get("/playground/api/models", headers=good).status_code == 200
    assert client.post("/playground/api/attention", json=body, headers=good).status_code == 200


CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def make_chat_run(run_dir: Path) -> Path:
    """A character model whose vocabulary has ChatML's special tokens, with a ChatML template."""
    from tokenizers import AddedToken

    tok = Tokenizer.train_char(["hello, who are you? i am a model.\n"])
    tok.hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<|im_start|>", "<|im_end|>")])
    tok = Tokenizer(tok.hf)
    torch.manual_seed(1)
    model = CausalLM(CausalLMConfig(vocab_size=tok.vocab_size, d_model=16, n_heads=2, d_ff=32, n_layers=1,
                                    max_positions=64, dropout=0.0))
    with torch.no_grad():
        model.lm_head.weight.mul_(8)
    save_lm_run(run_dir, model, tok, SpecialTokens(None, None, tok.pad_id))
    (run_dir / "chat_template.jinja").write_text(CHATML)
    (run_dir / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    return run_dir


def test_a_run_with_a_chat_template_can_take_the_prompt_as_a_user_message(models, tmp_path):
    from fastapi.testclient import TestClient

    from handformer.generation.chat import stop_ids_for
    from handformer.generation.chat_template import load_chat_template

    chat_models = load_served_models([f"chatty={make_chat_run(tmp_path / 'chat')}", f"story={models['story'].run_dir}"])
    client = TestClient(create_app(chat_models))
    listed = {m["id"]: m["chat"] for m in client.get("/playground/api/models").json()["models"] if m["task"] == "lm"}
    assert listed == {"chatty": True, "story": False}
    run, template = chat_models["chatty"].lm, load_chat_template(tmp_path / "chat")
    stop = stop_ids_for(run.tokenizer, run.tokens.eos_ids, template)
    ids = run.tokenizer.encode_with_special_tokens(template.render([{"role": "user", "content": "who are you?"}]))
    # a seed whose reply ends with the template's end token before the limit (the reference decides)
    seed = next(seed for seed in range(500)
                if generate(run.model, [ids], 12, temperature=0.7, seed=seed, stop_tokens=stop)[0][-1] in stop)
    body = {"model": "chatty", "prompt": "who are you?", "chat": True, "max_tokens": 12, "temperature": 0.7,
            "seed": seed}
    start, *tokens, done = events(client.post("/playground/api/generate", json=body))
    assert start["ids"] == ids and start["tokens"][:2] == ["<|im_start|>", "u"]
    expected = generate(run.model, [ids], 12, temperature=0.7, seed=seed, stop_tokens=stop)[0]
    assert [e["id"] for e in tokens] == expected
    assert done["finish_reason"] == "stop" and len(tokens) < 12
    assert tokens[-1]["token"] == "<|im_end|>" and "<|im_end|>" not in done["text"]
    plain = events(client.post("/playground/api/generate", json={**body, "chat": False}))
    assert plain[0]["ids"] == run.tokenizer.encode("who are you?")
    for bad, message in [({"model": "story", "chat": True}, "model 'story' has no chat template"),
                         ({"model": "chatty", "chat": "yes"}, "chat must be true or false")]:
        r = client.post("/playground/api/generate", json={"prompt": "hi", **bad})
        assert r.status_code == 400 and message in r.json()["error"]["message"]


def test_a_body_without_a_length_is_cut_off_at_the_limit(client):
    chunks = (b"x" * (1 << 19) for _ in range(3))  # sent chunked: no Content-Length to trust
    r = client.post("/playground/api/generate", content=chunks)
    assert r.status_code == 413 and "over the limit" in r.json()["error"]["message"]
