"""`handformer check` finds free functions by what they do, whatever their name: a generation loop,
a filter, a sampler, greedy choice, temperature, a training step, an encoder-decoder's greedy decoder
(signatures.py); a function that is none of these (dropout, softmax, a data helper) is left alone,
and a function whose name says one kind but whose arguments and output say another is checked as
what it does."""

from __future__ import annotations

import pytest

from handformer.check.core.discovery import find_components
from handformer.check.core.engine import check_file, import_learner
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")

FREE = '''
import torch
import torch.nn.functional as F


def generate_text_simple(model, idx, max_new_tokens, context_size):
    for _ in range(max_new_tokens):
        logits = model(idx[:, -context_size:])[:, -1, :]
        idx = torch.cat((idx, logits.argmax(-1, keepdim=True)), dim=1)
    return idx


def translate(model, src, src_mask, max_len, start_symbol):
    return src


def nucleus(logits, p=0.9):
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    probs = F.softmax(sorted_logits, dim=-1)
    drop = probs.cumsum(-1) - probs > p
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))


def keep_best(logits, k):
    v, _ = torch.topk(logits, min(k, logits.size(-1)))
    return logits.masked_fill(logits < v[..., -1:], float("-inf"))


def draw(probs, p):
    return torch.multinomial(probs, 1)


def pick(logits):
    return logits.argmax(-1)


def cool(logits, temperature):
    return logits / temperature


def update(model, batch, optimizer, criterion):
    return 0.0


def sample_top_p(logits, p):  # named a sampler, returns filtered logits: a filter
    return nucleus(logits, p)


def greedy_decode(model, idx, max_new_tokens):  # named the encoder-decoder's, takes a prompt: a loop
    return generate_text_simple(model, idx, max_new_tokens, 8)


def dropout(x, p):
    return x * (torch.rand_like(x) > p) / (1 - p)


def softmax(x):
    return x.exp() / x.exp().sum(-1, keepdim=True)


def evaluate_model(model, train_loader, val_loader, device, eval_iter):
    return 0.0


def text_to_token_ids(text, tokenizer):
    return tokenizer.encode(text)
'''


def test_free_functions_are_found_by_what_they_do(tmp_path):
    path = tmp_path / "free.py"
    path.write_text(FREE)
    found = {c.name: (c.kind, c.found_by) for c in find_components(import_learner(str(path)))}
    assert found == {
        "generate_text_simple": ("generate", "signature"), "translate": ("greedy_decode", "signature"),
        "nucleus": ("top_p", "signature"), "keep_best": ("top_k", "signature"), "draw": ("sample", "signature"),
        "pick": ("greedy", "signature"), "cool": ("temperature", "signature"), "update": ("train_step", "signature"),
        "sample_top_p": ("top_p", "name"), "greedy_decode": ("generate", "name")}


FILTER = '''
import torch


def nucleus(logits, p):
    probs = torch.softmax(logits, -1)
    sorted_probs, order = probs.sort(-1, descending=True)
    drop = sorted_probs.cumsum(-1) > p{plant}
    return logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
'''


def test_a_filter_found_by_what_it_does_is_graded_and_its_mistake_named(tmp_path):
    """The plain nucleus rule found by its call; with the token that crosses p dropped (cum > p
    instead of the mass above it), it FAILs as top_p_drops_crossing."""
    right = tmp_path / "right.py"
    right.write_text(FILTER.format(plant="\n    drop[..., 1:] = drop[..., :-1].clone()\n    drop[..., 0] = False"))
    (comp,) = check_file(str(right)).components
    assert (comp.kind, comp.status) == ("top_p", "pass"), format_report(check_file(str(right)))
    assert any("by what it does" in n["en"] for n in comp.notes)
    wrong = tmp_path / "wrong.py"
    wrong.write_text(FILTER.format(plant=""))
    result = check_file(str(wrong))
    assert result.components[0].status == "fail"
    assert "top_p_drops_crossing" in [f.name for f in result.components[0].findings], format_report(result)


def test_a_filter_object_python_cannot_hash_is_probed_not_refused():
    """A callable dataclass (eq=True, so no __hash__) as a filter: probed each time, never a TypeError."""
    import dataclasses

    from handformer.check.core.signatures import rows_apart, takes_one_row

    @dataclasses.dataclass
    class TopK:
        k: int = 2

        def __call__(self, logits):
            cut = logits.topk(self.k, dim=-1).values[..., -1:]
            return logits.masked_fill(logits < cut, float("-inf"))

    assert takes_one_row(TopK()) is False
    assert rows_apart(TopK()) is False
