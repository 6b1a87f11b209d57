"""Another handformer checkout's code, timed beside this one's: the `--baseline DIR` of
benchmarks/decode_tiny.py, decode_limit.py, lm_vs_hf.py and beam_vs_hf.py.

`BaselineWorker(DIR)` starts this file as a worker process with PYTHONPATH and cwd = DIR, so it
imports DIR's handformer and never this checkout's (it checks where `handformer` came from before
answering). The caller drives it with one JSON object a line on stdin, one reply a line on stdout:

- `load`: a CausalLM from a config dict (`cfg.to_dict()`) and a state dict (torch.save'd to a
  temporary file), prepared one of the ways in PREPARATIONS with DIR's own functions (from
  handformer.inference, or from handformer.nn and handformer.generation in a checkout without it);
- `batches`: a list of (B, T + 1) token batches for `train`, torch.save'd to a temporary file;
- `generate`: `generate(model, prompts, n, temperature=0, threads=...)`; replies with its seconds
  (timed inside the worker, around the call alone) and the new tokens;
- `translator`: a translation run loaded with DIR's `Translator.load`, and source batches
  (torch.save'd) for `beam`;
- `beam`: DIR's `beam_search` over those batches (benchmarks/beam_vs_hf.py); replies with its
  seconds and the hypotheses;
- `train`: one round of benchmarks/lm_vs_hf.py's training loop (AdamW fused, lr 3e-4, weight decay
  0.1, clipping at 1.0, cross-entropy on fp32 logits, optional bf16 autocast) over the batches; the
  optimizer lives as long as the model, as in lm_vs_hf; replies with the seconds of the steps after
  the warm-up ones and the last loss.

The caller gives the same weights, the same inputs and the thread count its own case runs with, so a
baseline case is the same work as its twin in this checkout; the benchmarks time both in the same
interleaved rounds, each twin next to its case and the order reversed every other round (so a
neighbour's load on a shared machine falls on both alike). `comparison_table` prints each pair's
medians, their ratio and whether the tokens agree.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

PREPARATIONS = ("as loaded", "pack_linears", "prepare_for_decoding", "int8", "int8, head fp32",
                "int4 groups of 32", "bf16 weights")
TOLERANCE = 0.05  # "as fast as the baseline": medians within 5 % of its medians


class Reply(NamedTuple):
    """One timed call in the worker: its seconds and its tokens (generate) or last loss (train).
    `cpu_seconds`: the process's CPU time over the same call (generate and beam): on a shared
    machine it counts only the time the worker ran, so neighbours disturb it much less than the
    wall clock (with one intra-op thread it is the work itself)."""

    seconds: float
    result: Any
    cpu_seconds: float | None = None


class BaselineWorker:
    """A worker process that runs the handformer checkout at `source` (see the module docstring)."""

    def __init__(self, source: Path, threads: int | None = None) -> None:
        source = Path(source).resolve()
        if not (source / "handformer" / "__init__.py").is_file():
            raise SystemExit(f"--baseline {source}: no handformer/__init__.py there; give the root of "
                             "a handformer checkout (e.g. `git worktree add DIR <commit>`)")
        self.source = source
        self.label = describe_checkout(source)
        self.tmp = tempfile.TemporaryDirectory(prefix="handformer-baseline-")
        self._files = 0
        # Nothing of this checkout on the worker's path: the checkout's root, cwd, PYTHONPATH alone.
        env = {**os.environ, "PYTHONPATH": str(source)}
        self.proc = subprocess.Popen([sys.executable, "-P", str(Path(__file__).resolve()), "--worker"],
                                     cwd=source, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        hello = self._call({"op": "hello", "threads": threads or torch.get_num_threads()})
        self.handformer_file = hello["handformer"]

    def _call(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise RuntimeError(f"the baseline worker ({self.source}) has stopped; its error is above"
                               ) from None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the baseline worker ({self.source}) stopped during {request['op']!r}; "
                               "its error is above")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"the baseline checkout {self.source} failed {request['op']!r}:\n"
                               f"{reply['error']}")
        return reply

    def _save(self, obj: Any) -> str:
        self._files += 1
        path = Path(self.tmp.name) / f"{self._files}.pt"
        torch.save(obj, path)
        return str(path)

    def load(self, name: str, model: torch.nn.Module, preparation: str,
             state_dict: dict[str, torch.Tensor] | None = None) -> int | None:
        """Build `name` in the worker: a CausalLM of `model.cfg` with `state_dict` (default: `model`'s;
        give the unprepared model's when `model` is already fused or quantized), prepared as
        `preparation`. Returns the thread count the baseline's own `default_threads` picks for it."""
        if preparation not in PREPARATIONS:
            raise ValueError(f"preparation {preparation!r}; choose one of {', '.join(PREPARATIONS)}")
        weights = self._save(state_dict if state_dict is not None else model.state_dict())
        try:
            reply = self._call({"op": "load", "name": name, "config": model.cfg.to_dict(), "weights": weights,
                                "prepare": preparation})
        finally:
            Path(weights).unlink()  # the worker holds its copy: a 124M model's file is 0.5 GB
        return reply["default_threads"]

    def batches(self, name: str, data: Sequence[torch.Tensor]) -> None:
        """Hand the worker the training batches `train(name=...)` will run over."""
        self._call({"op": "batches", "name": name, "path": self._save(list(data))})

    def generate(self, name: str, prompts: Sequence[Sequence[int]], new_tokens: int, threads: int | None,
                 use_cache: bool = True) -> Reply:
        """Greedy `generate` of model `name` with `threads` intra-op threads (None: the worker's
        torch setting, which is the caller's). Reply(seconds, new tokens of each prompt)."""
        reply = self._call({"op": "generate", "name": name, "prompts": [list(p) for p in prompts],
                            "new_tokens": new_tokens, "threads": threads, "use_cache": use_cache})
        return Reply(reply["seconds"], reply["tokens"], reply["cpu_seconds"])

    def translator(self, run_dir: Path, batches: Sequence[torch.Tensor]) -> None:
        """Load the translation run `run_dir` in the worker and hand it the (B, S) source batches
        that `beam` translates."""
        self._call({"op": "translator", "run_dir": str(Path(run_dir).resolve()),
                    "path": self._save(list(batches))})

    def beam(self, beam_size: int, length_penalty: float) -> Reply:
        """The worker's `beam_search` over every batch: Reply(seconds, hypotheses in order)."""
        reply = self._call({"op": "beam", "beam_size": beam_size, "length_penalty": length_penalty})
        return Reply(reply["seconds"], reply["hypotheses"], reply["cpu_seconds"])

    def train(self, name: str, batches: str, warmup: int, bf16: bool = False) -> Reply:
        """One round of lm_vs_hf's training loop on model `name`: Reply(seconds after the warm-up
        steps, last loss)."""
        reply = self._call({"op": "train", "name": name, "batches": batches, "warmup": warmup,
                            "bf16": bf16})
        return Reply(reply["seconds"], reply["loss"])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=120)
        self.tmp.cleanup()

    def __enter__(self) -> BaselineWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None and self.proc.poll() is None:
            self.proc.kill()
        self.close()


def resolved_threads(choice: int | None) -> int:
    """The intra-op thread count a `generate(threads=...)` case runs with: `choice`
    (default_threads' answer, or an explicit count), or torch's setting for None."""
    return choice if choice is not None else torch.get_num_threads()


def describe_checkout(source: Path) -> str:
    try:
        commit = subprocess.run(["git", "-C", str(source), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{source} ({commit})" if commit else str(source)


def comparison_table(title: str,
                     rows: Sequence[tuple[str, Sequence[float], Sequence[float], bool | str | None]],
                     label: str) -> str:
    """The lines comparing each case with its baseline twin: rows of (case, this checkout's seconds
    per round, the baseline's in the same rounds, whether the tokens are the same: a bool, a
    sentence (e.g. about losses) or None when there is nothing to compare).

    Columns: the two medians, their ratio (> 1: this checkout is slower) and its verdict against
    the 5 % target; "paired" is the median of the per-round ratios, which a neighbour's load on a
    shared machine disturbs less (both runs of a round see much the same load)."""
    header = (f"{'case':44} {'this':>9} {'baseline':>9} {'this/base':>9} {'paired':>7}  {'verdict':13} "
              "tokens (or losses)")
    lines = [f"  {title}: this checkout vs the baseline {label}, median seconds of the same rounds",
             f"    {header}"]
    for case, ours, theirs, same in rows:
        a, b = statistics.median(ours), statistics.median(theirs)
        ratio = a / b
        paired = statistics.median(x / y for x, y in zip(ours, theirs, strict=True))
        verdict = ("within 5 %" if abs(ratio - 1) <= TOLERANCE else
                   f"{ratio - 1:.0%} SLOWER" if ratio > 1 else f"{1 - ratio:.0%} faster")
        tokens = same if isinstance(same, str) else "" if same is None else "same" if same else "DIFFERENT"
        lines.append(f"    {case:44} {a:9.4f} {b:9.4f} {ratio:9.3f} {paired:7.3f}  {verdict:13} {tokens}")
    return "\n".join(lines)


# --- the worker side: runs in the baseline checkout, imports only from it ---------------------------

def _import(new: str, old: str, name: str) -> Any:
    """`name` from module `new` (this checkout's layout), else from `old` (the layout without the
    inference/ and adapters/ rooms)."""
    import importlib

    try:
        module = importlib.import_module(new)
    except ModuleNotFoundError as error:
        if error.name is None or not new.startswith(error.name):
            raise
        module = importlib.import_module(old)
    return getattr(module, name)


def _only_this_checkout() -> None:
    """Keep imports inside the worker's checkout (cwd): drop the import hooks of an editable install
    (`pip install -e` of another checkout), which would otherwise answer for any module the checkout
    lacks, such as `handformer.inference` in a checkout without that room."""
    def editable(hook: object) -> bool:
        return getattr(hook, "__module__", "").startswith("__editable__")

    sys.meta_path[:] = [finder for finder in sys.meta_path if not editable(finder)]
    sys.path_hooks[:] = [hook for hook in sys.path_hooks if not editable(hook)]
    sys.path_importer_cache.clear()


def _check_provenance() -> None:
    """Raise unless every imported handformer module comes from the worker's checkout."""
    root = Path.cwd().resolve()
    for name, module in list(sys.modules.items()):
        if name == "handformer" or name.startswith("handformer."):
            files = [getattr(module, "__file__", None), *getattr(module, "__path__", [])]
            for file in filter(None, files):
                if not Path(file).resolve().is_relative_to(root):
                    raise RuntimeError(f"the worker imported {name} from {file}, not from {root}")


class _Worker:
    def __init__(self) -> None:
        _only_this_checkout()
        import handformer

        _check_provenance()
        self.handformer = str(Path(handformer.__file__).resolve())
        self.models: dict[str, torch.nn.Module] = {}
        self.optims: dict[str, torch.optim.Optimizer] = {}
        self.data: dict[str, list[torch.Tensor]] = {}

    def hello(self, threads: int) -> dict[str, Any]:
        torch.set_num_threads(threads)  # the caller's setting, which its cases with threads=None use
        return {"handformer": self.handformer, "torch": torch.__version__}

    def load(self, name: str, config: dict, weights: str, prepare: str) -> dict[str, Any]:
        from handformer.config import config_from_dict
        from handformer.models.causal_lm import CausalLM

        try:
            cfg = config_from_dict(config)
        except ValueError:  # a checkout whose configs name their class `family`, not `kind`
            cfg = config_from_dict({("family" if k == "kind" else k): v for k, v in config.items()})
        model = CausalLM(cfg).eval()
        model.load_state_dict(torch.load(weights))
        self.models[name] = self._prepare(model, prepare)
        default_threads = _import("handformer.inference.threads", "handformer.generation.generate",
                                  "default_threads")
        return {"default_threads": default_threads(self.models[name])}

    @staticmethod
    def _prepare(model: torch.nn.Module, how: str) -> torch.nn.Module:
        prepare_for_decoding = _import("handformer.inference.prepare", "handformer.generation.prepare",
                                       "prepare_for_decoding")
        if how == "as loaded":
            return model
        if how == "pack_linears":
            pack_linears = _import("handformer.inference.packed_linear", "handformer.nn.packed_linear",
                                   "pack_linears")
            pack_linears(model)
            return model
        if how == "bf16 weights":  # `handformer quantize --bf16`, then as `handformer generate` runs it
            return prepare_for_decoding(model.to(torch.bfloat16))
        quantize = {"int8": dict(bits=8), "int8, head fp32": dict(bits=8, skip=("lm_head",)),
                    "int4 groups of 32": dict(bits=4)}.get(how)
        if quantize is not None:
            _import("handformer.inference.quant", "handformer.nn.quant", "quantize_linears")(
                model, group_size=32, **quantize)
        elif how != "prepare_for_decoding":
            raise ValueError(f"unknown preparation {how!r}")
        return prepare_for_decoding(model)

    def batches(self, name: str, path: str) -> dict[str, Any]:
        self.data[name] = torch.load(path)
        return {}

    def generate(self, name: str, prompts: list[list[int]], new_tokens: int, threads: int | None,
                 use_cache: bool) -> dict[str, Any]:
        from handformer.generation.generate import generate

        cpu, start = time.process_time(), time.perf_counter()  # generate runs under inference_mode itself
        out = generate(self.models[name], prompts, new_tokens, temperature=0, threads=threads,
                       use_cache=use_cache)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        return {"seconds": seconds, "cpu_seconds": cpu, "tokens": out}

    def translator(self, run_dir: str, path: str) -> dict[str, Any]:
        from handformer.tasks.translation.translator import Translator

        self.translation = Translator.load(run_dir)
        self.sources = torch.load(path)
        return {}

    def beam(self, beam_size: int, length_penalty: float) -> dict[str, Any]:
        from handformer.generation.decoding import beam_search

        model, limits = self.translation.model, self.translation.limits()
        cpu, start = time.process_time(), time.perf_counter()
        with torch.no_grad():
            out = [h for src in self.sources
                   for h in beam_search(model, src, limits, beam_size, length_penalty)]
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        return {"seconds": seconds, "cpu_seconds": cpu, "hypotheses": out}

    def train(self, name: str, batches: str, warmup: int, bf16: bool) -> dict[str, Any]:
        import torch.nn.functional as F

        model = self.models[name]
        if name not in self.optims:
            self.optims[name] = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
        optim = self.optims[name]
        model.train()
        elapsed, loss = 0.0, None
        for i, batch in enumerate(self.data[batches]):
            x, y = batch[:, :-1], batch[:, 1:]  # (B, T) inputs and next-token targets
            start = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                logits = model(x).logits  # (B, T, V)
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optim.step()
            optim.zero_grad(set_to_none=True)
            if i >= warmup:
                elapsed += time.perf_counter() - start
            loss = loss.item()
        return {"seconds": elapsed, "loss": loss}


def _serve() -> None:
    import traceback

    worker = _Worker()
    for line in sys.stdin:
        request = json.loads(line)
        op = request.pop("op")
        try:
            reply = getattr(worker, op)(**request)
            _check_provenance()
        except Exception:  # the caller raises it, with the checkout's name
            reply = {"error": traceback.format_exc()}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    _serve()
elif __name__ == "__main__":
    raise SystemExit("benchmarks/baseline.py is the --baseline worker of decode_tiny.py, decode_limit.py, "
                     "lm_vs_hf.py and beam_vs_hf.py; run one of those with --baseline DIR")
