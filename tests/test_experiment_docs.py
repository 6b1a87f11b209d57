"""The experiments' pages show what their committed result files hold: every number of every
results table in docs/experiments.md and docs/zh/experiments.md is the committed results.json's
mean, standard deviation, min or max (as rounded on the page), the overview's wall times are the
files' own, and each experiment's smoke claim (or the reason it has none) is printed as declared."""

import json
import re
from pathlib import Path

import pytest

from handformer.experiments import EXPERIMENTS

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "figures" / "experiments"
PAGES = [ROOT / "docs" / "experiments.md", ROOT / "docs" / "zh" / "experiments.md"]

# The metric of each column of an experiment's table on the page (after the variant's name); its
# rows are the experiment's variants, in order.
COLUMNS = {
    "post-vs-pre-norm": ["train_loss", "val_loss", "exact_match"],
    "no-scaling": ["entropy_init", "saturated_init", "entropy", "saturated", "train_loss", "val_loss",
                   "exact_match"],
    "no-positions": ["val_loss", "exact_match", "year", "month", "day", "permutation_gap"],
    "layernorm-vs-rmsnorm": ["val_loss", "step_ms", "norm_us"],
    "activations": ["val_loss", "train_loss", "ffn_params", "step_ms"],
    "no-causal-mask": ["train_loss", "val_as_trained", "val_causal"],
    "positions": ["train_loss", "val_1B", "val_2B", "val_4B"],
    "muon": ["val_loss", "train_loss", "step_ms"],
    "qk-norm": ["val_loss", "train_loss", "step_ms"],
}
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:e-?\d+)?")


def results(name: str) -> dict:
    return json.loads((RESULTS / name / "results.json").read_text())


def sections(page: Path) -> dict[str, str]:
    """Each experiment's section of the page, by the experiment its first paragraph names."""
    found = {}
    for section in page.read_text(encoding="utf-8").split("\n## ")[1:]:
        match = re.search(r"`handformer experiment ([a-z-]+)`", section.split("\n\n|")[0])
        if match and match.group(1) in EXPERIMENTS:
            found[match.group(1)] = section
    return found


def table_rows(text: str) -> list[list[str]]:
    """The body rows of the first table in `text`, as lists of cells."""
    lines = text[text.index("\n|"):].strip().splitlines()
    body = []
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        body.append([c.strip() for c in line.strip("|").split("|")])
    return body


def shown(cell: str) -> list[tuple[float, float]]:
    """(value, half a unit of its last digit) of every number the cell shows."""
    out = []
    for text in NUMBER.findall(cell):
        plain = text.replace(",", "")
        mantissa, _, exponent = plain.partition("e")
        decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
        unit = 10.0 ** (-decimals + (int(exponent) if exponent else 0))
        out.append((float(plain), unit / 2 * 1.001))
    return out


def agrees(cell: str, stats: dict, percent: bool) -> list[str]:
    """What in `cell` does not match `stats` (mean, then std after ±, then min .. max)."""
    numbers = shown(cell)
    keys = ["mean"] + (["std"] if "±" in cell else [])
    keys += ["min", "max"] if ".." in cell else []
    if len(numbers) != len(keys):
        return [f"{cell!r}: {len(numbers)} numbers for {keys}"]
    scale = 100.0 if percent else 1.0
    return [f"{cell!r}: {key} {stats[key] * scale:.6g} is not {value}"
            for (value, tolerance), key in zip(numbers, keys) if abs(stats[key] * scale - value) > tolerance]


@pytest.mark.parametrize("page", PAGES, ids=["en", "zh"])
def test_every_number_in_the_tables_is_the_committed_results(page):
    found = sections(page)
    assert set(found) == set(COLUMNS) == set(EXPERIMENTS), "an experiment without its section"
    problems = []
    for name, columns in COLUMNS.items():
        exp, data = EXPERIMENTS[name], results(name)
        rows = table_rows(found[name])
        assert len(rows) == len(exp.variants), f"{name}: {len(rows)} rows for {len(exp.variants)} variants"
        percent = {m.key: m.percent for m in exp.metrics}
        for variant, row in zip(exp.variants, rows):
            assert len(row) == len(columns) + 1, f"{name}: row {row[0]!r} has {len(row) - 1} columns"
            for key, cell in zip(columns, row[1:]):
                problems += [f"{name}, {variant}, {key}: {p}"
                             for p in agrees(cell, data["summary"][variant][key], percent[key])]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=["en", "zh"])
def test_the_overview_shows_each_runs_own_wall_time(page):
    text = page.read_text(encoding="utf-8")
    for name in EXPERIMENTS:
        row = next(line for line in text.splitlines() if line.startswith("|")
                   and f"`handformer experiment {name}`" in line)
        wall = round(results(name)["wall_s"])
        assert re.search(rf"\| {wall} s \|", row), f"{name}: the overview does not show {wall} s: {row}"


def test_the_committed_results_are_full_runs_of_three_seeds_without_failures():
    for name, exp in EXPERIMENTS.items():
        data = results(name)
        assert data["scale"] == "full" and data["seeds"] == [0, 1, 2], name
        assert [t["variant"] for t in data["trials"]] == [v for _ in range(3) for v in exp.variants], name
        for variant, metrics in data["summary"].items():
            for key, stats in metrics.items():
                assert stats["n"] == 3 and stats["failed"] == 0, (name, variant, key)


@pytest.mark.parametrize("page", PAGES, ids=["en", "zh"])
def test_each_section_prints_its_smoke_claim_or_the_reason_it_has_none(page):
    found = sections(page)
    zh = "/zh/" in str(page)
    for name, exp in EXPERIMENTS.items():
        claim_lines = [line for line in found[name].splitlines()
                       if line.startswith("冒烟声明" if zh else "Smoke claim")]
        assert len(claim_lines) == 1, f"{name}: {len(claim_lines)} smoke-claim lines"
        for claim in exp.smoke_claims:
            assert claim.formula() in claim_lines[0], f"{name}: {claim.formula()} not on the page"
        if not exp.smoke_claims:
            reason = exp.no_smoke_claim[0].upper() + exp.no_smoke_claim[1:]
            assert ("无。" in claim_lines[0]) if zh else (f"none. {reason}." in claim_lines[0]), name


def readme_row(readme: Path, name: str) -> str:
    return next(line for line in readme.read_text(encoding="utf-8").splitlines()
                if line.startswith(f"| `{name}` |"))


@pytest.mark.parametrize("readme", [ROOT / "README.md", ROOT / "README.zh.md"], ids=["en", "zh"])
def test_the_readme_experiment_table_is_the_committed_results(readme):
    """The README's summary of three experiments, number by number, from the committed results."""
    def mean(name: str, variant: str, key: str) -> float:
        return 100 * results(name)["summary"][variant][key]["mean"]

    def percents(row: str) -> list[float]:
        return [float(n) for n in re.findall(r"(\d+)%", row)]

    post = [100 * results("post-vs-pre-norm")["summary"][f"post, 6+6, {w}"]["exact_match"][end]
            for w in ("warmup", "no warmup") for end in ("min", "max")]  # every seed's
    pre = [mean("post-vs-pre-norm", f"pre, 6+6, {w}", "exact_match") for w in ("warmup", "no warmup")]
    row = readme_row(readme, "post-vs-pre-norm")
    assert "12" in row and re.search(r"0-2%", row) and re.search(r"54-65%", row), row
    assert all(0 <= m <= 2.5 for m in post) and abs(min(pre) - 54) <= 0.5 and abs(max(pre) - 65) <= 0.5, (post, pre)
    row = readme_row(readme, "no-scaling")
    saturated = mean("no-scaling", "unscaled", "saturated_init")
    exact = [mean("no-scaling", v, "exact_match") for v in ("unscaled", "scaled (1/sqrt(d_k))")]
    for shown, value in zip(percents(row), [saturated, *exact]):
        assert abs(shown - value) <= 0.5, (row, shown, value)
    assert len(percents(row)) == 3
    norms = results("layernorm-vs-rmsnorm")["summary"]
    assert abs(norms["RMSNorm"]["val_loss"]["mean"] - norms["LayerNorm"]["val_loss"]["mean"]) < 0.01  # the same loss
    assert norms["RMSNorm"]["step_ms"]["mean"] > norms["LayerNorm"]["step_ms"]["mean"]  # slower here
