"""A decoding loop judged against the model it is handed, when that model is the learner's own and
computes with lossy arithmetic (an int8 KV cache, a low-precision one): its cached steps give logits a
little apart from the full forward's on the same tokens, so its greedy tokens may part from exact
greedy decoding where the two likeliest tokens lie within that error. Such a token is no departure.

The error is measured, not assumed: each step's last logits, as the learner's model gave them to the
loop (recorded by generate_own.OwnModel), against the full forward of the same model on the same
tokens (no cache), relative to the range of the full forward's logits. Within LOSSY (an int8 cache is
~0.2 %, a cache written at the wrong slot or with a wrong scale ~10 to 25 %) the loop is judged token
by token on its own path: each token must be the likeliest of the full forward's logits, or lie
within twice the measured error of it. Above LOSSY the cached steps compute something else: a
failed check, whatever the tokens.

The tolerance is granted only to a file whose code computes lossily (LOSSY_CODE: an int8 or
half-precision dtype, a rounding, a quantizer); an exact cache is held to float rounding (EXACT).

Shape legend: B batch, V vocabulary, n new tokens.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import torch
from torch import Tensor

from handformer.check.core.result import Check, Text, text
from handformer.check.core.source import code_text

LOSSY = 0.05  # the largest error of a cached step, relative to the logits' range, that is rounding
EXACT = 1e-6  # the same for a file that computes exactly (float rounding)
STEP = 1e-3  # an exact file's cached step against the full forward: rounding is ~1e-6, a lost context ~0.2
# code that computes lossily: an 8-bit or half-precision dtype, a rounding to levels, a quantizer; `half`
# and `round` only as torch's or a tensor's (RoPE's `half = x.size(-1) // 2` is no half precision)
LOSSY_CODE = re.compile(r"\b(u?int8|u?int4|float16|bfloat16|float8\w*|fp8|quantiz\w*)\b"
                        r"|\btorch\.(half|round)\b|\.(half|round)\(")


def computes_lossily(obj: Any) -> bool:
    """Whether the file that defines `obj` (a class, an instance, a module) computes lossily (LOSSY_CODE)."""
    return bool(LOSSY_CODE.search(code_text(inspect.getmodule(obj))))


def tolerance(obj: Any) -> float:
    """LOSSY where the file that defines `obj` computes lossily, else EXACT."""
    return (EXACT, LOSSY)[computes_lossily(obj)]


def relative(err: float, whole: Tensor) -> float:
    """An error relative to the range of the logits `whole` (..., V)."""
    return err / max(float((whole.amax(-1) - whole.amin(-1)).min()), 1e-12)


def lossy_note(err: float, relative: bool = True) -> Text:
    """Its cached outputs `err` apart from the whole sequence's (of the logits' range, or absolute)."""
    said, said_zh = ((f"{err:.1e}", f" {err:.1e}"),
                     (f"{err:.2%} of their range", f"其范围的 {err:.2%}"))[relative]
    return text(f"your code computes lossily (a quantized or half-precision cache): through its cache its "
                f"outputs are {said} apart from the whole sequence's, within the {LOSSY:.0%} a lossy cache's "
                "rounding is allowed",
                f"你的代码做有损运算（量化或半精度的缓存）：经过缓存的输出与整句的相差{said_zh}，"
                f"在有损缓存允许的舍入 {LOSSY:.0%} 之内")


def step_logits(run: Any) -> tuple[Tensor, Tensor] | None:
    """(own, exact): the last logits (n, B, V) the learner's model handed the loop at each step, and
    the full forward's on the same tokens; None where the loop's calls are not one a new token (a
    search, a stand-in model) or its tokens are unknown."""
    outputs, exact = getattr(run.model, "outputs", None), getattr(run.model, "exact", None)
    # one call a new token, and maybe one more after the last (a loop that steps before it stops)
    if run.out is None or not outputs or exact is None or len(outputs) - run.out.size(1) not in (0, 1):
        return None
    outputs = outputs[:run.out.size(1)]
    if any(o.shape != outputs[0].shape or o.size(0) != run.out.size(0) for o in outputs):
        return None
    ids = torch.cat([run.prompt, run.out], 1)  # (B, T + n)
    T = run.prompt.size(1)
    crop = getattr(run.model, "block_size", ids.size(1))  # what a model that raises past it saw
    full = torch.stack([exact(ids[:, :T + k][:, -crop:])[:, -1] for k in range(run.out.size(1))])  # (n, B, V)
    return torch.stack(outputs).to(full.dtype), full


def lossy_steps(run: Any) -> tuple[Tensor, Tensor] | None:
    """`step_logits` in a file that computes lossily, else None: an exact file's model is not run again
    (nor on a whole context a crop kept from it)."""
    return step_logits(run) if computes_lossily(getattr(run.model, "module", None)) else None


def relative_errors(own: Tensor, full: Tensor) -> Tensor:
    """The largest |own - full| of each step (n,), relative to the range of the full forward's logits."""
    spread = (full.amax(-1) - full.amin(-1)).clamp(min=1e-12)  # (n, B)
    return ((own - full).abs().amax(-1) / spread).amax(-1)


def excused(run: Any) -> bool:
    """In a file that computes lossily, whether tokens that part from exact greedy decoding are each
    the full forward's likeliest on the loop's own path, or within twice the measured error of it, the
    error being rounding (<= LOSSY)."""
    logits = lossy_steps(run)  # an exact file is held to exact greedy tokens
    if logits is None:
        return False
    own, full = logits
    error = (own - full).abs().amax(-1, keepdim=True)  # (n, B, 1)
    if float(relative_errors(own, full).max()) > LOSSY:
        return False
    chosen = full.gather(-1, run.out.T[..., None])  # (n, B, 1): the logit of each token it chose
    return bool((full.amax(-1, keepdim=True) - chosen <= 2 * error).all())


def cache_checks(run: Any) -> list[Check]:
    """The check that each step's logits, after the first, equal the full forward's on the same tokens:
    within the rounding of a lossy cache (LOSSY) in a file that computes lossily, within float rounding
    (STEP) elsewhere; an exact model's greedy tokens alone may not show a loop that loses its context
    (a tied embedding at random weights can make each token its own likeliest successor, whatever came
    before); there a step apart is failed only where it lost its context (`context_lost`). None where the
    steps cannot be told apart."""
    logits = step_logits(run)
    if logits is None:
        return []
    errors = relative_errors(*logits)
    worst, lossy = int(errors.argmax()), computes_lossily(getattr(run.model, "module", None))
    why = (("float rounding", "浮点舍入"),
           ("the rounding of a lossy cache: your code quantizes or computes in half precision",
            "有损缓存的舍入：你的代码做了量化或半精度运算"))[lossy]
    bound = (STEP, LOSSY)[lossy]
    if not (float(errors[worst]) <= bound or lossy or context_lost(run)):
        return []  # an exact step apart for a reason of its own (a capacity that counts tokens): tokens judge
    share = f"{bound:.{int(bound < 0.01)}%}"  # 5%, 0.1%
    return [Check(text(f"each step's logits (with its cache) equal the full forward's on the same tokens, "
                      f"within {share} of their range ({why[0]})",
                      f"每一步（用缓存）的 logits 与同样 token 上完整前向的 logits 相同，"
                      f"误差不超过其范围的 {share}（{why[1]}）"),
                 float(errors[worst]) <= bound,
                 text(f"step {worst} is {float(errors[worst]):.1%} apart", f"步 {worst} 相差 "
                      f"{float(errors[worst]):.1%}"))]


def context_lost(run: Any) -> bool:
    """Whether every step after the first gives the logits of the full forward on the token it was fed
    alone (at position 0, nothing before it): the loop never hands its model the cache it got back."""
    logits = step_logits(run)
    if logits is None:
        return False
    own = logits[0]  # (n, B, V)
    ids = torch.cat([run.prompt, run.out], 1)  # (B, T + n)
    T, exact = run.prompt.size(1), run.model.exact
    fed = [ids[:, T + k - 1 : T + k] for k in range(1, own.size(0))]  # each step's one token (B, 1)
    alone = torch.stack([own[0], *(exact(one)[:, -1].to(own.dtype) for one in fed)])  # (n, B, V), step 0 own
    return own.size(0) > 1 and float(relative_errors(own, alone).max()) <= STEP
