"""A chat with a decoder-only model: the conversation is kept as messages, rendered with the
checkpoint's chat template (chat_template.py) at every turn, and the KV cache is kept across
turns, so each turn processes only the tokens the cache does not already hold.

Each turn:
1. the user's message is appended and the whole conversation is rendered and encoded (with the
   assistant header at the end); when it does not leave `max_new_tokens` positions free, the
   oldest turns after the system message are dropped (and `notify` is told) until it does;
2. the longest common prefix of that prompt and the tokens in the cache is kept; the cache is cut
   back to it and only the rest of the prompt is run (usually: the end of the last reply and the
   new message; after dropped turns: everything after the system message, the prompt re-run);
3. tokens are sampled (one SamplingOptions: temperature, top-k, top-p, seeded; speculative when it
   says so) until a stop token (any EOS or end-of-turn id), streamed as text; the reply's text is
   appended as the assistant's message.
So the model always sees exactly the tokens of the re-encoded conversation, as a fresh run would.

Shape legend: T new positions, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from handformer.data.tokenizer import Tokenizer
from handformer.generation.chat_template import ChatTemplate
from handformer.generation.engine import Choice, Engine, Row, frequency_set
from handformer.generation.prefix_cache import common_prefix
from handformer.generation.sampling import SamplingOptions
from handformer.generation.speculative import SpeculationStats
from handformer.generation.stream import TextStream
from handformer.models.causal_lm import CausalLM
from handformer.modes import eval_mode
from handformer.settings import is_int

# Tokens that end an assistant turn in the chat formats of common instruction-tuned families
# (Llama 3, ChatML (Qwen2, SmolLM2), Gemma, Phi-3), where the checkpoint's EOS ids may not list them.
END_OF_TURN_TOKENS = ("<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<end_of_turn>", "<|end|>")


def check_chat_options(template: ChatTemplate, system: str | None, max_new_tokens: int | None,
                       thinking: bool | None = None) -> None:
    """What a chat can refuse before any model is loaded (its sampling options are a
    SamplingOptions, checked when it was made): max_new_tokens (None: the caller's default), a
    thinking switch the template does not have, and a template that fails on a first exchange."""
    _check_max_new_tokens(max_new_tokens)
    if thinking is not None and "enable_thinking" not in template.source:
        raise ValueError(f"{template.origin} has no thinking switch (it never reads enable_thinking), so "
                         f"{'--think' if thinking else '--no-think'} would change nothing; leave it out")
    opening = [] if system is None else [{"role": "system", "content": system}]
    options = {} if thinking is None else {"enable_thinking": thinking}
    template.render(opening + [{"role": "user", "content": "hi"}], True, **options)  # fail early, clearly


def _check_max_new_tokens(max_new_tokens: int | None) -> None:
    if max_new_tokens is not None and (not is_int(max_new_tokens) or max_new_tokens < 1):
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")


class ChatSession:
    """A conversation with `model`, sampling with `sampling` (None: temperature 1, unseeded), one
    generator seeded once for the whole conversation. `thinking` is the template's `enable_thinking`
    (None: the template's default). `send(text)` returns the reply (streamed to `on_text`). A
    template that cannot render the conversation fails its first `send`
    (`check_chat_options` finds it sooner, before a model is loaded)."""

    def __init__(self, model: CausalLM, tokenizer: Tokenizer, template: ChatTemplate,
                 stop_ids: Sequence[int], *, system: str | None = None,
                 sampling: SamplingOptions | None = None, max_new_tokens: int = 256,
                 notify: Callable[[str], None] | None = None, thinking: bool | None = None) -> None:
        _check_max_new_tokens(max_new_tokens)
        if max_new_tokens >= model.cfg.max_positions:
            raise ValueError(f"max_new_tokens={max_new_tokens} leaves no room for a prompt in the model's "
                             f"context of {model.cfg.max_positions} tokens (max_positions); lower it")
        if not stop_ids:
            raise ValueError("a chat needs at least one stop token (an EOS or end-of-turn id)")
        self.model, self.tokenizer, self.template = model, tokenizer, template
        self.stop_ids = sorted(set(stop_ids))
        self.options = sampling if sampling is not None else SamplingOptions()
        self.max_new_tokens = max_new_tokens
        # the template's enable_thinking (None: not passed, the template's default)
        self.template_options = {} if thinking is None else {"enable_thinking": thinking}
        self.notify = notify or (lambda message: None)
        self.messages: list[dict[str, Any]] = []
        if system is not None:
            self.messages.append({"role": "system", "content": system})
        self.device = next(model.parameters()).device
        self.generator = self.options.generator(self.device)  # one for every turn
        self.cache = model.new_cache(model.cfg.max_positions)
        self.context: list[int] = []  # the tokens whose keys and values the cache holds, in order
        self.processed = 0  # tokens run through the model so far, all turns together
        self.speculation = SpeculationStats()  # guesses drafted and accepted, all turns (with speculate)
        self.unseen_said = False  # characters a character tokenizer never saw: said once a conversation

    def encode(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """The prompt for `messages`: rendered with the assistant header, then tokenized with the
        template's special-token text as special tokens (as transformers' apply_chat_template)."""
        return self.tokenizer.encode_with_special_tokens(self.template.render(messages, True,
                                                                              **self.template_options))

    def decode(self, ids: Sequence[int]) -> str:
        """A reply's text: special tokens (a stray end-of-turn marker) are not shown."""
        return self.tokenizer.hf.decode(list(ids), skip_special_tokens=True)

    def send(self, text: str, on_text: Callable[[str], None] | None = None) -> str:
        """Add the user's message, generate the reply, add it to the history and return it."""
        if not isinstance(text, str):
            raise ValueError(f"a chat message is text, got {type(text).__name__}")
        self.messages.append({"role": "user", "content": text})
        self._say_unseen(text)
        try:
            prompt = self._fit_prompt()
        except ValueError:
            self.messages.pop()
            raise
        new = self._generate(prompt, on_text)
        if not new or new[-1] not in self.stop_ids:
            self.notify(f"the reply reached max_new_tokens={self.max_new_tokens} before an end-of-turn "
                        "token and is cut there")
        reply_ids = new[:-1] if new and new[-1] in self.stop_ids else new
        reply = self.decode(reply_ids)
        self.messages.append({"role": "assistant", "content": reply})
        return reply

    def _say_unseen(self, text: str) -> None:
        """Notify once a conversation which characters of the system message or `text` a character
        tokenizer never saw (the model reads <unk> for each), as `handformer generate` does."""
        system = self.messages[0]["content"] if self.messages[0]["role"] == "system" else ""
        note = None if self.unseen_said else self.tokenizer.unseen_note(system + text)
        if note is not None:
            self.notify(note)
            self.unseen_said = True

    def _fit_prompt(self) -> list[int]:
        """The prompt, after dropping the oldest turns after the system message while it leaves
        fewer than max_new_tokens positions of the context free. Nothing is dropped when even the
        newest message alone does not fit."""
        budget = self.model.cfg.max_positions - self.max_new_tokens
        messages, notes = list(self.messages), []
        while True:
            prompt = self.encode(messages)
            if not prompt:
                raise ValueError(f"{self.template.origin} rendered the conversation as no text at all")
            if len(prompt) <= budget:
                break
            first = 1 if messages[0]["role"] == "system" else 0
            later_users = [i for i in range(first + 1, len(messages)) if messages[i]["role"] == "user"]
            if not later_users:
                raise ValueError(
                    f"the message does not fit: the prompt is {len(prompt)} tokens and "
                    f"max_new_tokens={self.max_new_tokens} more must fit in the model's context of "
                    f"{self.model.cfg.max_positions} (max_positions); shorten it or lower max_new_tokens")
            notes.append(f"the conversation outgrew the context ({len(prompt)} prompt tokens + "
                         f"{self.max_new_tokens} new > {self.model.cfg.max_positions}): dropped the oldest "
                         f"turn ({later_users[0] - first} messages) and re-ran the prompt")
            del messages[first:later_users[0]]
        self.messages = messages
        for note in notes:
            self.notify(note)
        return prompt

    @torch.inference_mode()
    def _generate(self, prompt: list[int], on_text: Callable[[str], None] | None) -> list[int]:
        keep = min(common_prefix(self.context, prompt), len(prompt) - 1)  # run >= 1 token for logits
        key_set = frequency_set(self.model)
        if key_set(self.cache.length) != key_set(keep):
            keep = 0  # the cached keys took other frequencies (LongRoPE's long factors) than these will
        if self.cache.keeps_states and keep < self.cache.length:
            keep = 0  # linear attention's state cannot forget the positions after `keep`: all again
        self.cache.truncate(keep)
        row = Row(prompt, self.max_new_tokens, self.options, frozenset(self.stop_ids),
                  generator=self.generator, speculation=self.speculation)  # one generator for every turn
        stream = None if on_text is None else TextStream(self.tokenizer, out=on_text, decode=self.decode)

        def show(choice: Choice) -> None:
            if stream is not None and choice.token not in self.stop_ids:  # holds back a partial character
                stream.push(choice.token)

        with eval_mode(self.model):
            engine = Engine(self.model)
            for choice in engine.add([row], cache=self.cache):
                show(choice)
            engine.run(show)
        if stream is not None:
            stream.close()
        fed = prompt[keep:] + row.tokens[:-1]  # the last token is chosen, never fed
        self.context = prompt[:keep] + fed
        self.processed += len(fed)
        return row.tokens


def stop_ids_for(tokenizer: Tokenizer, eos_ids: Sequence[int], template: ChatTemplate) -> list[int]:
    """Every id that ends a reply: the run's EOS ids, the template's eos_token, and the
    end-of-turn tokens of common chat formats that the vocabulary has as special tokens."""
    ids = list(eos_ids)
    specials = {t.content for t in tokenizer.hf.get_added_tokens_decoder().values() if t.special}
    names = [template.special_tokens.get("eos_token"), *END_OF_TURN_TOKENS]
    for name in names:
        token_id = tokenizer.hf.token_to_id(name) if name in specials else None
        if token_id is not None:
            ids.append(token_id)
    return list(dict.fromkeys(ids))


__all__ = ["END_OF_TURN_TOKENS", "ChatSession", "check_chat_options", "common_prefix", "stop_ids_for"]
