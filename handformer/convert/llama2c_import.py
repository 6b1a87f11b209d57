"""Import a llama2.c checkpoint and its tokenizer as a handformer language-model run.

    import_llama2c("stories260K.bin", "tok512.bin", "runs/stories260K")
    # then: handformer generate runs/stories260K --prompt "Once upon a time" --temperature 0

The weights are read by `llama2c_weights` (legacy and version 1 fp32 files, shared or separate
classifier, RoPE rows permuted to half-split), the tokenizer by `llama2c_tokenizer` (a standard
tokenizer.json that encodes as run.c does). Special tokens follow run.c: prompts start with BOS
(1); generation stops at EOS (2) and also at BOS, as run.c's does: the TinyStories models were
trained on stories that each begin with BOS, so BOS is how they end a story.
"""

from __future__ import annotations

import os
from pathlib import Path

from handformer.convert.hf_import import ImportedLM, model_from_state
from handformer.convert.llama2c_tokenizer import llama2c_tokenizer
from handformer.convert.llama2c_weights import read_llama2c
from handformer.tasks.lm.run import SpecialTokens, save_lm_run

BOS_ID, EOS_ID = 1, 2  # hard-wired in run.c


def import_llama2c(model_path: str | os.PathLike, tokenizer_path: str | os.PathLike,
                   run_dir: str | os.PathLike, overwrite: bool = False) -> ImportedLM:
    """Convert llama2.c's `model_path` + `tokenizer_path` into a run directory (tasks/lm/run.py)."""
    model_path, tokenizer_path, run_dir = Path(model_path), Path(tokenizer_path), Path(run_dir)
    if (run_dir / "config.json").exists() and not overwrite:
        raise ValueError(f"{run_dir} already holds a run; choose another directory or overwrite it")
    header, state = read_llama2c(model_path)
    tokenizer = llama2c_tokenizer(tokenizer_path, header.vocab_size)  # both read before writing
    cfg = header.config()
    model = model_from_state(cfg, state)  # the file's tensors become its parameters: no random init
    notes = ["generation also stops at BOS (id 1), as llama2.c's run.c does: its TinyStories "
             "models begin every story with BOS"]
    tokens = SpecialTokens(bos_id=BOS_ID, eos_id=EOS_ID, pad_id=None, eos_ids=[EOS_ID, BOS_ID])
    source = {"llama2c_model": str(model_path.resolve()), "llama2c_tokenizer": str(tokenizer_path.resolve()),
              "format": header.format_name, "shared_classifier": header.shared_classifier, "notes": notes}
    save_lm_run(run_dir, model, tokenizer, tokens, source=source)
    return ImportedLM(run_dir, header.format_name, "Llama", model.num_parameters(), cfg.n_layers,
                      cfg.vocab_size, tokens, notes)


__all__ = ["import_llama2c"]
