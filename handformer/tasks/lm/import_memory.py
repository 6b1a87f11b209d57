"""How much memory an import takes: the peak resident memory a fresh process gains while it runs
(benchmarks/import_memory.py reports it for a ~1 GB checkpoint; tests/test_import_memory.py checks
that it does not grow from a 50 MB checkpoint to a 100 MB one, where a loader holding a copy does).

The process imports torch and handformer first, then resets its peak (writing 5 to
/proc/self/clear_refs, Linux) and runs the import: the growth is VmHWM (the peak) minus VmRSS
before, so what the libraries take at import time does not count. (A first model built on the
meta device, to learn the shapes the checkpoint must have, loads about 75 MB of torch's meta
machinery once; the rest of the growth is the checkpoint's pages as they are read.)
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
import json, sys
import torch, handformer.tasks.lm.imports  # imported before the measurement
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak (VmHWM) starts again from here
before = status("VmRSS")
{code}
print(json.dumps({{"growth": status("VmHWM") - before}}))
"""


def checkpoint_bytes(hf_dir: str | os.PathLike) -> int:
    """The size of a checkpoint's safetensors files."""
    return sum(p.stat().st_size for p in Path(hf_dir).glob("*.safetensors"))


def peak_growth(hf_dir: str | os.PathLike, run_dir: str | os.PathLike, code: str = IMPORT) -> int:
    """Bytes of peak resident memory that `code` (default: import_hf(hf_dir, run_dir)) adds to a
    fresh Python process with torch and handformer imported (Linux only: /proc/self)."""
    if not Path("/proc/self/clear_refs").exists():
        raise OSError("measuring peak memory needs Linux's /proc/self/clear_refs")
    script = _MEASURE.format(code=code.format(hf_dir=str(hf_dir), run_dir=str(run_dir)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[3]), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          check=False)
    if done.returncode:
        raise RuntimeError(f"the measured import failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["growth"]


def within_bound(growth: int, checkpoint: int) -> bool:
    return growth <= BOUND_FACTOR * checkpoint + BOUND_SLACK


__all__ = ["BOUND_FACTOR", "BOUND_SLACK", "checkpoint_bytes", "peak_growth", "within_bound"]
