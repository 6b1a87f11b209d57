"""What the reference has no place for: a component that departs while it holds state or is handed
settings that check mapped to nothing (a settings object's Mirostat tau, an MoE's selection-only bias)
computes something the reference cannot express, so its difference is no evidence of a mistake: NOT
CHECKED, with the reason naming them, never FAIL. A catalogued mistake found in it still FAILs. Where
it matches, the report says what was left unchecked.
"""

from __future__ import annotations

import itertools
import operator
import re
from collections.abc import Iterable
from typing import Any

from torch import nn

from handformer.check.core.built_masks import CAUSAL_BUILT
from handformer.check.core.moe import moe_parts
from handformer.check.core.result import (
    DEPARTS,
    FAIL,
    NOT_CHECKED,
    PASS,
    Check,
    ComponentResult,
    Finding,
    LearnerError,
    Text,
    text,
)
from handformer.check.core.source import first_line, functions_called, methods_called, source_lines
from handformer.check.core.weights import Leaf, Slot, leaves, of_kind, shapes_text

NOWHERE = Finding("", text("", ""))  # a departure with no line


def held_words(held: list[Leaf], reference: Text) -> list[Text]:
    """What the reference has no place for, said: the learner's parameters that no reference weight
    took, named with their shapes, and whether they are inert or live (`_live`); none: nothing."""
    said = text(f"it holds {shapes_text(held)}, which handformer's {reference['en']} has not",
                f"它有 {shapes_text(held)}，handformer 的{reference['zh']}没有这些参数")
    return [{**said, HELD: ("inert", "live")[any(map(_live, held))]}] * bool(held)


# checks that read no reference (a Unigram tokenizer's encode against its own pieces' scores: unigram.py)
FREE = ("causality", "eval mode is deterministic", "padding invariance", "by its own scores", "round trip",
        "its loss is the cross-entropy of its own logits")
FREE_FORM = "reference-free"  # the form of a finding of a property every correct one has (lm_properties.py)
HELD = "held"  # a key of what is held as built: "inert" at ones and zeros, "live" at other values, "term"
# a linear layer no role took


def _live(leaf: Leaf) -> bool:
    """Whether a held parameter is at values that take part in what the component computes: any but
    ones and zeros (nanochat's residual scalars as built, a table held at zero: the reference's
    computation, so a departure is theirs); at nGPT's 0.05, or a head's temperature of 2, a mistake's
    variant may match by chance (the scale sqrt(d_k) = 2 left out)."""
    w = leaf.weight.detach()
    return bool(((w != 0) & (w != 1)).any())


def held_apart(module: nn.Module, taken: Iterable[Slot], reference: Text) -> list[Text]:
    """The parameters of a component's own that its mapping onto the reference left untaken (nGPT's
    scaling vectors, a learned per-head temperature; gpt-oss's sinks are taken), said as held_words;
    and its linear layers that no role took (`term_words`). Bare parameters are read among those of a
    module that holds layers; a reading that consumed a layer (a fused qkv, split heads, a tied head)
    took it. A top-k of its scores (top_k_words) is said too."""
    ids = _ids(taken)
    return held_words(_untaken(module, "scalar", ids), reference) + linear_terms(
        module, _untaken(module, "linear", ids), reference) + top_k_words(module, reference)


def learned_terms(module: nn.Module, taken: Iterable[Slot], reference: Text, also: Iterable[Any] = ()
                  ) -> list[Text]:
    """`term_words` of the linear layers of `module` that neither the slots `taken` nor the weights
    `also` (a model's embedding and head) hold."""
    return linear_terms(module, _untaken(module, "linear", _ids(taken) | set(map(id, also))), reference)


def _ids(taken: Iterable[Slot]) -> set[int]:
    return set(map(id, itertools.chain.from_iterable((*s.leaf.tensors(), s.leaf.bias) for s in taken)))


def _untaken(module: nn.Module, kind: str, ids: set[int]) -> list[Leaf]:
    """Its leaves of `kind` none of whose tensors `ids` holds; heads kept one by one (a leaf of parts)
    are the attention's projections, read by the heads' mapping wherever it is taken, and a mixture of
    experts' router, shared gate and experts are its reading's (moe.py)."""
    experts = {id(m) for sub in module.modules() if moe_parts(sub) is not None for m in sub.modules()}
    return [leaf for leaf in of_kind(leaves(module), kind) if id(leaf.module) not in experts
            and leaf.parts is None and not ids & set(map(id, leaf.tensors()))]


def linear_terms(module: nn.Module, linears: list[Leaf], reference: Text) -> list[Text]:
    """`term_words` of the learner's linear layers that no role of the reference took (a forget gate, a
    router that picks the tokens a block sees, an extra projection), each named with its shape and the
    line that reads it."""
    read = [(f"{leaf.name} {tuple(leaf.weight.shape)}", *_read_at(module, leaf)) for leaf in linears]
    return term_words(read, reference)


def term_words(read: list[tuple[str, str, str]], reference: Text) -> list[Text]:
    """What the reference has no place for, said: parts of the learner's, each (name and shape, where it
    is read in English, in Chinese). A learned term feeds what the component computes, so an unnamed
    departure is no evidence; a named mistake stands (HELD "term")."""
    en, zh = "; ".join(name + at for name, at, _ in read), "；".join(name + at for name, _, at in read)
    return [{**text(f"it computes a learned term with {en}, which handformer's {reference['en']} has not",
                    f"它用 {zh} 算了一个可学习的项，handformer 的{reference['zh']}没有这一项"),
             HELD: "term"}] * bool(read)


def top_k_words(module: nn.Module, reference: Text) -> list[Text]:
    """A selection the reference has not: a top-k in the forward of one of the learner's modules inside
    `module`, or in a function or method it calls, outside a mixture of experts (its router's top-k is
    the MoE's reading): the keys each query attends to chosen by a score (MoBA's blocks, a sparse
    attention's indexer), said with its first line. At lengths where it keeps every key the component
    computes the reference's attention; past them, its departure is no evidence (HELD "term")."""
    experts = {id(m) for sub in module.modules() if moe_parts(sub) is not None for m in sub.modules()}
    learners = {id(sub): type(sub).forward for sub in module.modules()
                if type(sub).__module__.startswith("learner_")}
    forwards = [forward for i, forward in learners.items() if i not in experts]
    called = [f for fn in forwards for f in (*functions_called(fn), *methods_called(fn))]
    n, code = first_line((TOP_K,), source_lines([*forwards, *called]))
    return [{**text(f"it keeps a top-k of its scores at line {n}: {code} (the keys or blocks each query "
                    f"attends to, chosen by score), which handformer's {reference['en']} has not",
                    f"它在第 {n} 行保留分数的 top-k：{code}（按分数选出每个查询要看的键或块），"
                    f"handformer 的{reference['zh']}没有这一步"), HELD: "term"}] * bool(n)


TOP_K = r"\btopk\s*\("  # torch.topk(scores, k) or scores.topk(k)


def _read_at(module: nn.Module, leaf: Leaf) -> tuple[str, str]:
    """Where its owner's forward first reads the layer, said in English and Chinese ("" where it is
    not found)."""
    owner_path, _, attr = leaf.name.rpartition(".")
    lines = source_lines([getattr(type(module.get_submodule(owner_path)), "forward", None)])
    reads = re.compile(rf"\.{re.escape(attr)}\b")
    found = [(n, code.split("#")[0].strip()) for n, code in lines if reads.search(code)]
    said = [(f", read at line {n}: {code}", f"（第 {n} 行读取它：{code}）") for n, code in found]
    return next(iter(said), ("", ""))


def _causal(check: Check) -> bool:
    return check.name["en"].startswith("causality")


def free_failed(result: ComponentResult) -> list[Check]:
    """The failed checks of the result that read no reference (FREE): no setting the reference lacks
    explains them."""
    return list(filter(lambda c: not c.ok and c.name["en"].startswith(FREE), result.checks))


def settle(result: ComponentResult, unmapped: list[Text]) -> None:
    """A FAIL with nothing named, of a component that holds what the reference has no place for: NOT
    CHECKED, the line where it parts from the reference said in the reason; a PASS: said what was not
    checked. Parameters held at ones and zeros leave the reference's computation as it is: a FAIL
    stands. Held at other values, a mistake's name is no evidence either. A reference-free check that
    failed (causality, determinism) FAILs whatever the reference lacks, its findings (FREE_FORM) kept."""
    if not unmapped:
        return
    free, kept = free_failed(result), [f for f in result.findings if f.form == FREE_FORM]
    weights = {u.get(HELD) for u in unmapped}  # None: settings, state, what else feeds it
    en, zh = ("; ".join(map(operator.itemgetter(lang), unmapped)) for lang in ("en", "zh"))
    if result.status == PASS:
        result.notes.append(text(f"checked as it is built and given here; {en}: not checked at other values",
                                 f"按这里的构造和输入检查；{zh}：其他取值没有检查"))
    if result.status == FAIL and "live" in weights:  # a name a held value may explain
        result.findings = [f for f in result.findings if f.name == DEPARTS or f in kept]
    if (result.status, bool(result.named())) != (FAIL, False) or weights == {"inert"}:  # as it is
        return
    first = next(iter(result.findings), NOWHERE)
    # a departure from what cannot express it is no evidence; a mask its builder made that keeps a later
    # key is, where causality failed (judged by what it keeps, not by the reference: see built_masks.py)
    built = [*filter(lambda f: f.form == CAUSAL_BUILT, result.findings)] * any(map(_causal, free))
    result.findings, result.max_abs_error = [*kept, *filter(lambda f: f not in kept, built)], None
    result.checks = [c for c in result.checks if c.ok or c in free]
    if not free:  # else it fails a check of its own: FAIL on that alone
        _cannot_express(result, en, zh, first)


def _cannot_express(result: ComponentResult, en: str, zh: str, first: Finding) -> None:
    shown = first.line is not None  # where it parts, as its departure quotes it
    result.status = NOT_CHECKED
    result.error = LearnerError(
        "mapping", f"{result.name} computes something handformer's reference cannot express: {en}; it "
        f"parts from the reference{f' at line {first.line}: {first.code}' * shown}, which says nothing about "
        "whether it is right (an adapter that sets them to values the reference has, or leaves them out, "
        "lets check grade it)", "",
        message_zh=f"{result.name} 算的东西 handformer 的参考实现表达不了：{zh}；它与参考实现不同"
        f"{f'（第 {first.line} 行：{first.code}）' * shown}，这说明不了它对不对（写一个适配函数，"
        "把这些设置成参考实现有的取值，或者去掉它们，检查程序就能判断）")
