"""A decoder-only language model trained with and without its causal mask (character LM).

The tutorials' claim: without the causal mask, position t sees token t + 1, the very token it is
asked to predict, so the training loss falls suspiciously fast towards zero; but when generating,
the future does not exist yet, so the model has learned nothing useful and its text is garbage.

Measured: the final training loss (as trained); the held-out loss as trained (no mask); the
held-out loss with the causal mask, which is what generation sees, since a token generated with
the KV cache can only attend to the tokens before it; and a greedy sample from each model.

Training without the mask is a lesson, not a configuration: `logits_without_mask` runs the same
model's modules with no mask at all. `CausalLM` itself is always causal.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from handformer.data.text import validation_batches
from handformer.experiments.runner import Experiment, Metric, Plot, Trial
from handformer.experiments.workloads import (
    LMData,
    LMSettings,
    lm_data,
    lm_loss_sum,
    lm_model,
    lm_val_loss,
    train_lm,
)
from handformer.generation.generate import generate
from handformer.models.causal_lm import CausalLM
from handformer.modes import eval_mode
from handformer.nn.kv_cache import KVCache
from handformer.nn.masks import AttentionMask
from handformer.training.losses import token_cross_entropy


@dataclass
class Settings:
    model: LMSettings
    sample_chars: int  # length of the greedy sample
    prompt_chars: int  # prompt + sample fit in the model's positions (max_positions)


FULL = Settings(LMSettings(steps=400), sample_chars=40, prompt_chars=24)
SMOKE = Settings(LMSettings(d_model=16, n_heads=2, d_ff=32, n_layers=1, block_size=16, max_positions=64,
                            batch_size=4, steps=3, eval_batches=1, log_every=1),
                 sample_chars=8, prompt_chars=8)

VARIANTS = ("causal mask", "no mask")


class NoCausalMaskLM(CausalLM):
    """CausalLM whose layers get no mask at all: every position attends to every position, the
    future included. Only `build_mask` differs; the forward pass is CausalLM's own."""

    def build_mask(self, T: int, offset: int, attention_mask: Tensor | None, cache: KVCache | None,
                   device: torch.device) -> AttentionMask:
        return AttentionMask()  # no mask, and not is_causal: nothing is hidden


def logits_without_mask(model: CausalLM, ids: Tensor) -> Tensor:
    """(B, T) ids -> (B, T, V) logits of the same model (its modules and weights, shared) with no
    mask: the trial trains and scores one model both ways, so `model` itself stays causal."""
    unmasked = NoCausalMaskLM.__new__(NoCausalMaskLM)
    object.__setattr__(unmasked, "__dict__", model.__dict__)  # the same submodules, parameters, mode
    return unmasked(ids).logits  # (B, T, V)


def loss_sum_without_mask(model: CausalLM, batch) -> Tensor:
    return token_cross_entropy(logits_without_mask(model, batch.x), batch.y, None)


@torch.no_grad()
def val_loss_without_mask(model: CausalLM, data: LMData, s: LMSettings) -> float:
    total, tokens = 0.0, 0
    with eval_mode(model):
        for batch in validation_batches(data.val_ids, s.block_size, s.batch_size, s.eval_batches):
            total += float(loss_sum_without_mask(model, batch))
            tokens += batch.n_tokens
    return total / tokens


def greedy_sample(model: CausalLM, data: LMData, settings: Settings) -> str:
    prompt = data.val_ids[: settings.prompt_chars].tolist()
    new = generate(model, [prompt], settings.sample_chars, temperature=0.0)[0]
    tok = data.tokenizer
    return f"{tok.decode(prompt)!r} + {tok.decode(new)!r}"


def run_trial(variant: str, seed: int, settings: Settings) -> Trial:
    s = settings.model
    data = lm_data()
    model = lm_model(s, data.tokenizer.vocab_size, seed)
    masked = variant == "causal mask"
    log = train_lm(model, s, data, seed, lm_loss_sum if masked else loss_sum_without_mask)
    metrics = {"train_loss": log.final_loss}
    notes = {}
    if log.diverged_at is None:
        metrics["val_causal"] = lm_val_loss(model, data, s)
        metrics["val_as_trained"] = metrics["val_causal"] if masked else val_loss_without_mask(model, data, s)
        if seed == 0:
            notes["greedy sample (prompt + continuation)"] = greedy_sample(model, data, settings)
    return Trial(variant, seed, metrics, {"train": log.curve}, notes)


EXPERIMENT = Experiment(
    name="no-causal-mask",
    title="A decoder-only LM trained with and without the causal mask (character LM)",
    claim="without the causal mask the training loss falls suspiciously fast, and generation is garbage",
    variants=VARIANTS,
    metrics=[Metric("train_loss", "final training loss"),
             Metric("val_as_trained", "held-out loss, as trained"),
             Metric("val_causal", "held-out loss, causal (what generation sees)")],
    plots=[Plot("train", "training loss (as trained)")],
    run_trial=run_trial,
    settings={"full": FULL, "smoke": SMOKE},
    no_smoke_claim=("3 steps are too few for the unmasked model to learn to copy the next character: "
                    "its losses are lower in only 6 or 7 of 10 seeds"),
)
