"""Embeddings of texts from a language-model run: its last hidden states (after the final norm,
the input of the output head), pooled over each text and L2-normalised.

    mean   the mean over the text's real positions (the default)
    last   the last position (for a causal model, the only one that has seen the whole text)

A model trained only to predict the next token was not trained to place texts of similar meaning
near each other: these vectors are meaningful for models trained for it (an embedding fine-tune);
for others they are features, not a similarity measure.

Texts are run in batches, left-padded (the padding hidden by the mask, positions counted over
real tokens), so a text's vector does not depend on the others in its batch.

Shape legend: B texts in a batch, T the longest, D d_model.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from handformer.models.causal_lm import CausalLM
from handformer.modes import eval_mode

POOLINGS = ("mean", "last")
BATCH = 16


@torch.inference_mode()
def embed(model: CausalLM, texts: Sequence[Sequence[int]], pooling: str = "mean", batch: int = BATCH,
          dimensions: int | None = None) -> Tensor:
    """(N, D) float32 unit vectors, one per text of token ids. `dimensions`: keep the first that
    many of each vector, normalised again (as OpenAI's `dimensions`)."""
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
    if dimensions is not None and not 1 <= dimensions <= model.cfg.d_model:
        raise ValueError(f"dimensions must be from 1 to the model's width {model.cfg.d_model}, "
                         f"got {dimensions}")
    out = [pooled_batch(model, texts[i:i + batch], pooling) for i in range(0, len(texts), batch)]
    vectors = torch.cat(out)[:, :dimensions]  # (N, D')
    return torch.nn.functional.normalize(vectors, dim=-1)


def pooled_batch(model: CausalLM, texts: Sequence[Sequence[int]], pooling: str) -> Tensor:
    """(B, D) the pooled, not yet normalised, hidden states of one batch."""
    device = next(model.parameters()).device
    T = max(len(t) for t in texts)
    ids = torch.zeros(len(texts), T, dtype=torch.long, device=device)  # (B, T), left-padded
    mask = torch.zeros(len(texts), T, dtype=torch.bool, device=device)
    for i, t in enumerate(texts):
        ids[i, T - len(t):] = torch.tensor(list(t), device=device)
        mask[i, T - len(t):] = True
    hidden = last_hidden_states(model, ids, mask if not bool(mask.all()) else None).float()  # (B, T, D)
    if pooling == "last":
        return hidden[:, -1]  # right-aligned: every text ends at the last column
    weights = mask.float()[..., None]  # (B, T, 1)
    return (hidden * weights).sum(1) / weights.sum(1)  # (B, D)


def last_hidden_states(model: CausalLM, ids: Tensor, mask: Tensor | None) -> Tensor:
    """(B, T, D) what the output head would read at every position: the last block's output,
    through the final norm. Read with a hook on the last block, so the head runs for one position
    only."""
    seen: list[Tensor] = []
    hook = model.layers[-1].register_forward_hook(lambda module, args, out: seen.append(out[0]))
    try:
        with eval_mode(model):
            model(ids, mask, logits_to_keep=1)
    finally:
        hook.remove()
    return model.norm(seen[0])  # (B, T, D)


__all__ = ["POOLINGS", "embed", "last_hidden_states"]
