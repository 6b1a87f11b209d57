"""`handformer experiment`: every experiment runs end to end in its smoke configuration (the full
runs are slow-marked), the lesson-only switches do exactly what they claim, and the runner's
statistics and files are right."""

import contextlib
import io
import json
import math
import os
from pathlib import Path

import pytest
import torch

from handformer.cli import main
from handformer.config import CausalLMConfig
from handformer.experiments import EXPERIMENTS, get_experiment, runner
from handformer.experiments.activations import hidden_width
from handformer.experiments.no_causal_mask import logits_without_mask
from handformer.experiments.no_positions import permutation_gap
from handformer.experiments.no_scaling import remove_scaling
from handformer.experiments.runner import (
    Experiment,
    Metric,
    Plot,
    SmokeClaim,
    Trial,
    run_experiment,
    summarize,
)
from handformer.experiments.workloads import DatesSettings, dates_data, dates_model
from handformer.models.causal_lm import CausalLM
from handformer.nn.attention import MultiHeadAttention

pytestmark = pytest.mark.usefixtures("one_thread")
RESULTS = Path(__file__).resolve().parents[1] / "docs" / "figures" / "experiments"


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_each_experiment_runs_in_its_smoke_configuration(name, tmp_path):
    """Seed 0 of the smoke configuration: the files, and each declared smoke claim's direction."""
    exp = EXPERIMENTS[name]
    summary = run_experiment(exp, tmp_path, seeds=1, smoke=True, log=lambda _: None)
    assert list(summary) == list(exp.variants)
    out = tmp_path / name
    data = json.loads((out / "results.json").read_text())  # strict JSON: NaN would fail here
    assert data["scale"] == "smoke" and len(data["trials"]) == len(exp.variants)
    for trial in data["trials"]:
        assert trial["wall_s"] > 0
        assert any(trial["curves"].values()), f"{name}: {trial['variant']} recorded no curve"
    table = (out / "results.md").read_text()
    for variant in exp.variants:
        assert f"| {variant} |" in table
    assert (out / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    for claim in exp.smoke_claims:
        low, high = (summary[v][claim.metric]["mean"] for v in (claim.lower, claim.higher))
        assert low < high, f"{name}: {claim.describe(exp)} failed on seed 0: {low} >= {high}"
    assert exp.smoke_claims or len(exp.no_smoke_claim) > 20


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_each_experiment_full_run_reproduces_its_committed_results(name, tmp_path):
    """The full configuration with three seeds, as the committed results were made (minutes each):
    no seed diverges, and every metric that is not a time lands within a seed's spread (one
    standard deviation, at least 1%) of the committed mean."""
    exp = EXPERIMENTS[name]
    summary = run_experiment(exp, tmp_path, seeds=3, log=lambda _: None, workers=2)
    committed = json.loads((RESULTS / name / "results.json").read_text())["summary"]
    problems = []
    for variant in exp.variants:
        for metric in exp.metrics:
            ours, theirs = summary[variant][metric.key], committed[variant][metric.key]
            if ours["n"] != 3 or ours["failed"]:
                problems.append(f"{variant}, {metric.key}: {ours['failed']} of 3 seeds failed")
            elif not metric.timing and abs(ours["mean"] - theirs["mean"]) > max(
                    theirs["std"], 0.01 * abs(theirs["mean"]), 1e-9):
                problems.append(f"{variant}, {metric.key}: mean {ours['mean']:.6g}, committed "
                                f"{theirs['mean']:.6g} ± {theirs['std']:.3g}")
    assert not problems, f"{name}:\n" + "\n".join(problems)


def test_the_greedy_samples_fit_in_the_models_positions():
    from handformer.experiments import no_causal_mask

    for settings in (no_causal_mask.FULL, no_causal_mask.SMOKE):
        assert settings.prompt_chars + settings.sample_chars <= settings.model.max_positions


def test_cli_lists_the_experiments_and_rejects_bad_input(tmp_path):
    rc, out, _ = run_cli("experiment", "list")
    assert rc == 0
    for name in EXPERIMENTS:
        assert name in out
    rc, _, err = run_cli("experiment", "no-such-thing")
    assert rc == 2 and err.startswith("error: unknown experiment 'no-such-thing'")
    rc, _, err = run_cli("experiment", "positions", "--seeds", "2", "--out", str(tmp_path))
    assert rc == 2 and "at least 3 seeds" in err and err.count("\n") == 1
    (tmp_path / "a_file").write_text("x")
    for bad in (["--out", str(tmp_path / "a_file")], ["--workers", "0"], ["--threads", "0"]):
        rc, _, err = run_cli("experiment", "activations", "--smoke", *bad)
        assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    with pytest.raises(ValueError, match="unknown experiment"):
        get_experiment("nope")


def test_cli_runs_an_experiment_and_names_its_command(tmp_path):
    """In this process (`--workers 1`); the worker processes of the default `--workers 2` are the
    next test's."""
    rc, out, _ = run_cli("experiment", "layernorm-vs-rmsnorm", "--smoke", "--seeds", "1", "--workers", "1",
                         "--out", str(tmp_path))
    assert rc == 0 and "results.md" in out
    data = json.loads((tmp_path / "layernorm-vs-rmsnorm" / "results.json").read_text())
    assert data["command"] == (f"handformer experiment layernorm-vs-rmsnorm --out {tmp_path} --seeds 1 "
                               "--workers 1 --smoke")
    assert data["wall_s"] > 0 and data["cpu_s"] > 0 and data["workers"] == 1


def test_workers_run_each_trial_in_a_spawned_process_on_the_parents_threads(tmp_path):
    """workers > 1 (the command's default is 2): every trial runs in a worker process started for
    the run, which computes on as many torch threads as the parent; its metrics and curves come
    back into the parent's results. One trial, so one worker is started (a second costs a torch
    import and proves nothing more)."""
    from helpers import NoSettings, trial_telling_where_it_ran

    exp = Experiment("where", "where a trial runs", "a claim", ["only"], [Metric("pid", "pid"),
                     Metric("threads", "threads")], [Plot("train", "training loss")], trial_telling_where_it_ran,
                     {"full": NoSettings(), "smoke": NoSettings()}, no_smoke_claim="it trains nothing at all")
    summary = run_experiment(exp, tmp_path, seeds=1, smoke=True, log=lambda _: None, workers=2)
    assert summary["only"]["pid"]["n"] == 1 and summary["only"]["pid"]["mean"] != os.getpid()
    assert summary["only"]["threads"]["mean"] == torch.get_num_threads()
    data = json.loads((tmp_path / "where" / "results.json").read_text())
    assert data["workers"] == 2 and data["trials"][0]["curves"]["train"] == [[1, 1.0], [2, 0.5]]


def test_summarize_counts_diverged_runs_apart():
    stats = summarize([1.0, 3.0, math.nan, 2.0])
    assert stats == {"n": 3, "failed": 1, "mean": 2.0, "min": 1.0, "max": 3.0, "std": 1.0}
    assert summarize([math.inf]) == {"n": 0, "failed": 1}


def fake_experiment() -> Experiment:
    """Two variants, one of which diverges; a trial takes no time."""
    def run_trial(variant, seed, settings):
        loss = math.nan if variant == "diverges" else 1.0 + seed
        return Trial(variant, seed, {"loss": loss}, {"train": [(1, 2.0), (2, loss)]})

    from dataclasses import dataclass

    @dataclass
    class Settings:
        steps: int = 1

    return Experiment("fake", "a fake experiment", "a claim", ["fine", "diverges"],
                      [Metric("loss", "loss")], [Plot("train", "training loss")], run_trial,
                      {"full": Settings(), "smoke": Settings()}, no_smoke_claim="a fake shows nothing")


def test_runner_writes_strict_json_and_marks_failed_runs(tmp_path):
    summary = run_experiment(fake_experiment(), tmp_path, seeds=3, log=lambda _: None)
    assert summary["fine"]["loss"]["mean"] == 2.0 and summary["diverges"]["loss"]["failed"] == 3
    data = json.loads((tmp_path / "fake" / "results.json").read_text())
    assert data["trials"][1]["metrics"]["loss"] is None
    assert "| diverges | 3 | failed (3) |" in (tmp_path / "fake" / "results.md").read_text()


@pytest.mark.parametrize("replot_seconds, plots", [(30.0, 1), (0.0, 3)])
def test_results_after_every_trial_the_plot_when_replot_seconds_passed_and_at_the_end(
        tmp_path, monkeypatch, replot_seconds, plots):
    """An interrupted run keeps every finished trial in results.json and results.md; the plot, which
    takes longer to draw than a smoke trial takes to train, is redrawn only once REPLOT_SECONDS have
    passed since the last one, and once at the end."""
    written, drawn = [], []
    write_text, plot_trials = runner.atomic_write_text, runner.plot_trials

    def record_text(path, text):
        written.append(Path(path).name)
        return write_text(path, text)

    def record_plot(exp, trials, path):
        drawn.append(len(trials))
        return plot_trials(exp, trials, path)

    monkeypatch.setattr(runner, "atomic_write_text", record_text)
    monkeypatch.setattr(runner, "plot_trials", record_plot)
    monkeypatch.setattr(runner, "REPLOT_SECONDS", replot_seconds)
    run_experiment(fake_experiment(), tmp_path, seeds=1, smoke=True, log=lambda _: None)
    assert written == ["results.json", "results.md"] * 3  # after each of the 2 trials, and at the end
    assert len(drawn) == plots and drawn[-1] == 2
    assert (tmp_path / "fake" / "fake.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("declared, message", [
    ({}, "declare smoke_claims, or no_smoke_claim"),
    ({"smoke_claims": [SmokeClaim("loss", "a", "b", held=10)], "no_smoke_claim": "why"}, "not both"),
    ({"smoke_claims": [SmokeClaim("accuracy", "a", "b", held=10)]}, "unknown metric or variant"),
    ({"smoke_claims": [SmokeClaim("loss", "a", "c", held=10)]}, "unknown metric or variant"),
    ({"smoke_claims": [SmokeClaim("loss", "a", "b", held=8)]}, "held in 8 of 10 seeds"),
])
def test_a_smoke_claim_is_declared_only_as_measured(declared, message):
    with pytest.raises(ValueError, match=message):
        Experiment("fake", "a fake experiment", "a claim", ["a", "b"], [Metric("loss", "loss")], [],
                   lambda *_: None, {}, **declared)


def test_remove_scaling_gives_softmax_of_unscaled_scores():
    torch.manual_seed(0)
    attn = MultiHeadAttention(d_model=32, n_heads=2)
    x = torch.randn(2, 5, 32)
    remove_scaling(attn)
    _, weights = attn(x, need_weights=True)  # (B, H, T, T)
    q = attn.split_heads(torch.nn.functional.linear(x, attn.q_proj.weight, attn.q_proj.bias), 2)
    k = attn.split_heads(attn.k_proj(x), 2)
    expected = torch.softmax(q @ k.transpose(-2, -1), dim=-1)  # no 1/sqrt(d_k)
    torch.testing.assert_close(weights, expected)


def test_logits_without_mask_see_the_future():
    torch.manual_seed(0)
    # One layer: with two, the last position reads earlier positions' layer-1 outputs, which
    # without the mask already saw the future.
    model = CausalLM(CausalLMConfig(vocab_size=20, d_model=16, n_heads=2, d_ff=32, n_layers=1, dropout=0.0,
                                    max_positions=16)).eval()
    ids = torch.randint(0, 20, (1, 8))
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % 20
    with torch.no_grad():
        # The last position sees every token either way: the two paths agree there.
        torch.testing.assert_close(logits_without_mask(model, ids)[:, -1], model(ids).logits[:, -1])
        # Changing the last token moves the earlier positions' logits only without the mask.
        assert torch.equal(model(ids).logits[:, :-1], model(changed).logits[:, :-1])
        assert not torch.allclose(logits_without_mask(model, ids)[:, :-1],
                                  logits_without_mask(model, changed)[:, :-1])


def test_without_positions_the_encoder_cannot_see_order():
    data = dates_data(300, 8)
    blind = dates_model(DatesSettings(d_model=16, n_heads=2, d_ff=32, n_layers=1, position="none"), data, 0)
    seeing = dates_model(DatesSettings(d_model=16, n_heads=2, d_ff=32, n_layers=1), data, 0)
    assert permutation_gap(blind, data) < 1e-5
    assert permutation_gap(seeing, data) > 1e-2


def test_swiglu_width_keeps_the_parameters_equal():
    for d_model in (64, 96, 512):
        plain = 2 * d_model * 4 * d_model
        gated = 3 * d_model * hidden_width("swiglu", 4 * d_model)
        assert abs(gated - plain) / plain < 0.01
    assert hidden_width("relu", 256) == 256
