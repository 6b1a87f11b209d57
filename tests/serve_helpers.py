"""Tiny runs and a real uvicorn server on a free port, shared by the serve tests."""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path

import helpers
import torch
import uvicorn
from tokenizers import AddedToken

from handformer.config import CausalLMConfig
from handformer.data.special_tokens import SpecialTokens
from handformer.data.tokenizer import Tokenizer
from handformer.models.causal_lm import CausalLM
from handformer.tasks.lm.run import save_lm_run

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
TEXT = ("the quick brown fox jumps over the lazy dog. Hello, who are you? I am a model! 0123456789"
        ' {"name": [true, false, null], "x": -1.5E+3}_<>/\\\n')  # JSON and tool-call markup can be written


LLAMA3 = ("{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n'"
          " + m['content'] + '<|eot_id|>' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
MARKUP = {"chatml": ("<|im_start|>", "<|im_end|>"),
          "llama3": ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")}


def qwen3_template() -> str:
    """A Qwen3-style template: handformer's ChatML template with tools, whose generation prompt
    opens a `<think>` section, or writes an empty one when `enable_thinking` is false (as Qwen3's
    does); an assistant turn's earlier reasoning is not shown."""
    from handformer.generation.tool_calls import TEMPLATES

    source = (TEMPLATES / "chatml_tools.jinja").read_text()
    prompt = "{%- if add_generation_prompt -%}\n  {{- '<|im_start|>assistant\\n' }}\n{%- endif -%}"
    assert prompt in source
    return source.replace(prompt, "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' }}"
                          "{%- if enable_thinking is defined and not enable_thinking -%}{{- '<think>\\n\\n</think>\\n\\n' }}"
                          "{%- else -%}{{- '<think>\\n' }}{%- endif -%}{%- endif -%}")


def seed_by_default(monkeypatch, seed: int = 0) -> None:
    """A request that sends no seed (the Messages API has none) samples as if it sent `seed`, so a
    test or a docs example gets the same reply on every run: unseeded, the tiny random model could
    end a reply (or a thinking block) at once on one run in a few dozen."""
    from handformer.generation.sampling import SamplingOptions

    drawn = SamplingOptions.generator

    def generator(self, device, choice: int = 0):
        return drawn(self if self.seed is not None else replace(self, seed=seed), device, choice)

    monkeypatch.setattr(SamplingOptions, "generator", generator)


def make_lm_run(run_dir: Path, chat: bool = True, max_positions: int = 96, seed: int = 0,
                markup: str = "chatml", template: str | None = None, thinking: bool = False) -> Path:
    """A random Llama-style run on a character tokenizer (BOS and EOS set), its matrices scaled up
    so next-token distributions are far from flat; with `chat`, a ChatML template (or Llama 3's,
    with `markup="llama3"`; or `template`). `thinking`: `<think>` and `</think>` are tokens of
    their own (added, not special: a reply's text keeps them, as Qwen3's vocabulary does)."""
    tok = Tokenizer.train_char([TEXT])
    tok.hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in MARKUP[markup]])
    if thinking:
        tok.hf.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<think>", "</think>")])
    tok = Tokenizer(tok.hf)
    torch.manual_seed(seed)
    cfg = CausalLMConfig.llama_style(vocab_size=tok.vocab_size, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64,
                                     n_layers=2, max_positions=max_positions)
    model = CausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8)
    save_lm_run(run_dir, model, tok, SpecialTokens(bos_id=tok.bos_id, eos_id=tok.eos_id, pad_id=tok.pad_id))
    if chat:
        (run_dir / "chat_template.jinja").write_text(template or (CHATML if markup == "chatml" else LLAMA3))
        config = {"eos_token": "<|im_end|>"} if markup == "chatml" else {
            "eos_token": "<|eot_id|>", "bos_token": "<|begin_of_text|>"}
        (run_dir / "tokenizer_config.json").write_text(json.dumps(config))
    return run_dir


def make_translation_run(run_dir: Path) -> Path:
    """A random (untrained) encoder-decoder run, one layer each side."""
    return helpers.make_translation_run(run_dir, layers=1, max_len_b=8)


def pace_steps(monkeypatch, server, model: str = "story", seconds: float = 0.005) -> None:
    """Make each decoding step of `model` as slow as a real model's, so that "a few steps" after a
    client leaves means the same on any machine."""
    engine = server.app.state.engines[model].engine
    step = engine.step

    def paced():
        time.sleep(seconds)
        return step()

    monkeypatch.setattr(engine, "step", paced)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """The app under a real uvicorn server on a free port of 127.0.0.1, in a thread."""

    def __init__(self, app) -> None:
        # IPPROTO_TCP named, so that asyncio sets TCP_NODELAY on the connections it accepts (it
        # checks the protocol; with 0 it does not, and every response waits ~40 ms for an ACK)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
