"""Getting a loaded model ready for decoding: the inference-only transforms the CLI and the server
apply after loading a run (never during training, and never to a model a caller passed in).

Today that is packing the large fp32 linear weights for oneDNN (`handformer.nn.packed_linear`): the
same numbers up to the order of sums, 1.6x to 2x faster matrix products on a CPU for models with
weight matrices of 1 MiB and more; tiny models are left as they are.
"""

from __future__ import annotations

import os

from torch import nn

from handformer.nn.packed_linear import pack_linears

PLAIN_ENV = "HANDFORMER_PLAIN_LINEAR"  # set to 1 to decode with plain nn.Linear layers (debugging)


def prepare_for_decoding(model: nn.Module, pack: bool | None = None) -> nn.Module:
    """Apply the decoding transforms to `model` in place (it must be in eval mode afterwards: the
    packed layers refuse training). pack: pack large linear weights (None: yes unless the environment
    sets HANDFORMER_PLAIN_LINEAR=1). Returns the model."""
    if pack is None:
        pack = os.environ.get(PLAIN_ENV, "") not in ("1", "true", "yes")
    model.eval()
    if pack:
        pack_linears(model)
    return model


__all__ = ["PLAIN_ENV", "prepare_for_decoding"]
