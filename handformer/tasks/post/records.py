"""The JSONL files of post-training, read and checked line by line.

One JSON object a line, in the formats of OpenAI's and Hugging Face's chat data:

    messages           {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", ...}]}
    prompt_completion  {"prompt": "..." | [messages], "completion": "..." | [messages]}
    preference         {"prompt": "..." | [messages]  (or "messages"), "chosen": ..., "rejected": ...}
    prompts            {"prompt": "..." | [messages]  (or "messages"), any other fields}

A string prompt is the user's message and a string completion (chosen, rejected) the assistant's.
Roles are system, developer, user, assistant and tool; an assistant message may carry "tool_calls"
instead of text (the template renders them where it takes them). Every error names the file and
the line: a line that is not a JSON object, a missing field, an unknown role, an empty message.
Blank lines are skipped.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool")
FORMATS = ("messages", "prompt_completion")


@dataclass
class Conversation:
    """A conversation to train on: its messages, and from which message on the assistant's turns
    are learned (0: every one; a prompt_completion line: the completion's)."""

    messages: list[dict[str, Any]]
    train_from: int = 0
    tools: list[dict[str, Any]] | None = None
    where: str = ""  # "file.jsonl:12", named in errors


@dataclass
class Preference:
    """A prompt and two replies, the first preferred."""

    prompt: list[dict[str, Any]]
    chosen: list[dict[str, Any]]
    rejected: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    where: str = ""


@dataclass
class Prompt:
    """A prompt to sample completions for, and the line's other fields (a reward's answer key)."""

    prompt: list[dict[str, Any]]
    columns: dict[str, Any] = field(default_factory=dict)
    where: str = ""


def read_lines(path: str | os.PathLike) -> list[tuple[str, dict[str, Any]]]:
    """(where, object) for each non-blank line of a JSONL file; where = "file:line"."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no JSONL file at {path}")
    out = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except ValueError as err:
                raise ValueError(f"{where} is not valid JSON ({err}); each line holds one JSON "
                                 "object") from None
            if not isinstance(record, dict):
                raise ValueError(f"{where} holds a {type(record).__name__}; each line holds one JSON object")
            out.append((where, record))
    if not out:
        raise ValueError(f"{path} holds no lines to train on")
    return out


def check_messages(messages: Any, where: str) -> list[dict[str, Any]]:
    """A list of messages, each with a known role and text (or an assistant's tool calls)."""
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: the messages must be a non-empty list of "
                         "{\"role\": ..., \"content\": ...} objects")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"{where}: message {i} is a {type(message).__name__}, not an object")
        role = message.get("role")
        if role not in ROLES:
            raise ValueError(f"{where}: message {i} has role {role!r}; the roles are {', '.join(ROLES)}")
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise ValueError(f"{where}: message {i} ({role}) has content of type {type(content).__name__}; "
                             "give it as text")
        calls = role == "assistant" and isinstance(message.get("tool_calls"), list) and message["tool_calls"]
        if not (content or "").strip() and not calls:
            raise ValueError(f"{where}: message {i} ({role}) is empty; give it text (or, for an assistant, "
                             "tool_calls), or leave it out")
    return messages


def as_messages(value: Any, role: str, where: str, name: str) -> list[dict[str, Any]]:
    """A string as one message of `role`, a list as messages (checked)."""
    if isinstance(value, str):
        return check_messages([{"role": role, "content": value}], f"{where}: \"{name}\"")
    if value is None:
        raise ValueError(f"{where} has no \"{name}\"")
    return check_messages(value, f"{where}: \"{name}\"")


def tools_of(record: dict[str, Any], where: str) -> list[dict[str, Any]] | None:
    tools = record.get("tools")
    if isinstance(tools, str):  # Hugging Face datasets often store them as a JSON string
        try:
            tools = json.loads(tools)
        except ValueError:
            raise ValueError(f"{where}: \"tools\" is a string that is not JSON") from None
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise ValueError(f"{where}: \"tools\" must be a list of tool objects")
    return tools


def read_conversations(path: str | os.PathLike, format: str) -> list[Conversation]:
    """The conversations of an SFT file in `format` (messages | prompt_completion)."""
    if format not in FORMATS:
        raise ValueError(f"[data] format={format!r} is invalid: choose {' or '.join(FORMATS)}")
    out = []
    for where, record in read_lines(path):
        if format == "messages":
            if "messages" not in record:
                raise ValueError(f"{where} has no \"messages\" (data.format = \"messages\"); a line is "
                                 "{\"messages\": [...]}, or set data.format = \"prompt_completion\"")
            out.append(Conversation(check_messages(record["messages"], where), 0, tools_of(record, where),
                                    where))
            continue
        if "prompt" not in record or "completion" not in record:
            raise ValueError(f"{where} needs \"prompt\" and \"completion\" (data.format = "
                             "\"prompt_completion\")")
        prompt = as_messages(record["prompt"], "user", where, "prompt")
        completion = as_messages(record["completion"], "assistant", where, "completion")
        if not any(m["role"] == "assistant" for m in completion):
            raise ValueError(f"{where}: the completion has no assistant message to learn")
        out.append(Conversation(prompt + completion, len(prompt), tools_of(record, where), where))
    return out


def prompt_of(record: dict[str, Any], where: str) -> list[dict[str, Any]]:
    if "prompt" in record:
        return as_messages(record["prompt"], "user", where, "prompt")
    if "messages" in record:
        return check_messages(record["messages"], f"{where}: \"messages\"")
    raise ValueError(f"{where} has no \"prompt\" (or \"messages\")")


def read_preferences(path: str | os.PathLike) -> list[Preference]:
    """The pairs of a DPO file: a prompt (or messages), the chosen and the rejected reply."""
    out = []
    for where, record in read_lines(path):
        prompt = prompt_of(record, where)
        replies = [as_messages(record.get(name), "assistant", where, name) for name in ("chosen", "rejected")]
        out.append(Preference(prompt, replies[0], replies[1], tools_of(record, where), where))
    return out


def read_prompts(path: str | os.PathLike) -> list[Prompt]:
    """The prompts of a GRPO file, and each line's other fields (handed to the reward)."""
    out = []
    for where, record in read_lines(path):
        prompt = prompt_of(record, where)
        columns = {k: v for k, v in record.items() if k not in ("prompt", "messages")}
        out.append(Prompt(prompt, columns, where))
    return out


__all__ = ["FORMATS", "ROLES", "Conversation", "Preference", "Prompt", "check_messages", "read_conversations",
           "read_lines", "read_preferences", "read_prompts"]
