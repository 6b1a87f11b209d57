"""The order in which a model calls its blocks, read by hooks as it runs.

A model may call one block more than once: MobileLLM's block-wise sharing (each block twice in a row),
ALBERT's one block for every layer, a looped transformer's stack run again. Its reference is then
driven through the same sequence of the learner's blocks. Only a sequence that calls every block, and
some block more than once, is taken so: a block never called (a loop that stops one short) or blocks
merely run in another order stay for the comparison to charge.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import nn
from torch.utils.hooks import RemovableHandle

from handformer.check.core.result import Text, text


def call_order(blocks: Sequence[nn.Module], run: Callable[[], Any]) -> tuple[int, ...]:
    """The indices of `blocks` in the order `run` calls them, where every block is called and some
    block more than once; () otherwise (one call each, in any order: compared as built), and where
    one module stands at two places of the list (ALBERT's [block] * n: its places are the calls)."""
    called: list[int] = []
    hooks = [block.register_forward_pre_hook(lambda *_, i=i: called.append(i))
             for i, block in enumerate(blocks)]
    try:
        run()
    finally:
        [*map(RemovableHandle.remove, hooks)]
    if len(set(map(id, blocks))) < len(blocks) or set(called) != set(range(len(blocks))) \
            or len(called) == len(blocks):
        return ()
    return tuple(called)


def order_note(order: tuple[int, ...]) -> Text:
    said = ", ".join(map(str, order))
    return text(f"your model calls its blocks in the order {said} (a block called more than once: weights "
                "shared across layers): handformer's model is run through the same sequence of your blocks",
                f"你的模型按 {said} 的顺序调用各个 Block（有 Block 被调用不止一次：层间共享权重）："
                "handformer 的模型按同样的顺序使用你的 Block")
