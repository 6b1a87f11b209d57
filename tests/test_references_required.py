"""The reference suite cannot vanish silently: under HANDFORMER_REQUIRE_REFERENCES=1 (set by
.ci/run) a missing reference library, browser or font fails the run, and so does any other skip
outside run_policy.ALLOWED_SKIPS; without it, the tests that need it are skipped and counted. The
probes run in this process (pytester) with the suite's skip hooks."""

from pathlib import Path

import pytest
import run_policy
from helpers import REQUIRE_ENV

TESTS = Path(__file__).resolve().parent
# the suite's own plugin policy (pyproject.toml's addopts): an inner run that loaded every installed
# plugin would import and rewrite them all again (pytester restores sys.modules after each run), 2 s a run
ARGS = ("-q", "-p", "no:cacheprovider", "--disable-plugin-autoload")

HOOKS = "from run_policy import pytest_make_collect_report, pytest_runtest_makereport\n"
PROBE = '''
from helpers import missing, require_module

absent = require_module("handformer_no_such_reference", "pip install it")


def test_uses_it():
    assert absent
'''
PROBE_BROWSER = '''
from helpers import missing

missing("no chromium browser installed")


def test_uses_it():
    pass
'''
PROBE_SKIPS = '''
import pytest


def test_skips():
    pytest.skip("no GPU here")


def test_allowed():
    pytest.skip("allowed, with its reason")


@pytest.mark.xfail(reason="expected", strict=True)
def test_expected_failure():
    assert False


def test_passes():
    pass
'''


def run_probe(pytester, monkeypatch, source: str, required: bool):
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    if required:
        monkeypatch.setenv(REQUIRE_ENV, "1")
    pytester.makeconftest(HOOKS)
    pytester.makepyfile(test_probe=source)
    return pytester.runpytest_inprocess(*ARGS)


@pytest.mark.parametrize("probe, required", [(PROBE, True), (PROBE_BROWSER, False)],
                         ids=["library-required", "browser-local"])
def test_a_missing_reference_fails_only_when_required(pytester, monkeypatch, probe, required):
    result = run_probe(pytester, monkeypatch, probe, required)
    out = result.stdout.str()
    if required:
        assert result.ret != 0 and "references are required" in out, out
    else:
        assert result.ret in (0, 5) and "1 skipped" in out, out  # 5: nothing left to run


def test_a_skip_outside_the_allow_list_fails_when_required(pytester, monkeypatch):
    monkeypatch.setitem(run_policy.ALLOWED_SKIPS, "test_probe.py::test_allowed", "the probe's own reason")
    result = run_probe(pytester, monkeypatch, PROBE_SKIPS, required=True)
    result.assert_outcomes(passed=1, failed=1, skipped=1, xfailed=1)
    result.stdout.fnmatch_lines(["_* test_skips _*", "skipped, but * allows no skip outside *ALLOWED_SKIPS: no GPU here *"])
    local = run_probe(pytester, monkeypatch, PROBE_SKIPS, required=False)
    local.assert_outcomes(passed=1, skipped=2, xfailed=1)


def test_a_module_skipped_outside_the_allow_list_fails_when_required(pytester, monkeypatch):
    result = run_probe(pytester, monkeypatch, PROBE_BROWSER, required=True)
    assert result.ret != 0 and "references are required" in result.stdout.str()
    skipped_module = "import pytest\n\npytest.skip('no data', allow_module_level=True)\n\n\ndef test_x():\n    pass\n"
    result = run_probe(pytester, monkeypatch, skipped_module, required=True)
    assert result.ret != 0 and "ALLOWED_SKIPS: no data" in result.stdout.str(), result.stdout.str()


def test_every_allowed_skip_names_a_test_of_the_suite_and_says_why():
    assert run_policy.ALLOWED_SKIPS
    for key, reason in run_policy.ALLOWED_SKIPS.items():
        path, _, name = key.partition("::")
        source = (TESTS.parent / path).read_text()
        assert not name or f"def {name.split('[')[0]}(" in source, key
        assert len(reason.split()) >= 5, f"{key}: say why it may skip in CI"


def test_golden_files_are_not_rewritten_in_a_run_that_must_prove(pytester, monkeypatch):
    monkeypatch.setenv(run_policy.WRITE_GOLDEN_ENV, "1")
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.UsageError, match="unset one of them"):
        run_policy.refuse_golden_writes_when_required()
    pytester.makeconftest("from run_policy import refuse_golden_writes_when_required\n\n\n"
                          "def pytest_configure(config):\n    refuse_golden_writes_when_required()\n")
    pytester.makepyfile(test_probe="def test_passes():\n    pass\n")
    result = pytester.runpytest_inprocess(*ARGS)
    assert result.ret == pytest.ExitCode.USAGE_ERROR and "unset one of them" in result.stderr.str()
    monkeypatch.delenv(REQUIRE_ENV)
    run_policy.refuse_golden_writes_when_required()  # regenerating locally is allowed


def test_an_empty_parameter_list_fails_at_collection(pytester):
    """With the suite's own setting (pyproject.toml): a glob that matches nothing is an error."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    options = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    pytester.makepyfile(test_probe="import pytest\n\n\n@pytest.mark.parametrize('config', [])\n"
                                   "def test_config(config):\n    pass\n")
    result = pytester.runpytest_inprocess(*ARGS, "-o",
                                          f"empty_parameter_set_mark={options['empty_parameter_set_mark']}")
    assert result.ret == pytest.ExitCode.INTERRUPTED and "Empty parameter set" in result.stdout.str()


def test_ci_requires_the_references():
    ci = (TESTS.parent / ".ci" / "run").read_text()
    assert "export HANDFORMER_REQUIRE_REFERENCES=1" in ci


def test_a_hardware_skip_passes_in_ci_only_where_the_cpu_lacks_the_instructions(monkeypatch):
    """The C kernels' skip ("torch sees no AVX-512 on this CPU") is allowed under REQUIRE only where
    /proc/cpuinfo, read apart from the kernels' own guard, shows no avx512f: a guard that skipped on an
    AVX-512 CPU would still fail CI."""
    reason = "the C kernel cannot be built here: torch sees no AVX-512 on this CPU"
    monkeypatch.setattr(run_policy, "_cpu_flags", lambda: "flags : fpu sse2 avx2 fma")
    assert run_policy.hardware_skip(reason)
    monkeypatch.setattr(run_policy, "_cpu_flags", lambda: "flags : fpu sse2 avx2 avx512f avx512bw")
    assert not run_policy.hardware_skip(reason)
    assert not run_policy.hardware_skip("no GPU here")
