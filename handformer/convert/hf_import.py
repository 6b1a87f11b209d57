"""Import a Hugging Face checkpoint directory (any family of the catalogue, handformer/families) as a
handformer language-model run.

    import_hf("path/to/hf-model", "runs/gpt2")   # then: handformer generate runs/gpt2 --prompt ...

The Hugging Face directory needs config.json, tokenizer.json and the weights as safetensors:
model.safetensors, or shards listed in model.safetensors.index.json. `transformers` is not
imported: config.json is read as JSON, the tensors with `safetensors`, and the weights are mapped
by `handformer.convert.hf_weights` (strictly: missing, unexpected and wrong-shaped tensors are all named).
Pickle files (pytorch_model.bin) are never read.

A checkpoint of a few GB streams through: each safetensors file is memory-mapped and its tensors
are views of the mapping (`map_safetensors`: nothing is read into memory), the weight map splits
them into views again (Phi-3's fused projections, stacked experts), and the run's
model.safetensors is written one tensor at a time from those views (`write_safetensors`), each
tensor's pages let go once written (`MappedFiles.release`). No second copy of the weights is held,
and at most a tensor's pages are (GPT-2's Conv1D weights are transposed one at a time as they are
written); benchmarks/import_memory.py measures the peak, within 1.25 x the checkpoint + 300 MB.
The run keeps the checkpoint's dtype (e.g. bfloat16); `load_lm` casts to the model's.

chat_template.jinja and tokenizer_config.json, when the checkpoint has them, are copied into the run
as they are: `handformer chat` renders the checkpoint's chat template from them.

Special tokens (`SpecialTokens` in the run's config.json):
- eos_id and pad_id: the first of generation_config.json, config.json (`eos_token_id`,
  `pad_token_id`) and tokenizer_config.json (`eos_token`, `pad_token` looked up in the tokenizer)
  that names one. When a file lists several EOS ids (Llama 3 instruct lists three and ends its
  turns with the third, <|eot_id|>), eos_id is the first and every one is recorded in eos_ids:
  each of them stops generation.
- bos_id is set only when prompts should start with BOS, as the tokenizer would do it:
  tokenizer_config.json's `add_bos_token` decides when present (Llama tokenizers set it, and
  transformers 4 applied it); otherwise tokenizer.json's post-processor does (as `tokenizers` does,
  and transformers 5, which ignores add_bos_token when a tokenizer.json exists; in real checkpoints
  the two agree, and a disagreement is noted). GPT-2 adds none. The id is the one the
  post-processor prepends, else the BOS id found like eos_id.
- Ids outside the model's vocabulary are dropped (with a note). Every choice made that the files
  did not state plainly is returned in `ImportedLM.notes` and recorded in "source".
"""

from __future__ import annotations

import json
import mmap
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import Tensor

from handformer.config import CausalLMConfig
from handformer.convert.hf_weights import (
    HEAD,
    check_implemented,
    other_family,
)
from handformer.data.special_tokens import SpecialTokens
from handformer.data.tokenizer import Tokenizer
from handformer.families import build_causal_lm
from handformer.families.catalogue import SPECS
from handformer.io import atomic_write
from handformer.models.causal_lm import CausalLM
from handformer.training.checkpoint import safetensors_problem

# The chat template and its special-token strings, copied into the run for `handformer chat`
# (generation/chat_template.py reads them there as transformers reads them from a checkpoint).
CHAT_FILES = ("chat_template.jinja", "tokenizer_config.json")
# model_type -> the Hugging Face class whose checkpoints `hf_weights` maps (each spec's `hf_class`).
ARCHITECTURES = {model_type: spec.hf_class for model_type, spec in SPECS.items()}
SINGLE_FILE, INDEX_FILE = "model.safetensors", "model.safetensors.index.json"


def read_json(path: Path, required: bool = False) -> dict[str, Any]:
    if path.is_dir():
        raise ValueError(f"{path} is a directory, not a JSON file")
    if not path.is_file():
        if required:
            raise FileNotFoundError(f"{path.parent} has no {path.name}")
        return {}
    try:
        data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def architecture_of(hf_config: dict[str, Any], path: Path) -> tuple[str, str]:
    """(model_type, class name), refusing what `hf_weights` does not map or implement."""
    model_type = hf_config.get("model_type")
    try:
        check_implemented(hf_config)  # settings handformer lacks are named before anything is read
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    supported = ", ".join(f"{c} (model_type {t!r})" for t, c in ARCHITECTURES.items())
    if model_type not in ARCHITECTURES:
        raise ValueError(f"{path}: unsupported model_type {model_type!r}{other_family(model_type)}; "
                         f"handformer imports {supported}")
    architectures = hf_config.get("architectures") or [ARCHITECTURES[model_type]]
    if ARCHITECTURES[model_type] not in architectures:
        raise ValueError(f"{path}: unsupported architectures {architectures}; for model_type "
                         f"{model_type!r} handformer imports {ARCHITECTURES[model_type]}")
    return model_type, ARCHITECTURES[model_type]


# --- multimodal checkpoints: their text model ------------------------------------------------------

# Released checkpoints that wrap a text model handformer imports beside a vision encoder: the
# wrapper's model_type -> what is left out. config.json's "text_config" is the text model's config.
MULTIMODAL = {"qwen3_5": "Qwen3.5's vision encoder (model.visual) and multi-token-prediction layer (mtp)",
              "mistral3": "Mistral 3's vision tower and projector (model.vision_tower, "
                          "model.multi_modal_projector)"}
# the text model's tensors in the wrapper: transformers 5's names, and the names its save_pretrained
# writes for some wrappers (Mistral 3's) -> the text model's own
TEXT_PREFIXES = {"model.language_model.": "model.", "language_model.model.": "model.",
                 "language_model.lm_head.": "lm_head.", "lm_head.": "lm_head."}
_SHARED_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")  # read from the wrapper when absent


def text_config_of(hf_config: dict[str, Any], path: Path) -> tuple[dict[str, Any], str | None]:
    """(the config to import, a note): a multimodal wrapper's text_config, with the wrapper's
    special-token ids where the text config has none; any other config as it is."""
    if hf_config.get("model_type") not in MULTIMODAL:
        return hf_config, None
    text = hf_config.get("text_config")
    if not isinstance(text, dict) or "model_type" not in text:
        raise ValueError(f"{path}: a {hf_config['model_type']!r} checkpoint keeps its text model's config in "
                         "'text_config' (an object with a model_type); this one has none: save the "
                         "checkpoint again with transformers")
    text = {**{k: hf_config[k] for k in _SHARED_KEYS if k in hf_config}, **text}
    return text, (f"the text model of a {hf_config['model_type']!r} checkpoint was imported; "
                  f"{MULTIMODAL[hf_config['model_type']]} left out")


def text_weights_of(hf_state: dict[str, Tensor]) -> dict[str, Tensor]:
    """A multimodal wrapper's text-model tensors under the text model's names (TEXT_PREFIXES;
    an untied head is in the file, a tied one is not); the vision tensors are dropped."""
    state = {}
    for name, tensor in hf_state.items():
        prefix = next((p for p in TEXT_PREFIXES if name.startswith(p)), None)
        if prefix is not None:
            state[TEXT_PREFIXES[prefix] + name[len(prefix):]] = tensor
    if not any(name.startswith("model.") for name in state):
        raise ValueError("the checkpoint has no text-model tensor (model.language_model.* or "
                         "language_model.model.*): it is not the multimodal checkpoint its config.json "
                         "says; save it again with transformers")
    return state


# --- weights ---------------------------------------------------------------------------------------

# safetensors dtype names -> torch dtypes (the header names each tensor's)
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}
_NAMES = {v: k for k, v in _DTYPES.items()}


class MappedFiles:
    """The files a checkpoint's tensors are memory-mapped views of. `release(t)` drops the pages a
    tensor lies on from this process's memory once it has been used (written out): they stay in
    the file, and touching the tensor again reads them again. So an import holds one tensor's pages
    at a time, not the whole checkpoint's."""

    def __init__(self) -> None:
        self.maps: list[tuple[int, int, mmap.mmap]] = []  # (address, length, mapping)

    def map(self, f: Any) -> mmap.mmap:
        """A private (copy-on-write) mapping of the open file `f`: the file never changes."""
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        address = torch.frombuffer(mapped, dtype=torch.uint8, count=1).data_ptr()
        self.maps.append((address, len(mapped), mapped))
        return mapped

    def release(self, t: Tensor) -> None:
        """Let the system drop the pages under `t` (a view of one of these files; others: nothing)."""
        if not hasattr(mmap, "MADV_DONTNEED") or not t.numel():
            return
        span = 1 + sum((n - 1) * stride for n, stride in zip(t.shape, t.stride()))  # elements, strided
        begin, end = t.data_ptr(), t.data_ptr() + span * t.element_size()
        for address, length, mapped in self.maps:
            if address <= begin and end <= address + length:
                first = (begin - address) // mmap.PAGESIZE * mmap.PAGESIZE
                mapped.madvise(mmap.MADV_DONTNEED, first, end - address - first)
                return


def map_safetensors(path: Path, files: MappedFiles | None = None) -> dict[str, Tensor]:
    """Every tensor of a safetensors file as a view of the file mapped into memory: nothing is read
    until a tensor is used, and then only its pages (`files.release` lets them go again). The
    mapping is private (copy on write): the file never changes. The header is checked by
    safetensors first."""
    try:
        with safe_open(str(path), framework="pt") as f:
            names = list(f.keys())
    except Exception as err:  # safetensors raises its own error types on malformed files
        raise ValueError(f"{path} is not a readable safetensors file: {safetensors_problem(path, err)}; "
                         "download or save the checkpoint again") from None
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
        mapped = (files or MappedFiles()).map(f) if names else None
    start = 8 + size
    tensors = {}
    for name in names:
        info = header[name]
        dtype, shape = _DTYPES.get(info["dtype"]), info["shape"]
        begin, end = info["data_offsets"]
        if dtype is None:  # a dtype torch cannot view (fp8 and the like): read it as safetensors does
            with safe_open(str(path), framework="pt") as f:
                tensors[name] = f.get_tensor(name)
        elif begin == end:
            tensors[name] = torch.empty(shape, dtype=dtype)
        elif (start + begin) % dtype.itemsize:  # never in files safetensors writes (it aligns them)
            data = bytearray(mapped[start + begin:start + end])
            tensors[name] = torch.frombuffer(data, dtype=dtype).view(shape)
        else:
            count = (end - begin) // dtype.itemsize
            view = torch.frombuffer(mapped, dtype=dtype, count=count, offset=start + begin)
            tensors[name] = view.view(shape)
    return tensors


def write_safetensors(path: str | os.PathLike, tensors: dict[str, Tensor],
                      metadata: dict[str, str] | None = None,
                      release: Callable[[Tensor], None] | None = None) -> None:
    """Write `tensors` as a safetensors file, atomically, one tensor at a time: the header, then each
    tensor's bytes straight from its memory (a strided view is made contiguous alone, then
    dropped), then `release(tensor)` (MappedFiles.release: its pages may go). Nothing holds the
    whole file in memory, as `safetensors.torch.save` would."""
    order = sorted(tensors, key=lambda k: (-tensors[k].element_size(), k))  # aligned: widest first
    entries: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name in order:
        t = tensors[name]
        if t.dtype not in _NAMES:
            raise ValueError(f"cannot write {name}: dtype {t.dtype} has no safetensors name here")
        n = t.numel() * t.element_size()
        entries[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                         "data_offsets": [offset, offset + n]}
        offset += n
    head = json.dumps(entries, separators=(",", ":")).encode("utf-8")
    head += b" " * (-len(head) % 8)  # the data starts 8-byte aligned

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(len(head).to_bytes(8, "little"))
            f.write(head)
            for name in order:
                t = tensors[name].detach().cpu().contiguous()  # a view of the mapping stays a view
                if t.numel():
                    f.write(t.reshape(-1).view(torch.uint8).numpy().data)
                if release is not None:
                    release(tensors[name])

    atomic_write(path, write)


def read_hf_weights(hf_dir: str | os.PathLike, files: MappedFiles | None = None,
                    ) -> tuple[dict[str, Tensor], str]:
    """Every tensor of the checkpoint in `hf_dir` (single file or shards), memory-mapped (into
    `files`, when given), and the files' names."""
    hf_dir = Path(hf_dir)
    if (hf_dir / SINGLE_FILE).exists():
        return map_safetensors(hf_dir / SINGLE_FILE, files), SINGLE_FILE
    if not (hf_dir / INDEX_FILE).is_file():
        pickles = sorted(p.name for p in hf_dir.glob("*.bin"))
        found = (f"; found {', '.join(pickles)}, but handformer reads only safetensors, never pickle "
                 "(re-save the model with save_pretrained(..., safe_serialization=True))") if pickles else ""
        raise FileNotFoundError(f"{hf_dir} has no {SINGLE_FILE} or {INDEX_FILE}{found}")
    weight_map = read_json(hf_dir / INDEX_FILE).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{hf_dir / INDEX_FILE} has no 'weight_map' of tensor name -> shard file")
    shards = sorted(set(weight_map.values()))
    missing = [s for s in shards if not (hf_dir / s).exists()]
    if missing:
        raise FileNotFoundError(f"{hf_dir} lacks {len(missing)} of the {len(shards)} shard files "
                                f"{INDEX_FILE} lists: {', '.join(missing)}")
    state: dict[str, Tensor] = {}
    for shard in shards:
        tensors = map_safetensors(hf_dir / shard, files)
        absent = [k for k, s in weight_map.items() if s == shard and k not in tensors]
        twice = [k for k in tensors if k in state]
        if absent or twice:
            raise ValueError(f"{hf_dir / shard} does not match {INDEX_FILE}: "
                             f"listed but absent: {', '.join(absent) or 'none'}; "
                             f"also in another shard: {', '.join(twice) or 'none'}")
        state.update(tensors)
    return state, f"{len(shards)} shards ({INDEX_FILE})"


# --- special tokens --------------------------------------------------------------------------------

def _ids(value: Any) -> list[int]:
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


def _token_content(value: Any) -> str | None:
    """tokenizer_config.json writes a special token as a string or as {"content": ...}."""
    value = value.get("content") if isinstance(value, dict) else value
    return value if isinstance(value, str) else None


def _find_ids(kind: str, files: list[tuple[str, dict[str, Any]]], tokenizer: Tokenizer,
              vocab_size: int, notes: list[str]) -> tuple[list[int], str | None]:
    """The ids of the `kind` ("bos", "eos", "pad") token and the first file that names one inside
    the vocabulary; tokenizer_config.json names tokens by their text."""
    for name, data in files:
        if name == "tokenizer_config.json":
            content = _token_content(data.get(f"{kind}_token"))
            token_id = None if content is None else tokenizer.hf.token_to_id(content)
            ids = [] if token_id is None else [token_id]
        else:
            ids = _ids(data.get(f"{kind}_token_id"))
        outside = [i for i in ids if not 0 <= i < vocab_size]
        if outside:
            notes.append(f"{name} gives {kind} id(s) {outside} outside the vocabulary "
                         f"(0..{vocab_size - 1}); ignored")
        ids = [i for i in ids if i not in outside]
        if ids:
            return ids, name
    return [], None


def prepended_id(tokenizer: Tokenizer) -> int | None:
    """The id tokenizer.json's post-processor puts before a single sequence, if any."""
    encoding = tokenizer.hf.encode("hello", add_special_tokens=True)
    if encoding.ids and encoding.special_tokens_mask[0] == 1:
        return encoding.ids[0]
    return None


def special_tokens(hf_dir: Path, hf_config: dict[str, Any], tokenizer: Tokenizer, vocab_size: int,
                   notes: list[str]) -> tuple[SpecialTokens, list[int]]:
    """The run's `SpecialTokens` and every EOS id the files list (see the module docstring)."""
    tokenizer_config = read_json(hf_dir / "tokenizer_config.json")
    files = [("generation_config.json", read_json(hf_dir / "generation_config.json")),
             ("config.json", hf_config), ("tokenizer_config.json", tokenizer_config)]
    found = {}
    for kind in ("bos", "eos", "pad"):
        ids, source = _find_ids(kind, files, tokenizer, vocab_size, notes)
        if len(ids) > 1 and kind != "eos":
            notes.append(f"{source} lists {kind} ids {ids}; handformer uses the first, {ids[0]}")
        found[kind] = ids

    prepended = prepended_id(tokenizer)
    add_bos = tokenizer_config.get("add_bos_token")
    if isinstance(add_bos, bool):
        if add_bos != (prepended is not None):
            notes.append(f"tokenizer_config.json has add_bos_token={str(add_bos).lower()} but "
                         f"tokenizer.json's post-processor {'adds no' if add_bos else 'adds a'} BOS; "
                         "following tokenizer_config.json")
    else:
        add_bos = prepended is not None
    bos_id = None
    if add_bos:
        bos_id = prepended if prepended is not None else next(iter(found["bos"]), None)
        if bos_id is None:
            notes.append("the tokenizer should add BOS, but no BOS id is known; prompts get none")
        elif found["bos"] and bos_id != found["bos"][0]:
            notes.append(f"the tokenizer prepends id {bos_id}, not the BOS id {found['bos'][0]} the "
                         f"config files name; prompts start with {bos_id}")
    tokens = SpecialTokens(bos_id=bos_id, eos_id=next(iter(found["eos"]), None),
                           pad_id=next(iter(found["pad"]), None), eos_ids=found["eos"])
    return tokens, found["eos"]


# --- the import ------------------------------------------------------------------------------------

def model_from_state(cfg: CausalLMConfig, state: dict[str, Tensor]) -> CausalLM:
    """The model of `cfg` (`build_causal_lm`) whose parameters are `state`'s tensors: built on the
    meta device (no memory, no random init, no copy) and loaded strictly. A tied model's head is its
    embedding, so a state without "lm_head.weight" (llama2.c's shared classifier) is complete."""
    if cfg.tie_embeddings:
        state = {**state, HEAD: state["embed.weight"]}
    with torch.device("meta"):
        model = build_causal_lm(cfg)
    model.load_state_dict({k: v.contiguous() for k, v in state.items()}, strict=True, assign=True)
    if cfg.tie_embeddings:
        model.lm_head.weight = model.embed.weight  # assign=True gave the head its own Parameter
    return model


__all__ = ["ARCHITECTURES", "CHAT_FILES", "MULTIMODAL", "MappedFiles", "architecture_of", "text_config_of",
           "text_weights_of", "map_safetensors",
           "model_from_state", "prepended_id", "read_hf_weights", "read_json", "special_tokens",
           "write_safetensors"]
