"""A GGUF file's hyperparameter keys, read checked: a missing key or a bad value is a ValueError
that names the key and the file. gguf_arch reads the shared keys with these, a family's own code
(its spec's `GgufCode`) reads its keys through a `KeyReader`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from handformer.settings import is_int, is_number


def read_int(metadata: dict[str, Any], key: str, where: str, default: Any = ...) -> int:
    value = metadata.get(key, default)
    if value is ...:
        raise ValueError(f"{where} lacks {key}, which handformer needs")
    if isinstance(value, list):  # per-layer values: llama.cpp allows them, handformer has one
        if len(set(value)) != 1:
            raise ValueError(f"{where}: {key} differs between layers ({value[:8]}...); handformer's "
                             "layers are all the same size")
        value = value[0]
    if not is_int(value) or value <= 0:
        raise ValueError(f"{where}: {key}={value!r} must be a positive integer")
    return value


def read_float(metadata: dict[str, Any], key: str, where: str, default: Any = ...) -> float:
    value = metadata.get(key, default)
    if value is ...:
        raise ValueError(f"{where} lacks {key}, which handformer needs")
    if not is_number(value) or not value > 0:
        raise ValueError(f"{where}: {key}={value!r} must be a number > 0")
    return float(value)


@dataclass(frozen=True)
class KeyReader:
    """A file's hyperparameter keys by gguf.Keys template ("{arch}.expert_count"), for a family's
    own code (`GgufCode.read`), checked as read_hparams checks its own."""

    metadata: dict[str, Any]
    arch: str
    where: str  # the file, for messages

    def name(self, template: str) -> str:
        return template.format(arch=self.arch)

    def get(self, template: str, default: Any = None) -> Any:
        return self.metadata.get(self.name(template), default)

    def int(self, template: str, default: Any = ...) -> int:
        return read_int(self.metadata, self.name(template), self.where, default)

    def float(self, template: str, default: Any = ...) -> float:
        return read_float(self.metadata, self.name(template), self.where, default)


__all__ = ["KeyReader", "read_float", "read_int"]
