"""`eval_mode`: run code with a model in eval mode (dropout off), then give the model back in the
mode it was in, even when the code raises. Evaluation, decoding, generation, scoring and tracing
all use it, so none of them leaves a model that was training in eval mode."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)
