"""What a run under HANDFORMER_REQUIRE_REFERENCES=1 (set by .ci/run) refuses. A skipped test fails,
unless ALLOWED_SKIPS names it with the reason it may skip there: a reference, browser, font or data
file that went missing, or a guard that started skipping, cannot leave CI green with less proven.
And the golden files are never rewritten in such a run (HANDFORMER_WRITE_GOLDEN=1 turns comparisons
into writers). conftest.py (and the probes of test_references_required.py) import the hooks below."""

import os
from pathlib import Path

import pytest
from helpers import REQUIRE_ENV, references_required

WRITE_GOLDEN_ENV = "HANDFORMER_WRITE_GOLDEN"

# test file or test id (as pytest prints it) -> why it may skip even in CI
ALLOWED_SKIPS = {
    "tests/test_import_memory.py::test_import_hf_streams_a_sharded_checkpoint":
        "peak memory is read from Linux's /proc; skipped only on other systems",
}


# skip reasons allowed even in CI where this machine truly lacks what the test needs, read apart from the
# code that skips (a guard that wrongly skips on a CPU that has it still fails): the C kernels are AVX-512
# code, and the CPU a clone runs on may be AVX2 only (torch's own path is what runs there, tested as always)
HARDWARE_SKIPS = {"torch sees no AVX-512 on this CPU": lambda: "avx512f" not in _cpu_flags()}


def _cpu_flags() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def hardware_skip(reason: str) -> bool:
    return any(said in reason and lacks() for said, lacks in HARDWARE_SKIPS.items())


def allowed(nodeid: str) -> bool:
    return any(nodeid == key or nodeid.startswith(key + "::") or nodeid.startswith(key + "[")
               for key in ALLOWED_SKIPS)


def refuse_skip(report) -> None:
    """Turn a skip outside ALLOWED_SKIPS into a failure that says what skipped and how to fix it."""
    if not (report.skipped and references_required()) or hasattr(report, "wasxfail") or allowed(report.nodeid):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    if hardware_skip(reason):
        return
    report.outcome = "failed"
    report.longrepr = (f"skipped, but {REQUIRE_ENV}=1 allows no skip outside run_policy.ALLOWED_SKIPS: {reason} "
                       "(provide what it needs, or allow it there with the reason)")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    refuse_skip(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    refuse_skip(report)
    return report


def refuse_golden_writes_when_required() -> None:
    """Called at start-up: a run that must prove (CI) may not rewrite what it compares against."""
    if references_required() and os.environ.get(WRITE_GOLDEN_ENV, "") not in ("", "0"):
        raise pytest.UsageError(f"{WRITE_GOLDEN_ENV}=1 rewrites the golden files the tests compare against, and "
                                f"{REQUIRE_ENV}=1 asks for a run that proves: unset one of them")
