"""What every runner needs: the sizes the learner's components are built with, the learner's file
and components, building and calling their modules, and turning search results into findings.

Shape legend: B batch, T query length, S key length, D d_model, H heads, F FFN width.
"""

from __future__ import annotations

import inspect
import math
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from handformer.check import fingerprint as fp
from handformer.check.discovery import Component, build, own_objects
from handformer.check.result import Check, ComponentResult, Finding, Text, text
from handformer.check.source import locate, source_lines
from handformer.check.weights import scramble_
from handformer.nn.masks import causal_mask

D, H, F_WIDTH, DROPOUT, MAX_LEN = 16, 4, 40, 0.1, 64
SIZES = {"d_model": D, "n_heads": H, "d_ff": F_WIDTH, "dropout": DROPOUT, "max_len": MAX_LEN}
TUTORIAL = {"d_model": 512, "n_heads": 8, "d_ff": 2048, "dropout": DROPOUT, "max_len": 128}

ATTENTION_FLAGS = ("no_scaling", "scale_by_dk", "softmax_wrong_dim:-2", "softmax_wrong_dim:1",
                   "mask_inverted", "mask_after_softmax:zero", "mask_after_softmax:neg")
HEAD_FLAGS = ("split_no_transpose", "concat_no_transpose", "no_output_projection", "kv_swapped")
MASK_FLAGS = ("mask_inverted", "mask_after_softmax")


@dataclass
class Context:
    path: str
    module: types.ModuleType
    components: dict[str, Component]
    convention: str | None = None  # forced by --mask-convention; None = detect
    learner: fp.Learner = field(init=False)

    def __post_init__(self) -> None:
        self.learner = fp.Learner(self.path)

    def conventions(self) -> tuple[str, ...]:
        if self.convention:
            return (self.convention, self.convention + "3")
        return fp.AUTO + tuple(c + "3" for c in fp.AUTO)

    def parts(self, sizes: dict[str, Any]) -> dict[str, Callable[[], Any]]:
        """Factories for the learner's own attention and FFN, for layers that take them as
        constructor arguments."""
        out = {}
        for kind, key in (("mha", "mha"), ("ffn", "ffn")):
            if kind in self.components:
                cls = self.components[kind].obj
                out[key] = lambda cls=cls: build(cls, sizes)
        return out

    def build(self, comp: Component, sizes: dict[str, Any] = SIZES, seed: int = 0,
              checked: bool = True) -> nn.Module:
        """The learner's module, built with matched arguments, eval mode; `checked`: scrambled and
        float64 (for comparisons), else as built (for the tutorial-size shape check)."""
        module = self.learner.call("__init__", build, comp.obj, sizes, self.parts(sizes))
        if not isinstance(module, nn.Module):
            raise self.learner.fail("__init__", f"{comp.name}(...) is not an nn.Module")
        if not checked:
            return module.eval()
        scramble_(module, seed)
        return module.double().eval()

    def objects(self, comp: Component, *kinds: str) -> list[Any]:
        """The component's class or function, then the learner's other components of `kinds`, then
        every other function and class of their file: where to look for a line."""
        objs = [comp.obj] + [self.components[k].obj for k in kinds if k in self.components]
        return objs + [obj for obj in own_objects(self.module).values() if obj not in objs]

    def findings(self, flags: frozenset[str], matched: float, correct: float, comp: Component,
                 *kinds: str) -> list[Finding]:
        lines = source_lines(self.objects(comp, *kinds))
        out = []
        for flag in sorted(flags):
            name, _, form = flag.partition(":")
            number, code = locate(name, lines)
            out.append(Finding(name, observed_match(name, form, matched, correct), number, code,
                               form))
        return out


def observed_match(name: str, form: str, matched: float, correct: float) -> dict[str, str]:
    what = {"softmax_wrong_dim": (f" (softmax over dim {form})", f"（softmax 作用在 dim {form}）"),
            "no_residual": (f" (the {form} sublayer)", f"（{form} 子层）"),
            "pre_norm": (f" (the {form} sublayer is pre-norm)", f"（{form} 子层是 pre-norm）"),
            "causal_off_by_one": ({"no_self": " (a token does not see itself)",
                                   "sees_next": " (a token sees the next one)"}.get(form, ""),
                                  {"no_self": "（token 看不到自己）",
                                   "sees_next": "（token 看到了下一个位置）"}.get(form, "")),
            "mask_after_softmax": ({"zero": " (weights zeroed after the softmax)",
                                    "neg": " (-1e9 written into the weights)"}.get(form, ""),
                                   {"zero": "（softmax 之后把权重置零）",
                                    "neg": "（把 -1e9 写进了权重）"}.get(form, "")),
            "pe_wrong_frequency": ({"pair_index": " (10000^(i/d) instead of 10000^(2i/d))",
                                    "dim_index": " (each column j uses 10000^(j/d))",
                                    "positive": " (pos * 10000^(2i/d): the exponent's sign is flipped)",
                                    }.get(form, ""),
                                   {"pair_index": "（用了 10000^(i/d) 而不是 10000^(2i/d)）",
                                    "dim_index": "（第 j 列用了 10000^(j/d)）",
                                    "positive": "（pos * 10000^(2i/d)：指数符号反了）"}.get(form, "")),
            }.get(name, ("", ""))
    return text(f"your output equals the computation with this mistake{what[0]} (max abs difference "
                f"{matched:.1e}); it differs from the correct one by {correct:.3g}",
                f"你的输出与带有这个错误的计算结果一致{what[1]}（最大绝对误差 {matched:.1e}），与正确结果"
                f"相差 {correct:.3g}")


def forward_parameters(module: Any) -> list[inspect.Parameter]:
    fn = module.forward if isinstance(module, nn.Module) else module
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return params


def is_mask_name(name: str) -> bool:
    return "mask" in name.lower()


def deterministic(run: Callable[[], Tensor | None]) -> bool:
    """Two calls on the same input in eval mode give the same output (seeds differ between them)."""
    torch.manual_seed(1)
    a = run()
    torch.manual_seed(2)
    b = run()
    return a is not None and b is not None and a.shape == b.shape and torch.equal(a, b)


def dropout_finding(ctx: Context, comp: Component, run: Callable[[], Tensor | None], *kinds: str,
                    ) -> Finding | None:
    """dropout_in_eval when two eval calls differ but two calls with the same seed agree (so the
    difference is randomness, i.e. dropout left on)."""
    if deterministic(run):
        return None
    torch.manual_seed(3)
    a = run()
    torch.manual_seed(3)
    b = run()
    if a is None or b is None or not torch.equal(a, b):
        return None
    torch.manual_seed(4)
    c = run()
    diff = (a - c).abs().max().item() if c is not None and c.shape == a.shape else math.inf
    number, code = locate("dropout_in_eval", source_lines(ctx.objects(comp, *kinds)))
    return Finding("dropout_in_eval", text(
        f"in eval mode two runs on the same input differ by up to {diff:.3g}; with the same random "
        "seed they agree, so randomness (dropout) is still on",
        f"eval 模式下同一输入两次运行最多相差 {diff:.3g}；固定随机种子后结果一致，说明随机性（dropout）"
        "仍然开着"), number, code)


def check_determinism(res: ComponentResult, ctx: Context, comp: Component,
                      run: Callable[[], Tensor | None], *kinds: str) -> None:
    """The check "eval mode is deterministic", and the dropout_in_eval finding when it is not."""
    drop = dropout_finding(ctx, comp, run, *kinds)
    res.checks.append(Check(text("eval mode is deterministic (dropout off)",
                                 "eval 模式下结果确定（dropout 已关闭）"), drop is None))
    if drop:
        res.findings.append(drop)


def hidden_rows(out: Tensor | None, rows: Tensor | None) -> Tensor | None:
    """The learner's output on the query rows whose keys are all masked; None when there are none."""
    if out is None or rows is None or bool(rows.all()):
        return None
    hidden = ~rows[:, 0] if out.dim() == 3 else (~rows).expand(out.shape[:-1])  # (B, T) or (B, H, T)
    return out[hidden]  # (rows, D) or (rows, Dh)


def nan_on_hidden_rows(res: ComponentResult, out: Tensor | None, rows: Tensor | None, comp: Component,
                       ctx: Context) -> None:
    """The finding nan_on_masked_rows (once a component) when a row whose keys are all masked is NaN."""
    values = hidden_rows(out, rows)
    if values is None or not torch.isnan(values).any() or any(
            f.name == "nan_on_masked_rows" for f in res.findings):
        return
    number, code = locate("nan_on_masked_rows", source_lines(ctx.objects(comp, "sdpa", "mha")))
    res.findings.append(Finding("nan_on_masked_rows", text(
        f"{values.size(0)} query rows with every key masked came out NaN",
        f"{values.size(0)} 个所有键都被屏蔽的查询行输出为 NaN"), number, code))


def masked_rows(res: ComponentResult, out: Tensor | None, rows: Tensor | None, comp: Component,
                ctx: Context) -> None:
    """Fully masked rows are compared nowhere: note what each side does; NaN there is a finding."""
    values = hidden_rows(out, rows)
    if values is None:
        return
    if torch.isnan(values).any():
        nan_on_hidden_rows(res, out, rows, comp, ctx)
        return
    note = text("rows whose keys are all masked were not compared: with -1e9 your code gives uniform "
                "weights there (the mean of V), handformer gives zeros; both are defined, neither is wrong",
                "所有键都被屏蔽的行没有参与比较：用 -1e9 时你的代码在这些行给出均匀权重（V 的平均），"
                "handformer 给出 0；两者都有定义，都不算错")
    if note not in res.notes:
        res.notes.append(note)


def shape_of(raw: Any) -> str:
    """What a learner call returned, for a message: shapes of tensors, nested in tuples."""
    if isinstance(raw, Tensor):
        return f"a tensor of shape {tuple(raw.shape)}"
    if isinstance(raw, (tuple, list)):
        return "(" + ", ".join(shape_of(r) for r in raw) + ")"
    return type(raw).__name__


def error_text(err: float) -> Text:
    """A check's detail: the largest difference it measured."""
    return text(f"max abs error {err:.2e}", f"最大绝对误差 {err:.2e}")


def positions(batch: int, length: int, pad: list[int]) -> Tensor:
    """(B, 1, 1, S) bool padding mask: row b keeps its first length - pad[b] positions."""
    keep = torch.ones(batch, 1, 1, length, dtype=torch.bool)
    for b, p in enumerate(pad):
        if p:
            keep[b, ..., length - p:] = False
    return keep


def causal(length: int) -> Tensor:
    return causal_mask(length)  # (T, T), True = may attend: handformer's own mask


def finish(res: ComponentResult) -> ComponentResult:
    """The status from what was found: fail on any finding or failed check or a large error."""
    from handformer.check.result import DIFFERS, ERROR, FAIL

    if res.status in (ERROR, FAIL):
        return res
    failed = [c for c in res.checks if not c.ok]
    big = res.max_abs_error is not None and not res.max_abs_error < 1e-5
    if res.findings or failed or big:
        res.status = FAIL
    elif res.status != DIFFERS:
        res.status = "pass"
    return res


def grads_error(pairs: list[tuple[Tensor | None, Tensor | None]]) -> float:
    err = 0.0
    for a, b in pairs:
        if a is None and b is None:
            continue
        if a is None or b is None:
            return math.inf
        err = max(err, fp.max_error(a.reshape(1, -1), b.reshape(1, -1)))
    return err


def guarded(res: ComponentResult, step: Callable[[], None]) -> None:
    """Run a comparison step; once a mistake is named, the learner's code raising in a later step
    (a decoder with swapped masks fails when T != S) is one more failed check, not an error."""
    try:
        step()
    except fp.LearnerFailure as failure:
        if not res.findings:
            raise
        err = failure.error
        where = f" ({err.traceback[-1]})" if err.traceback else ""
        res.checks.append(Check(text("runs on every test shape", "能在所有测试形状上运行"), False,
                                text(f"{err.message}{where}", f"{err.message}{where}")))


def outputs_by_convention(run: Callable[[str], Tensor | None], conventions: tuple[str, ...],
                          ) -> tuple[dict[str, Tensor], fp.LearnerFailure | None]:
    """The learner's output under each mask convention it runs with (and returns a tensor for), and
    its first failure."""
    outputs, failure = {}, None
    for conv in conventions:
        try:
            out = run(conv)
        except fp.LearnerFailure as err:
            failure = failure or err
            continue
        if out is not None:
            outputs[conv] = out
    return outputs, failure


def first_working(ctx: Context, run: Callable[[str], Any]) -> str:
    """The first mask convention the learner's code runs with (torch.nn-style code raises on a 0/1
    int mask); their first exception if none does."""
    failure = None
    for conv in ctx.conventions():
        try:
            run(conv)
            return conv
        except fp.LearnerFailure as err:
            failure = failure or err
    assert failure is not None
    raise failure
