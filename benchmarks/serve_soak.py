"""Benchmark: `handformer serve` soaked: 2,000 requests from 32 clients, mixed (completions, chat
with a JSON schema, forced tool calls, embeddings; whole and streamed, a third of the streams
dropped mid-way), and the server's resident memory (VmRSS from /proc/PID/status) when request
200 and request 2,000 have been answered. Target: RSS at 2,000 <= RSS at 200 + 5 %. Each client
sends one request more (2,032 in all), so that the server is still under full load when request
2,000 is answered, not idle with its memory given back.

Growth is counted from request 200, not from the start: the first 200 requests are the warm-up
(the first grammars compiled and kept, the prefix cache filling, the allocator reaching the sizes
the batches need), and what is measured is whether memory keeps growing after it. The RSS before
the first request and after every 400th is printed too, so the warm-up is seen, not hidden.

The server is the real command, `python -m handformer serve`, in its own process, serving a small
random run made here (Llama-style, 4 layers, d_model 128, a byte-level BPE of 2,000 tokens trained on
tiny Shakespeare, a ChatML template), on a port free when chosen (taken by another
program before the server binds it, another is tried) and with an API key of its own (so that no
other program's answers are taken for its); the clients are threads over httpx. Every answer must
be a 200 (or a stream that was dropped); a 5xx stops the run.

    python benchmarks/serve_soak.py                   # ~3 min on 2 shared cores
    python benchmarks/serve_soak.py --requests 400    # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import torch
from tokenizers import AddedToken

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from handformer.config import CausalLMConfig  # noqa: E402
from handformer.data.lookup import locate  # noqa: E402
from handformer.data.special_tokens import SpecialTokens  # noqa: E402
from handformer.data.tokenizer import Tokenizer  # noqa: E402
from handformer.models.causal_lm import CausalLM  # noqa: E402
from handformer.tasks.lm.run import save_lm_run  # noqa: E402

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
SCHEMA = {"type": "object",
          "properties": {"ok": {"type": "boolean"}, "name": {"type": "string", "maxLength": 8}},
          "required": ["ok", "name"], "additionalProperties": False}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"],
    "additionalProperties": False}}}


def make_run(run_dir: Path) -> Path:
    tok = Tokenizer.train_bpe([locate("tinyshakespeare", "input.txt").read_text()], 2000)
    markup = ("<|im_start|>", "<|im_end|>")
    tok.hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in markup])
    tok = Tokenizer(tok.hf)
    torch.manual_seed(0)
    cfg = CausalLMConfig.llama_style(vocab_size=tok.vocab_size, d_model=128, n_heads=4, n_kv_heads=2,
                                     d_ff=256, n_layers=4, max_positions=2048)
    save_lm_run(run_dir, CausalLM(cfg).eval(), tok, SpecialTokens(bos_id=tok.bos_id, eos_id=tok.eos_id,
                                                                   pad_id=tok.pad_id))
    (run_dir / "chat_template.jinja").write_text(CHATML)
    (run_dir / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    return run_dir


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def request(rng: random.Random, i: int) -> tuple[str, dict]:
    kind, chat = i % 5, "/v1/chat/completions"
    if kind == 0:
        return "/v1/completions", {"model": "m", "prompt": "ROMEO: " * rng.randint(1, 30), "max_tokens": 16,
                                   "seed": i}
    if kind == 1:
        return chat, {"model": "m", "messages": [{"role": "user", "content": f"Who are you {i}?"}],
                      "max_tokens": 40, "seed": i,
                      "response_format": {"type": "json_schema",
                                          "json_schema": {"name": "r", "schema": SCHEMA}}}
    if kind == 2:
        return chat, {"model": "m", "messages": [{"role": "user", "content": "Weather?"}], "max_tokens": 60,
                      "seed": i, "tools": [TOOL], "tool_choice": "required"}
    if kind == 3:
        return "/v1/embeddings", {"model": "m", "input": ["To be, or not to be"] * rng.randint(1, 4)}
    system = {"role": "system", "content": "You are a player in a play. " * 10}
    return chat, {"model": "m", "messages": [system, {"role": "user", "content": f"Line {i}"}],
                  "max_tokens": 24, "seed": i}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(command: Callable[[int], list[str]], env: dict[str, str], key: str,
                 ports: Callable[[], int] = free_port, attempts: int = 5,
                 timeout: float = 120) -> tuple[subprocess.Popen, str]:
    """Start `command(port)` on a port of 127.0.0.1 free when chosen, and wait until it answers
    GET /v1/models with `key` and refuses it without (so that another program on that port is
    not taken for it). Another program may bind the port between the choice and the server's bind: the server
    then exits with "address already in use", and another port is tried, `attempts` in all.
    Returns the process and its URL; any other failure to start is a SystemExit with its stderr."""
    for _ in range(attempts):
        port = ports()
        url = f"http://127.0.0.1:{port}"
        log = tempfile.TemporaryFile("w+")
        proc = subprocess.Popen(command(port), env=env, cwd=ROOT, stderr=log, text=True)
        deadline = time.monotonic() + timeout
        while proc.poll() is None and not answers(url, key):
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                break
            time.sleep(0.2)
        if proc.poll() is None:
            return proc, url
        log.seek(0)
        err = log.read()
        if "address already in use" not in err.lower():
            raise SystemExit(f"the server did not start:\n{err[-3000:]}")
    raise SystemExit(f"the server did not start: the port was taken {attempts} times")


def answers(url: str, key: str) -> bool:
    """The server started with `key` answers there: a 200 with the key, a 401 without it."""
    try:
        with_key = httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=1)
        return with_key.status_code == 200 and httpx.get(url + "/v1/models", timeout=1).status_code == 401
    except httpx.HTTPError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="the server's torch threads")
    parser.add_argument("--prefix-cache-mb", type=float, default=None,
                        help="passed to serve (its default when not given)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = make_run(Path(tmp) / "m")
        key = secrets.token_hex(16)  # this server's: an answer with it is from this server
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": str(ROOT),
               "HANDFORMER_API_KEY": key}

        def command(port: int) -> list[str]:
            extra = [] if args.prefix_cache_mb is None else ["--prefix-cache-mb", str(args.prefix_cache_mb)]
            return [sys.executable, "-m", "handformer", "serve", f"m={run_dir}", "--port", str(port),
                    "--log-level", "warning", *extra]

        proc, url = start_server(command, env, key)
        try:
            soak(url, key, proc.pid, args)
        finally:
            proc.terminate()
            proc.wait(30)


def soak(url: str, key: str, pid: int, args: argparse.Namespace) -> None:
    lock = threading.Lock()
    answered, rss, failures, statuses = [0], {}, [], {}
    marks = sorted({min(200, args.requests), args.requests, *range(400, args.requests, 400)})
    before = rss_mb(pid)  # started, its models loaded, no request answered yet
    start = time.perf_counter()

    def client(c: int) -> None:
        rng = random.Random(c)
        with httpx.Client(timeout=300, headers={"Authorization": f"Bearer {key}"}) as http:
            for i in range(c, args.requests + args.clients, args.clients):  # a request more each, in
                # flight while the last mark is taken: the server is measured under load, not drained
                route, body = request(rng, i)
                stream = route != "/v1/embeddings" and rng.random() < 0.5
                drop = stream and rng.random() < 0.33
                if stream:
                    with http.stream("POST", url + route, json={**body, "stream": True}) as r:
                        status = r.status_code
                        for n, line in enumerate(r.iter_lines()):
                            if '"server_error"' in line:
                                status = 500
                            if drop and n >= 3:
                                break
                else:
                    status = http.post(url + route, json=body).status_code
                with lock:
                    statuses[status] = statuses.get(status, 0) + 1
                    if status >= 500:
                        failures.append((route, body))
                    answered[0] += 1
                    if answered[0] in marks:
                        rss[answered[0]] = rss_mb(pid)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    if failures:
        raise SystemExit(f"{len(failures)} requests got a 5xx, e.g. {failures[0]}")
    a, b = rss[marks[0]], rss[marks[-1]]
    peak = max(rss.values())
    total = args.requests + args.clients
    print(f"\nserve soak: {total} requests from {args.clients} clients in {seconds:.0f} s "
          f"({total / seconds:.1f} requests/s); statuses {statuses}")
    print(f"server RSS (MB) before the first request: {before:.1f}; after request "
          + ", ".join(f"{m}: {rss[m]:.1f}" for m in marks))
    print(f"server RSS at request {marks[0]}: {a:.1f} MB; at request {marks[-1]}: {b:.1f} MB "
          f"({(b - a) / a * 100:+.1f} %, target <= +5 %); the most at any mark from {marks[0]} on: "
          f"{peak:.1f} MB ({(peak - a) / a * 100:+.1f} %)")


if __name__ == "__main__":
    main()
