"""Zero-initialised output projections (the modded-nanogpt speedrun's): a training trick, init only.

Every block adds two sublayers into the residual stream, attention through `o_proj` and the
feed-forward network through `down_proj`. Starting both at zero makes each block the identity at
step 0: the model begins as embeddings -> head (a bigram model), and each block joins in as its
projections grow. The first step moves only the projections (the layers before them get no
gradient through a zero matrix); from the second on, everything trains.
"""

from __future__ import annotations

from torch import nn

from handformer.training.muon import BLOCKS

OUTPUT_PROJECTIONS = ("o_proj", "down_proj")  # the two writes into the residual stream


def zero_output_projections(model: nn.Module) -> int:
    """Zero the weights of every block's o_proj and down_proj (and their biases); returns how many
    matrices were zeroed. Raises when the model has none, so a config never asks for it in vain."""
    zeroed = 0
    for block in model.modules():
        if not isinstance(block, BLOCKS):
            continue
        for name, module in block.named_modules():
            if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in OUTPUT_PROJECTIONS:
                nn.init.zeros_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
                zeroed += 1
    if not zeroed:
        raise ValueError("train.zero_init_projections=true found no o_proj or down_proj inside the "
                         "model's blocks; set it to false for this model")
    return zeroed
