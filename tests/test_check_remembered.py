"""The reference computations a search remembers (check/reference/remembered.py): inside
`remembering()` a call is computed once per distinct key and answered as it is computed outside; an
input written in place is another key; an attention's key holds only the mistakes it reads
(variants.ATTENTION_READS, pinned here against the code of multi_head_attention and what it calls)."""

from __future__ import annotations

import ast
import inspect

import torch

from handformer.check.reference import remembered as R
from handformer.check.reference import variants as V

D, H = 8, 2


def _attention() -> V.MHAWeights:
    g = torch.Generator().manual_seed(0)
    lin = [(torch.randn(D, D, generator=g, dtype=torch.float64), None) for _ in range(4)]
    return V.MHAWeights(*lin, n_heads=H, rope="half")


def _reachable_reads(root: str) -> set[str]:
    """The names `has(flags, name)` asks for in `root` and every function of variants.py it calls."""
    tree = ast.parse(inspect.getsource(V))
    fns = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    seen, todo, reads = set(), [root], set()
    while todo:
        name = todo.pop()
        if name in seen or name not in fns:
            continue
        seen.add(name)
        for node in ast.walk(fns[name]):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                todo.append(node.func.id)
                if node.func.id == "has" and isinstance(node.args[1], ast.Constant):
                    reads.add(node.args[1].value)
    return reads


def test_every_mistake_the_attention_reads_is_in_its_key():
    # norm's mistakes reach it only as QK-norm's, which heads_norm calls with no flags
    norm_reads = _reachable_reads("norm")
    assert _reachable_reads("_multi_head_attention") - norm_reads <= V.ATTENTION_READS
    assert {f.partition(":")[0] for f in V.ROPE_FORMS} <= V.ATTENTION_READS  # read by rotary's intersection


def test_a_remembered_call_answers_as_computed_and_once():
    w, x = _attention(), torch.randn(2, 5, D, dtype=torch.float64)
    keep = torch.ones(5, 5, dtype=torch.bool).tril()[None, None]
    outside = V.multi_head_attention(w, x, x, x, keep, frozenset({"no_scaling"}))[0]
    with R.remembering():
        first = V.multi_head_attention(w, x, x, x, keep, frozenset({"no_scaling", "no_residual:attn"}))[0]
        again = V.multi_head_attention(w, x, x, x, keep, frozenset({"no_scaling", "pre_norm:ffn"}))[0]
        assert first is again  # the layer's own mistakes are not the attention's: one answer
        other = V.multi_head_attention(w, x, x, x, keep, frozenset())[0]
        x.mul_(2)  # written in place: another key, computed again
        doubled = V.multi_head_attention(w, x, x, x, keep, frozenset({"no_scaling"}))[0]
    assert torch.equal(first, outside) and not torch.equal(other, first)
    assert doubled is not first and torch.allclose(doubled, V.multi_head_attention(w, x, x, x, keep, frozenset({"no_scaling"}))[0])
    assert R._memo is None  # forgotten after the block


def test_nothing_is_remembered_outside_a_search():
    w, x = _attention(), torch.randn(2, 5, D, dtype=torch.float64)
    a = V.multi_head_attention(w, x, x, x, None)[0]
    assert a is not V.multi_head_attention(w, x, x, x, None)[0]


def test_a_dataclass_keyed_again_is_found_by_its_id(monkeypatch):
    """A search keys its weights at every call: their fields are read once, later calls find the key by
    the dataclass's id (read again, each call would walk every field)."""
    w, x, read = _attention(), torch.randn(2, 5, D, dtype=torch.float64), []
    is_dataclass = R.dataclasses.is_dataclass
    monkeypatch.setattr(R.dataclasses, "is_dataclass", lambda v: read.append(v) or is_dataclass(v))
    with R.remembering():
        first = V.multi_head_attention(w, x, x, x, None, frozenset({"no_scaling"}))[0]
        again = V.multi_head_attention(w, x, x, x, None, frozenset({"no_scaling"}))[0]
    assert first is again
    assert sum(v is w for v in read) == 1, read


def test_a_flags_form_is_read_from_the_sets_forms_once():
    """has(flags, name): the form ("" for none), None where absent; a frozenset's forms are read once
    and answered from then on (a search asks hundreds of thousands of times), a set or list as well."""
    flags = frozenset({"causal_off_by_one:sees_next", "no_scaling"})
    assert (V.has(flags, "causal_off_by_one"), V.has(flags, "no_scaling"), V.has(flags, "no_residual")) == (
        "sees_next", "", None)
    assert V.has({"pre_norm:ffn"}, "pre_norm") == "ffn" and V.has(["no_scaling"], "no_scaling") == ""
    hits = V._forms.cache_info().hits
    assert V.has(flags, "no_scaling") == "" and V._forms.cache_info().hits == hits + 1


def test_a_layer_search_computes_the_rows_of_each_set_of_mistakes_once(monkeypatch):
    """The rows a set of mistakes leaves visible depend on the layer and the set alone: a search that
    tries the set in every reading of the weights computes them once (a layer with no residual: the
    search reads every setting before it names the mistake)."""
    from pathlib import Path

    from handformer.check.core.engine import check_file
    from handformer.check.runners import layers

    asked, rows = [], layers._search_rows
    monkeypatch.setattr(layers, "_search_rows", lambda lay, inp, flags: asked.append(flags) or rows(lay, inp, flags))
    fixture = Path(__file__).parent / "fixtures" / "learners" / "no_residual.py"
    (layer,) = check_file(str(fixture), only=["encoder_layer"]).components
    assert layer.status == "fail" and "no_residual" in {f.name for f in layer.findings}
    assert len(asked) > 1 and len(asked) == len(set(asked)), asked
