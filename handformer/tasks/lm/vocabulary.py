"""New special tokens for a run: the tokenizer gains them and the model's embedding (and output
head) gains a row each, so a base that never had role tokens (llama2.c's stories260K, say) can be
taught a chat format that uses them.

A new row starts as the mean of the existing rows: the model's average token, so the new tokens
begin neither huge nor arbitrary and the logits of the old tokens are unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from tokenizers import AddedToken

from handformer.config import CausalLMConfig
from handformer.families import build_causal_lm
from handformer.tasks.lm.finetune import copy_chat_files
from handformer.tasks.lm.run import load_lm, save_lm_run


def add_special_tokens(run_dir: str | os.PathLike, out_dir: str | os.PathLike, tokens: list[str],
                       end_of_turn: str | None = None) -> list[int]:
    """Write `out_dir`: the run in `run_dir` with `tokens` added as special tokens (those it lacks),
    its embedding and head grown to the new vocabulary. `end_of_turn`: one of them that ends
    generation too (added to the run's eos_ids). Returns the tokens' ids."""
    run = load_lm(run_dir)
    if "quantization" in run.config or "lora" in run.config:
        raise ValueError(f"{run_dir} holds a quantized or LoRA run; add tokens to a full-precision run "
                         "(merge LoRA adapters first)")
    tok = run.tokenizer
    tok.hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in tokens])
    old, new = run.model.cfg.vocab_size, max(tok.vocab_size, run.model.cfg.vocab_size)
    cfg = CausalLMConfig.from_dict({**run.model.cfg.to_dict(), "vocab_size": new}, "model")
    model = build_causal_lm(cfg)
    state = run.model.state_dict()
    with torch.no_grad():
        for name, param in model.state_dict().items():
            value = state[name]
            if value.shape != param.shape:  # the embedding and the head: (V, D) rows
                value = torch.cat([value, value.mean(dim=0, keepdim=True).expand(new - old, -1)])
            param.copy_(value)
    ids = [tok.hf.token_to_id(t) for t in tokens]
    special = run.tokens
    if end_of_turn is not None:
        special.eos_ids = list(dict.fromkeys([*special.eos_ids, tok.hf.token_to_id(end_of_turn)]))
    sections = {k: v for k, v in run.config.items() if k in ("source", "train", "data")}
    save_lm_run(out_dir, model, tok, special, **sections)
    copy_chat_files(Path(run_dir), Path(out_dir))
    return ids


__all__ = ["add_special_tokens"]
