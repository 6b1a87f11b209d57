"""What the playground page asks of a served model, as plain functions (the routes are in
playground.py): a generation that hands back, at every step, the token it sampled and the whole
next-token distribution it sampled from; the attention of one position over its context; a
translation with its cross-attention.

Generation.step, attention_row, lm_explorer and translate run the model: call them off the event loop
and under the model's lock.

A distribution is sent sorted (stable, descending logit, ties by token id: the order top-p ranks
tokens in, see generation/sampling.py), so the page can redo temperature, top-k and top-p for any
slider setting: the first TOP_CANDIDATES with their ids, text, logit and probability (temperature
1); the logits of the first EXACT_RANKS ranks exactly, as base64 of little-endian float32 (the
model's own values, -inf included, 4 bytes each); past them (vocabularies over 4096 tokens) the rest
as (mean logit, count) groups of logits within TAIL_BIN of each other.

Shape legend: T positions so far, V vocabulary, L layers, H heads, S source length.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from handformer.generation.chat_template import ChatTemplate
from handformer.generation.engine import Engine, Row, sampled_distribution
from handformer.generation.generate import max_new_tokens_for
from handformer.generation.sampling import SamplingOptions
from handformer.modes import eval_mode
from handformer.see.explorer import explorer_html, explorer_text
from handformer.see.viz import AttentionReport, AttentionView, translation_views
from handformer.tasks.lm.run import LMRun
from handformer.tasks.translation.translator import Translator, attention_maps

TOP_CANDIDATES = 20  # tokens per step sent with their id and text (the bars)
EXACT_RANKS = 4096  # logits sent exactly, one by one
TAIL_BIN = 0.01  # past EXACT_RANKS, logits this close share one (mean, count) group
MAX_BEAM = 16


def prompt_ids(run: LMRun, prompt: str, template: ChatTemplate | None = None) -> list[int]:
    """BOS (when the run has one) + the prompt's tokens, as `handformer generate` encodes a prompt;
    with a chat template, the prompt as one user message rendered with the assistant header, as
    `handformer chat` encodes a first turn. Checked against the model's context."""
    if template is not None:
        ids = run.tokenizer.encode_with_special_tokens(template.render([{"role": "user", "content": prompt}]))
    else:
        ids = ([run.tokens.bos_id] if run.tokens.bos_id is not None else []) + run.tokenizer.encode(prompt)
    if not ids:
        raise ValueError("prompt is empty and the run has no BOS token; type a prompt")
    context = run.model.cfg.max_positions
    if len(ids) > context:
        raise ValueError(f"prompt is {len(ids)} tokens but the model's context is {context} tokens; "
                         "shorten it")
    return ids


def distribution(logits: Tensor, tokenizer: Any) -> dict[str, Any]:
    """One step's (V,) logits, sorted for the page (see the module docstring)."""
    values, order = torch.sort(logits.float().cpu(), descending=True, stable=True)  # (V,)
    top = order[:TOP_CANDIDATES].tolist()
    tail = values[EXACT_RANKS:]
    groups: list[list[float]] = []
    if tail.numel():
        finite = tail[torch.isfinite(tail)]
        bins = torch.floor(finite / TAIL_BIN)
        keys, counts = torch.unique_consecutive(bins, return_counts=True)  # sorted: bins fall
        means = torch.zeros(len(keys)).index_add_(0, torch.repeat_interleave(
            torch.arange(len(keys)), counts), finite) / counts
        groups = [[float(m), int(c)] for m, c in zip(means.tolist(), counts.tolist())]
        if len(finite) < len(tail):
            groups.append([None, len(tail) - len(finite)])
    head = values[:EXACT_RANKS].contiguous()
    probs = torch.softmax(values, dim=-1)[:TOP_CANDIDATES].tolist()  # at temperature 1
    return {"vocab_size": len(values),
            "top": [{"id": i, "token": t, "logit": v, "p": p} for i, t, v, p in
                    zip(top, tokenizer.tokens(top), _json_floats(values[:TOP_CANDIDATES]), probs)],
            "sorted": base64.b64encode(head.numpy().astype("<f4").tobytes()).decode("ascii"),
            "tail": groups}


def sampled_probability(logits: Tensor, token: int, sampling: SamplingOptions) -> float:
    """The probability `token` had in the distribution it was drawn from (1 when greedy)."""
    if sampling.temperature == 0:
        return 1.0
    return math.exp(float(sampled_distribution(logits, sampling)[token]))


def _json_floats(values: Tensor) -> list[float | None]:
    """-inf (a token the model masked out) is not JSON: it is sent as null."""
    return [v if v != float("-inf") else None for v in values.tolist()]


def sorted_logits(dist: dict[str, Any]) -> Tensor:
    """(V,) every logit of a distribution as the page rebuilds it (groups past EXACT_RANKS repeated)."""
    head = torch.frombuffer(bytearray(base64.b64decode(dist["sorted"])), dtype=torch.float32)
    tail = [float("-inf") if m is None else m for m, n in dist["tail"] for _ in range(n)]
    return torch.cat([head, torch.tensor(tail, dtype=torch.float32)])


@dataclass
class Generation:
    """`generate` for one prompt, one step at a time, keeping each step's logits: a row of the
    decoding engine (generation/engine.py), as `generate` runs a single prompt, so a seed gives
    the same tokens (a test pins it)."""

    run: LMRun
    ids: list[int]  # the prompt's ids
    max_new_tokens: int
    sampling: SamplingOptions = SamplingOptions(seed=0)
    stop_tokens: Sequence[int] | None = None  # ids that end it (None: the run's EOS ids)
    new: list[int] = field(default_factory=list)
    done: bool = False
    finish_reason: str = ""

    def __post_init__(self) -> None:
        limit = max_new_tokens_for(len(self.ids), self.run.model.cfg.max_positions)
        if not 1 <= self.max_new_tokens <= limit:
            raise ValueError(f"max_tokens must be between 1 and {limit} for this prompt of {len(self.ids)} "
                             f"tokens (the model's context is {self.run.model.cfg.max_positions}), "
                             f"got {self.max_new_tokens}")
        stop = self.run.tokens.eos_ids if self.stop_tokens is None else self.stop_tokens
        self.row = Row(list(self.ids), self.max_new_tokens, self.sampling, frozenset(stop), keep_logits=True)
        self.engine = Engine(self.run.model)

    @torch.inference_mode()
    def step(self) -> tuple[int, Tensor]:
        """Sample the next token: (its id, the (V,) logits it was sampled from)."""
        if self.done:
            raise RuntimeError("the generation is finished")
        with eval_mode(self.run.model):
            (choice,) = self.engine.add([self.row]) if not self.new else self.engine.step()
        self.new = self.row.tokens
        if self.row.done:
            self.done, self.finish_reason = True, self.row.finish_reason
        return choice.token, choice.logits

    def text(self) -> str:
        """The continuation decoded so far, without the token that ended it (decoded with the
        prompt, so a leading space stays)."""
        tok = self.run.tokenizer
        new = self.new[:-1] if self.finish_reason == "stop" else self.new
        full, prompt = tok.decode(self.ids + new), tok.decode(self.ids)
        return full[len(prompt):] if full.startswith(prompt) else tok.decode(new)


def check_ids(ids: Any, vocab_size: int, context: int) -> list[int]:
    """Token ids from a request: a non-empty list of ints in [0, vocab_size), at most `context`."""
    if not isinstance(ids, list) or not ids or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError("ids must be a non-empty list of token ids (integers)")
    bad = next((i for i in ids if not 0 <= i < vocab_size), None)
    if bad is not None:
        raise ValueError(f"ids holds {bad}, outside the vocabulary [0, {vocab_size})")
    if len(ids) > context:
        raise ValueError(f"ids has {len(ids)} tokens but the model's context is {context}")
    return ids


@torch.inference_mode()
def lm_attention(run: LMRun, ids: Sequence[int]) -> list[Tensor]:
    """Per layer (H, T, T): the causal self-attention of one forward over `ids`."""
    model = run.model
    with eval_mode(model):
        out = model(torch.tensor([list(ids)], device=next(model.parameters()).device), need_weights=True)
    return [w[0].float().cpu() for w in out.attentions]


def attention_row(run: LMRun, ids: Sequence[int], position: int) -> dict[str, Any]:
    """Where position `position` looks: per layer and head, its weights over ids[:position + 1]."""
    if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position < len(ids):
        raise ValueError(f"position must be an integer in [0, {len(ids)}) (a position in ids), "
                         f"got {position!r}")
    context = list(ids[: position + 1])
    layers = lm_attention(run, context)  # per layer (H, P, P), P = position + 1
    return {"position": position, "tokens": run.tokenizer.tokens(context),
            "layers": [_rounded(w[:, -1, :]) for w in layers]}  # per layer (H, P)


def lm_explorer(run: LMRun, ids: Sequence[int], split: int | None, lang: str = "en") -> str:
    """The attention explorer's page (see/explorer.py) for one forward over `ids`: every layer and
    head, every query; `split` is where the generated tokens begin; its words in `lang`."""
    layers = [w.numpy() for w in lm_attention(run, ids)]
    tokens = run.tokenizer.tokens(list(ids))
    view = AttentionView("self", "causal self-attention over the prompt and the generated tokens",
                         tokens, tokens, "token (query)", "tokens it may attend to (keys)", layers, split)
    cut = split if split is not None else len(ids)
    decode = run.tokenizer.decode
    report = AttentionReport("lm", decode(list(ids[:cut])), decode(list(ids[cut:])), [view])
    data = report.to_dict()
    data["output_label"] = "continuation"  # sampled with the page's settings, not necessarily greedy
    return explorer_html(data, explorer_text(lang)["playground_title"], lang)


def translate(translator: Translator, text: str, beam: int, lang: str = "en") -> dict[str, Any]:
    """Translate `text` (beam 1 = greedy), then teacher-force the output to read every attention
    map: the cross-attention for the page's own view and all of them in the explorer (in `lang`)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("text is empty: type a sentence to translate")
    if isinstance(beam, bool) or not isinstance(beam, int) or not 1 <= beam <= MAX_BEAM:
        raise ValueError(f"beam must be an integer from 1 (greedy) to {MAX_BEAM}, got {beam!r}")
    if len(translator.encode_sources([text])[0]) <= 1:  # only the EOS the encoder appends
        raise ValueError("text tokenizes to nothing; type text the run's tokenizer knows")
    sources, outputs = translator.translate_ids([text], beam=beam)
    maps = attention_maps(translator, text, outputs[0])
    src, produced = maps["source_tokens"], maps["output_tokens"]
    views = translation_views(maps)
    output = translator.tgt_tok.decode(outputs[0])
    report = AttentionReport("translation", text, output, views)
    return {"output": output, "output_ids": outputs[0], "output_tokens": produced,
            "source_ids": sources[0], "source_tokens": src,
            "cross": [_rounded(torch.from_numpy(w)) for w in maps["cross"]],  # per layer (H, T, S)
            "explorer": explorer_html(report.to_dict(), explorer_text(lang)["playground_title"], lang)}


def _rounded(weights: Tensor) -> list:
    return torch.round(weights.double(), decimals=5).tolist()
