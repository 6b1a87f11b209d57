"""What `/metrics` reports, in Prometheus's text format (version 0.0.4), written by hand:

    handformer_requests_total{route, method, status}          counter: answered requests
    handformer_prompt_tokens_total{model}                     counter: prompt tokens of admitted requests
    handformer_generation_tokens_total{model}                 counter: tokens generated
    handformer_sequences_running{model}                       gauge: sequences in the decoding batch
    handformer_sequences_waiting{model}                       gauge: sequences queued for the batch
    handformer_time_to_first_token_seconds{model}             histogram: submitted -> first token
    handformer_time_per_output_token_seconds{model}           histogram: between a sequence's tokens
    handformer_prefix_cache_hits_total{model}                 counter: prefills that reused a prefix
    handformer_prefix_cache_reused_tokens_total{model}        counter: positions those prefills reused

Requests are counted by `MetricsMiddleware` around the whole app, under the route's template (such
as `/v1/models/{model_id}`, so a new route is counted with no change here; a path no route matches
counts as `unmatched`). A request whose client left before its answer was complete counts with
status 499. The tokens and timings are counted by each model's `BatchEngine` (serve/engine.py)
through its `ModelMetrics`, so every route that decodes there is counted the same way.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections import Counter
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("handformer.serve")

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Histogram:
    """Observations counted in cumulative buckets (upper bounds, seconds), with their sum."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets, self.counts, self.sum = buckets, [0] * (len(buckets) + 1), 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value

    def lines(self, name: str, labels: str) -> Iterable[str]:
        total = 0
        for bound, count in zip((*map(repr, self.buckets), "+Inf"), self.counts):
            total += count
            yield f'{name}_bucket{{{labels},le="{bound}"}} {total}'
        yield f"{name}_sum{{{labels}}} {self.sum!r}"
        yield f"{name}_count{{{labels}}} {total}"


class ModelMetrics:
    """One model's token counts and timings; written on its engine thread, read on a scrape."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.prompt_tokens = self.generation_tokens = 0
        self.ttft, self.tpot = Histogram(TTFT_BUCKETS), Histogram(TPOT_BUCKETS)

    def admitted(self, prompt_tokens: int) -> None:
        with self.lock:
            self.prompt_tokens += prompt_tokens

    def token(self, first: bool, seconds: float) -> None:
        """A generated token, `seconds` after the sequence was submitted (the first) or after its
        previous token."""
        with self.lock:
            self.generation_tokens += 1
            (self.ttft if first else self.tpot).observe(seconds)


class Metrics:
    """The server's counters: requests by route, method and status, and each model's."""

    def __init__(self, models: Iterable[str]) -> None:
        self.lock = threading.Lock()
        self.requests: Counter[tuple[str, str, int]] = Counter()
        self.models = {name: ModelMetrics() for name in models}

    def request(self, route: str, method: str, status: int) -> None:
        with self.lock:
            self.requests[(route, method, status)] += 1

    def render(self, engines: dict[str, Any]) -> str:
        """The text format; `engines`: each model's BatchEngine, read for its gauges."""
        out = ["# HELP handformer_requests_total Requests answered, by route template, method and status.",
               "# TYPE handformer_requests_total counter"]
        with self.lock:
            requests = sorted(self.requests.items())
        out += [f'handformer_requests_total{{route="{_escape(r)}",method="{m}",status="{s}"}} {n}'
                for (r, m, s), n in requests]
        out += self._model_lines(engines)
        return "\n".join(out) + "\n"

    def _model_lines(self, engines: dict[str, Any]) -> list[str]:
        families: dict[str, list[str]] = {name: [] for name in MODEL_FAMILIES}
        for model, m in sorted(self.models.items()):
            label = f'model="{_escape(model)}"'
            engine, cache = engines[model], engines[model].prefix_cache
            with m.lock:
                values = {"handformer_prompt_tokens_total": m.prompt_tokens,
                          "handformer_generation_tokens_total": m.generation_tokens}
                for name, histogram in (("handformer_time_to_first_token_seconds", m.ttft),
                                        ("handformer_time_per_output_token_seconds", m.tpot)):
                    families[name] += histogram.lines(name, label)
            values |= {"handformer_sequences_running": engine.running,
                       "handformer_sequences_waiting": engine.queued,
                       "handformer_prefix_cache_hits_total": cache.hits if cache else 0,
                       "handformer_prefix_cache_reused_tokens_total": cache.reused_tokens if cache else 0}
            for name, value in values.items():
                families[name].append(f"{name}{{{label}}} {value}")
        out = []
        for name, (kind, help_text) in MODEL_FAMILIES.items():
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *families[name]]
        return out


MODEL_FAMILIES = {  # name: (type, help)
    "handformer_prompt_tokens_total": ("counter", "Prompt tokens of admitted requests (each prompt once)."),
    "handformer_generation_tokens_total": ("counter", "Tokens generated (end tokens included)."),
    "handformer_sequences_running": ("gauge", "Sequences in the decoding batch."),
    "handformer_sequences_waiting": ("gauge", "Sequences submitted, waiting for room in the batch."),
    "handformer_time_to_first_token_seconds": ("histogram", "Seconds from a sequence's submission to its "
                                               "first token."),
    "handformer_time_per_output_token_seconds": ("histogram", "Seconds between a sequence's tokens after "
                                                 "the first."),
    "handformer_prefix_cache_hits_total": ("counter", "Prefills that reused a cached prefix."),
    "handformer_prefix_cache_reused_tokens_total": ("counter", "Prompt positions read from the prefix cache "
                                                    "instead of computed."),
}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class MetricsMiddleware:
    """Counts every HTTP request under its route's template and its status (499: the client left
    before the answer was complete), and logs those 499s."""

    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = {"status": 500, "complete": False, "gone": False}

        async def watched_receive() -> dict:
            message = await receive()
            if message["type"] == "http.disconnect" and not state["complete"]:
                state["gone"] = True
            return message

        async def watched_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                state["complete"] = True
            await send(message)

        try:
            await self.app(scope, watched_receive, watched_send)
        finally:
            gone = state["gone"] or state["status"] == 499
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            if gone and state["status"] != 499:
                log.info("%s %s: the client went away before the answer was complete (499)",
                         scope["method"], scope["path"])
            self.metrics.request(template, scope["method"], 499 if gone else state["status"])


__all__ = ["Histogram", "Metrics", "MetricsMiddleware", "ModelMetrics"]
