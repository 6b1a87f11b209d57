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
from typing import Literal

import torch
from torch import Tensor

from handformer.generation.sampling import check_sampling_options, next_tokens
from handformer.inference.threads import default_threads, intra_op_threads
from handformer.models.causal_lm import CausalLM, CausalLMOutput
from handformer.modes import eval_mode
from handformer.nn.positions import LongRotaryEmbedding

# import default_threads, intra_op_threads


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
             threads: int | None | Literal["auto"] = "auto", compile_step: bool = False,
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
    its training flag is restored afterwards. threads: torch intra-op threads while generating
    ("auto": `default_threads(model)`, one for a small model; None: torch's setting; the count is
    process-wide while `generate` runs, and restored afterwards). compile_step: run the one-token
    decoding steps through `torch.compile` (same tokens; the first call compiles for tens of seconds
    on a CPU, so it pays only over tens of thousands of tokens: off by default, see the README).

    Raises ValueError when a prompt plus max_new_tokens - 1 (the last token is never fed back)
    exceeds the model's max_positions.
    """
    _check_args(model, prompts, max_new_tokens, temperature, top_k, top_p, pad_id)
    if threads not in (None, "auto") and (isinstance(threads, bool) or not isinstance(threads, int)
                                          or threads < 1):
        raise ValueError(f"threads must be a positive integer, 'auto' or None, got {threads!r}")
    with intra_op_threads(default_threads(model) if threads == "auto" else threads), eval_mode(model):
        # The one-token steps all have the same shapes but the cache length: compiled once for any
        # length (dynamic), re-wrapping the same model reuses torch's compiled code.
        step = torch.compile(model, dynamic=True) if compile_step and use_cache else model
        return _generate(model, step, prompts, max_new_tokens, temperature, top_k, top_p, seed,
                         {operator.index(t) for t in stop_tokens}, pad_id, use_cache, on_token)


def _generate(model: CausalLM, step: Callable[..., CausalLMOutput], prompts: Sequence[Sequence[int]],
              max_new_tokens: int, temperature: float, top_k: int | None, top_p: float | None,
              seed: int | None, stop: set[int], pad_id: int, use_cache: bool,
              on_token: Callable[[int, int], None] | None) -> list[list[int]]:
    """The decoding loop of `generate` (arguments checked, model in eval mode); `step` runs the
    model on one new token a row (the model itself, or its compiled version)."""
    device = next(model.parameters()).device
    B, L = len(prompts), max(len(p) for p in prompts)
    width = L + max_new_tokens  # room for every token the loop may feed back
    ids = torch.full((B, width), pad_id, dtype=torch.long, device=device)  # (B, L + new)
    mask = torch.zeros(B, width, dtype=torch.bool, device=device)  # (B, L + new) True = real token
    for row, prompt in enumerate(prompts):
        ids[row, L - len(prompt):L] = torch.tensor([operator.index(t) for t in prompt])
        mask[row, L - len(prompt):L] = True
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)

    capacity = positions_needed(L, max_new_tokens)
    cache = model.new_cache(capacity) if use_cache and max_new_tokens else None
    restart = long_rope_start(model)
    outputs: list[list[int]] = [[] for _ in range(B)]
    done = [False] * B  # rows that have emitted a stop token
    # A single row is never padded: without a mask the model builds none at each step.
    padded = B > 1
    S = L  # positions fed so far, after this step's input
    inputs = ids[:, :L]  # with a cache: the positions not yet seen by the model
    for i in range(max_new_tokens):
        seen = mask[:, :S] if padded else None  # (B, S)
        one_token = i > 0 and cache is not None and inputs.size(1) == 1  # not the prompt, not a restart
        forward = step if one_token else model
        logits = forward(inputs, seen, cache=cache, logits_to_keep=1).logits[:, -1]  # (B, V)
        token = next_tokens(logits, temperature, top_k, top_p, generator)  # (B,)
        finished_before = torch.tensor(done, device=device) if padded and any(done) else None
        for row, t in enumerate(token.tolist()):  # one read of the new tokens per step
            if done[row]:
                continue
            outputs[row].append(t)
            if on_token is not None:
                on_token(row, t)
            done[row] = t in stop
        if all(done):
            break
        if finished_before is not None:
            token = token.masked_fill(finished_before, pad_id)  # finished rows are fed padding
        if padded:
            mask[:, S] = torch.tensor([not d for d in done], device=device)  # a stop token is not attended
        S += 1
        ids[:, S - 1] = token
        inputs = token[:, None] if cache is not None else ids[:, :S]  # (B, 1): the cache holds the rest
        if cache is not None and restart is not None and S - 1 >= restart >= cache.length:
            cache, inputs = model.new_cache(capacity), ids[:, :S]  # LongRoPE's long factors: every position
    return outputs


def long_rope_start(model: CausalLM) -> int | None:
    """Where a LongRoPE model (Phi-3.5, Phi-4-mini) turns to its long factors: the keys a cache
    holds from before were turned with the short ones, so the first step there runs every position
    again, with the long factors (as transformers' generate does); None for other models."""
    rotary = getattr(model, "rotary", None)
    return rotary.original if isinstance(rotary, LongRotaryEmbedding) else None
