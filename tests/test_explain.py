"""`handformer explain`: every figure is drawn, small, from the real code; the measurements behind
the scaling figure say what the tutorials say; docs/figures holds every figure."""

import contextlib
import io
import math
from pathlib import Path

import pytest
import torch

from handformer.cli import main
from handformer.see.explain import FIGURES, TEMPERATURES, measure_scaling, sample_masks, softmax_at

DOCS_FIGURES = Path(__file__).resolve().parent.parent / "docs" / "figures"


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    out = tmp_path_factory.mktemp("figures")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["explain", "--out", str(out)])
    return rc, buf.getvalue(), out


def test_explain_writes_every_figure(drawn):
    rc, stdout, out = drawn
    assert rc == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{name}.png" for name in FIGURES)
    assert stdout.splitlines() == [f"wrote {out / name}.png" for name in FIGURES]
    for path in out.iterdir():
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        assert width <= 1400 and height <= 800, (path.name, width, height)  # dpi 100
        assert len(data) < 300_000, path.name


def test_the_committed_figures_are_all_there():
    assert sorted(p.name for p in DOCS_FIGURES.glob("*.png")) == sorted(f"{n}.png" for n in FIGURES)


def test_scaling_keeps_softmax_from_saturating():
    m = measure_scaling((4, 64, 1024), n_keys=16, samples=256)
    for d, raw, scaled in zip((4, 64, 1024), m["raw_std"], m["scaled_std"]):
        assert raw == pytest.approx(math.sqrt(d), rel=0.15)  # q.k of unit vectors: std sqrt(d_k)
        assert scaled == pytest.approx(1.0, rel=0.15)
    assert m["max_unscaled"][-1] > 0.9 and m["entropy_unscaled"][-1] < 0.3  # nearly one-hot
    assert max(m["max_scaled"]) < 0.4 and min(m["entropy_scaled"]) > 2.0  # log(16) = 2.77
    assert m["max_unscaled"] == sorted(m["max_unscaled"])  # saturates more as d_k grows


def test_softmax_temperature_endpoints():
    scores = torch.tensor([3.0, 1.5, 1.0])
    assert softmax_at(scores, 0.0).tolist() == [1.0, 0.0, 0.0]
    probs = [softmax_at(scores, t)[0].item() for t in TEMPERATURES]
    assert probs == sorted(probs, reverse=True)  # the top score loses mass as T grows


def test_sample_masks_follow_the_convention():
    batch, masks = sample_masks()
    T = len(batch[0])
    pad = masks["padding"]
    assert pad.shape == (2, T, T) and pad.dtype == torch.bool
    assert pad[0, :, -2:].sum() == 0 and pad[1].all()  # sentence 0 ends in two <pad>
    assert torch.equal(masks["causal"][0], torch.ones(T, T, dtype=torch.bool).tril())
    assert torch.equal(masks["padding & causal"], pad & masks["causal"])
