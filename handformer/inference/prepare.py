"""Getting a loaded model ready for decoding: the inference-only transforms the CLI and the server
apply after loading a run (never during training, and never to a model a caller passed in).

1. `fuse_projections` (`handformer.inference.fuse`): W_Q, W_K, W_V stacked into one matrix, W_gate
   and W_up into another: fewer, larger products, which is what a small model's decoding step needs.
2. `remove_dropout` (`handformer.inference.dropout`): every nn.Dropout becomes NoDropout (the
   same function in eval mode, a plain call instead of nn.Module's hook machinery at every layer).
3. `plain_norms` (`handformer.inference.norms`): every lesson norm becomes its decoding
   twin (the same weights and numbers, a plain call, no cast of a float32 input).
4. `pack_linears` (`handformer.inference.packed_linear`): fp32 and bf16 weights of 1 MiB and more
   packed for oneDNN, 1.6x to 2x `F.linear`'s speed on a CPU; tiny models keep plain layers.

Fusing comes first, so the stacked matrices are the ones packed. Both give the same tokens (up to
the order of sums in a matrix product, as between two thread counts). The model's state dict then
has the fused names (`qkv_proj`, `gate_up_proj`): save, export, quantize or fine-tune the loaded
run, not the prepared model.
"""

from __future__ import annotations

import os

from torch import nn

from handformer.inference.dropout import remove_dropout
from handformer.inference.fuse import fuse_projections
from handformer.inference.norms import plain_norms
from handformer.inference.packed_linear import pack_linears

PLAIN_ENV = "HANDFORMER_PLAIN_DECODING"  # set to 1 to decode with the model as loaded (debugging)


def prepare_for_decoding(model: nn.Module, enabled: bool | None = None) -> nn.Module:
    """Fuse, remove dropout, plain norms and pack `model` in place for decoding, and put it in eval
    mode (the packed layers refuse training). enabled=None: yes, unless the environment sets
    HANDFORMER_PLAIN_DECODING=1. Returns the model."""
    if enabled is None:
        enabled = os.environ.get(PLAIN_ENV, "") not in ("1", "true", "yes")
    model.eval()
    if enabled:
        fuse_projections(model)
        remove_dropout(model)
        plain_norms(model)
        pack_linears(model)
    return model


__all__ = ["PLAIN_ENV", "prepare_for_decoding"]
