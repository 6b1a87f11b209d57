"""`handformer speedrun shakespeare`: one run is timed from process start and scored exactly as
`handformer eval RUN --data val`; configs that are not the target's task, bf16 on a CPU without
native bf16 and an existing run are one clear error each; every record config is a valid job; the
benchmark's record rule is the documented one."""

import contextlib
import importlib.util
import io
import json
import re
from pathlib import Path

import pytest

from handformer.cli import main
from handformer.speedrun import TARGETS
from handformer.speedrun.common import seconds_since_process_start
from handformer.speedrun.shakespeare import RECORD
from handformer.tasks.job_file import builtin_configs

ROOT = Path(__file__).resolve().parents[1]
RECORDS = [name for name in builtin_configs() if name.startswith("speedrun_shakespeare_")]
TINY = [f"--set={pair}" for pair in ("model.d_model=16", "model.n_heads=2", "model.n_kv_heads=2",
                                      "model.d_ff=32", "model.n_layers=1", "train.steps=4",
                                      "train.eval_every=4", "train.compile=false")]

pytestmark = pytest.mark.usefixtures("one_thread")


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture
def text(tmp_path):
    path = tmp_path / "input.txt"
    path.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 60)
    return path


def speedrun(out, text, *extra, config=RECORD):
    return run_cli("speedrun", "shakespeare", "--config", config, "--out", str(out),
                   "--data", str(text), *TINY, *extra)


def test_a_run_is_timed_from_process_start_and_scored_as_eval_val(tmp_path, text, monkeypatch):
    monkeypatch.chdir(tmp_path)  # another folder than the clone's: the record config ships in the package
    rc, out, err = speedrun(tmp_path / "run", text, "--seed", "3")
    assert rc == 0, err
    result = json.loads((tmp_path / "run" / "speedrun.json").read_text())
    assert result["target"] == "shakespeare" and result["seed"] == 3 and result["steps"] == 4
    # this test process started earlier (wall_s is rounded to 0.01 s, which may round it up)
    assert 0 < result["wall_s"] <= seconds_since_process_start() + 0.01
    assert result["machine"]["cores"] and result["machine"]["torch"]
    rc, printed, _ = run_cli("eval", str(tmp_path / "run"), "--data", "val")
    assert rc == 0 and f"loss {result['loss']:.4f} per token" in printed
    assert f"validation loss {result['loss']:.4f}" in out


def test_the_clock_counts_the_whole_process():
    """A child that waits 0.6 s before it imports the clock: the clock still counts that wait."""
    import subprocess
    import sys

    from helpers import bare_packages

    code = ("import time; time.sleep(0.6)\n" + bare_packages("handformer", "handformer.speedrun")
            + "from handformer.speedrun.common import seconds_since_process_start\n"
            "print(seconds_since_process_start())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          cwd=ROOT, timeout=60)
    assert float(done.stdout) >= 0.6
    assert seconds_since_process_start() > 0

@pytest.mark.parametrize("override, message", [
    ("data.tokenizer=bpe", "tokenizer='bpe' (must be 'char')"),
    ("data.val_fraction=0.2", "val_fraction=0.2 (must be 0.1)"),
])
def test_a_config_of_another_task_is_one_error(tmp_path, text, override, message):
    rc, _, err = speedrun(tmp_path / "run", text, "--set", override)
    assert rc == 2 and err.count("\n") == 1 and message in err and "nanoGPT's split" in err
    assert not (tmp_path / "run").exists()


def test_bf16_on_a_cpu_without_native_bf16_is_one_error(tmp_path, text, monkeypatch):
    from handformer.training import loop

    monkeypatch.setattr(loop, "cpu_has_fast_bf16", lambda: False)
    rc, _, err = speedrun(tmp_path / "run", text, "--set", "train.bf16=true")
    assert rc == 2 and err.count("\n") == 1 and "no native bf16" in err and RECORD in err


def test_an_existing_run_is_kept_unless_overwrite(tmp_path, text):
    assert speedrun(tmp_path / "run", text)[0] == 0
    rc, _, err = speedrun(tmp_path / "run", text)
    assert rc == 2 and "already holds a run" in err and "--overwrite" in err
    assert speedrun(tmp_path / "run", text, "--overwrite")[0] == 0


def test_the_speedrun_group_holds_each_target_in_its_own_subcommand(capsys):
    assert "shakespeare" in TARGETS
    with pytest.raises(SystemExit) as exc:
        main(["speedrun", "no-such-target"])
    assert exc.value.code == 2 and "shakespeare" in capsys.readouterr().err


@pytest.mark.parametrize("config", RECORDS)
def test_every_record_config_is_a_valid_fixed_length_job(config):
    from handformer.speedrun.shakespeare import job_dict
    from handformer.tasks.lm.job import LMJob

    args = type("Args", (), {"config": config, "overrides": {}, "seed": 0, "data": None})()
    job = LMJob.from_dict({k: v for k, v in job_dict(args).items() if k != "task"})
    assert job.train.eval_every >= 1 and job.train.steps >= 100
    assert not job.train.progress  # a progress bar would print into the timed run
    assert job.data.eval_batches == 20


def test_the_default_record_is_the_last_fp32_record():
    assert RECORD in RECORDS and len(RECORDS) == 5


def load_benchmark():
    spec = importlib.util.spec_from_file_location("speedrun_benchmark", ROOT / "benchmarks" / "speedrun.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_row_is_a_record_when_every_seed_beats_the_last_records_mean_within_the_target_loss():
    bench = load_benchmark()

    def runs(walls, losses):
        return [{"wall_s": w, "loss": x} for w, x in zip(walls, losses)]

    rows = {bench.NANOGPT: runs([100, 102, 98], [1.90, 1.90, 1.90]),
            "faster": runs([50, 52, 49, 51, 50], [1.89, 1.90, 1.88, 1.89, 1.90]),
            "one slow seed": runs([40, 41, 55, 40, 40], [1.85] * 5),
            "worse loss": runs([30, 30, 30, 30, 30], [1.95] * 5),
            "bf16 faster": runs([45, 45, 46, 44, 45], [1.895, 1.89, 1.89, 1.90, 1.89]),
            # worse than the last fp32 record (1.892) by more than its SE, yet at nanoGPT's 1.90
            "spends the margin": runs([40, 41, 39, 40, 40], [1.899, 1.90, 1.90, 1.899, 1.90]),
            "over the target": runs([20, 20, 20, 20, 20], [1.905] * 5),
            "three seeds": runs([10, 10, 10], [1.80] * 3)}  # fast and good, but a record needs five
    text, summary = bench.table(rows, {"bf16 faster": True})
    assert [r["record"] for r in summary] == [True, True, False, False, True, True, False, False]
    assert summary[1]["ratio"] == pytest.approx(50.4 / 100)
    assert re.search(r"\| faster \| fp32 \| 5 \| 50\.4 ± 1\.1 \| 0\.50x \| 1\.8920 ± 0\.0084 \| record \|", text)


FIGURES = ROOT / "docs" / "figures" / "speedrun"
RESULTS = FIGURES / "shakespeare.json"  # the latest sitting: the headline record
SITTINGS = sorted(FIGURES.glob("shakespeare*.json"))  # every sitting's table is on the pages
PAGES = {"en": ROOT / "docs" / "speedrun.md", "zh": ROOT / "docs" / "zh" / "speedrun.md"}
ZH_WORDS = {"record": "是", "no": "否"}  # the record column, as the Chinese page writes it


def committed_table(path: Path = RESULTS) -> tuple[str, list[dict]]:
    data = json.loads(path.read_text())
    rows = {r["name"]: r["runs"] for r in data["rows"]}
    return load_benchmark().table(rows, {r["name"]: r["bf16"] for r in data["rows"]})


@pytest.mark.parametrize("lang", list(PAGES))
def test_the_record_table_on_each_page_is_the_committed_runs(lang):
    """Every row of the docs' record tables is what benchmarks/speedrun.py's table() makes of the
    committed runs (docs/figures/speedrun/shakespeare*.json, one file a sitting): means, spreads,
    ratios, records."""
    assert RESULTS in SITTINGS
    page = PAGES[lang].read_text(encoding="utf-8")
    for path in SITTINGS:
        text, _ = committed_table(path)
        ours = [line for line in text.splitlines()[2:] if line.startswith("|")]
        if lang == "zh":
            ours = [re.sub(r"\| (record|no) \|$", lambda m: f"| {ZH_WORDS[m.group(1)]} |", line)
                    for line in ours]
        assert f"docs/figures/speedrun/{path.name}" in page
        for line in ours:
            assert line in page, f"{PAGES[lang].name}: {path.name} gives the row {line!r}"


def test_the_default_is_the_best_fp32_row_of_the_latest_sitting():
    """`handformer speedrun shakespeare` runs the latest sitting's last fp32 record, or, while that
    sitting has none (fewer than five seeds a row), its fastest fp32 row at nanoGPT's loss."""
    _, summary = committed_table()
    fp32 = [r for r in summary[1:] if not r["bf16"]]
    records = [r["name"] for r in fp32 if r["record"]]
    at_target = [r for r in fp32 if r["loss"]["mean"] <= summary[0]["loss"]["mean"]]
    best = records[-1] if records else min(at_target, key=lambda r: r["wall"]["mean"])["name"]
    assert best == RECORD
    for path in SITTINGS:
        data = json.loads(path.read_text())
        assert data["machine"]["cpu"] and data["machine"]["threads"] >= 1


def test_rounds_measured_in_several_sittings_add_up_only_when_measured_alike(tmp_path):
    bench = load_benchmark()
    info = {"cpu": "a CPU", "threads": 1}
    runs = {bench.NANOGPT: [{"wall_s": 100.0, "loss": 1.9, "seed": 1337}],
            "c.toml": [{"wall_s": 30.0, "loss": 1.8, "seed": s} for s in (0, 1, 2)]}
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"machine": info, "device": "cpu",
                                "rows": [{"name": n, "runs": r} for n, r in runs.items()]}))
    assert bench.earlier_runs(path, ["c.toml"], info, "cpu", range(3, 5)) == runs
    for args, message in ((({**info, "threads": 2}, "cpu", range(3, 5)), "another machine, thread count"),
                          ((info, "cuda", range(3, 5)), "another machine, thread count or device"),
                          ((info, "cpu", range(2, 4)), r"already has seed\(s\) \[2\]; start at --first-seed 3")):
        with pytest.raises(SystemExit, match=message):
            bench.earlier_runs(path, ["c.toml"], *args)
    with pytest.raises(SystemExit, match="pass the same --configs"):
        bench.earlier_runs(path, ["other.toml"], info, "cpu", range(3, 5))
