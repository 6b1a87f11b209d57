"""The contract between a learner's code and the grader, for what check cannot infer: a plain Python
file of adapter functions (as Stanford CS336's `adapters.py`), given with `--adapters FILE` or found
as `handformer_adapters.py` beside the learner's file; in the learner's own file (or a notebook cell
saved with it) the same functions count when their names start with `handformer_`.

- `make_<kind>(d_model, n_heads, ...)` builds the learner's module of that kind at the sizes check
  asks for (its arguments are matched by name as a constructor's are: d_model, n_heads, n_kv_heads,
  d_ff, dropout, max_len, vocab_size, n_layers, or any alias); check then grades that module.
- `<kind>(...)` is a function of the arguments check calls that kind with (`generate(model, idx,
  max_new_tokens)`, ...), which calls the learner's own; it is graded in place of theirs.

`NOT CHECKED` prints the adapter to write (`adapter_hint`).
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
import types
from pathlib import Path
from typing import Any

from handformer.check.core.argument_names import (
    LR_NAMES,
    MODEL_NAMES,
    X_NAMES,
    Y_NAMES,
    call_parameters,
    names_of,
)
from handformer.check.core.defaults import quietly
from handformer.check.core.result import LearnerError

ADAPTERS_FILE = "handformer_adapters.py"
IN_FILE_PREFIX = "handformer_"
# what check calls a function kind with: the signature of its adapter
CALLS: dict[str, str] = {
    "generate": "model, idx, max_new_tokens", "greedy_decode": "model, src, src_mask, max_len, start_symbol, "
    "end_symbol", "beam_search": "model, src, src_mask, max_len, start_symbol, end_symbol, beam_size",
    "sample": "logits", "top_k": "logits, k", "top_p": "logits, p", "temperature": "logits, temperature",
    "greedy": "logits", "train_step": "model, batch, optimizer, criterion", "train_epoch": "model, loader, "
    "optimizer, criterion", "lm_train_step": "model, x, y, optimizer, lr", "schedule": "step",
    "group_advantages": "rewards, group_size",
    "loss": "logits, targets, pad_id", "causal_mask": "size",
    "sdpa": "q, k, v, mask=None", "rope": "q, k, positions", "bpe": "input_path, vocab_size, special_tokens",
    "mask_helper": "src, pad_id", "masked_softmax": "scores, valid_lens", "min_p": "logits, min_p",
    "quantize": "weight, blocksize", "span_noise_mask": "length, noise_density, mean_noise_span_length",
    "mlm_masking": "input_ids, mask_token_id, vocab_size, pad_token_id, mlm_probability"}
MODEL_CALLS = {("loss", True): "model, tokens"}  # a kind whose first argument is a model, called so
# a learner's name for what check passes a function kind under another name
CALLED = {"bos": "start_symbol", "bos_id": "start_symbol", "bos_idx": "start_symbol", "sos": "start_symbol",
          "sos_id": "start_symbol", "start": "start_symbol", "start_id": "start_symbol",
          "start_token": "start_symbol", "eos": "end_symbol", "eos_id": "end_symbol", "eos_idx": "end_symbol",
          "end": "end_symbol", "end_id": "end_symbol", "end_token": "end_symbol", "beam_width": "beam_size",
          "num_beams": "beam_size", "max_length": "max_len", "maxlen": "max_len",
          "max_tokens": "max_new_tokens", "num_tokens": "max_new_tokens", "tokens": "idx", "ids": "idx",
          "input_ids": "idx",
          "source_mask": "src_mask", "src_pad_mask": "src_mask"}
# a language model step's windows and rate under the learner's names (xb -> x)
WINDOWS = {**dict.fromkeys(X_NAMES, "x"), **dict.fromkeys(Y_NAMES, "y"), **dict.fromkeys(LR_NAMES, "lr")}
SIZE_NAMES = {"d_model": "d_model", "n_heads": "n_heads", "n_kv_heads": "n_kv_heads", "d_ff": "d_ff",
              "dropout": "dropout", "max_len": "max_len", "src_vocab": "vocab_size",
              "tgt_vocab": "tgt_vocab_size", "n_layers": "n_layers", "pad_id": "pad_id", "theta": "theta",
              "d_head": "head_size", "n_classes": "n_classes", "ffn_mult": "ffn_mult"}
CANNOT = ("mapping", "internal", "stand_in", "discovery", "cannot_build", "cannot_call")


def cannot_check(error: LearnerError) -> bool:
    """Whether an error says nothing about the learner's code: check could not build the component
    (its constructor's arguments, or the constructor raising on the arguments check guessed), could
    not map its weights or call it, a stand-in would not take the learner's call, or handformer's own
    grader failed; or their own `assert` refused the input check gave (Umar Jamil's Llama: "Only one
    token at a time can be processed"): an input their code does not accept. The learner's exceptions
    on inputs their code accepts are not among them."""
    return error.kind in CANNOT or (error.kind == "exception" and error.where == "__init__") or refused(error)


def refused(error: LearnerError) -> bool:
    """Their code's own assert statement failed on check's input."""
    last = error.traceback[-1].split(": ", 1)[-1] if error.traceback else ""
    return (error.kind == "exception" and error.message.startswith("AssertionError")
            and last.startswith("assert "))


def adapter_hint(comp: Any) -> str:
    """The adapter function that lets check build or drive `comp`, pre-filled from its signature."""
    from handformer.check.core.discovery import argument_keys

    obj = comp.obj
    if inspect.isclass(obj):
        keys = argument_keys(obj)
        wanted = [k for k in dict.fromkeys(keys.values()) if k]
        params = ", ".join(SIZE_NAMES.get(k, k) for k in wanted) or "d_model, n_heads"
        args = ", ".join(f"{n}={SIZE_NAMES.get(k, '...')}" for n, k in keys.items())
        return f"def make_{comp.kind}({params}):\n    return {obj.__name__}({args})"
    name = getattr(obj, "__name__", comp.name)
    names, required = quietly(lambda: names_of(call_parameters(obj, ("self",))), (TypeError, ValueError),
                              ([], ["..."]))
    # a loss of the model and its tokens (compute_loss(model, tokens)) is called so
    call = MODEL_CALLS.get((comp.kind, next(iter(names), "") in MODEL_NAMES), CALLS.get(comp.kind, "..."))
    theirs = ", ".join(_as_called(n, call) for n in required)
    if "." in comp.name:  # a method (GPT.generate): called on the model check gives
        return (f"def {comp.kind}({call}):\n    return model.{name}({theirs})"
                "  # your method, called as check calls it")
    source = inspect.getsourcefile(inspect.unwrap(obj)) or "your_file.py"  # decorated: its own file
    stem = Path(source).stem  # imported as in the docs' `from odd import Attn`
    return (f"def {comp.kind}({call}):\n    from {stem} import {name} as yours\n{_unfilled(required, call)}"
            f"    return yours({theirs})  # your function, called as check calls it")


def _unfilled(required: list[str], call: str) -> str:
    """A line for each argument of theirs that check's call does not hand (`cfg`, `micro_batches`),
    to be built from what it hands: the adapter then calls theirs with their own order and names."""
    handed = call.split(", ")
    return "".join(f"    {n} = ...  # your {n}: build it from ({call})\n"
                   for n in required if _as_called(n, call) not in handed and n != "...")


def _as_called(name: str, call: str) -> str:
    """Their parameter as the adapter has it: its own name, or the adapter's for the same thing
    (bos_id -> start_symbol) when the adapter has that one."""
    handed = call.split(", ")
    return next((c for c in (CALLED.get(name), WINDOWS.get(name)) if c in handed), name)


def load(path: str | None, learner_path: str) -> types.ModuleType | None:
    """The adapters module: `path`, or handformer_adapters.py beside the learner's file, or None."""
    if path is None:
        beside = Path(learner_path).resolve().parent / ADAPTERS_FILE
        if not beside.is_file():
            return None
        path = str(beside)
    spec = importlib.util.spec_from_file_location("handformer_learner_adapters", path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"--adapters {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def functions(adapters: types.ModuleType | None, learner: types.ModuleType) -> dict[str, Any]:
    """Adapter functions by the name the contract gives them (make_mha, generate, ...): those of the
    adapters file, and those of the learner's file that start with `handformer_`."""
    out = {}
    for name, obj in vars(learner).items():
        if name.startswith(IN_FILE_PREFIX) and inspect.isfunction(obj):
            out[name[len(IN_FILE_PREFIX):]] = obj
    if adapters is not None:
        out.update({n: o for n, o in vars(adapters).items() if inspect.isfunction(o)
                    and getattr(o, "__module__", None) == adapters.__name__ and not n.startswith("_")})
    return out
