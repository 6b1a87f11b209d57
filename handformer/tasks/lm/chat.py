"""Chat with a language-model run directory: the run's chat template (chat_template.jinja or
tokenizer_config.json's chat_template, copied from the checkpoint by `handformer import-hf`) and
its stop tokens, around a `ChatSession`.

    session = chat("runs/smollm2-instruct", system="You are terse.", temperature=0)
    print(session.send("Name three colours."))
    print(session.send("And two more."))   # the history and the KV cache carry over
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch

from handformer.generation.chat import ChatSession, check_chat_options, stop_ids_for
from handformer.generation.chat_template import load_chat_template
from handformer.generation.sampling import SamplingOptions, Speculation
from handformer.tasks.lm.run import LMRun, load_lm
from handformer.tasks.run_config import RunDir


def chat(run: str | os.PathLike | LMRun, *, system: str | None = None, temperature: float = 1.0,
         top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
         max_new_tokens: int | None = None, device: str | torch.device = "cpu",
         notify: Callable[[str], None] | None = None, run_dir: str | os.PathLike | None = None,
         speculate: Speculation | None = None, thinking: bool | None = None) -> ChatSession:
    """A `ChatSession` with the run in `run` (a run directory, or an `LMRun` already loaded from
    `run_dir`). Refuses a run without a chat template: base models have none. max_new_tokens
    None: 256, or half the context when that is shorter. temperature, top_k, top_p and seed make
    the session's one SamplingOptions (checked here, before any model is loaded), with `speculate`
    (speculative decoding: prompt lookup, or its draft_model; `session.speculation` counts it).
    `thinking`: the template's `enable_thinking` (None: the template's default; a template without
    the switch refuses True and False)."""
    sampling = SamplingOptions(temperature, top_k, top_p, seed, speculate=speculate)
    if isinstance(run, LMRun):
        if run_dir is None:
            raise ValueError("chat(run: LMRun) needs run_dir=, the directory it was loaded from")
    else:
        run_dir = RunDir.read(run)  # not a run at all: say so, before looking for a template
    # refusals that need no model come before loading it
    template = load_chat_template(run_dir)
    if template is None:
        raise ValueError(f"{run_dir} has no chat template (chat_template.jinja, or a chat_template in "
                         "tokenizer_config.json), so it cannot chat: use an instruction-tuned checkpoint "
                         "imported with `handformer import-hf`, or `handformer generate` to continue text")
    check_chat_options(template, system, max_new_tokens, thinking)
    if not isinstance(run, LMRun):
        run = load_lm(run_dir, device, decoding=True)  # our own copy: prepared for speed
    stop_ids = stop_ids_for(run.tokenizer, run.tokens.eos_ids, template)
    if not stop_ids:
        raise ValueError(f"{Path(run_dir) / 'config.json'} lists no EOS ids and the vocabulary has no "
                         "end-of-turn token, so a reply would never end")
    if max_new_tokens is None:
        max_new_tokens = min(256, run.model.cfg.max_positions // 2)
    return ChatSession(run.model, run.tokenizer, template, stop_ids, system=system, sampling=sampling,
                       max_new_tokens=max_new_tokens, notify=notify, thinking=thinking)


__all__ = ["chat"]
