"""What every runner needs: the sizes the learner's components are built with, the learner's file
and components, building and calling their modules, and turning search results into findings.

Shape legend: B batch, T query length, S key length, D d_model, H heads, F FFN width.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import re
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.argument_names import (  # noqa: F401  (the runners import them here)
    RESIDUAL_NAMES,
    call_parameters,
    named,
    names_of,
    readable_parameters,
)
from handformer.check.core.conventions import QUERY_FIRST, conventions_for, is_lengths_name, masks_where_true
from handformer.check.core.defaults import then
from handformer.check.core.discovery import (
    SIZE_OF,
    Component,
    build,
    defined_here,
    init_parameters,
    own_objects,
    size_of,
    with_head_size,
)
from handformer.check.core.own_calls import values_built_with
from handformer.check.core.parent_inputs import through_parent_
from handformer.check.core.result import (
    DEPARTS,
    PASS,
    Check,
    ComponentResult,
    Finding,
    LearnerError,
    Text,
    text,
)
from handformer.check.core.sizes import (  # noqa: F401  (the runners import them here)
    DROPOUT,
    F_WIDTH,
    MAX_LEN,
    SDPA_SIZES,
    SIZES,
    SRC_VOCAB,
    TGT_VOCAB,
    D,
    H,
    is_number,
)
from handformer.check.core.source import (
    Objects,
    first_line,
    functions_called,
    global_reads,
    locate,
    locate_form,
    methods_called,
    module_reads,
    reachable,
    source_lines,
    source_text,
)
from handformer.check.core.stacked import unstack_
from handformer.check.core.weights import scramble_, untranspose_
from handformer.check.reference.diagnoses import CATALOG
from handformer.nn.masks import causal_mask

TUTORIAL = {"d_model": 512, "n_heads": 8, "d_ff": 2048, "dropout": DROPOUT, "max_len": 128}

ATTENTION_FLAGS = ("no_scaling", "scale_by_dk", "softmax_wrong_dim:-2", "softmax_wrong_dim:1",
                   "mask_inverted", "mask_after_softmax:zero", "mask_after_softmax:neg", "mask_not_applied",
                   "mask_hides_queries", "nan_on_masked_rows")
HEAD_FLAGS = ("split_no_transpose", "concat_no_transpose", "no_output_projection", "kv_swapped")
ROPE_FLAGS = ("rope_rotation_sign", "rope_wrong_base:exponent",  # searched when rotary positions are inside
              "rope_wrong_base:positive")


# the attention's and the heads' mistakes the search may apply, by whether there is a W_O (none missing
# when there is none)
FLAGS_BY_O = {True: ATTENTION_FLAGS + HEAD_FLAGS,
              False: ATTENTION_FLAGS + tuple(f for f in HEAD_FLAGS if f != "no_output_projection")}


def attention_flags(has_o: bool) -> tuple[str, ...]:
    """The attention's and the heads' mistakes the search may apply (no W_O missing when there is none)."""
    return FLAGS_BY_O[bool(has_o)]


@dataclass
class Context:
    path: str
    module: types.ModuleType
    components: dict[str, Component]
    convention: str | None = None  # forced by --mask-convention; None = detect
    learner: fp.Learner = field(init=False)
    partial: ComponentResult | None = None  # the result in progress
    results: dict[str, ComponentResult] = field(default_factory=dict)  # the components checked so far
    hyperparameter_note: Text | None = None  # the learner's module-level sizes set for this component
    skipped: list[str] = field(default_factory=list)  # top-level statements of their file not run
    # their attention raises with fewer key/value heads than heads, and their config gives as many
    # ("ungrouped") or one ("one", multi-query) (grouping.py): built so from then on; grouped_asked: the
    # component's check asked for fewer
    own_kv: str | None = None
    grouped_asked: bool = False
    # what a component holds or is handed that the reference has no place for (settings of its own left
    # at values that are not neutral, state it keeps): by component name, read by unmapped.settle
    unmapped: dict[str, list[Text]] = field(default_factory=dict)
    neutral: dict[str, list[Text]] = field(default_factory=dict)  # settings checked at neutral values only
    found: list[Component] = field(default_factory=list)  # every component of the file (its callers)
    raised: BaseException | None = None  # what their code raised in the check in progress (accepted.py)

    def __post_init__(self) -> None:
        self.learner = fp.Learner(self.path)

    @contextlib.contextmanager
    def hyperparameters(self, comp: Component) -> Iterator[None]:
        """The learner's module-level hyperparameters that `comp` reads (Karpathy's n_embd, n_head,
        block_size, vocab_size), set to the sizes its runner builds with for the length of its check,
        then put back; the report says so (`hyperparameter_note`)."""
        wanted = module_sizes(self.module, comp, KIND_SIZES.get(comp.kind, SIZES))
        self.hyperparameter_note = None
        with globals_set(self.module, wanted) as old:
            if wanted:
                self.hyperparameter_note = _set_note(wanted, old)
            yield

    def sizes_set(self, comp: Component, sizes: dict[str, Any]) -> contextlib.AbstractContextManager:
        """Inside a check, the module-level hyperparameters `comp` reads that the learner's file
        defines, set to `sizes` (the tutorial's, for the shape check) for the block, then put back."""
        wanted = module_sizes(self.module, comp, sizes)
        return globals_set(self.module, {k: v for k, v in wanted.items() if k in vars(self.module)})

    def result(self, comp: Component) -> ComponentResult:
        """A new result for `comp`, kept as the one in progress: when the learner's code raises later,
        what was already found (a missing projection, a mask buffer) stays in the report."""
        self.partial = ComponentResult(comp.kind, comp.name)
        return self.partial

    def conventions(self, mask_name: str | None = None) -> tuple[str, ...]:
        """The mask conventions to try for a mask parameter of this name (see conventions.py)."""
        return conventions_for(mask_name, self.convention)

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
              checked: bool = True, warmup: Callable[[nn.Module], Any] | None = None) -> nn.Module:
        """The learner's module, built with matched arguments, eval mode; `checked`: scrambled and
        float64 (for comparisons), else as built (for the tutorial-size shape check). A module with
        lazy layers (d2l's nn.LazyLinear) is first run once by `warmup`, which gives them shapes."""
        sizes = {**dict.fromkeys(("theta",) * (comp.kind not in OWN_BASE), REFERENCE_THETA), **sizes,
                 "switched": comp.switched}
        if sizes.get("n_kv_heads"):  # as many as heads where the file's attention is ungrouped
            sizes = {**sizes, "n_kv_heads": self.kv_heads(sizes["n_kv_heads"], sizes.get("n_heads", H))}
        module = self.learner.call("__init__", build, comp.obj, sizes, self.parts(sizes))
        if not isinstance(module, nn.Module):
            raise self.learner.fail("__init__", f"{comp.name}(...) is not an nn.Module",
                                    f"{comp.name}(...) 不是 nn.Module")
        keyword_inputs_positional_(module)
        through_parent_(module, sizes, build)  # what its parent computes and hands it
        self.materialize(comp, module, warmup)
        untranspose_(module)  # Hugging Face's Conv1D: weights stored (in, out)
        unstack_(module)  # modded-nanogpt's qkv_w (3, D, D): one fused (3D, D) projection
        if not checked:
            return module.eval()
        scramble_(module, seed)
        return attributes_double_(module.double()).eval()

    def kv_heads(self, n_kv_heads: int, n_heads: int = H) -> int:
        """The key/value heads to build with: `n_kv_heads`, or as many as heads where the file's
        attention takes no fewer (`own_kv` "ungrouped"), one where it takes one alone ("one"); a check
        that asks for fewer is remembered."""
        self.grouped_asked |= n_kv_heads < n_heads
        return {"ungrouped": max(n_kv_heads, n_heads), "one": 1}.get(self.own_kv, n_kv_heads)

    @torch.no_grad()
    def materialize(self, comp: Component, module: nn.Module, warmup: Callable[[nn.Module], Any] | None,
                    ) -> None:
        """A module with lazy layers (d2l's nn.LazyLinear) run once by `warmup` at check's sizes, which
        gives them shapes; nothing for any other."""
        if not is_lazy(module):
            return
        if warmup is None:
            raise self.learner.fail("__init__", f"{comp.name} has lazy layers (nn.LazyLinear) that "
                                    "handformer cannot give shapes to here; use nn.Linear(in, out)",
                                    f"{comp.name} 有惰性层（nn.LazyLinear），handformer "
                                    "在这里给不了它们形状；请用 nn.Linear(in, out)")
        self.learner.call("forward", warmup, module.eval())
        self._shape_unused_lazy(comp, module)

    def _shape_unused_lazy(self, comp: Component, module: nn.Module) -> None:
        """A lazy layer that the first forward never called has no shape: a LazyLinear(n) gets
        (n, n) (d2l's W_o is num_hiddens to num_hiddens), so that a projection the forward forgot is
        mapped, and named, as a written-out nn.Linear would be; any other lazy layer is an error
        (called by `materialize`, without gradients)."""
        for name, sub in module.named_modules():
            own = sub.parameters(recurse=False)
            if not any(isinstance(p, nn.parameter.UninitializedParameter) for p in own):
                continue
            if isinstance(sub, nn.LazyLinear):
                sub.initialize_parameters(torch.zeros(1, sub.out_features))
                continue
            raise self.learner.fail("forward", f"{comp.name}.{name} ({type(sub).__name__}) is never called "
                                    "by forward, so it has no shape; remove it, or call it",
                                    f"forward 从不调用 {comp.name}.{name}（{type(sub).__name__}），"
                                    "所以它没有形状；删掉它，或者调用它")

    def checked(self, comp: Component, check: Callable[[Component, Context], ComponentResult],
                ) -> ComponentResult | None:
        """The result of the learner's component's own check (run here when it has not been yet, once
        a file: --component asked for the runner that builds on it alone), for a runner that builds on
        it (their loss in a training step, their model under a beam search); None when their code
        raises there."""
        if comp.name not in self.results:
            partial = self.partial
            try:
                self.results[comp.name] = check(comp, self)
            except Exception:  # noqa: BLE001  (their code raises: the runner builds on handformer's)
                return None
            finally:
                self.partial = partial
        return self.results[comp.name]

    def passes(self, comp: Component, check: Callable[[Component, Context], ComponentResult]) -> bool:
        """Whether the learner's component passes its own check (`checked`); their code raising there
        is a no."""
        return getattr(self.checked(comp, check), "status", None) == PASS

    def objects(self, comp: Component, *kinds: str) -> list[Any]:
        """The component's class or function, then the file's functions and classes it reads by name
        (gpt-fast's sample calls logits_to_probs) and those they read in turn, then the learner's other
        components of `kinds` (these its `near` ones, where a line is looked for first), then every
        other one: where to look for a line."""
        reads, own = global_reads(comp.obj), own_objects(self.module)
        called = reachable([comp.obj], lambda o: {own[n] for n in global_reads(o) if n in own})  # in turn
        objs = [comp.obj] + [obj for name, obj in own.items() if name in reads]
        objs += [obj for obj in own.values() if obj in called]
        objs += [self.components[k].obj for k in kinds if k in self.components]
        out = Objects(dict.fromkeys(objs + list(own.values()), None))  # each once, in that order
        out.near = len(dict.fromkeys(objs, None))  # a mistake's line is looked for there first
        return out

    def findings(self, flags: frozenset[str], matched: float, correct: float, comp: Component,
                 *kinds: str) -> list[Finding]:
        lines = source_lines(self.objects(comp, *kinds))
        out = []
        for flag in sorted(flags):
            name, _, form = flag.partition(":")
            form, number, code = locate_form(name, form, lines)
            out.append(Finding(name, observed_match(name, form, matched, correct), number, code,
                               form))
        return out


def causal_mask_named(res: ComponentResult, ctx: Context, comp: Component, causal_inside: bool) -> None:
    """A component that builds its own causal mask and computes as if it had none, where no line
    throws a masked_fill's result away (`is_causal=False`, the masking line left out): its causal mask
    is missing, not a mask never applied."""
    lines = source_lines(ctx.objects(comp))
    missing = causal_inside and first_line(CATALOG["mask_not_applied"].patterns[:1], lines)[0] is None
    for finding in [f for f in res.findings if f.name == "mask_not_applied"] * missing:
        finding.name = "causal_mask_missing"
        finding.line, finding.code = locate("causal_mask_missing", lines)


def keyword_inputs_positional_(module: nn.Module) -> None:
    """A forward whose inputs are all keyword-only (labml's forward(self, *, query, key, value, mask))
    takes them by position too, in the order it names them, as check hands its inputs; its own code
    still calls it by keyword. Nothing changes for any other forward."""
    forward = type(module).forward
    params = list(inspect.signature(forward).parameters.values())[1:]
    names = [p.name for p in params if p.kind is p.KEYWORD_ONLY]
    if not names or len(names) < len(params):
        return

    @functools.wraps(forward)  # its signature, for the runners
    def positional(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        return forward(self, **dict(zip(names, args)), **kwargs)

    module.forward = types.MethodType(positional, module)  # a copy of the module gets its own


def attributes_double_(module: nn.Module) -> nn.Module:
    """The float tensors a module keeps as plain attributes, not buffers (Umar Jamil's KV cache
    `self.cache_k = torch.zeros(...)`), in float64 as `.double()` puts its parameters."""
    for sub in module.modules():  # parameters and buffers are not in vars(sub)
        floats = {n: v for n, v in vars(sub).items() if torch.is_tensor(v) and v.is_floating_point()}
        vars(sub).update({n: v.double() for n, v in floats.items()})
    return module


_UNSET = object()


def _set_note(wanted: dict[str, Any], old: dict[str, Any]) -> Text:
    """What the report says of the learner's hyperparameters set to `wanted` (they were `old`)."""
    were, were_zh = (", ".join(f"{n}={old[n]!r}" if old[n] is not _UNSET else f"{n}{undefined}"
                               for n in wanted) for undefined in (" (not defined)", "（没有定义）"))
    now = ", ".join(f"{n}={v}" for n, v in wanted.items())
    return text(f"your module-level hyperparameters were set to {now} for this check (they were "
                f"{were}): the sizes at which check builds and compares this kind",
                f"检查这个组件时，你在模块顶层定义的超参数被设成了 {now}（原来是 {were_zh}）："
                "这是检查这类组件用的尺寸")


@contextlib.contextmanager
def globals_set(module: types.ModuleType, values: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The module's globals `values` set for the block, then put back (removed where the learner's
    file did not define them); it yields their values before (_UNSET: not defined)."""
    old = {name: vars(module).get(name, _UNSET) for name in values}
    defaults = _defaults_following(module, values)  # read before: they hold the sizes' values
    vars(module).update(values)
    try:
        yield old
    finally:
        for name, value in old.items():
            if value is _UNSET:
                vars(module).pop(name, None)
            else:
                vars(module)[name] = value
        for function, (positional, keywords) in defaults.items():
            function.__defaults__, function.__kwdefaults__ = positional, keywords


def _defaults_following(module: types.ModuleType, values: dict[str, Any]) -> dict[Any, tuple[Any, Any]]:
    """The defaults of the learner's functions and methods that took a module-level size when the
    file ran (`size_defaults`), set with the size; returns each changed function's defaults before."""
    taken = size_defaults(module, defined_here(module).values(), values)
    before = {f: (f.__defaults__, f.__kwdefaults__) for f, _ in taken}
    for f, name in taken:
        _default_set(f, name, values[name])
    return before


def _default_set(f: Any, name: str, value: Any) -> None:
    """The default of f's argument `name` (keyword-only or not) set to value."""
    if name in (f.__kwdefaults__ or {}):
        f.__kwdefaults__ = {**f.__kwdefaults__, name: value}
        return
    code, defaults = f.__code__, f.__defaults__
    names = code.co_varnames[code.co_argcount - len(defaults):code.co_argcount]  # the arguments with defaults
    f.__defaults__ = tuple(value if n == name else d for n, d in zip(names, defaults))


def size_defaults(module: types.ModuleType, own: Any, names: Any) -> list[tuple[Any, str]]:
    """(function, argument) of these functions and the methods of these classes whose argument is
    named as a module-level size among `names` and took its value as a default when the file ran
    (nlp-tutorial's `def __init__(self, d_model=d_model, n_head=n_head)`): read at definition, never by
    name after."""
    functions = [m for o in own for m in (vars(o).values() if inspect.isclass(o) else [o])
                 if inspect.isfunction(m)]
    return [(f, p.name) for f in functions for p in inspect.signature(f).parameters.values()
            if p.name in names and is_number(p.default) and is_number(value := vars(module).get(p.name))
            and p.default == value]


# the sizes each kind's runner builds with, for the learner's module-level hyperparameters
KIND_SIZES: dict[str, dict[str, Any]] = {
    "gpt": {**SIZES, "src_vocab": 29, "n_layers": 2, "max_len": 16},
    "generate": {"max_len": 8, "src_vocab": 24},
    "block": {**SIZES, "src_vocab": 29, "n_layers": 2},
    "sdpa": {"n_heads": SDPA_SIZES[1], "d_head": SDPA_SIZES[4]},  # no d_model: d_head is its inputs' width
    "transformer": {**SIZES, "src_vocab": SRC_VOCAB, "tgt_vocab": TGT_VOCAB, "n_layers": 2},
}
# the rotary base a component is built with (its config's rope_theta, a `base` argument with a default):
# the reference's, for a part compared with rotary positions at that base (Mixtral's attention with its
# rotary module inside, its config at rope_theta = 1e6); the kinds that read the base back from the
# learner's model and tables keep its own (a base its config names but its tables ignore is a mistake)
REFERENCE_THETA = 10000.0
OWN_BASE = ("gpt", "kv_cache", "llama2c", "rope", "generate")


GLOBAL_SIZES = ("d_model", "n_heads", "n_kv_heads", "d_ff", "dropout", "max_len", "src_vocab", "tgt_vocab",
                "n_layers", "d_head")


def module_sizes(module: types.ModuleType, comp: Component, sizes: dict[str, Any]) -> dict[str, Any]:
    """The learner's module-level names that `comp` (or a class or function of theirs it uses) reads
    as globals and that stand for a size (n_embd, n_head, block_size, vocab_size, head_size, ...),
    each with the value `sizes` gives it; names their code never reads are left alone."""
    sizes = with_head_size(sizes)
    own = defined_here(module)  # each of their objects followed to the names it reads
    reads = reachable(global_reads(comp.obj), lambda name: global_reads(own[name]) if name in own else set())
    reads |= {name for _, name in size_defaults(module, map(own.get, reads), vars(module))}
    out = {}
    for name in sorted(reads):
        key = SIZE_OF.get(name.lower())
        value = vars(module).get(name, _UNSET)
        numeric = value is _UNSET or is_number(value)
        if key in GLOBAL_SIZES and key in sizes and numeric:
            out[name] = sizes[key]
    return out


def is_lazy(module: nn.Module) -> bool:
    """Whether some parameter has no shape yet (nn.LazyLinear before its first forward)."""
    return any(isinstance(p, nn.parameter.UninitializedParameter) for p in module.parameters())


SUBLAYER = {"attn": ("the attention sublayer", "注意力子层"), "cross": ("the cross-attention sublayer",
                                                                   "交叉注意力子层"),
            "ffn": ("the FFN sublayer", "前馈子层"), "add_norm": ("AddNorm", "AddNorm"),
            "all": ("every sublayer", "所有子层")}
FORMS: dict[str, dict[str, tuple[str, str]]] = {
    "rope_wrong_base": {"positive": ("frequencies base^(2j/d), the reciprocal left out: base^(-2j/d) meant",
                                     "频率是 base^(2j/d)，漏了取倒数：应为 base^(-2j/d)")},
    "causal_off_by_one": {"no_self": ("a token does not see itself", "token 看不到自己"),
                          "sees_next": ("a token sees the next one", "token 看到了下一个位置")},
    "mask_inverted": {"causal": ("its own causal mask inverted: a token sees the later ones, not itself nor "
                                 "the earlier ones", "它自己的因果掩码用反了：token 看得到后面的位置，"
                                 "看不到自己和前面的位置")},
    "mask_after_softmax": {"zero": ("weights zeroed after the softmax", "softmax 之后把权重置零"),
                           "neg": ("-1e9 written into the weights", "把 -1e9 写进了权重")},
    "pe_wrong_frequency": {"pair_index": ("10000^(i/d) instead of 10000^(2i/d)",
                                          "用了 10000^(i/d) 而不是 10000^(2i/d)"),
                           "dim_index": ("each column j uses 10000^(j/d)", "列 j 用了 10000^(j/d)"),
                           "positive": ("pos * 10000^(2i/d): the exponent's sign is flipped",
                                        "pos * 10000^(2i/d)：指数符号反了"),
                           "not_divided": ("10000^(2i) instead of 10000^(2i/d): the exponent is not divided "
                                           "by d_model", "用了 10000^(2i) 而不是 10000^(2i/d)：指数没有除以 "
                                           "d_model"),
                           "doubled": ("10000^(4i/d) instead of 10000^(2i/d): the pair's index 2i "
                                       "doubled again (2 * arange(0, d, 2))",
                                       "用了 10000^(4i/d) 而不是 10000^(2i/d)：2i 又乘了 2"
                                       "（2 * arange(0, d, 2)）"),
                           "own": ("the columns are the sines and cosines of the positions at frequencies "
                                   "other than 1/10000^(2i/d)", "各列仍是位置的正弦和余弦，但频率不是 "
                                   "1/10000^(2i/d)")},
    "layernorm_unbiased_std": {"std": ("(x - mean) / (x.std() + eps)", "(x - mean) / (x.std() + eps)"),
                               "var": ("(x - mean) / sqrt(x.var() + eps), the unbiased variance",
                                       "(x - mean) / sqrt(x.var() + eps)，用了无偏方差")},
    "norm_no_gain": {"gain": ("the weight (gain) is not applied", "没有乘权重（gain）"),
                     "bias": ("the bias is not added", "没有加偏置")},
    "norm_wrong_dim": {"-2": ("statistics over dim -2 (the positions)", "统计量沿 dim -2（位置）计算"),
                       "all": ("statistics over every dimension at once", "统计量对所有维度一起计算")},
    "scale_by_dk": {"sqrt_d_model": (
        "your line divides by sqrt(d_model), the model's width, not the head's: at the sizes checked "
        "(d_model 16, 4 heads) that is d_k = 4",
        "你的代码除以的是 sqrt(d_model)（整个模型的宽度，不是每个头的）：在检查用的尺寸"
        "（d_model 16，4 个头）下它正好等于 d_k = 4")},
    "latent_scale_wrong_width": {"v": ("1/sqrt(v_head_dim)", "1/sqrt(v_head_dim)"),
                                 "nope": ("1/sqrt(qk_nope_head_dim)", "1/sqrt(qk_nope_head_dim)")},
    "shared_norm": {"first": ("the first norm is used for every sublayer", "每个子层都用了第一个归一化层"),
                    "last": ("the last norm is used for every sublayer", "每个子层都用了最后一个归一化层")},
}


# the diagnoses whose form is a sublayer
SUBLAYER_FORMED = ("no_residual", "pre_norm", "residual_from_normed", "sandwich_norm_missing")


def form_text(name: str, form: str) -> tuple[str, str]:
    """The words for one form of a diagnosis ("" when it has none), English and Chinese."""
    if name == "softmax_wrong_dim" and form:
        return f"softmax over dim {form}", f"softmax 作用在 dim {form}"
    if name in SUBLAYER_FORMED and form in SUBLAYER:
        en, zh = SUBLAYER[form]
        return ((f"{en} is pre-norm", f"{zh}是 Pre-Norm") if name == "pre_norm" else (en, zh))
    return FORMS.get(name, {}).get(form, ("", ""))


def observed_match(name: str, form: str, matched: float, correct: float) -> dict[str, str]:
    en, zh = form_text(name, form)
    en, zh = (f" ({en})", f"（{zh}）") if en else ("", "")
    return text(f"your output equals the computation with this mistake{en} (max abs difference "
                f"{matched:.1e}); it differs from the correct one by {correct:.3g}",
                f"你的输出与带有这个错误的计算结果一致{zh}（最大绝对误差 {matched:.1e}），与正确结果"
                f"相差 {correct:.3g}")


def forward_parameters(module: Any) -> list[inspect.Parameter]:
    return call_parameters(module.forward if isinstance(module, nn.Module) else module)


def residual_handed_zero(module: nn.Module) -> nn.Module:
    """The module, its forward handed zero for the stream it requires and adds its output to (BLOOM's
    MLP.forward(x, residual)): called with x alone, it is the sublayer alone."""
    names = [p.name for p in forward_parameters(module) if p.name in RESIDUAL_NAMES and p.default is p.empty]
    if names and isinstance(module, nn.Module):
        module.forward = functools.partial(module.forward, **dict.fromkeys(names, torch.zeros(())))
    return module


# the inputs of an attention or a layer, never taken for an optional extra (a cross-attention's memory)
INPUT_NAMES = ("key", "value", "k", "v", "keys", "values", "memory", "context", "enc_out", "encoder_out",
               "enc_output", "encoder_output", "y", "kv", "xk", "xv", "src", "tgt")


def optional_inputs(fn: Any, params: list[inspect.Parameter], handled: set[str], passed_on: bool = False,
                    ) -> set[str]:
    """The arguments without a default that the forward tests against None (nanochat's value
    embedding `ve`: `if ve is not None`), or, with `passed_on`, hands as it is to a call (its block's
    `self.attn(norm(x), ve, cos_sin)`) while its file tests that name against None, besides its first
    input and those check fills (`handled`: masks, rotary tables): handed None, the forward's own way
    to do without them."""
    fn = type(fn).forward if isinstance(fn, nn.Module) else fn
    source, file = source_text(fn), source_text(inspect.getmodule(fn))
    return {p.name for p in params[1:] if p.default is p.empty and p.name.lower() not in INPUT_NAMES
            and p.name not in handled and not is_mask_name(p.name)
            and (re.search(NONE_TEST.format(p.name), source) or passed_on
                 and re.search(rf"[(,]\s*{p.name}\s*[,)]", source)
                 and re.search(NONE_TEST.format(p.name), file))}


# `x is None`, `x is not None`, or a switch's truth (`if use_cache:`: None takes the branch without it)
NONE_TEST = r"\b{0}\s+is\s+(not\s+)?None\b|\bif\s+(not\s+)?{0}\s*:"


def optional_extra(p: inspect.Parameter) -> bool:
    """An argument after the inputs that defaults to None and is named for no input (CS336's
    forward(x, token_positions=None)): the forward does without it, so it is never handed an input."""
    return p.default is None and p.name.lower() not in INPUT_NAMES


def forward_names(module: Any) -> list[str]:
    """The names of the parameters a call of the module's forward (or of the function) names."""
    return [p.name for p in forward_parameters(module)]


def forward_defaults(module: Any) -> dict[str, Any]:
    """Each parameter a call of the module's forward (or of the function) names -> its default
    (`inspect.Parameter.empty` where it has none)."""
    return {p.name: p.default for p in forward_parameters(module)}


def is_cache_argument(p: inspect.Parameter) -> bool:
    """A KV cache the forward takes and does without when handed nothing (nanoGPT's kin:
    forward(x, layer_past=None), Hugging Face's past_key_value=None): never an input to fill."""
    return p.default is None and bool(re.search("past|cache", p.name.lower()))


# a mask's parameter named for what it lets through (True = may attend), without the word mask
KEEP_NAMES = ("keep", "visible", "allowed", "can_attend", "may_attend", "attend")


# a mask handed as the additive bias on the scores (tensor2tensor's forward(x, bias), its
# encoder_self_attention_bias: 0 or -1e9, built from the padding); T5's position_bias and MPT's
# attn_bias (positions, not a mask) have no word before attention_bias and are read as positions
ADDITIVE_MASK_NAME = re.compile(r"bias|\w+_(?:attention|attn)_bias")


def is_mask_name(name: str) -> bool:
    """A parameter that takes the mask: its name says mask or what it keeps, or valid lengths (d2l's
    valid_lens), or it is the scores' additive bias (tensor2tensor's); not Longformer's
    global_attention_mask, which marks tokens (global_window.py)."""
    lowered = name.lower()
    return ("mask" in lowered and "global" not in lowered or lowered in KEEP_NAMES or is_lengths_name(name)
            or bool(ADDITIVE_MASK_NAME.fullmatch(lowered)))


# what code does with a mask, whatever its name (a Chinese course's `yanma`, 掩码): adds it to the
# scores (`scores = scores + yanma`, `attn += m`), fills by it, or picks by it
# the scores: att, attn, attention, attn_weights, attention_scores (never attn_output: a residual
# adds to it)
SCORES_WORD = (r"(?:scores?|att(?:n|ention)?(?:_(?:scores?|weights?|logits|probs|dots))?|logits|weights?|"
               r"dots|sim|energy|qk|w)")
MASK_USES = (r"\b{s}\s*(?:\+=|=\s*{s}\s*\+)\s*{name}\b(?![.(])", r"masked_fill_?\(\s*{name}\b",
             r"\.masked_fill_?\([^,()]*\b{name}\b", r"torch\.where\(\s*{name}\b")


NOT_MASK_WORDS = re.compile(r"(?i)bias|pos|alibi|rel|freq|cos|sin|rope|rotary|table|hidden|states")


def used_as_mask(source: str, name: str) -> bool:
    """Whether `source` uses a variable of this name as a mask: added to the attention's scores, or
    what a masked_fill or torch.where fills by; never a bias of positions added so (T5's position_bias,
    ALiBi's slopes), which its name says."""
    uses = (use.format(s=SCORES_WORD, name=re.escape(name)) for use in MASK_USES)
    plain = name != "self" and not NOT_MASK_WORDS.search(name)
    return plain and any(re.search(use, source, re.IGNORECASE) for use in uses)


def is_mask_param(name: str, owner: Any) -> bool:
    """A parameter of `owner` (a forward, a class) that takes the mask: by its name, or by what the
    file that defines it does with a variable of that name (used_as_mask)."""
    return is_mask_name(name) or used_as_mask(source_text(inspect.getmodule(owner)), name)


def says_keep(name: str | None) -> bool:
    """A mask's name that says True = may attend (keep_mask, visible): never read as torch.nn's
    True = masked."""
    return bool(name) and any(word in name.lower() for word in KEEP_NAMES)


# a comment or docstring of the attention's forward that says its mask's True lets a key through
# (lucidrains': `# mask: (b, n) bool, True = keep this token`)
KEEP_COMMENT = re.compile(r"\bTrue\s*(?:=|:|means|is)\s*"
                          r"(?:keep|attend|visible|valid|real|(?:may|can) (?:attend|see))", re.I)


def comment_says_keep(forward: Any) -> bool:
    """Whether the forward's own words state True = may attend: never read as torch.nn's True = masked."""
    return bool(KEEP_COMMENT.search(source_text(forward)))


SIZE_MISMATCH = ("must match the size", "size of tensor", "expanded size", "shape mismatch",
                 "does not match the shape", "cannot be broadcast", "not broadcastable")


def not_cropped(res: ComponentResult, ctx: Context, comp: Component, module: nn.Module,
                failure: fp.LearnerFailure, T: int) -> bool:
    """causal_mask_not_cropped, when the learner's forward failed on T tokens with a size mismatch
    and the module holds a square (L, L) buffer, L > T: a causal mask built once for the maximum
    length (nanoGPT's `self.bias`) and used without `[:T, :T]` on the line that raised."""
    message = failure.error.message
    squares = [(name, b.size(-1)) for name, b in module.named_buffers()
               if b.dim() >= 2 and b.size(-1) == b.size(-2) and b.size(-1) > T]
    if not squares or not any(m in message for m in SIZE_MISMATCH):
        return False
    name, L = max(squares, key=lambda s: s[1])
    if not re.search(rf"\b{name.split('.')[-1]}\b(?!\s*\[[^\]]*:)", "".join(failure.error.traceback[-1:])):
        return False  # the line that raised does not use it uncropped: the mismatch is another's (q's axes)
    number, code = locate("causal_mask_not_cropped", source_lines(ctx.objects(comp)))
    res.findings.append(Finding("causal_mask_not_cropped", text(
        f"the buffer {name} is ({L}, {L}), built for the longest input; on {T} tokens your forward raised "
        f"{message}", f"缓冲区 {name} 的形状是 ({L}, {L})，按最大长度建好；输入 {T} 个 token 时 "
        f"forward 报错：{message}"), number, code))
    res.checks.append(Check(text(f"runs on {T} tokens (fewer than the maximum length {L})",
                                 f"能在 {T} 个 token（少于最大长度 {L}）上运行"), False))
    return True


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
    diff = fp.max_error(a, c)  # inf when the third run returns nothing or another shape
    drawn = random_draw(run)
    if drawn is not None:
        return Finding("dropout_in_eval", text(
            f"in eval mode two runs on the same input differ by up to {diff:.3g}, with dropout turned off "
            "too: a random draw that is not a dropout runs in eval mode (draw it only in training: if "
            "self.training)", f"eval 模式下同一输入两次运行最多相差 {diff:.3g}，关掉 dropout 也一样："
            "不是 dropout 的随机抽样在 eval 模式下也在运行（只在训练时抽样：if self.training）"), *drawn)
    number, code = locate("dropout_in_eval", source_lines(ctx.objects(comp, *kinds)))
    return Finding("dropout_in_eval", text(
        f"in eval mode two runs on the same input differ by up to {diff:.3g}; with the same random "
        "seed they agree, so randomness (dropout) is still on",
        f"eval 模式下同一输入两次运行最多相差 {diff:.3g}；固定随机种子后结果一致，说明随机性（dropout）"
        "仍然开着"), number, code)


# a random draw in a forward: torch.randn_like(logits), torch.rand(...), x.normal_(), torch.multinomial
RANDOM_DRAW = re.compile(r"\b(?:randn|rand|randint|randperm|multinomial|bernoulli|normal)(?:_like)?\(|"
                         r"\.(?:normal_|uniform_|bernoulli_|exponential_)\(")


def random_draw(run: Callable[[], Tensor | None]) -> tuple[int, str] | None:
    """The line of a random draw other than dropout that makes eval runs differ (nanoMoE's noisy
    gating left on): the first module call whose output differs between two runs with other seeds and
    dropout off, the draw in its class's source; None where dropout alone is random."""
    seen: list[list[tuple[nn.Module, Tensor | None]]] = [[], []]
    for seed, calls in zip((3, 4), seen):
        torch.manual_seed(seed)
        record = nn.modules.module.register_module_forward_hook(
            lambda m, args, out, calls=calls: calls.append((m, fp.first_tensor(out))))
        with fp.hooked([record]), fp.dropout_off():
            fp.quietly(run)
    # (a module that returns no tensor, or another shape each run, is inf apart: not the one)
    first = next((m for (m, a), (_, b) in zip(*seen) if 0 < fp.max_error(a, b) < math.inf), None)
    lines = source_lines([type(first)])  # none for no module
    number, code = first_line([RANDOM_DRAW.pattern], lines)
    return then(number, lambda n: _guard(n, str(code), lines))


def _guard(number: int, code: str, lines: list[tuple[int, str]]) -> tuple[int, str]:
    """The `if` a draw at line `number` sits under (its condition lets it run in eval mode: nanoMoE's
    `if self.use_noisy_top_k:` with no `and self.training`), else the draw's line itself."""
    raw = dict(lines)
    depth = len(raw[number]) - len(raw[number].lstrip())
    # the last line above it that is indented less: the statement it sits in
    above = [number, *[n for n, line in lines if n < number and re.match(rf" {{0,{depth - 1}}}\S", line)]][-1]
    return [(number, code), (above, raw[above].strip())][raw[above].lstrip().startswith("if ")]


def check_determinism(res: ComponentResult, ctx: Context, comp: Component,
                      run: Callable[[], Tensor | None], *kinds: str) -> None:
    """The check "eval mode is deterministic", and the dropout_in_eval finding when it is not."""
    drop = dropout_finding(ctx, comp, run, *kinds)
    res.checks.append(Check(text("eval mode is deterministic (dropout off)",
                                 "eval 模式下结果确定（dropout 已关闭）"), drop is None))
    if drop:
        res.findings.append(drop)


def built_without_dropout(cls: Any) -> bool:
    """Whether the file builds the class `cls` with every dropout rate its constructor takes at 0 (Peter
    Bloem's TransformerBlock(..., dropout=0.0), never given another): read from its defaults and the
    file's own calls; no where a rate is read from a config, set inside, or handed a value not read."""
    params = init_parameters(cls) if inspect.isclass(cls) else []
    rates = [p.name for p in params if size_of(p.name) == "dropout"]
    return bool(rates) and all(v in (0, None) for name in rates for v in values_built_with(cls, name))


def dropout_on_residual(res: ComponentResult, ctx: Context, comp: Component, run: Callable[[], Any],
                        reference: Callable[[list[Tensor]], Any]) -> None:
    """dropout_on_residual when a tensor the learner's code hands to dropout (recorded in eval mode,
    where dropout is the identity) is the residual stream itself: the input of a sublayer, or the sum
    x + f(x); `reference(trace)` fills `trace` with those values as the correct layer computes them."""
    trace: list[Tensor] = []
    reference(trace)
    with fp.dropout_recorder() as seen:
        run()
    hits = [t for t in seen if any(t.shape == r.shape and fp.max_error(t, r) < fp.TOL for r in trace)]
    if not hits or res.has("dropout_on_residual"):
        return
    number, code = locate("dropout_on_residual", source_lines(ctx.objects(comp, "add_norm")))
    if built_without_dropout(comp.obj):
        res.notes.append(text(
            f"line {number}: dropout on the residual stream, but the file builds {comp.name} with a dropout "
            "rate of 0 (its default, and no call of the file gives another): it drops nothing, not charged",
            f"第 {number} 行：残差流上有 dropout，但文件构造 {comp.name} 时 dropout 率为 0"
            "（默认值，文件里也没有调用给别的值）：什么也不丢，不算错误"))
        return
    n = len(hits)
    tensors, are = ("tensors", "are") if n > 1 else ("tensor", "is")
    res.findings.append(Finding("dropout_on_residual", text(
        f"{n} {tensors} that your code hands to dropout {are} the "
        "residual stream itself (a sublayer's input, or x + f(x)): in training, the residual path is "
        "dropped too", f"你的代码交给 dropout 的张量中有 {n} 个就是残差流本身（子层的输入，或 x + f(x)）："
        "训练时残差通路也被 dropout 了"), number, code))


def hidden_rows(out: Tensor | None, rows: Tensor | None) -> Tensor | None:
    """The learner's output on the query rows whose keys are all masked; None when there are none."""
    if out is None or rows is None or bool(rows.all()) or out.dim() not in (3, 4):
        return None
    hidden = ~rows[:, 0] if out.dim() == 3 else ~rows  # (B, T), or (B, 1, T) for (B, H, T, Dh)
    try:
        hidden = hidden.expand(out.shape[:-1])
    except RuntimeError:  # an output of another shape than the rows: compared (and failed) elsewhere
        return None
    return out[hidden]  # (rows, D) or (rows, Dh)


def nan_on_hidden_rows(res: ComponentResult, out: Tensor | None, rows: Tensor | None, comp: Component,
                       ctx: Context) -> None:
    """The finding nan_on_masked_rows (once a component) when a row whose keys are all masked is NaN."""
    values = hidden_rows(out, rows)
    if values is None or not torch.isnan(values).any() or res.has("nan_on_masked_rows"):
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
        return "(" + ", ".join(map(shape_of, raw)) + ")"
    return type(raw).__name__


def error_text(err: float) -> Text:
    """A check's detail: the largest difference it measured."""
    return text(f"max abs error {err:.2e}", f"最大绝对误差 {err:.2e}")


def positions(batch: int, length: int, pad: list[int]) -> Tensor:
    """(B, 1, 1, S) bool padding mask: row b keeps its first length - pad[b] positions."""
    keep = torch.ones(batch, 1, 1, length, dtype=torch.bool)
    for b, p in enumerate(pad):  # no padding: an empty slice
        keep[b, ..., length - p:] = False
    return keep


def causal(length: int) -> Tensor:
    return causal_mask(length)  # (T, T), True = may attend: handformer's own mask


def finish(res: ComponentResult) -> ComponentResult:
    """The status from what was found: fail on any finding or failed check or a large error."""
    from handformer.check.core.result import DIFFERS, DRIVER, ERROR, FAIL, NOT_CHECKED

    if res.status in (ERROR, FAIL) or (res.status == NOT_CHECKED and not res.findings):
        return res
    failed = any(not c.ok for c in res.checks)
    big = res.max_abs_error is not None and not res.max_abs_error < 1e-5
    if res.findings or failed or big:
        res.status = FAIL
    elif res.status not in (DIFFERS, DRIVER):
        res.status = "pass"
    return res


def holds_torch_attention(module: Any) -> bool:
    """Whether a model computes its attention with torch.nn's (nn.Transformer, nn.MultiheadAttention)."""
    return isinstance(module, nn.Module) and any(isinstance(m, nn.MultiheadAttention)
                                                 for m in module.modules())


# torch.nn's plain layers (nn.Linear, nn.Embedding, the norms, nn.Sequential): a toy model's parts
TORCH_PLAIN = ("torch.nn.modules.linear", "torch.nn.modules.sparse", "torch.nn.modules.normalization",
               "torch.nn.modules.container")


def drives_only(module: nn.Module) -> bool:
    """A toy model that a file's training step or generation loop drives, not a Transformer to compare:
    no module inside it but torch.nn's plain layers is a block or an attention (the learner's class, or
    torch's nn.MultiheadAttention, holding a square projection or a fused (3n, n) one); what attention
    it has, if any, is a few lines of its own forward (a single-head TinyLM made to run `generate`)."""
    inside = [m for m in module.modules() if type(m).__module__ not in TORCH_PLAIN]  # the model first
    return one_layer(module) or not any(p.dim() == 2 and p.size(0) in (p.size(1), 3 * p.size(1))
                                        for m in inside[1:] for p in m.parameters())


def one_layer(module: nn.Module) -> bool:
    """A toy of one attention layer and no more: no list of blocks, no feed-forward (no two linear
    layers of D -> F and F -> D): a TinyLM of embeddings, one nn.MultiheadAttention, a norm and a head,
    written to run a sampling file's `generate`. Only a model check could not map is asked."""
    linears = filter(lambda m: isinstance(m, nn.Linear), module.modules())
    shapes = {(m.in_features, m.out_features) for m in linears}
    ffn = any(map(lambda shape: shape[::-1] in shapes - {shape}, shapes))  # D -> F and F -> D, F != D
    return not ffn and nn.ModuleList not in set(map(type, module.modules()))


DRIVER_NOTE = text("a toy model with no block or attention class of its own (a few torch.nn layers, written "
                   "to drive a training step or a generation loop): no Transformer to compare with "
                   "handformer's; its plain properties are checked, the components it drives are graded on "
                   "their own",
                   "一个没有自己的 Block 或注意力类的小模型（几层 torch.nn，用来驱动训练步或生成循环）："
                   "没有可以和 handformer 比较的 Transformer；只检查它的基本性质，它驱动的组件单独评分")


def masks_where_true_inside(module: Any, mask_name: str | None = None) -> bool:
    """Whether the module, or one of the learner's classes inside it, fills where its mask is True
    (torch.nn's convention, Raschka's Llama 3 and Qwen3 attention, a 手撕 attention whose
    ScaledDotProductAttention does `masked_fill(attn_mask, -1e9)`: see conventions.masks_where_true),
    or hands its masks to an nn.MultiheadAttention; a function: its own source, its mask `mask_name`."""
    if not isinstance(module, nn.Module):
        return masks_where_true(source_text(module), mask_name)
    if holds_torch_attention(module):
        return True
    # (whose source, whose arguments): the learner's classes, the modules their forwards build as they
    # run (nlp-tutorial's `ScaledDotProductAttention()(Q, K, V, attn_mask)`), the functions they call
    sources = [(type(sub), type(sub).forward) for sub in module.modules()
               if type(sub).__module__.startswith("learner_")]
    sources += [(cls, cls.forward) for _, forward in sources for cls in module_reads(forward)
                if nn.Module in getattr(cls, "__mro__", ())]
    # and the methods it hands its mask to under another name (Megatron's scale_mask_softmax(scores, mask))
    sources += [(f, f) for _, fn in sources for f in (*functions_called(fn), *methods_called(fn))]
    return any(_fills_where_true(code, fn) for code, fn in sources)


def _fills_where_true(code: Any, fn: Any) -> bool:
    """Whether `code`'s source fills where a mask argument of `fn` is True."""
    source = source_text(code)
    return any(is_mask_name(p.name) and masks_where_true(source, p.name) for p in readable_parameters(fn))


def file_masks_keep(ctx: Context) -> bool:
    """Whether the file's own causal mask function writes True (or 1) = may see: its mask for 3
    tokens, (3, 3) or (1, 3, 3), lets query 0 see key 0; False when the file has none, or its mask is
    additive or does not run (then nothing in the file says how its attention must read a mask)."""
    comp = ctx.components.get("causal_mask", NO_COMPONENT)
    try:
        raw = ctx.learner.call("forward", comp.obj, 3)
        return not raw.is_floating_point() and bool(raw.reshape(3, 3)[0, 0] != 0)
    except (fp.LearnerFailure, AttributeError, RuntimeError):  # none, or no (3, 3) mask
        return False


NO_COMPONENT = Component("", "", lambda *args: None, "")  # a component the file lacks: returns nothing


SEQUENCE_FIRST = text("it takes its input sequence-first, (T, B, D) (PyTorch's nn.Transformer tutorial, "
                      "batch_first=False): driven so",
                      "它的输入是序列维在前的 (T, B, D)（PyTorch nn.Transformer 教程的写法，"
                      "batch_first=False）：按这种布局调用")


def reads_sequence_first(ctx: Context, run: Callable[[Tensor], Any], x: Tensor) -> bool:
    """Whether a forward reads its input x (2, 7, ...) sequence-first, (T, B, ...), from what it does:
    changing entry [0, 3] moves output [1, 3] (read as one sequence a column, the same sequence) and
    leaves [0, 0] (another one); False when it does not run so."""
    bumped = x.clone()
    # 1 for a token id, 1..D for a vector: not a constant, which a LayerNorm first would take away
    bumped[0, 3] += torch.arange(1, 1 + x[0, 3].numel()).reshape(x[0, 3].shape).to(x.dtype)
    try:
        a, b = (fp.first_tensor(ctx.learner.call("forward", run, v), 3) for v in (x, bumped))
        return moved_by(a, b, (1, 3)) > 1e-9 and moved_by(a, b, (0, 0)) < 1e-9
    except (fp.LearnerFailure, IndexError):  # it refuses the input, or returns fewer positions
        return False


def reads_sequence_first_masked(ctx: Context, run: Callable[[Tensor], Any],
                                hand: Callable[[str | None], None], convs: tuple[str | None, ...]) -> bool:
    """`reads_sequence_first` on a square input (7, 7, D), a mask it is handed fitting either reading:
    `hand` hands it every key visible in each of `convs` in turn (None: no mask), as a forward that
    requires its mask (fairseq's forward(x, key_padding_mask)) needs."""
    x = fp.randn(7, 7, D, seed=8)

    def reads(conv: str | None) -> bool:
        hand(conv)
        return reads_sequence_first(ctx, run, x)

    first = any(map(reads, convs))
    hand(None)
    return first


def batch_first(raw: Any) -> Any:
    """A sequence-first output (T, B, ...), or the first of a tuple (out, weights), as (B, T, ...)."""
    if isinstance(raw, tuple):
        return (batch_first(raw[0]), *raw[1:])
    return raw.transpose(0, 1) if isinstance(raw, Tensor) else raw


def batch_first_by_shape(t: Tensor, B: int, T: int) -> Tensor:
    """t as (B, T, ...): transposed where its first two sizes read (T, B) (ChatGLM's layers, handed
    [seq, batch, hidden] inside a model that takes (B, T) ids); as it is otherwise."""
    return t.transpose(0, 1) if tuple(t.shape[:2]) == (T, B) != (B, T) else t


def logits_shape(res: ComponentResult, out: Tensor | None, want: tuple[int, ...], vocab: str) -> bool:
    """The check that an assembled model's logits have the shape (B, T, vocab) = want; whether they do."""
    got = then(out, lambda o: tuple(o.shape))
    res.checks.append(Check(text(f"logits of shape (B, T, {vocab}) = {want}",
                                 f"logits 的形状为 (B, T, {vocab}) = {want}"), got == want,
                            text(f"got {got}", f"实际得到 {got}")))
    return got == want


def moved_by(a: Tensor | None, b: Tensor | None, index: Any) -> float:
    """How far a (B, T, D) output moved from b on the positions `index` picks (inf when either is
    missing or their shapes differ: the property cannot hold)."""
    if a is None or b is None or a.shape != b.shape or a.dim() != 3:
        return float("inf")
    diff = (a - b).abs()[index]
    return diff.max().item() if diff.numel() else 0.0


def grads_error(pairs: list[tuple[Tensor | None, Tensor | None]]) -> float:
    err = 0.0
    for a, b in pairs:
        if (a is None) != (b is None):  # a gradient on one side only
            return math.inf
        if a is None:
            continue
        err = max(err, fp.max_error(a.reshape(1, -1), b.reshape(1, -1)))
    return err


def raised_at(err: LearnerError) -> Finding | None:
    """A finding at the line of the learner's file where their code raised (the innermost of its
    frames), for a check whose run raised: None when it raised elsewhere (a stand-in, torch alone)."""
    innermost = "".join(err.traceback[-1:]) * (err.kind == "exception")  # "line 12, in f: code", or ""
    frame = re.match(r"line (\d+), in [^:]+: (.*)", innermost)
    said = text(f"your code raised here: {err.message}", f"你的代码在这里抛出了异常：{err.message}")
    return frame and Finding(DEPARTS, said, int(frame.group(1)), frame.group(2))


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
        if conv in QUERY_FIRST and set(outputs) - set(QUERY_FIRST):  # a fallback: where every other raised
            break
        try:
            out = run(conv)
        except fp.LearnerFailure as err:
            failure = failure or err
            continue
        if out is not None:
            outputs[conv] = out
    return outputs, failure


def first_working(ctx: Context, run: Callable[[str], Any], conventions: tuple[str, ...] | None = None,
                  ) -> str:
    """The first mask convention the learner's code runs with (torch.nn-style code raises on a 0/1
    int mask); their first exception if none does."""
    failure = None
    for conv in conventions or ctx.conventions():
        try:
            run(conv)
            return conv
        except fp.LearnerFailure as err:
            failure = failure or err
    assert failure is not None
    raise failure
