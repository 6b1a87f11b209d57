"""Per-channel gains on a sublayer's output (LayerScale, CaiT's and DINOv2's: x + gamma * f(x)), as a
module of one vector (`ls1 = LayerScale(d)`) or a bare Parameter the block multiplies (`self.gamma_1 *
self.attn(...)`): diag(gamma) W_O is a linear map of W_O's form, so the block is handformer's with the
rows of W_O (and of the FFN's down projection) scaled by the gains. The mapping folds each gain into
those rows for the comparison (a convention, said in the report); gains it cannot place one a sublayer
are named and the block is not compared.

Shape legend: D d_model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import Tensor

from handformer.check.core.defaults import then
from handformer.check.core.result import Text, text
from handformer.check.core.weights import Leaf, MappingError, Slot

FFN_WORDS = re.compile(r"(?i)ffn|mlp|feed|ff_|_ff")  # a gain of the FFN's branch (ffn_scale, ls_mlp)
OUTPUT_ROLES = ("W_O", "FFN W_2", "FFN W_down")  # the projections a sublayer's output leaves through


@dataclass
class ScaledSlot(Slot):
    """A sublayer's output projection (its leaf and rows) with its rows scaled by the gain that
    follows it."""

    gain: Leaf | None = None

    def weight(self) -> Tensor:
        return self.gain.weight[:, None] * super().weight()  # (out, in): row i times gamma_i

    def bias(self) -> Tensor | None:
        return then(super().bias(), lambda b: self.gain.weight * b)

    def describe(self) -> str:
        return f"{self.gain.name} * {super().describe()}"


def fold(gains: list[Leaf], sublayers: list[list[Slot]], what: str) -> list[list[Slot]]:
    """Each sublayer's slots with its output projection scaled by its gain: one gain a sublayer, in
    the order they are defined, an FFN's named so last; no gains: the slots as they are; any other
    count, or a sublayer without an output projection: MappingError naming them."""
    if not gains:
        return sublayers
    gains = sorted(gains, key=lambda g: bool(FFN_WORDS.search(g.name.split(".")[-1])))
    outputs = [list(filter(lambda s: s.role.endswith(OUTPUT_ROLES), slots)) for slots in sublayers]
    shown = ", ".join(f"{g.name} {tuple(g.weight.shape)}" for g in gains)
    if len(gains) != len(sublayers) or set(map(len, outputs)) != {1}:
        raise MappingError(f"{what}: per-channel gains on the sublayers' outputs (LayerScale: {shown}), "
                           f"which check folds into each sublayer's output projection, one a sublayer; "
                           f"{len(sublayers)} sublayers, each with one output projection, would take them",
                           zh=f"{what}：子层输出上的逐通道增益（LayerScale：{shown}），检查程序把它们并进"
                              f"每个子层的输出投影，一个子层一个；要有 {len(sublayers)} 个子层、"
                              "每个一个输出投影才放得下")
    return [[ScaledSlot(s.role, s.leaf, s.rows, s.part, gain=g) if s is o[0] else s for s in slots]
            for slots, o, g in zip(sublayers, outputs, gains)]


def gain_note(slots: list[Slot]) -> list[Text]:
    """What the folded gains were read as, for the report; none where there are none."""
    scaled = [s for s in slots if isinstance(s, ScaledSlot)]
    pairs = ", ".join(f"{s.gain.name} -> {s.leaf.name}" for s in scaled)
    return [text(f"per-channel gains on the sublayers' outputs (LayerScale: {pairs}) are folded into the "
                 "rows of those output projections for the comparison: a convention, not an error",
                 f"子层输出上的逐通道增益（LayerScale：{pairs}）在比较时并进这些输出投影的行里："
                 "这是写法约定，不是错误")] * bool(scaled)


def folded_gains(sublayers: list[list[Slot]]) -> tuple[Tensor | None, ...]:
    """Each sublayer's gain folded into its output projection (None: none)."""
    return tuple(next((s.gain.weight.detach() for s in slots if isinstance(s, ScaledSlot)), None)
                 for slots in sublayers)
