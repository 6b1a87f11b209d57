"""A translation run written for `transformers`: the paper's post-norm encoder-decoder as a
`MarianMTModel` directory (`export-hf` of a translation run). The weight map and config are
handformer/convert/marian_export.py's; this module reads the run and writes the directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

from safetensors.torch import save as st_save

from handformer.convert.marian_export import marian_config, marian_mismatches, marian_state_dict
from handformer.io import atomic_write_bytes, atomic_write_text, check_export_target
from handformer.tasks.translation.translator import Translator


def export_marian(run_dir: str | os.PathLike, out_dir: str | os.PathLike, overwrite: bool = False,
                  ) -> list[str]:
    """Write the translation run in `run_dir` as a Marian directory; returns notes. Settings that
    do not map raise one `ValueError` naming each of them."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    check_export_target(run_dir, out_dir, overwrite)
    translator = Translator.load(run_dir)
    cfg = translator.model.cfg
    problems = marian_mismatches(cfg)
    if problems:
        raise ValueError("cannot export to MarianMTModel: " + "; ".join(problems) + "; a run trained "
                         "with Marian's settings exports (`handformer train --config demo --set "
                         "model.norm_placement=post`)")
    bos, eos = translator.tgt_tok.bos_id, translator.tgt_tok.eos_id
    if bos is None or eos is None:
        raise ValueError(f"{run_dir}'s target tokenizer has no <s> / </s> token, which decoding needs")
    notes = [] if cfg.bias else ["the run has no biases (bias=false); Marian always has them, so they "
                                 "are written as zeros (the same function)"]
    tensors = marian_state_dict(translator.model.state_dict(), cfg)
    config = marian_config(cfg, bos, eos)
    generation = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id",
                                         "decoder_start_token_id", "forced_eos_token_id")}
    generation["num_beams"] = translator.job.decode.beam
    generation["suppress_tokens"] = [bos]  # handformer's decoding never emits BOS (Marian bans only pad)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out_dir / "model.safetensors", st_save(tensors, metadata={"format": "pt"}))
    for name in ("tokenizer.json", "tokenizer.target.json"):
        if (run_dir / name).is_file():
            atomic_write_bytes(out_dir / name, (run_dir / name).read_bytes())
    atomic_write_text(out_dir / "generation_config.json", json.dumps(generation, indent=2) + "\n")
    atomic_write_text(out_dir / "config.json", json.dumps(config, indent=2) + "\n")  # last: complete
    return notes
