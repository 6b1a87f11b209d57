"""The learner's own parts a training step is handed when its code needs them: the file's batch class
(the Annotated Transformer's `Batch(src, tgt, pad)`, which shifts the target and counts the real
tokens into `tgt_y` and `ntokens`) and its loss-compute wrapper (`SimpleLossCompute(generator,
criterion)`, called `loss_compute(out, tgt_y, ntokens)`), found by what they take and set, never by
their names.

Shape legend: B batch, S source length, T target length.
"""

from __future__ import annotations

import inspect
import re
import sys
from typing import Any

import torch.nn as nn
from torch import Tensor

from handformer.check.core.argument_names import CRITERION_NAMES, PAD_NAMES, names_of, readable_parameters
from handformer.check.core.context import Context
from handformer.check.core.discovery import own_objects


def _classes(fn: Any) -> list[Any]:
    """The classes the file of `fn` defines."""
    return list(filter(inspect.isclass, own_objects(sys.modules[fn.__module__]).values()))


def own_batch(ctx: Context, step: Any, fields: list[str], src: Tensor, tgt: Tensor, pad: int) -> Any:
    """The file's batch built from (src, tgt) with the pad id `pad`: a class of the file that takes
    them and sets every field the step reads; None when there is none."""
    for cls in _classes(step):
        pads = {p.name: pad for p in readable_parameters(cls)[2:] if p.name.lower() in PAD_NAMES}
        try:
            batch = ctx.learner.call("forward", cls, src.clone(), tgt.clone(), **pads)
        except Exception:  # noqa: BLE001  (not a batch of this step: the next class, or the fields as before)
            continue
        if all(hasattr(batch, f) for f in fields):
            return batch
    return None


# a three-argument call of the criterion: loss_compute(out, batch.tgt_y, batch.ntokens)
ARGUMENT = r"\s*(?:[^(),\s]|\([^()]*\))+\s*"


def calls_with_norm(source: str, name: str) -> bool:
    """Whether the step calls its criterion `name` with three arguments (output, target, norm)."""
    return bool(re.search(rf"\b{re.escape(name)}\({ARGUMENT},{ARGUMENT},{ARGUMENT}\)", source))


ROLES = {**dict.fromkeys(("generator", "gen", "proj", "projection", "head", "lm_head"), "generator"),
         **dict.fromkeys((*CRITERION_NAMES, "loss"), "criterion")}


def own_loss_compute(ctx: Context, step: Any, criterion: Any) -> Any:
    """The file's loss-compute wrapper around `criterion`, its generator a stand-in that changes
    nothing (the model handed already returns log-probabilities): a class that requires a generator
    and a criterion and nothing else; `criterion` itself when the file has none."""
    given = {"generator": nn.Identity(), "criterion": criterion}
    for cls in _classes(step):
        roles = {n: ROLES.get(n.lower()) for n in names_of(readable_parameters(cls))[1]}
        if sorted(map(str, roles.values())) == ["criterion", "generator"]:
            return ctx.learner.call("__init__", cls, **{n: given[r] for n, r in roles.items()})
    return criterion
