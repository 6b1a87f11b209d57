"""Text generation for the decoder-only model: `generate` continues a batch of prompts; the model
itself knows nothing about generation.

It drives the decoding engine (engine.py): one forward over all the prompts, left-padded (prefill),
into a KV cache with room for every new token, then one forward per new token. Positions are
counted from the attention mask inside the model, so a left-padded prompt sees the same positions
as it would alone. The logit filters are in sampling.py.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Literal

import torch
from torch import Tensor

from handformer.generation.engine import Choice, Engine, Row
from handformer.generation.sampling import SamplingOptions, Speculation
from handformer.generation.speculative import SpeculationStats
from handformer.inference.static_step import static_step_for
from handformer.inference.threads import default_threads, intra_op_threads
from handformer.models.causal_lm import CausalLM
from handformer.modes import eval_mode
from handformer.settings import is_int, non_negative_int


def _check_args(model: CausalLM, prompts: Sequence[Sequence[int]], max_new_tokens: int, pad_id: int) -> None:
    non_negative_int("max_new_tokens", max_new_tokens)
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
             speculate: Speculation | None = None, stats: SpeculationStats | None = None,
             ) -> list[list[int]]:
    """Continue each prompt (a list of token ids) by up to `max_new_tokens` tokens.

    Returns the new tokens of each prompt. A row stops at its first token in `stop_tokens`; that
    stop token is included as the row's last token, and nothing follows it. `on_token(row,
    token_id)` is called for every returned token as soon as it is chosen (for streaming).

    temperature 0 is greedy decoding; otherwise tokens are sampled after `filter_logits`
    (temperature, then top_k, then top_p), prompt i from its own generator seeded with seed + i
    (None = random), so the same seed gives the same samples, and a prompt the same samples alone
    as in a batch. Prompts of different lengths are left-padded with `pad_id`, which is masked out
    and does not change the result. `use_cache=False` recomputes the whole sequence at every step
    (slow; for testing the cache). The model runs in eval mode and its training flag is restored
    afterwards. threads: torch intra-op threads while generating ("auto": `default_threads(model)`,
    one for a small model; None: torch's setting; the count is process-wide while `generate` runs,
    and restored afterwards). compile_step: run the one-token decoding steps as one compiled
    step of fixed shapes (inference/static_step.py; the same tokens; the first call for a batch size
    compiles for tens of seconds on a CPU, later calls reuse it; off by default: docs/benchmarks.md
    has the figures; models and batches it does not serve decode eagerly). speculate: speculative
    decoding of a single prompt (a `Speculation`: prompt lookup, or its draft_model): the same
    tokens when greedy, the same distribution when sampling, in fewer forwards; `stats` (a
    SpeculationStats), when given, counts the guesses drafted and accepted.

    Raises ValueError when a prompt plus max_new_tokens - 1 (the last token is never fed back)
    exceeds the model's max_positions.
    """
    options = SamplingOptions(temperature, top_k, top_p, seed, speculate=speculate)  # checked
    _check_args(model, prompts, max_new_tokens, pad_id)
    if speculate is not None and len(prompts) != 1:
        raise ValueError(f"speculative decoding runs one prompt at a time (a batch shares each forward "
                         f"already); give one prompt, not {len(prompts)}, or leave out speculate")
    if threads not in (None, "auto") and (not is_int(threads)
                                          or threads < 1):
        raise ValueError(f"threads must be a positive integer, 'auto' or None, got {threads!r}")
    if max_new_tokens == 0:
        return [[] for _ in prompts]
    stop = frozenset(operator.index(t) for t in stop_tokens)
    rows = [Row([operator.index(t) for t in prompt], max_new_tokens, options, stop, choice=i,
                speculation=stats) for i, prompt in enumerate(prompts)]
    index = {id(row): i for i, row in enumerate(rows)}

    def streamed(choice: Choice) -> None:
        if on_token is not None:
            on_token(index[id(choice.row)], choice.token)

    with intra_op_threads(default_threads(model) if threads == "auto" else threads), eval_mode(model):
        static = static_step_for(model) if compile_step and use_cache else None  # kept per model
        engine = Engine(model, pad_id=pad_id, use_cache=use_cache, static_step=static)
        for choice in engine.add(rows):
            streamed(choice)
        engine.run(streamed)
    return [row.tokens for row in rows]
