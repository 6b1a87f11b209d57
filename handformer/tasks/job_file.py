"""Job configs: TOML files with [model], [train], [data] and [decode] sections.

`--config` takes a path or the name of a config shipped in the package (handformer/configs/), and
`--set section.key=value` (or `key=value` when the key is in one section only) overrides a field.
"""

from __future__ import annotations

import copy
import os
from importlib import resources
from pathlib import Path
from typing import Any

from handformer.paths import kind_of

SECTIONS = ("model", "train", "data", "decode", "dpo", "grpo")


def builtin_configs() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("handformer.configs").iterdir()
                  if p.name.endswith(".toml"))


def _parse_toml(text: str, source: str) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    try:
        job = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{source} is not valid TOML: {err}") from None
    if not job:  # else every default holds: a 45M-parameter translator trains for hours
        raise ValueError(f"{source} holds no settings; write a job (task = \"lm\" and its [data], [model] "
                         "and [train] sections; configs/tiny_lm.toml is a small one) or give --config demo")
    return job


def load_job_file(spec: str | os.PathLike) -> dict[str, Any]:
    """A TOML path, or the name of a built-in config (e.g. 'demo')."""
    path = Path(spec)
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"{path} is not UTF-8 text (byte {err.start}: {err.reason}); TOML files "
                             "are UTF-8: save it as UTF-8") from None
        return _parse_toml(text, str(path))
    if path.is_dir():
        raise ValueError(f"--config {spec}: a folder, not a TOML file; to go on with a run give "
                         "--resume RUN_DIR, to start from its weights --init-from RUN_DIR")
    if (kind := kind_of(path)) is not None:  # /dev/null, a named pipe: there, but no TOML file
        raise ValueError(f"--config {spec}: {kind}, not a TOML file; give the path of a job file "
                         "(configs/tiny_lm.toml is a small one) or a built-in config name "
                         f"({', '.join(builtin_configs())})")
    if str(spec) in builtin_configs():
        text = resources.files("handformer.configs").joinpath(f"{spec}.toml").read_text()
        return _parse_toml(text, f"built-in config {spec!r}")
    raise FileNotFoundError(f"no config file {spec!r}; give a TOML path or a built-in config name "
                            f"({', '.join(builtin_configs())})")


def apply_overrides(job: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Set `section.key` (or a bare `key` found in exactly one section, else in [train])."""
    job = copy.deepcopy(job)
    for key, value in overrides.items():
        if "." in key:
            section, field = key.split(".", 1)
            if section not in SECTIONS:
                raise ValueError(f"--set {key}: unknown section {section!r}; "
                                 f"use one of {', '.join(SECTIONS)}")
        else:
            holders = [s for s in SECTIONS if key in job.get(s, {})]
            if len(holders) > 1:
                raise ValueError(f"--set {key} is ambiguous (in {', '.join(holders)}); write section.{key}")
            section, field = (holders[0] if holders else "train"), key
        table = job.setdefault(section, {})
        *tables, name = field.split(".")  # train.lora.rank: the [train.lora] table's rank
        for t in tables:
            table = table.setdefault(t, {})
            if not isinstance(table, dict):
                raise ValueError(f"--set {key}: {t} is not a table of settings")
        table[name] = value
    return job
