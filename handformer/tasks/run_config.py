"""A run directory's config.json, read with one clear error for each way it can be broken: missing,
a directory, not JSON, not an object, lacking the task or the model's sizes, or holding values of
the wrong type. Every error names the file, what is wrong and what to do."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from handformer.config import BlockConfig
from handformer.paths import missing_from, refuse_non_file

# The model fields that fix the shapes of the weights: a config.json without them cannot describe
# model.safetensors, so they are never filled in from defaults.
SIZE_FIELDS = {
    "seq2seq": ("d_model", "n_heads", "d_ff", "src_vocab_size", "tgt_vocab_size", "n_encoder_layers",
                "n_decoder_layers"),
    "causal_lm": ("d_model", "n_heads", "d_ff", "vocab_size", "n_layers"),
}
FIX = ("restore the file from a copy, or re-create the run (`handformer train`, or `handformer "
       "import-hf` for imported models)")


def read_run_config(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The parsed config.json of `run_dir`, checked to be an object with a known task; raises
    FileNotFoundError or ValueError (one line each). `run_model_config` checks the model section."""
    path = Path(run_dir) / "config.json"
    if path.is_dir():
        raise ValueError(f"{path} is a directory, not a file; {FIX}")
    refuse_non_file(path, "a file", FIX)  # a device or a pipe named config.json
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a run directory ({missing_from(run_dir, 'config.json')}); "
                                "train one with `handformer train` or `handformer demo`, or import one "
                                "with `handformer import-hf`")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        reason = "the file is empty" if not path.stat().st_size else f"{err}"
        raise ValueError(f"{path} is not valid JSON ({reason}); {FIX}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(config).__name__}; {FIX}")
    task = config.get("task")
    if task not in ("translation", "lm"):
        raise ValueError(f"{path} has task={task!r}; expected 'translation' or 'lm'; {FIX}")
    for name in ("train", "data", "decode", "tokens"):
        if name in config and config[name] is not None and not isinstance(config[name], dict):
            raise ValueError(f"{path}: \"{name}\" must be an object, got "
                             f"{type(config[name]).__name__}; {FIX}")
    return config


@dataclass(frozen=True)
class RunDir:
    """A run directory read once: its path and its checked config.json. `load_lm`, `chat`, the
    exports and serve's registry take one, so a run's config.json is read once on their way.

        run = RunDir.read("runs/smollm2")   # FileNotFoundError / ValueError: one line each
    """

    path: Path
    config: dict[str, Any]  # the whole config.json, checked by `read_run_config`

    @classmethod
    def read(cls, run_dir: str | os.PathLike | RunDir) -> RunDir:
        """`run_dir` read (a RunDir already read is returned as it is)."""
        if isinstance(run_dir, RunDir):
            return run_dir
        return cls(Path(run_dir), read_run_config(run_dir))

    @property
    def task(self) -> str:
        return self.config["task"]

    def model_config(self, cls: type[BlockConfig]) -> BlockConfig:
        return run_model_config(self.path, self.config, cls)

    def __fspath__(self) -> str:  # where a path is wanted, a RunDir is its directory
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)


def run_model_config(run_dir: str | os.PathLike, config: dict[str, Any], cls: type[BlockConfig],
                     ) -> BlockConfig:
    """The model config of a run's config.json, every error prefixed with the file's path."""
    path = Path(run_dir) / "config.json"
    section = config.get("model")
    if not isinstance(section, dict):
        raise ValueError(f"{path} lacks its \"model\" section (an object of model settings); {FIX}")
    missing = [f for f in SIZE_FIELDS.get(cls.kind, ()) if f not in section]
    if missing:
        raise ValueError(f"{path}: the model section lacks {', '.join(missing)}, which fix the "
                         f"shapes of the weights; {FIX}")
    try:
        return cls.from_dict(section, "model")
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


def weights_fix(run_dir: Path) -> str:
    """What to do about a broken model.safetensors in a trained run."""
    if (run_dir / "checkpoint.safetensors").is_file():
        return (f"re-run training, or resume it from checkpoint.safetensors (`handformer train "
                f"--resume {run_dir}`, with `--set train.steps=N` above its steps once it has finished): "
                "its next evaluation writes model.safetensors again")
    return "re-run training to write it again"
