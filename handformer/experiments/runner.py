"""The shared runner of the experiments: every variant under every seed, then a table and a plot.

An experiment (one file in this folder) names its variants, its metrics and its plots, and trains
one (variant, seed) pair in `run_trial`. The runner interleaves them (seed 0 of every variant, then
seed 1, ...) so that a slow spell of a shared machine hits every variant alike, and writes, into
`out/<name>/`, after every trial (atomically: a crash keeps the trials done so far):

    results.json   settings, every trial's metrics and curves, mean / std / min / max per variant
    results.md     the table: mean +- standard deviation (min .. max) over the seeds
    <name>.png     the overlaid curves: each seed thin, the mean over seeds thick
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from handformer.io import atomic_write, atomic_write_text

REPLOT_SECONDS = 30.0  # during a run the plot is redrawn after a trial at most this often

MIN_SEEDS = 3  # the floor for a full run: a mean and a spread, never one lucky seed
# The models are tiny: a second intra-op thread costs more than it saves on their small matrices,
# and on a machine shared with other jobs it made steps 4-10x slower (measured: 1,015 vs 109 ms a
# step of the dates model at load 8).
DEFAULT_THREADS = 1
DEFAULT_WORKERS = 2  # the command line's default: trials in two processes, one a core


@dataclass
class Metric:
    key: str  # the key in Trial.metrics
    label: str  # the table's column header
    fmt: str = "{:.3f}"  # how one value prints
    percent: bool = False  # stored as a fraction, printed as a percentage
    timing: bool = False  # a time: it varies with the machine and its load, not with the seed


@dataclass
class Plot:
    key: str  # the key in Trial.curves
    title: str
    x_label: str = "step"
    y_label: str = "loss"
    x_marker: float | None = None  # a dashed vertical line (e.g. the training length)
    log_y: bool = False  # a log scale, for losses that end near zero


@dataclass
class Trial:
    """One variant trained under one seed."""

    variant: str
    seed: int
    metrics: dict[str, float]
    curves: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # key -> (x, y)s
    notes: dict[str, str] = field(default_factory=dict)  # e.g. a generated sample
    wall_s: float = 0.0


@dataclass
class SmokeClaim:
    """A direction the seconds-long smoke configuration already shows: `metric` is lower for the
    variant `lower` than for `higher`. Declared only where it held in at least 9 of 10 seeds when
    measured (`python scripts/smoke_claims.py NAME`); `held` keeps that figure. The default test
    run asserts it on seed 0."""

    metric: str
    lower: str
    higher: str
    held: int  # of SMOKE_CLAIM_SEEDS seeds, when measured

    def formula(self) -> str:
        """The claim as both languages' pages print it: `metric`: `lower` < `higher` (held/seeds)."""
        return f"`{self.metric}`: `{self.lower}` < `{self.higher}` ({self.held}/{SMOKE_CLAIM_SEEDS})"

    def describe(self, exp: Experiment) -> str:
        label = next(m.label for m in exp.metrics if m.key == self.metric)
        return f"{label}: {self.lower} < {self.higher} (held in {self.held} of {SMOKE_CLAIM_SEEDS} seeds)"


SMOKE_CLAIM_SEEDS = 10
SMOKE_CLAIM_FLOOR = 9  # of SMOKE_CLAIM_SEEDS: below it, a direction is noise at the smoke scale


@dataclass
class Experiment:
    name: str  # the command's argument: handformer experiment NAME
    title: str
    claim: str  # what the tutorials say, which the experiment measures
    variants: Sequence[str]
    metrics: Sequence[Metric]
    plots: Sequence[Plot]
    run_trial: Callable[[str, int, Any], Trial]  # (variant, seed, settings) -> Trial
    settings: dict[str, Any]  # "full" and "smoke": the experiment's own settings dataclass
    # What the smoke configuration shows (asserted by the default test run), or, with none, why
    # it shows nothing reliable (docs/experiments.md prints the one or the other)
    smoke_claims: Sequence[SmokeClaim] = ()
    no_smoke_claim: str = ""

    def __post_init__(self) -> None:
        if bool(self.smoke_claims) == bool(self.no_smoke_claim):
            raise ValueError(f"experiment {self.name}: declare smoke_claims, or no_smoke_claim with the "
                             "reason the smoke configuration shows nothing reliable (not both)")
        keys = {m.key for m in self.metrics}
        for c in self.smoke_claims:
            if c.metric not in keys or not {c.lower, c.higher} <= set(self.variants):
                raise ValueError(f"experiment {self.name}: smoke claim {c} names an unknown metric "
                                 "or variant")
            if not SMOKE_CLAIM_FLOOR <= c.held <= SMOKE_CLAIM_SEEDS:
                raise ValueError(f"experiment {self.name}: smoke claim {c} held in {c.held} of "
                                 f"{SMOKE_CLAIM_SEEDS} seeds; declare only those that held in at "
                                 f"least {SMOKE_CLAIM_FLOOR}")


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Mean, sample standard deviation, min and max of the finite values, and how many failed
    (NaN or infinite: a run that diverged)."""
    finite = [v for v in values if math.isfinite(v)]
    out = {"n": len(finite), "failed": len(values) - len(finite)}
    if finite:
        out.update(mean=statistics.fmean(finite), min=min(finite), max=max(finite),
                   std=statistics.stdev(finite) if len(finite) > 1 else 0.0)
    return out


def _cell(metric: Metric, stats: dict[str, float]) -> str:
    if not stats.get("n"):
        return f"failed ({stats['failed']})"

    def show(v: float) -> str:
        return f"{metric.fmt.format(100 * v)}%" if metric.percent else metric.fmt.format(v)

    cell = f"{show(stats['mean'])} ± {show(stats['std'])} ({show(stats['min'])} .. {show(stats['max'])})"
    return cell + (f", {stats['failed']} failed" if stats["failed"] else "")


def summary_table(exp: Experiment, trials: Sequence[Trial]) -> tuple[dict, str]:
    """Per-variant statistics of every metric, and the same as a markdown table."""
    stats: dict[str, dict[str, dict[str, float]]] = {}
    header = "| variant | seeds | " + " | ".join(m.label for m in exp.metrics) + " |"
    lines = [header, "|" + "---|" * (len(exp.metrics) + 2)]
    for variant in exp.variants:
        mine = [t for t in trials if t.variant == variant]
        if not mine:
            continue
        stats[variant] = {m.key: summarize([t.metrics.get(m.key, math.nan) for t in mine])
                          for m in exp.metrics}
        cells = [_cell(m, stats[variant][m.key]) for m in exp.metrics]
        lines.append(f"| {variant} | {len(mine)} | " + " | ".join(cells) + " |")
    return stats, "\n".join(lines) + "\n"


def plot_trials(exp: Experiment, trials: Sequence[Trial], path: Path) -> None:
    """One panel per plot; in each, one colour per variant: every seed thin, the mean thick."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(exp.plots)
    cols = min(n, 2)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.2 * cols, 4.2 * rows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, plot in zip(axes.flat, exp.plots):
        for i, variant in enumerate(exp.variants):
            curves = [t.curves[plot.key] for t in trials if t.variant == variant and plot.key in t.curves]
            curves = [c for c in curves if c]
            if not curves:
                continue
            color = colors[i % len(colors)]
            for c in curves:
                ax.plot([x for x, _ in c], [y for _, y in c], color=color, alpha=0.25, linewidth=0.8)
            common = min(len(c) for c in curves)  # a diverged seed stops early
            xs = [x for x, _ in curves[0][:common]]
            mean = [statistics.fmean(c[j][1] for c in curves) for j in range(common)]
            ax.plot(xs, mean, color=color, linewidth=2.0, label=f"{variant} (n={len(curves)})")
        if plot.x_marker is not None:
            ax.axvline(plot.x_marker, color="gray", linestyle="--", linewidth=1)
        if plot.log_y:
            ax.set_yscale("log")
        ax.set_title(plot.title, fontsize=10)
        ax.set_xlabel(plot.x_label)
        ax.set_ylabel(plot.y_label)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    fig.suptitle(exp.title, fontsize=11)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)


def write_results(exp: Experiment, trials: Sequence[Trial], out: Path, info: dict[str, Any],
                  plot: bool = True) -> None:
    """results.json, results.md and (unless plot=False) the plot, each written atomically."""
    stats, table = summary_table(exp, trials)
    info = {**info, "settings": asdict(info["settings"])}
    data = _clean({"experiment": exp.name, "title": exp.title, "claim": exp.claim, **info,
                   "summary": stats, "trials": [asdict(t) for t in trials]})
    atomic_write_text(out / "results.json", json.dumps(data, indent=1, allow_nan=False) + "\n")
    lines = [f"# {exp.title}", "", f"Claim: {exp.claim}", "",
             f"Command: `{info['command']}`", "", table]
    for t in trials:
        for key, note in t.notes.items():
            lines += ["", f"{t.variant}, seed {t.seed}, {key}:", "", "```", note, "```"]
    if "wall_s" in info:
        lines += ["", f"Wall time {info['wall_s']:.0f} s, CPU time {info['cpu_s']:.0f} s, "
                  f"load average {info['load_before']:.1f} before / {info['load_after']:.1f} after "
                  f"({info['workers']} worker process(es) of {info['threads']} torch thread(s), "
                  f"{os.cpu_count()} CPUs)."]
    atomic_write_text(out / "results.md", "\n".join(lines) + "\n")
    if plot:
        plot_trials(exp, trials, out / f"{exp.name}.png")


def _clean(value: Any) -> Any:
    """NaN and infinities (a diverged run) as JSON null, so results.json is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def run_experiment(exp: Experiment, out_dir: str | os.PathLike, seeds: int = MIN_SEEDS,
                   smoke: bool = False, command: str = "", log: Callable[[str], None] = print,
                   threads: int = DEFAULT_THREADS, workers: int = 1) -> dict[str, Any]:
    """Run every variant under seeds 0 .. seeds-1 and write the results into out_dir/<name>/.
    workers > 1 trains that many trials at once in separate processes (each with `threads`
    torch threads); `exp.run_trial` must then be a module-level function. Returns the summary
    (variant -> metric -> statistics)."""
    import torch

    if not isinstance(seeds, int) or seeds < (1 if smoke else MIN_SEEDS):
        raise ValueError(f"seeds={seeds!r} is too few: a full run reports a mean and a spread over "
                         f"at least {MIN_SEEDS} seeds (use --smoke for a quick check)")
    for name, value in (("threads", threads), ("workers", workers)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} is invalid: it must be a positive integer")
    for folder in (Path(out_dir), Path(out_dir) / exp.name):
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"--out: {folder} is a file, not a folder; give a folder for the results")
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _run(exp, out_dir, seeds, smoke, command, log, workers)
    finally:
        torch.set_num_threads(previous_threads)


def timed_trial(run_trial: Callable[[str, int, Any], Trial], variant: str, seed: int,
                settings: Any) -> Trial:
    start = time.perf_counter()
    trial = run_trial(variant, seed, settings)
    trial.wall_s = time.perf_counter() - start
    return trial


def _trials(exp: Experiment, jobs: list[tuple[int, str]], settings: Any, workers: int) -> Iterator[Trial]:
    """The trials of `jobs` ((seed, variant) pairs) as they finish."""
    if workers == 1:
        for seed, variant in jobs:
            yield timed_trial(exp.run_trial, variant, seed, settings)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    import torch

    # spawn, not fork: a forked child of a process whose torch thread pool has started can hang
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                             initializer=torch.set_num_threads, initargs=(torch.get_num_threads(),)) as pool:
        futures = [pool.submit(timed_trial, exp.run_trial, variant, seed, settings) for seed, variant in jobs]
        for future in as_completed(futures):
            yield future.result()


def _run(exp: Experiment, out_dir: str | os.PathLike, seeds: int, smoke: bool, command: str,
         log: Callable[[str], None], workers: int) -> dict[str, Any]:
    import resource

    import torch

    settings = exp.settings["smoke" if smoke else "full"]
    out = Path(out_dir) / exp.name
    info: dict[str, Any] = {"command": command or f"handformer experiment {exp.name}",
                            "scale": "smoke" if smoke else "full", "settings": settings,
                            "seeds": list(range(seeds)), "threads": torch.get_num_threads(),
                            "workers": workers, "torch": torch.__version__}
    jobs = [(seed, variant) for seed in range(seeds) for variant in exp.variants]  # interleaved
    order = {job: i for i, job in enumerate(jobs)}
    trials: list[Trial] = []
    load_before = os.getloadavg()[0]

    def cpu_seconds() -> float:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)  # worker processes, once reaped
        return time.process_time() + children.ru_utime + children.ru_stime

    start, cpu_start = time.perf_counter(), cpu_seconds()
    plotted = start
    for trial in _trials(exp, jobs, settings, workers):
        trials.append(trial)
        trials.sort(key=lambda t: order[(t.seed, t.variant)])
        shown = ", ".join(f"{m.key}={trial.metrics.get(m.key, math.nan):.4g}" for m in exp.metrics)
        log(f"[{exp.name}] {trial.variant} seed {trial.seed}: {shown} ({trial.wall_s:.1f} s)")
        # the plot costs more than a smoke trial: redrawn once REPLOT_SECONDS have passed, and at the end
        replot = time.perf_counter() - plotted >= REPLOT_SECONDS
        write_results(exp, trials, out, info, plot=replot)
        plotted = time.perf_counter() if replot else plotted
    info.update(wall_s=time.perf_counter() - start, cpu_s=cpu_seconds() - cpu_start,
                load_before=load_before, load_after=os.getloadavg()[0])
    write_results(exp, trials, out, info)
    log(f"[{exp.name}] done in {info['wall_s']:.0f} s: {out / 'results.md'}, {out / (exp.name + '.png')}")
    return summary_table(exp, trials)[0]
