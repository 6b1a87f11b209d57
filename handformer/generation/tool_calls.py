"""Tool calls in a chat: the tools rendered into the prompt by a chat template, the model's
tool-call text read back as calls, and the grammar that forces a call (generation/grammar.py).

Two formats, those of the families whose chat templates take `tools`:

    chatml   Qwen2.5 / Qwen3 (and ChatML runs): a call is
             <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>, several one after another;
             results come back as <tool_response> blocks in a user turn
    llama3   Llama 3.1: the whole reply is {"name": ..., "parameters": {...}} (several joined by "; ");
             results come back in an "ipython" turn

Which template renders the tools: the run's own when it takes `tools` (an imported checkpoint's),
its format read from its text; else handformer's own for the vocabulary's chat markup
(templates/chatml_tools.jinja for <|im_start|>, templates/llama3_tools.jinja for
<|start_header_id|>).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from handformer.data.tokenizer import Tokenizer
from handformer.generation.chat_template import HARMONY_REFUSED, ChatTemplate
from handformer.generation.grammar import LAYOUT

TEMPLATES = Path(__file__).parent / "templates"


@dataclass(frozen=True)
class Tool:
    name: str
    description: str | None
    parameters: dict[str, Any]  # a JSON schema of the arguments object

    def as_template_data(self) -> dict[str, Any]:
        """The tool as chat templates take it (transformers' form: OpenAI's tool object)."""
        function = {"name": self.name, "parameters": self.parameters}
        if self.description is not None:
            function["description"] = self.description
        return {"type": "function", "function": function}


@dataclass
class Call:
    name: str
    arguments: dict[str, Any]

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True)
class ToolFormat:
    name: str  # "chatml" or "llama3"
    arguments_key: str  # "arguments" or "parameters"
    open: str  # what starts a call ("" for llama3: the reply itself is the call)
    close: str
    separator: str  # between two calls

    def call_schema(self, tools: list[Tool]) -> dict[str, Any]:
        """The JSON schema of one call to one of `tools`."""
        key = self.arguments_key
        options = [{"type": "object", "properties": {"name": {"const": t.name}, key: t.parameters},
                    "required": ["name", key], "additionalProperties": False} for t in tools]
        schema = options[0] if len(options) == 1 else {"anyOf": options}
        return {"x-guidance": LAYOUT, **schema}

    def grammar(self, tools: list[Tool], parallel: bool, answer: dict[str, Any] | None = None) -> str:
        """llguidance Lark text for a reply that is one call (or, with `parallel`, one or more) to
        `tools`; with `answer`, a reply may instead be JSON text of that schema."""
        body = f"%json {json.dumps(self.call_schema(tools))}"
        call = f"{json.dumps(self.open)} {body} {json.dumps(self.close)}" if self.open else body
        calls = f"calls: call ({json.dumps(self.separator)} call)*" if parallel else "calls: call"
        lines = [calls, f"call: {call}"]
        if answer is None:
            return "\n".join(["start: calls", *lines])
        answer_rule = f"answer: %json {json.dumps({'x-guidance': LAYOUT, **answer})}"
        return "\n".join(["start: calls | answer", *lines, answer_rule])

    def parser(self, tools: list[Tool], parallel: bool, forced: bool = False) -> ToolCallParser:
        return ToolCallParser(self, {t.name for t in tools}, parallel, forced)


CHATML = ToolFormat("chatml", "arguments", "<tool_call>\n", "\n</tool_call>", "\n")
LLAMA3 = ToolFormat("llama3", "parameters", "", "", "; ")


def tool_template(own: ChatTemplate | None, tokenizer: Tokenizer) -> tuple[ToolFormat, ChatTemplate]:
    """The format and the template that render `tools` for a run (see the module docstring);
    ValueError when the run's chat markup is neither."""
    if own is not None and own.harmony:
        raise ValueError(HARMONY_REFUSED.format(origin=own.origin))
    if own is not None and re.search(r"\btools\b", own.source):
        if "<tool_call>" in own.source:
            return CHATML, own
        if "ipython" in own.source or "<|python_tag|>" in own.source:
            return LLAMA3, own
        raise ValueError(f"{own.origin} takes tools in a format handformer does not read back (it reads "
                         "Qwen's <tool_call> blocks and Llama 3.1's JSON calls)")
    vocab = tokenizer.hf.get_vocab()
    special = dict(own.special_tokens) if own is not None else {}
    if "<|start_header_id|>" in vocab:
        return LLAMA3, ChatTemplate((TEMPLATES / "llama3_tools.jinja").read_text(encoding="utf-8"), special,
                                    "handformer's Llama 3.1 tool template")
    if "<|im_start|>" in vocab:
        return CHATML, ChatTemplate((TEMPLATES / "chatml_tools.jinja").read_text(encoding="utf-8"), special,
                                    "handformer's ChatML tool template")
    raise ValueError("this run's chat markup is neither ChatML (<|im_start|>) nor Llama 3's "
                     "(<|start_header_id|>), and its chat template does not take tools; give the run a "
                     "chat_template.jinja that does (Qwen's or Llama 3.1's format)")


class ToolCallParser:
    """A reply's text as it arrives -> its content and its calls. `feed(text)` and `finish()`
    return (content that is final, calls completed); text that may still turn out to be part of a
    call is held back. A block that does not read as a call to one of the tools stays content.

    A `forced` reply (tool_choice "required" or a named function: the grammar lets the model
    write nothing but calls) cut by its token limit (`finish(cut=True)`) inside a call keeps that
    call when what was written of it is already a whole call in JSON (only the closing marker is
    missing), and drops it when it is not: it is never shown as content."""

    def __init__(self, fmt: ToolFormat, names: set[str], parallel: bool, forced: bool = False) -> None:
        self.fmt, self.names, self.parallel, self.forced = fmt, names, parallel, forced
        self.buffer = ""
        self.calls = 0  # calls returned so far
        self.whole = fmt.open == ""  # llama3: the reply is a call or it is content
        self.content_seen = False
        self.after_call = False  # whitespace right after a call is not content

    def feed(self, text: str) -> tuple[str, list[Call]]:
        self.buffer += text
        return self._whole_feed() if self.whole else self._blocks(final=False)

    def finish(self, cut: bool = False) -> tuple[str, list[Call]]:
        """The rest of the reply; `cut`: it ended at its token limit, perhaps inside a call."""
        if cut and self.forced:  # the grammar let the model write calls only: the rest is one, or part of one
            start = self.buffer.find(self.fmt.open.strip()) if self.fmt.open else 0
            rest, self.buffer = ("" if start < 0 else self.buffer[start + len(self.fmt.open.strip()):]), ""
            return "", self._keep(self._whole_calls(rest))
        if self.whole:
            content, calls = self._read_whole(self.buffer)
            self.buffer = ""
            return content, self._keep(calls)
        return self._blocks(final=True)

    def _whole_calls(self, text: str) -> list[Call]:
        """The calls written out whole at the start of `text` (JSON objects, one after another)."""
        decoder, calls, i = json.JSONDecoder(), [], 0
        while True:
            while i < len(text) and text[i] in " \n\t;":
                i += 1
            try:
                value, i = decoder.raw_decode(text, i)
            except ValueError:
                return calls
            call = self._call(value)
            if call is None:
                return calls
            calls.append(call)

    # --- llama3: the whole reply ----------------------------------------------------------------
    def _whole_feed(self) -> tuple[str, list[Call]]:
        start = self.buffer.lstrip()
        if self.content_seen or (start and not start.startswith("{")):
            self.content_seen = True
            out, self.buffer = self.buffer, ""
            return out, []
        return "", []  # could be a call: held to the end

    def _read_whole(self, text: str) -> tuple[str, list[Call]]:
        if self.content_seen or not text.strip():
            return text, []
        decoder, calls, i = json.JSONDecoder(), [], 0
        while i < len(text):
            while i < len(text) and text[i] in " \n\t;":
                i += 1
            if i == len(text):
                break
            try:
                value, i = decoder.raw_decode(text, i)
            except ValueError:
                return text, []
            call = self._call(value)
            if call is None:
                return text, []
            calls.append(call)
        return ("", calls) if calls else (text, [])

    # --- chatml: <tool_call> blocks ------------------------------------------------------------
    def _blocks(self, final: bool) -> tuple[str, list[Call]]:
        """Content up to the next block, and the blocks that are complete. Whitespace between
        content and a call, or between calls, is not content (it is held until it is known)."""
        open_, close = self.fmt.open.strip(), self.fmt.close.strip()
        content, calls = [], []
        while True:
            if self.after_call:
                if not self.buffer.strip() and not final:
                    break  # only whitespace after a call so far
                self.buffer, self.after_call = self.buffer.lstrip(), False
            start = self.buffer.find(open_)
            if start < 0:
                keep = 0 if final else held_back(self.buffer, open_)
                text = self.buffer[:len(self.buffer) - keep]
                text = text.rstrip() if not final or self.calls or calls else text
                content.append(text)
                self.buffer = self.buffer[len(text):]
                break
            end = self.buffer.find(close, start)
            if end < 0:  # a block not closed yet (or never: then it is content)
                content.append(self.buffer if final else self.buffer[:start].rstrip())
                self.buffer = "" if final else self.buffer[len(content[-1]):]
                break
            block_end = end + len(close)
            call = self._parse_block(self.buffer[start + len(open_):end])
            if call is None:
                content.append(self.buffer[:block_end])
            else:
                content.append(self.buffer[:start].rstrip())
                calls.append(call)
                self.after_call = True
            self.buffer = self.buffer[block_end:]
        if final and (self.calls or calls) and not self.buffer.strip():
            self.buffer = ""
        return "".join(content), self._keep(calls)

    def _parse_block(self, body: str) -> Call | None:
        try:
            return self._call(json.loads(body))
        except ValueError:
            return None

    def _call(self, value: Any) -> Call | None:
        if not isinstance(value, dict) or value.get("name") not in self.names:
            return None
        arguments = value.get(self.fmt.arguments_key, value.get("arguments", value.get("parameters")))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        return Call(value["name"], arguments) if isinstance(arguments, dict) else None

    def _keep(self, calls: list[Call]) -> list[Call]:
        """Without parallel_tool_calls, only a reply's first call."""
        if not self.parallel:
            calls = calls[:max(0, 1 - self.calls)]
        self.calls += len(calls)
        return calls


def held_back(text: str, marker: str) -> int:
    """How many characters at the end of `text` could be the start of `marker`."""
    return max((k for k in range(1, len(marker)) if text.endswith(marker[:k])), default=0)


__all__ = ["CHATML", "LLAMA3", "Call", "Tool", "ToolCallParser", "ToolFormat", "tool_template"]
