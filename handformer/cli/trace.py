"""`handformer trace`: every module's input and output shapes for a preset or a run."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from handformer.cli.common import non_negative_int, parse_overrides, positive_int
from handformer.config import BlockConfig, config_from_dict, load_config
from handformer.paths import refuse_non_file


def config_path(source: str, presets: str) -> Path:
    """The config.json `source` names (a run directory's, or the file itself), or an error that
    says what is there instead."""
    path, fix = Path(source), f"give a run directory, a config.json or a preset ({presets})"
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"{source} is a folder with no config.json, not a run directory; {fix}")
        return path / "config.json"
    refuse_non_file(path, "a config file", fix)  # /dev/null, a pipe
    if not path.is_file():
        raise ValueError(f"{source!r} is neither a preset ({presets}) nor a config file or run directory")
    return path


def model_config_from_args(source: str, overrides: dict[str, Any]) -> BlockConfig:
    """A preset name, a config JSON file, or a run directory holding config.json."""
    from handformer.see.trace import PRESETS

    if source in PRESETS:
        cfg = PRESETS[source]()
        data = cfg.to_dict()
    else:
        path = config_path(source, ", ".join(PRESETS))
        if path.suffix == ".toml":  # a job's vocabulary comes from its data: the model exists once trained
            raise ValueError(f"{source} is a training job, whose model sizes come with its data; "
                             f"train it (`handformer train --config {source} --out RUN`), then trace RUN, "
                             "or trace a preset with --set")
        try:
            data = load_config(path).to_dict()
        except UnicodeDecodeError:
            raise ValueError(f"{source} is not a config JSON file (not UTF-8 text); give a preset, "
                             "a config.json or a run directory") from None
    unknown = set(overrides) - set(data)
    if unknown:
        raise ValueError(f"unknown config field(s) {', '.join(sorted(unknown))}; valid: "
                         f"{', '.join(sorted(k for k in data if k != 'family'))}")
    return config_from_dict({**data, **overrides})


def cmd_trace(args: argparse.Namespace) -> int:
    from handformer.see.trace import build_model, format_trace, trace

    cfg = model_config_from_args(args.model, parse_overrides(args.set))
    model = build_model(cfg)
    rows = trace(model, args.batch_size, args.src_length, args.tgt_length)
    print(f"{type(model).__name__} ({cfg.kind}): {model.num_parameters():,} parameters")
    print(format_trace(rows, args.depth))
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help="print every module's input/output shapes and parameter counts")
    p.add_argument("model", nargs="?", default="paper-base",
                   help="preset (paper-base, gpt2, llama), a config JSON file or a run directory")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a model config field, e.g. --set n_encoder_layers=2")
    p.add_argument("--batch-size", type=positive_int, default=2)
    p.add_argument("--src-length", type=positive_int, default=10, help="source (or prompt) length")
    p.add_argument("--tgt-length", type=positive_int, default=5, help="target length (encoder-decoder)")
    p.add_argument("--depth", type=non_negative_int, default=None, help="show modules down to this depth")
    p.set_defaults(func=cmd_trace)
