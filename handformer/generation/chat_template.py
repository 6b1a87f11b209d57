"""Chat templates: a conversation (a list of {"role", "content"} messages) rendered into the
prompt text an instruction-tuned checkpoint was trained on, with the checkpoint's own Jinja
template, rendered the way `transformers`' `apply_chat_template` renders it.

Where the template comes from (as `transformers` loads it): `chat_template.jinja` in the
directory, else tokenizer_config.json's "chat_template" (a string, or a list of {"name",
"template"} from which "default" is used). The template sees `messages`, `add_generation_prompt`,
`tools`, `documents`, the special-token strings of tokenizer_config.json (`bos_token`,
`eos_token`, ...) and any extra keyword arguments.

The environment matches transformers' (facts checked against transformers 5.x): Jinja's
*immutable sandbox* (templates come from the internet: no attribute access to internals, no
mutating the messages), `trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension
(`{% break %}`), a `{% generation %}` block tag that renders its body and, in
`render_with_spans`, records where each such block's text starts and ends (transformers uses the
same tag to mark the assistant's tokens for training), `tojson` as `json.dumps` without ASCII
escaping (and with `indent`, `separators`, `sort_keys`), `raise_exception(msg)`,
`strftime_now(fmt)`, `dict` and a `namespace` that refuses names starting with "_". Messages are
copied as plain JSON data and keys whose value is None are dropped, as transformers does.

Every failure (no template, a syntax error, `raise_exception`, a sandbox violation, an undefined
operation) is one `ValueError` that says which template and what went wrong.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

TEMPLATE_FILE, TOKENIZER_CONFIG = "chat_template.jinja", "tokenizer_config.json"
# Private-use characters that bracket a {% generation %} block's text while spans are recorded
# (render_with_spans), then removed; text that holds them cannot be rendered with spans.
GENERATION_START, GENERATION_END = "\ue000", "\ue001"
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                       "mask_token")


def _environment(record_generation: bool = False) -> Any:
    """A fresh sandboxed Jinja environment with the globals and filters templates rely on;
    `record_generation`: {% generation %} blocks bracket their text with GENERATION_START/END."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}`: rendered as its body (bracketed, when spans
        are recorded)."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            if record_generation:
                return GENERATION_START + caller() + GENERATION_END
            return caller()

    class SafeNamespace(jinja2.utils.Namespace):
        """`namespace(...)` whose attribute names may not start with "_" (no way to internals)."""

        def __init__(*args: Any, **kwargs: Any) -> None:
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for name in attrs:
                SafeNamespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            SafeNamespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"a namespace attribute may not start with '_': {name!r}")

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    class PlainDict:
        """`dict(...)` and `dict.fromkeys(...)`, without handing the template the type itself."""

        def __call__(self, *args: Any, **kwargs: Any) -> dict:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
            return dict.fromkeys(*args, **kwargs)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, namespace=SafeNamespace, dict=PlainDict(),
                       strftime_now=lambda fmt: datetime.now().strftime(fmt))
    return env


def plain_data(value: Any, where: str = "messages") -> Any:
    """A copy made of JSON types only (str, int, float, bool, None, dict, list), so the template
    sees no objects with methods of their own."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    for kind in (str, bool, int, float):
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, Mapping):
        return {str(k): plain_data(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_data(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise ValueError(f"{where} holds a {type(value).__name__}; chat messages hold only text, numbers, "
                     "lists and dicts")


def check_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Plain copies of the messages, each a dict with a string "role"; None values dropped."""
    if isinstance(messages, (str, Mapping)) or not isinstance(messages, Sequence):
        raise ValueError('messages must be a list of {"role": ..., "content": ...} dicts')
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise ValueError(f'message {i} must be a dict with a "role" string, got {message!r}')
        out.append({k: v for k, v in plain_data(message, f"message {i}").items() if v is not None})
    return out


# OpenAI's harmony chat format (gpt-oss): each assistant message goes to a channel (analysis,
# commentary, final), and a tool call is a message addressed "to=functions.NAME" ending in <|call|>.
HARMONY_MARK = "<|channel|>"
HARMONY_REFUSED = ("{origin} is OpenAI's harmony format (gpt-oss): its channels (analysis, commentary, "
                   "final) and its tool-call syntax (to=functions.NAME ... <|call|>) are not implemented in "
                   "handformer's chat and serve; continue a prompt written in that format with `handformer "
                   "generate`, or give the run a chat template of another format (chat_template.jinja)")


class ChatTemplate:
    """A compiled chat template and the special-token strings it may use."""

    def __init__(self, source: str, special_tokens: Mapping[str, str] | None = None,
                 origin: str = "the chat template") -> None:
        import jinja2

        if not isinstance(source, str) or not source.strip():
            raise ValueError(f"{origin} is empty; a chat template is Jinja text")
        self.source = source
        self.origin = origin  # named in errors, e.g. "runs/x/chat_template.jinja"
        self.special_tokens = dict(special_tokens or {})
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as err:
            raise ValueError(f"{origin} is not a valid Jinja template: line {err.lineno}: "
                             f"{err.message}") from None
        self._recording: Any = None  # the same template compiled to record generation spans

    @property
    def harmony(self) -> bool:
        """Whether this is OpenAI's harmony format (gpt-oss), whose turns carry a channel."""
        return HARMONY_MARK in self.source

    @property
    def has_generation_blocks(self) -> bool:
        """Whether the template marks the assistant's text with {% generation %} blocks."""
        return re.search(r"\{%-?\s*generation\s*-?%\}", self.source) is not None

    def render_with_spans(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = False,
                          tools: Sequence[Mapping[str, Any]] | None = None,
                          documents: Sequence[Mapping[str, Any]] | None = None, **kwargs: Any,
                          ) -> tuple[str, list[tuple[int, int]]]:
        """The text `render` gives, and the (start, end) character spans of its {% generation %}
        blocks, in order (none when the template has no such block)."""
        for where, value in (("messages", messages), ("tools", tools), ("documents", documents),
                             ("keyword arguments", kwargs)):
            if GENERATION_START in repr(value) or GENERATION_END in repr(value):
                raise ValueError(f"the {where} hold the private-use character U+E000 or U+E001, which "
                                 "marks generation blocks while they are recorded; remove it")
        if self._recording is None:
            self._recording = _environment(record_generation=True).from_string(self.source)
        marked = self.render(messages, add_generation_prompt, tools, documents, _template=self._recording,
                             **kwargs)
        return self._unmark(marked)

    def _unmark(self, marked: str) -> tuple[str, list[tuple[int, int]]]:
        """`marked` without the generation brackets, and where each bracketed text lies in it."""
        pieces = re.split(f"([{GENERATION_START}{GENERATION_END}])", marked)
        text: list[str] = []
        spans: list[tuple[int, int]] = []
        length, start = 0, None
        for piece in pieces:
            if piece == GENERATION_START:
                if start is not None:
                    raise ValueError(f"{self.origin} nests a generation block inside another")
                start = length
            elif piece == GENERATION_END:
                spans.append((start, length))
                start = None
            else:
                text.append(piece)
                length += len(piece)
        return "".join(text), [(a, b) for a, b in spans if b > a]

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
               tools: Sequence[Mapping[str, Any]] | None = None,
               documents: Sequence[Mapping[str, Any]] | None = None, **kwargs: Any) -> str:
        """The prompt text for `messages`; `add_generation_prompt` ends it with the header of an
        assistant turn, so the model's continuation is the reply."""
        import jinja2

        if self.harmony:
            raise ValueError(HARMONY_REFUSED.format(origin=self.origin))
        template = kwargs.pop("_template", self._template)
        context = {**self.special_tokens, **plain_data(kwargs, "keyword arguments")}
        try:
            return template.render(
                messages=check_messages(messages), add_generation_prompt=add_generation_prompt,
                tools=plain_data(tools, "tools"), documents=plain_data(documents, "documents"), **context)
        except jinja2.exceptions.SecurityError as err:
            raise ValueError(f"{self.origin} tried something the sandbox forbids: {err}") from None
        except jinja2.TemplateError as err:  # raise_exception(), undefined operations, ...
            raise ValueError(f"{self.origin} failed to render: {err}") from None
        except (TypeError, AttributeError, KeyError, IndexError, ZeroDivisionError) as err:
            raise ValueError(f"{self.origin} failed to render: {type(err).__name__}: {err}") from None


def _token_text(value: Any) -> str | None:
    """tokenizer_config.json writes a special token as a string or as {"content": ...}."""
    value = value.get("content") if isinstance(value, dict) else value
    return value if isinstance(value, str) else None


def _read_tokenizer_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object")
    return data


def load_chat_template(directory: str | os.PathLike) -> ChatTemplate | None:
    """The chat template of a checkpoint or run directory, or None when it has none."""
    directory = Path(directory)
    config = _read_tokenizer_config(directory / TOKENIZER_CONFIG)
    tokens = {name: text for name in SPECIAL_TOKEN_NAMES if (text := _token_text(config.get(name)))}
    if (directory / TEMPLATE_FILE).is_file():
        path = directory / TEMPLATE_FILE
        try:
            return ChatTemplate(path.read_text(encoding="utf-8"), tokens, str(path))
        except UnicodeDecodeError:
            raise ValueError(f"{path} is not UTF-8 text") from None
    source = config.get("chat_template")
    origin = f"{directory / TOKENIZER_CONFIG}'s chat_template"
    if source is None:
        return None
    if isinstance(source, list):  # [{"name": ..., "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        if "default" not in named:
            raise ValueError(f"{origin} lists templates {sorted(map(str, named))} but none named 'default'")
        source, origin = named["default"], origin + " 'default'"
    if not isinstance(source, str):
        raise ValueError(f"{origin} must be a string of Jinja text, got {type(source).__name__}")
    return ChatTemplate(source, tokens, origin)


__all__ = ["GENERATION_END", "GENERATION_START", "ChatTemplate", "check_messages", "load_chat_template",
           "plain_data"]
