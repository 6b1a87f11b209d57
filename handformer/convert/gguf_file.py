"""The GGUF container, read and written with the `gguf` package (llama.cpp's own Python library).

A GGUF file is a header, typed key-value metadata ("llama.context_length" = 2048, the tokenizer's
token list, ...), a table of tensors (name, GGML type, shape) and the tensor bytes, aligned.

- `read_gguf` opens a file (memory-mapped), turns its metadata into plain Python values and checks
  that every tensor's bytes lie inside the file, so a truncated or corrupt file is one ValueError
  that names it, never an exception from deep inside numpy.
- `write_gguf` writes metadata and tensors through `gguf.GGUFWriter` into a temporary file next to
  the target and renames it into place (handformer.io.atomic_write): a crash leaves no half file.

Shapes here are PyTorch's (rows last); GGUF stores them reversed (GGML's ne[0] is the row length),
which `gguf` handles on both sides.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from torch import Tensor

from handformer.convert.gguf_quants import BLOCKS
from handformer.io import atomic_write
from handformer.paths import refuse_non_file


@dataclass
class GGUFTensor:
    name: str
    type_name: str  # the GGML type: "F32", "Q8_0", ...
    shape: tuple[int, ...]  # PyTorch order
    raw: np.ndarray  # the tensor's bytes in the file (uint8, memory-mapped)

    def to_torch(self) -> Tensor:
        """The tensor as float32 (dequantized by handformer.convert.gguf_quants)."""
        from handformer.convert.gguf_quants import dequantize

        return dequantize(torch.from_numpy(np.array(self.raw)), self.type_name, self.shape)


@dataclass
class GGUFFile:
    path: Path
    metadata: dict[str, Any]  # key -> int, float, bool, str or a list of them
    tensors: dict[str, GGUFTensor]

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise ValueError(f"{self.path} has no general.architecture string; it is not a model file")
        return arch


def _value(field: Any) -> Any:
    """A metadata field as a Python value: strings decoded, arrays as lists. A float32 scalar
    comes back as the shortest decimal that is the same float32 (1e-05, not 9.99999974737875e-06):
    what was written from a Python float is read back as that float."""
    kinds = field.types
    if not kinds:
        return None
    if kinds[0] == gguf.GGUFValueType.ARRAY:
        if len(kinds) > 1 and kinds[-1] == gguf.GGUFValueType.ARRAY:
            raise ValueError(f"metadata key {field.name} is a nested array, which no model key is")
        return [] if not field.data else list(field.contents())
    value = field.contents()
    if kinds[0] == gguf.GGUFValueType.FLOAT32:
        value = float(str(np.float32(value)))
    return value


def read_gguf(path: str | os.PathLike) -> GGUFFile:
    """The metadata and tensors of the GGUF file at `path` (tensors stay on disk until used)."""
    path = Path(path)
    if not path.is_file():
        refuse_non_file(path, "a GGUF file", "give the .gguf file itself")
        raise FileNotFoundError(f"no GGUF file at {path}")
    size = path.stat().st_size
    try:
        reader = gguf.GGUFReader(path)
        metadata = {name: _value(field) for name, field in reader.fields.items()
                    if not name.startswith("GGUF.")}
    except Exception as err:  # numpy and gguf raise many kinds on a malformed file
        raise ValueError(f"{path} is not a readable GGUF file ({type(err).__name__}: {err}); it is "
                         "truncated, corrupt or not GGUF: download or export it again") from None
    tensors = {}
    for t in reader.tensors:
        type_name = t.tensor_type.name
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size:
            raise ValueError(f"{path} is truncated: tensor {t.name} ends at byte {end:,} but the file "
                             f"has {size:,}; download or export it again")
        raw = reader.data[int(t.data_offset):end]
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))
        tensors[t.name] = GGUFTensor(t.name, type_name, shape, raw)
    return GGUFFile(path, metadata, tensors)


def check_types(file: GGUFFile) -> None:
    """Refuse a tensor type handformer cannot decode, naming the tensor and the type."""
    odd = [f"{t.name} ({t.type_name})" for t in file.tensors.values() if t.type_name not in BLOCKS]
    if odd:
        raise ValueError(f"{file.path}: tensor type not supported: {', '.join(odd[:5])}"
                         f"{' and more' if len(odd) > 5 else ''}; import-gguf reads {', '.join(BLOCKS)} "
                         "(requantize with llama.cpp's llama-quantize to one of them, e.g. Q8_0)")


class _Writer(gguf.GGUFWriter):
    """GGUFWriter that also writes an empty array whose item type is given
    (`add_key_value(key, [], ARRAY, sub_type)`). GGUF allows zero-length arrays and llama.cpp reads
    them; the `gguf` writer refuses them, but a character vocabulary has no BPE merges and llama.cpp
    requires the tokenizer.ggml.merges key of a byte-level BPE vocabulary to exist."""

    def _pack_val(self, val: Any, vtype: Any, add_vtype: bool, sub_type: Any = None) -> bytes:
        if vtype == gguf.GGUFValueType.ARRAY and len(val) == 0 and sub_type is not None:
            head = self._pack("I", vtype) if add_vtype else b""
            return head + self._pack("I", sub_type) + self._pack("Q", 0)
        return super()._pack_val(val, vtype, add_vtype, sub_type)


def write_gguf(path: str | os.PathLike, arch: str, add_metadata: Callable[[Any], None],
               tensors: list[tuple[str, np.ndarray, Any]]) -> None:
    """Write a GGUF file atomically. `add_metadata(writer)` adds the keys with the writer's typed
    `add_*` methods; `tensors` are (name, array, GGML type or None for F32/F16 arrays), in order."""
    def write(tmp: str) -> None:
        writer = _Writer(tmp, arch)
        try:
            add_metadata(writer)
            for name, array, raw_dtype in tensors:
                writer.add_tensor(name, array, raw_dtype=raw_dtype)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()

    atomic_write(path, write)


__all__ = ["GGUFFile", "GGUFTensor", "check_types", "read_gguf", "write_gguf"]
