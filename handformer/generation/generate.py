"""Text generation for the decoder-only model: a batched sampling loop that takes a model (the model
itself knows nothing about generation); the logit filters are in sampling.py.

`generate` left-pads a batch of prompts, runs one forward over all of them (prefill) into a
preallocated KV cache, then one forward per new token. Positions are counted from the attention
mask inside the model, so a left-padded prompt sees the same positions as it would alone.

Shape legend: B batch, L longest prompt, S positions so far (prompt + generated), V vocabulary.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from handformer.generation.sampling import check_sampling_options, next_tokens
from handformer.models.causal_lm import CausalLM
from handformer.modes import eval_mode


def _check_args(model: CausalLM, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                temperature: float, top_k: int | None, top_p: float | None, pad_id: int) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
    check_sampling_options(temperature, top_k, top_p)
    if isinstance(prompts, (str, Tensor)) or not prompts or isinstance(prompts[0], int):
        raise ValueError("prompts must be a non-empty list of token-id lists, e.g. [[1, 17, 4]]")
    for i, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(f"prompt {i} is empty; give at least one token (e.g. the BOS id)")
    vocab = model.cfg.vocab_size
    if not 0 <= pad_id < vocab:
        raise ValueError(f"pad_id={pad_id} is outside the vocabulary [0, {vocab})")
    longest = max(len(p) for p in prompts)
    needed = positions_needed(longest, max_new_tokens)
    if needed > model.cfg.max_positions:
        raise ValueError(f"a prompt of {longest} tokens plus max_new_tokens={max_new_tokens} needs "
                         f"{needed} positions but the model has max_positions="
                         f"{model.cfg.max_positions}; lower max_new_tokens to at most "
                         f"{max_new_tokens_for(longest, model.cfg.max_positions)} or shorten the prompt")


def positions_needed(prompt_length: int, max_new_tokens: int) -> int:
    """Positions the model sees: the prompt and every new token but the last, which is returned
    without being fed back."""
    return prompt_length + max(max_new_tokens - 1, 0)


def max_new_tokens_for(prompt_length: int, max_positions: int) -> int:
    """The most new tokens a prompt of this length can get within max_positions (0 if none)."""
    return max(max_positions - prompt_length + 1, 0) if prompt_length <= max_positions else 0


@torch.inference_mode()  # cheaper per op than no_grad: decoding a small model is op overhead
def generate(model: CausalLM, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
             seed: int | None = None, stop_tokens: Sequence[int] = (), pad_id: int = 0,
             use_cache: bool = True, on_token: Callable[[int, int], None] | None = None,
             ) -> list[list[int]]:
    """Continue each prompt (a list of token ids) by up to `max_new_tokens` tokens.

    Returns the new tokens of each prompt. A row stops at its first token in `stop_tokens`; that
    stop token is included as the row's last token, and nothing follows it. `on_token(row,
    token_id)` is called for every returned token as soon as it is chosen (for streaming).

    temperature 0 is greedy decoding; otherwise tokens are sampled after `filter_logits`
    (temperature, then top_k, then top_p) from a generator seeded with `seed` (None = random),
    so the same seed gives the same samples. Prompts of different lengths are left-padded with
    `pad_id`, which is masked out and does not change the result. `use_cache=False` recomputes the
    whole sequence at every step (slow; for testing the cache). The model runs in eval mode and
    its training flag is restored afterwards.

    Raises ValueError when a prompt plus max_new_tokens - 1 (the last token is never fed back)
    exceeds the model's max_positions.
    """
    _check_args(model, prompts, max_new_tokens, temperature, top_k, top_p, pad_id)
    device = next(model.parameters()).device
    B, L = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((B, L), pad_id, dtype=torch.long, device=device)  # (B, L)
    mask = torch.zeros(B, L, dtype=torch.bool, device=device)  # (B, L) True = real token
    for row, prompt in enumerate(prompts):
        ids[row, L - len(prompt):] = torch.tensor([operator.index(t) for t in prompt])
        mask[row, L - len(prompt):] = True
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    stop = torch.tensor(sorted(set(stop_tokens)), dtype=torch.long, device=device)

    with eval_mode(model):
        cache = model.new_cache(positions_needed(L, max_new_tokens)) if use_cache and max_new_tokens else None
        outputs: list[list[int]] = [[] for _ in range(B)]
        finished = torch.zeros(B, dtype=torch.bool, device=device)
        inputs = ids  # with a cache: the positions not yet seen by the model
        if B == 1:  # a single row is never padded: no mask lets the model skip building one per step
            mask = None
        for _ in range(max_new_tokens):
            logits = model(inputs, mask, cache=cache, last_only=True).logits[:, -1]  # (B, V)
            token = next_tokens(logits, temperature, top_k, top_p, generator)  # (B,)
            token = token.masked_fill(finished, pad_id)  # finished rows are fed padding, not kept
            for row in (~finished).nonzero()[:, 0].tolist():
                outputs[row].append(int(token[row]))
                if on_token is not None:
                    on_token(row, int(token[row]))
            finished |= torch.isin(token, stop)
            if finished.all():
                break
            ids = torch.cat([ids, token[:, None]], dim=1)  # (B, S)
            if mask is not None:
                mask = torch.cat([mask, ~finished[:, None]], dim=1)  # (B, S)
            inputs = token[:, None] if cache is not None else ids
    return outputs
