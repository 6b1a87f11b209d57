"""Benchmark: `handformer serve` under load: throughput (requests/s, tokens/s) and
p50 / p95 request latency at 1, 4 and 16 concurrent clients, on a small model.

The model is llama2.c's stories260K (../shared/data/stories260K, imported to a temporary run),
or any run given with --run. The server is the real command, `python -m handformer serve`, in its
own process (OMP_NUM_THREADS=--threads); the clients are asyncio tasks over httpx in this process,
each sending its requests one after another: POST /v1/completions, the prompt "Once upon a time",
--max-tokens new tokens, temperature 1, each request its own seed (stories end with an end
token, so requests vary in length; tokens are counted from each response's usage).

Side by side, in the same interleaved rounds: the same server with --max-batch 1 (no batching:
requests decoded one at a time), at 16 clients. Target: at 16 clients, total tokens/s >= 3x one
client's. Every figure is the median over --rounds rounds (latency percentiles pool every request
of every round); other jobs on a shared machine make them noisy.

    python benchmarks/serve_load.py                 # 5 rounds, ~2 min on 2 shared cores
    python benchmarks/serve_load.py --rounds 1 --max-tokens 16    # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DATA = ROOT / ".." / "shared" / "data" / "stories260K"
CONCURRENCY = (1, 4, 16)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, run_dir: Path, threads: int, max_batch: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "handformer", "serve", f"m={run_dir}", "--port", str(self.port),
             "--max-batch", str(max_batch), "--log-level", "warning"], env=env, cwd=ROOT)
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(self.url + "/v1/models", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the server did not start")
            time.sleep(0.2)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


async def load(url: str, clients: int, requests_each: int, max_tokens: int, seed0: int,
               ) -> tuple[float, int, int, list[float]]:
    """(seconds, requests, tokens, latencies) of `clients` tasks each sending `requests_each`."""
    latencies: list[float] = []
    tokens = 0

    async def client(http: httpx.AsyncClient, c: int) -> None:
        nonlocal tokens
        for r in range(requests_each):
            body = {"model": "m", "prompt": "Once upon a time", "max_tokens": max_tokens, "temperature": 1.0,
                    "seed": seed0 + c * 1000 + r}
            start = time.perf_counter()
            response = await http.post(url + "/v1/completions", json=body)
            latencies.append(time.perf_counter() - start)
            response.raise_for_status()
            tokens += response.json()["usage"]["completion_tokens"]

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        start = time.perf_counter()
        await asyncio.gather(*(client(http, c) for c in range(clients)))
        seconds = time.perf_counter() - start
    return seconds, clients * requests_each, tokens, latencies


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", type=Path, default=None, help="a language-model run (default: stories260K)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--requests", type=int, default=2, help="requests per client per round (>= 4 in all)")
    parser.add_argument("--threads", type=int, default=1, help="the server's torch threads")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = args.run
        if run_dir is None:
            from handformer.tasks.lm.imports import import_llama2c

            run_dir = Path(tmp) / "stories260K"
            import_llama2c(DATA / "stories260K.bin", DATA / "tok512.bin", run_dir)
        servers = {"batched": ServerProcess(run_dir, args.threads, 32),
                   "max-batch 1": ServerProcess(run_dir, args.threads, 1)}
        cases = [("batched", c) for c in CONCURRENCY] + [("max-batch 1", 16)]
        results: dict[tuple[str, int], list] = {case: [] for case in cases}
        try:
            for name in servers:  # warm-up: first requests pay for lazy imports and allocations
                asyncio.run(load(servers[name].url, 4, 1, 8, 0))
            for r in range(args.rounds):
                for name, clients in cases:
                    each = max(args.requests, -(-4 // clients))
                    results[(name, clients)].append(
                        asyncio.run(load(servers[name].url, clients, each, args.max_tokens, 10_000 * r)))
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
        finally:
            for server in servers.values():
                server.stop()

    print(f"\nserve load: {run_dir.name if args.run else 'stories260K'}, {args.max_tokens} max new tokens a "
          f"request, server on {args.threads} thread(s), medians of {args.rounds} interleaved rounds\n")
    print(f"{'server':<12} {'clients':>7} {'requests/s':>10} {'tokens/s':>9} {'p50 s':>7} {'p95 s':>7} "
          f"{'tokens/req':>10}")
    tokens_per_s = {}
    for case in cases:
        rounds = results[case]
        tokens_per_s[case] = statistics.median(t / s for s, _, t, _ in rounds)
        rps = statistics.median(n / s for s, n, _, _ in rounds)
        latencies = [x for *_, lat in rounds for x in lat]
        per_request = sum(t for _, _, t, _ in rounds) / sum(n for _, n, _, _ in rounds)
        print(f"{case[0]:<12} {case[1]:>7} {rps:>10.2f} {tokens_per_s[case]:>9.0f} "
              f"{percentile(latencies, 0.5):>7.3f} {percentile(latencies, 0.95):>7.3f} {per_request:>10.1f}")
    one, sixteen = tokens_per_s[("batched", 1)], tokens_per_s[("batched", 16)]
    print(f"\n16 clients / 1 client, tokens/s: {sixteen / one:.2f}x (target >= 3x)")
    unbatched = tokens_per_s[("max-batch 1", 16)]
    print(f"batched / max-batch 1 at 16 clients, tokens/s: {sixteen / unbatched:.2f}x")


if __name__ == "__main__":
    main()
