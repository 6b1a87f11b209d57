"""`handformer serve` for its operators, through a real uvicorn server behind an API key: a client
that leaves mid-decode (streamed or not) frees its rows within a few steps and is counted as 499;
/health answers without the key and says 503 while draining or with a dead engine; /metrics,
parsed by prometheus_client's own parser, moves by exactly what known requests did; the key as
`Authorization: Bearer` or `x-api-key`; the 404 lists every route; the OpenAI SDKs' extra fields
and the `developer` role."""

from __future__ import annotations

import json
import logging
import socket
import time

import httpx
import pytest
from helpers import require_module
from serve_helpers import Server, make_lm_run, pace_steps

from handformer.serve.app import create_app
from handformer.serve.errors import error_body
from handformer.serve.registry import load_served_models

openai = require_module("openai", "pip install -e '.[dev]' (the official OpenAI client is a dev dependency)")
parser = require_module("prometheus_client.parser", "pip install -e '.[dev]' (prometheus-client parses /metrics)")

pytestmark = pytest.mark.usefixtures("one_thread")
KEY = "sk-ops"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def models(tmp_path_factory, one_thread):
    return load_served_models([str(make_lm_run(tmp_path_factory.mktemp("ops") / "story", max_positions=1024))])


@pytest.fixture(scope="module")
def server(models):
    s = Server(create_app(models, api_key=KEY))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)


def wait(condition, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


def scrape(server) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics, read by prometheus_client's parser: {(name, labels): value}."""
    r = httpx.get(server.url + "/metrics", headers=AUTH, timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in parser.text_string_to_metric_families(r.text) for s in family.samples}


def sample(samples, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


# --- a client that leaves --------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_client_that_leaves_mid_decode_frees_its_rows_within_a_few_steps(server, monkeypatch, caplog, stream):
    engine = server.app.state.engines["story"]
    pace_steps(monkeypatch, server)
    before = sample(scrape(server), "handformer_requests_total", route="/v1/completions", method="POST",
                    status="499")
    # greedy from this prompt never writes the end token: the rows decode until the client leaves
    body = json.dumps({"model": "story", "prompt": "the quick brown", "max_tokens": 1000, "n": 4,
                       "temperature": 0, "stream": stream}).encode()
    sock = socket.create_connection(("127.0.0.1", server.port))
    with caplog.at_level(logging.INFO, logger="handformer.serve"):
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
                     + b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        start = engine.steps
        wait(lambda: engine.running == 4 and engine.steps >= start + 5)  # tokens are flowing
        sock.close()
        closed_at = engine.steps
        wait(lambda: engine.running == 0 and not engine.sequences)
        assert engine.steps - closed_at <= 10, "the rows stayed in the batch after the client left"
        wait(lambda: sample(scrape(server), "handformer_requests_total", route="/v1/completions",
                            method="POST", status="499") == before + 1)
    assert any("went away" in r.getMessage() and "499" in r.getMessage() for r in caplog.records)


# --- /health and /metrics ------------------------------------------------------------------------


def test_health_needs_no_key_and_is_503_while_draining_or_with_a_dead_engine(server, models):
    r = httpx.get(server.url + "/health", timeout=10)
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    lifecycle = server.app.state.lifecycle
    lifecycle.draining = True
    try:
        r = httpx.get(server.url + "/health", timeout=10)
        assert r.status_code == 503 and r.json()["status"] == "draining"
    finally:
        lifecycle.draining = False
    from fastapi.testclient import TestClient

    never_started = TestClient(create_app(models, api_key=KEY))  # no lifespan: no decoding thread
    r = never_started.get("/health")
    assert r.status_code == 503 and r.json()["status"] == "failed" and "story" in r.json()["message"]


def test_metrics_need_the_key_and_move_by_what_known_requests_did(server, client):
    assert httpx.get(server.url + "/metrics", timeout=10).status_code == 401
    before = scrape(server)
    whole = client.completions.create(model="story", prompt="the lazy dog", max_tokens=7, temperature=0)
    chat = client.chat.completions.create(model="story", messages=[{"role": "user", "content": "who are you?"}],
                                          max_tokens=5, n=2, temperature=1.0, seed=3)
    again = client.completions.create(model="story", prompt="the lazy dog", max_tokens=3, temperature=0)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="story", prompt="x", max_tokens=0)
    assert httpx.get(server.url + "/v1/nope", headers=AUTH, timeout=10).status_code == 404
    after = scrape(server)

    def moved(name: str, **labels) -> float:
        return sample(after, name, **labels) - sample(before, name, **labels)

    usages = [whole.usage, chat.usage, again.usage]
    assert moved("handformer_requests_total", route="/v1/completions", method="POST", status="200") == 2
    assert moved("handformer_requests_total", route="/v1/chat/completions", method="POST", status="200") == 1
    assert moved("handformer_requests_total", route="/v1/completions", method="POST", status="400") == 1
    assert moved("handformer_requests_total", route="unmatched", method="GET", status="404") == 1
    assert moved("handformer_requests_total", route="/metrics", method="GET", status="200") == 1  # the first scrape
    model = {"model": "story"}
    assert moved("handformer_prompt_tokens_total", **model) == sum(u.prompt_tokens for u in usages)
    generated = sum(u.completion_tokens for u in usages)
    assert moved("handformer_generation_tokens_total", **model) == generated
    sequences = 4  # 1 + 2 choices + 1
    assert moved("handformer_time_to_first_token_seconds_count", **model) == sequences
    assert moved("handformer_time_per_output_token_seconds_count", **model) == generated - sequences
    assert moved("handformer_time_to_first_token_seconds_bucket", le="+Inf", **model) == sequences
    assert moved("handformer_prefix_cache_hits_total", **model) >= 1  # the second "the lazy dog" prompt
    assert moved("handformer_prefix_cache_reused_tokens_total", **model) >= 8
    assert sample(after, "handformer_sequences_running", **model) == 0
    assert sample(after, "handformer_sequences_waiting", **model) == 0


# --- the door ----------------------------------------------------------------------------------


def test_the_key_is_read_from_bearer_or_x_api_key_and_refused_in_the_api_shape(server):
    url = server.url + "/v1/models"
    assert httpx.get(url, headers=AUTH, timeout=10).status_code == 200
    assert httpx.get(url, headers={"x-api-key": KEY}, timeout=10).status_code == 200
    assert httpx.get(server.url + "/metrics", headers={"x-api-key": KEY}, timeout=10).status_code == 200
    for headers in ({}, {"x-api-key": "nope"}, {"Authorization": "Bearer nope"}, {"Authorization": f"Basic {KEY}"}):
        r = httpx.get(url, headers=headers, timeout=10)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", headers
    assert error_body(401, "no key", path="/v1/messages") == {
        "type": "error", "error": {"type": "authentication_error", "message": "no key"}}
    assert error_body(400, "bad", "max_tokens", path="/v1/messages/count_tokens")["error"]["type"] == \
        "invalid_request_error"
    assert error_body(404, "no", path="/v1/models")["error"]["type"] == "not_found_error"


def test_the_404_lists_every_route(server):
    r = httpx.get(server.url + "/v1/nothing/x", headers=AUTH, timeout=10)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    message = r.json()["error"]["message"]
    for route in ("GET /v1/models", "GET /v1/models/{model_id}", "POST /v1/completions", "POST /v1/chat/completions",
                  "POST /v1/embeddings", "POST /v1/translations", "GET /health", "GET /metrics", "GET /",
                  "POST /playground/api/generate", "GET /playground/api/models", "POST /v1/responses",
                  "DELETE/GET /v1/responses/{response_id}", "POST /v1/messages", "POST /v1/messages/count_tokens"):
        assert f"{route}," in message or message.endswith(route), (route, message)


def test_developer_is_the_system_role_and_the_sdks_extra_fields_change_nothing(client):
    user = {"role": "user", "content": "who are you?"}
    replies = [client.chat.completions.create(model="story", messages=[{"role": role, "content": "Be a fox."}, user],
                                              max_tokens=6, temperature=0, **extra)
               for role, extra in [("system", {}), ("developer", {}), ("developer", {
                   "store": False, "metadata": {"run": "a"}, "service_tier": "auto", "parallel_tool_calls": True,
                   "extra_body": {"include": [], "truncation": "disabled"}})]]
    alone = client.chat.completions.create(model="story", messages=[user], max_tokens=6, temperature=0)
    assert len({r.usage.prompt_tokens for r in replies}) == 1 and replies[0].usage.prompt_tokens > \
        alone.usage.prompt_tokens
    assert len({r.choices[0].message.content for r in replies}) == 1
