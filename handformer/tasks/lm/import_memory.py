"""How much memory an import takes: the peak resident memory a fresh process gains while it runs
(benchmarks/import_memory.py reports it for a ~1 GB checkpoint; tests/test_import_memory.py checks
that it does not grow from a 50 MB checkpoint to a 100 MB one, where a loader holding a copy does).

The process imports torch and handformer first, then resets its peak (writing 5 to
/proc/self/clear_refs, Linux) and runs the import: the growth is VmHWM (the peak) minus VmRSS
before, so what the libraries take at import time does not count. Several imports are measured in
one such process, each in a child forked from it after the libraries are imported: every child
starts from the same memory, as a fresh process would, without importing torch again. (A first
model built on the meta device, to learn the shapes the checkpoint must have, loads about 75 MB of
torch's meta machinery once; the rest of the growth is the checkpoint's pages as they are read.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BOUND_FACTOR, BOUND_SLACK = 1.25, 300 * 2**20  # peak growth <= 1.25 x the checkpoint + 300 MiB

IMPORT = ("from handformer.tasks.lm.imports import import_hf\n"
          "import_hf({hf_dir!r}, {run_dir!r}, overwrite=True)")

_MEASURE = """
import json, os, sys, traceback
import torch, handformer.tasks.lm.imports  # imported before the measurements
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
def measure(code):
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak (VmHWM) starts again from here
    before = status("VmRSS")
    exec(code, {{}})
    return status("VmHWM") - before
answers = []
for code in {codes!r}:
    read, write = os.pipe()
    if os.fork() == 0:  # the child: one measurement from the parent's memory, then gone
        try:
            answer = {{"growth": measure(code)}}
        except BaseException:
            answer = {{"error": traceback.format_exc()[-2000:]}}
        os.write(write, json.dumps(answer).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        answers.append(json.loads(f.read() or '{{"error": "the child died without an answer"}}'))
    os.wait()
print(json.dumps(answers))
"""


def checkpoint_bytes(hf_dir: str | os.PathLike) -> int:
    """The size of a checkpoint's safetensors files."""
    return sum(p.stat().st_size for p in Path(hf_dir).glob("*.safetensors"))


def peak_growth(hf_dir: str | os.PathLike, run_dir: str | os.PathLike, code: str = IMPORT) -> int:
    """Bytes of peak resident memory that `code` (default: import_hf(hf_dir, run_dir)) adds to a
    fresh Python process with torch and handformer imported (Linux only: /proc/self)."""
    return peak_growths([(hf_dir, run_dir, code)])[0]


def peak_growths(jobs: list[tuple[str | os.PathLike, str | os.PathLike, str]]) -> list[int]:
    """peak_growth of each (hf_dir, run_dir, code), measured one after another in children of one
    process that imported torch and handformer once."""
    if not Path("/proc/self/clear_refs").exists():
        raise OSError("measuring peak memory needs Linux's /proc/self/clear_refs")
    codes = [code.format(hf_dir=str(hf_dir), run_dir=str(run_dir)) for hf_dir, run_dir, code in jobs]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[3]), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _MEASURE.format(codes=codes)], capture_output=True,
                          text=True, env=env, check=False)
    if done.returncode:
        raise RuntimeError(f"the measuring process failed:\n{done.stderr[-2000:]}")
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    failed = [a["error"] for a in answers if "error" in a]
    if failed:
        raise RuntimeError(f"the measured import failed:\n{failed[0]}")
    return [a["growth"] for a in answers]


def within_bound(growth: int, checkpoint: int) -> bool:
    return growth <= BOUND_FACTOR * checkpoint + BOUND_SLACK


__all__ = ["BOUND_FACTOR", "BOUND_SLACK", "checkpoint_bytes", "peak_growth", "peak_growths", "within_bound"]
