"""Benchmark: `handformer serve` under load: throughput (requests/s, tokens/s) and
p50 / p95 request latency at 1, 4 and 16 concurrent clients, on a small model.

The model is llama2.c's stories260K (the dataset stories260K, docs/data.md; imported to a temporary run),
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
    python benchmarks/serve_load.py --baseline DIR                # and another checkout's server

With --baseline DIR (`git worktree add DIR <commit>`), DIR's own `handformer serve` (cwd and
PYTHONPATH = DIR, on a copy of the run DIR's own import wrote) runs beside this checkout's batched
server: each concurrency's case right next to its twin, every other round in reverse order, the
same requests with the same seeds; a table gives each pair's median tokens/s, their ratio and
whether every completion's text is the same.
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
sys.path.insert(0, str(ROOT / "benchmarks"))

from baseline import comparison_table, describe_checkout  # noqa: E402

from handformer.data.lookup import folder  # noqa: E402

CONCURRENCY = (1, 4, 16)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, run_dir: Path, threads: int, max_batch: int, source: Path = ROOT) -> None:
        """`handformer serve` of the checkout at `source` (this one by default) on a free port."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(source)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "handformer", "serve", f"m={run_dir}", "--port", str(self.port),
             "--max-batch", str(max_batch), "--log-level", "warning"], env=env, cwd=source)
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
               ) -> tuple[float, int, int, list[float], dict[int, str]]:
    """(seconds, requests, tokens, latencies, each seed's completion) of `clients` tasks each
    sending `requests_each`."""
    latencies: list[float] = []
    texts: dict[int, str] = {}
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
            texts[body["seed"]] = response.json()["choices"][0]["text"]

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        start = time.perf_counter()
        await asyncio.gather(*(client(http, c) for c in range(clients)))
        seconds = time.perf_counter() - start
    return seconds, clients * requests_each, tokens, latencies, texts


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
    parser.add_argument("--baseline", type=Path, help="another handformer checkout to serve beside this one")
    args = parser.parse_args()
    if args.baseline is not None and not (args.baseline / "handformer" / "__init__.py").is_file():
        raise SystemExit(f"--baseline {args.baseline}: no handformer/__init__.py there; give the root of a "
                         "handformer checkout (e.g. `git worktree add DIR <commit>`)")

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = args.run
        if run_dir is None:
            from handformer.tasks.lm.imports import import_llama2c

            run_dir = Path(tmp) / "stories260K"
            data = folder("stories260K")
            import_llama2c(data / "stories260K.bin", data / "tok512.bin", run_dir)
        servers = {"batched": ServerProcess(run_dir, args.threads, 32),
                   "max-batch 1": ServerProcess(run_dir, args.threads, 1)}
        cases = [("batched", c) for c in CONCURRENCY] + [("max-batch 1", 16)]
        if args.baseline is not None:
            servers["baseline"] = ServerProcess(baseline_run(args, run_dir, Path(tmp)), args.threads, 32,
                                                args.baseline.resolve())
            cases = [case for c in CONCURRENCY for case in (("batched", c), ("baseline", c))] + cases[3:]
        results: dict[tuple[str, int], list] = {case: [] for case in cases}
        try:
            for name in servers:  # warm-up: first requests pay for lazy imports and allocations
                asyncio.run(load(servers[name].url, 4, 1, 8, 0))
            for r in range(args.rounds):
                for name, clients in (reversed if r % 2 else list)(cases):  # every other round backwards
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
        tokens_per_s[case] = statistics.median(t / s for s, _, t, _, _ in rounds)
        rps = statistics.median(n / s for s, n, _, _, _ in rounds)
        latencies = [x for *_, lat, _ in rounds for x in lat]
        per_request = sum(t for _, _, t, _, _ in rounds) / sum(n for _, n, _, _, _ in rounds)
        print(f"{case[0]:<12} {case[1]:>7} {rps:>10.2f} {tokens_per_s[case]:>9.0f} "
              f"{percentile(latencies, 0.5):>7.3f} {percentile(latencies, 0.95):>7.3f} {per_request:>10.1f}")
    one, sixteen = tokens_per_s[("batched", 1)], tokens_per_s[("batched", 16)]
    print(f"\n16 clients / 1 client, tokens/s: {sixteen / one:.2f}x (target >= 3x)")
    unbatched = tokens_per_s[("max-batch 1", 16)]
    print(f"batched / max-batch 1 at 16 clients, tokens/s: {sixteen / unbatched:.2f}x")
    if args.baseline is not None:
        # comparison_table takes seconds: a round's seconds per token, so that its ratio > 1 is slower
        rows = []
        for c in CONCURRENCY:
            ours, theirs = results[("batched", c)], results[("baseline", c)]
            same = all(a[4] == b[4] for a, b in zip(ours, theirs, strict=True))  # every completion's text
            rows.append((f"{c} client(s), seconds a token", [s / t for s, _, t, _, _ in ours],
                         [s / t for s, _, t, _, _ in theirs], same))
        print(comparison_table("serve load", rows, describe_checkout(args.baseline.resolve())))


def baseline_run(args: argparse.Namespace, run_dir: Path, tmp: Path) -> Path:
    """The run the baseline serves: stories260K imported by the baseline's own import-llama2c,
    or a copy of --run."""
    if args.run is not None:
        return args.run
    out, data = tmp / "stories260K-baseline", folder("stories260K")
    subprocess.run([sys.executable, "-m", "handformer", "import-llama2c", str(data / "stories260K.bin"),
                    str(data / "tok512.bin"), str(out)], cwd=args.baseline.resolve(), check=True,
                   env={**os.environ, "PYTHONPATH": str(args.baseline.resolve())}, stdout=subprocess.DEVNULL)
    return out


if __name__ == "__main__":
    main()
