"""The sandbox's child side (sandbox.py is the parent's): the child's memory limit and imports,
then the check of the learner's file, one JSON line per component streamed to the results file.
Forked by zygote.py's server, or run as `python -m handformer.check.core.sandbox_child REQUEST`."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

from handformer.check.core.result import ComponentResult

DUMP_SIGNAL = signal.SIGUSR2  # the parent's request to the child: dump your stack (faulthandler's)


def _prepared(request: dict[str, Any]) -> None:
    """The child's limit and imports (none left to do in a child of the fork server), before the
    learner's file is imported."""
    import resource

    limit = int(request["memory_limit"]) * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import torch  # noqa: F401  (before the clock starts: torch's import is ours, not the learner's)

    from handformer.check.core.cpu_only import cuda_as_cpu
    from handformer.check.core.engine import import_runners

    import_runners()  # the grader's own modules, before any clock starts (0.3 s)
    sys.argv = [request["path"]]  # their file sees itself run, not the sandbox's request
    cuda_as_cpu(request["path"])  # a file written for a GPU (Meta's `.cuda()` KV cache) runs on the CPU here


def child(request: dict[str, Any]) -> None:
    """The child side: limits, imports, then the check, streaming results. The parent times each
    step (its CPU time) and, to stop one, has faulthandler dump the stack here first."""
    import faulthandler

    _prepared(request)
    from handformer.check.core.engine import check_file

    stack = open(request["stack"], "w")  # noqa: SIM115  (open until the process ends)
    results = open(request["results"], "a", encoding="utf-8")  # noqa: SIM115
    faulthandler.register(DUMP_SIGNAL, file=stack, all_threads=True)

    def started(step: str, kind: str) -> None:
        Path(request["progress"]).write_text(f"{step}\n{kind}")

    def emit(res: ComponentResult) -> None:
        results.write(json.dumps({"component": res.to_dict()}) + "\n")
        results.flush()

    Path(request["progress"]).write_text("ready")
    result = check_file(request["path"], request["overrides"], request["only"],
                        request["convention"], emit=emit, started=started, skip=request["skip"],
                        adapters=request.get("adapters"),
                        definitions_only=request.get("definitions_only", False))
    if result.skipped:
        results.write(json.dumps({"skipped": result.skipped}) + "\n")
    if result.error:
        from dataclasses import asdict

        results.write(json.dumps({"file_error": asdict(result.error)}) + "\n")
    results.write(json.dumps({"done": True}) + "\n")
    results.close()


if __name__ == "__main__":
    child(json.loads(sys.argv[1]))
