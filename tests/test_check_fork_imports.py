"""The sandbox's fork server imports check's runner modules and then forks a child for each check
(core/zygote.py): a fork after torch has run a parallel operation hangs the child in its next one (a
module-level `torch.ones(5, 5).tril()` once hung a forked child's cross-entropy). So importing them
computes nothing: every torch operation their import runs is recorded (a dispatch mode, in a fresh
interpreter), and only a tensor made from a literal (`torch.tensor([...])`, no kernel) is allowed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = {"aten.lift_fresh.default"}  # a tensor from a Python literal: copied, computed by no kernel

RECORD = """
import json, traceback
from torch.utils._python_dispatch import TorchDispatchMode

seen = []

class Recorded(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        ours = [f for f in traceback.extract_stack() if "handformer" in f.filename]
        seen.append([str(func), f"{ours[-1].filename}:{ours[-1].lineno}" if ours else "?"])
        return func(*args, **(kwargs or {}))

with Recorded():
    from handformer.check.core.engine import import_runners
    import_runners()  # what the fork server imports before it forks
print(json.dumps(seen))
"""


def test_importing_checks_runners_runs_no_torch_operation():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", RECORD], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    computed = [(op, where) for op, where in json.loads(done.stdout.splitlines()[-1]) if op not in ALLOWED]
    assert computed == [], f"made at import, computed before the fork server forks: {computed}"
