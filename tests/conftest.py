"""Shared test fixtures and the run's policies: threads under xdist, no leaked settings, no skip in CI
outside run_policy.ALLOWED_SKIPS, the costliest files first (run_order)."""

import gc
import os
import sys

import pytest
from run_order import pytest_collection_modifyitems  # noqa: F401 (hook)
from run_policy import (  # noqa: F401 (hooks)
    pytest_make_collect_report,
    pytest_runtest_makereport,
    refuse_golden_writes_when_required,
)

# Collection imports every test module and most of handformer in each worker: with
# PYTHONDONTWRITEBYTECODE set (some machines set it for every process), nothing compiled is cached and
# each run rewrites and compiles about 100,000 lines again (5 s of a worker's collection on a 2-core
# machine). Collection writes its caches (__pycache__, git-ignored) as a plain Python does; after it
# the environment's setting holds again, so a file a test writes and imports (a learner's chapter,
# changed between two checks in the same second) is never read back from a stale cache.
WRITE_BYTECODE_AFTER_COLLECTION = not sys.dont_write_bytecode
sys.dont_write_bytecode = False

pytest_plugins = ["pytester"]  # test_references_required runs probe suites in process

# The children a test starts (servers, CLI runs, sandboxes) inherit these.
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
# set by pytest and by libraries the tests use (not by the tests themselves): not counted as a leak
SET_BY_LIBRARIES = frozenset({"PYTEST_CURRENT_TEST", "TOKENIZERS_PARALLELISM", "CUDA_MODULE_LOADING"})
SET_BY_LIBRARIES_PREFIXES = ("TORCHINDUCTOR_", "_TORCHINDUCTOR_", "TRITON_")  # torch.compile's own


def pytest_configure(config):
    """Under pytest-xdist (the default run: two workers on a 2-core machine) each worker and every
    process it starts computes on one thread, so the workers never ask for more cores than there are."""
    refuse_golden_writes_when_required()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch  # in the workers only: the controller imports no torch, so they start sooner

        torch.set_num_threads(1)
        os.environ.update({name: "1" for name in THREAD_VARS})


# seconds a slow test may take (a full experiment, the full course, 20,000 fuzzed bodies run for
# minutes); the default run's tests get pyproject.toml's `timeout`, 120 s
SLOW_TIMEOUT = 3600


def pytest_itemcollected(item):
    """A slow test gets SLOW_TIMEOUT instead of the default run's limit, unless it has a timeout mark
    of its own or the command line gives --timeout (`--timeout 0` lifts every limit)."""
    if item.get_closest_marker("slow") and not item.get_closest_marker("timeout") \
            and item.config.getoption("timeout", None) is None:
        item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT))


def pytest_collection_finish(session):
    """Collection imported torch, transformers and every test module: millions of objects that live
    as long as the process. Frozen (gc.freeze), the cycle collector's full passes during the tests
    no longer walk them, only what the tests make (a few per cent of the run on a 2-core machine)."""
    sys.dont_write_bytecode = not WRITE_BYTECODE_AFTER_COLLECTION
    gc.collect()
    gc.freeze()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """The run is over: collect its garbage once, then freeze what is left (torch, transformers, every
    test module) so that pytest's closing collections and the interpreter's exit need not walk it
    again: about 5 s fewer per process at the end of a run that imported everything."""
    gc.collect()
    gc.freeze()


@pytest.fixture(scope="module")
def one_thread():
    """The test tensors are tiny: a second intra-op thread costs more than it saves (10x on a busy
    2-core machine). Modules opt in with `pytestmark`; the setting is restored after the module."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", autouse=True)
def leaves_threads_and_environment_as_found(request):
    """A module that changes the torch thread count or an environment variable for good would
    change every module run after it in the same process (which ones depends on -k and on the
    xdist worker): it fails here, naming what it left, and the setting is put back."""
    import torch

    threads, env = torch.get_num_threads(), dict(os.environ)
    yield
    changed = sorted(k for k in set(env) | set(os.environ)
                     if env.get(k) != os.environ.get(k) and k not in SET_BY_LIBRARIES
                     and not k.startswith(SET_BY_LIBRARIES_PREFIXES))
    left = [f"${k}: {env.get(k)!r} -> {os.environ.get(k)!r}" for k in changed]
    if torch.get_num_threads() != threads:
        left.append(f"torch threads {threads} -> {torch.get_num_threads()}")
        torch.set_num_threads(threads)
    for k in changed:
        if k in env:
            os.environ[k] = env[k]
        else:
            del os.environ[k]
    if left:
        pytest.fail(f"{request.module.__name__} left {'; '.join(left)} (use monkeypatch or restore it)",
                    pytrace=False)
