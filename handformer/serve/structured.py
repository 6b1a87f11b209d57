"""Structured output and forced tool calls for one served model: the request's response_format and
tool_choice turned into a grammar (generation/grammar.py) over the run's own tokens, or an OpenAI
error naming what is wrong.

    response_format json_object            any JSON object
    response_format json_schema            JSON text valid against the schema
    tool_choice "required" / a function     one call (several with parallel_tool_calls) to the
                                            tools (to that function), its arguments valid JSON for
                                            the function's parameters
    tool_choice "auto" with response_format a call, or the JSON answer
    tool_choice "auto" without it           no grammar: the model writes freely, its calls are read back

The vocabulary is prepared on the first request that needs it (in a worker thread; about a second
for 50k tokens) and kept; a grammar is compiled in a worker thread the first time its schema (or
tools) comes, and the latest 64 are kept.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import OrderedDict
from typing import Any

from handformer.generation.chat import stop_ids_for
from handformer.generation.chat_template import ChatTemplate
from handformer.generation.grammar import Grammar, GrammarEngineMissing, Vocabulary, json_object_schema
from handformer.generation.json_schema import SchemaError, check_schema
from handformer.generation.tool_calls import ToolFormat
from handformer.serve.errors import APIError
from handformer.serve.openai_schema import ChatRequest, ResponseFormat
from handformer.tasks.lm.run import LMRun

GRAMMARS_KEPT = 64


class Structured:
    def __init__(self, run: LMRun, template: ChatTemplate | None) -> None:
        self.run, self.template = run, template
        self._vocabulary: Vocabulary | None = None
        self._lock = threading.Lock()
        self._grammars: OrderedDict[tuple[str, str], Grammar] = OrderedDict()  # the latest compiled

    def vocabulary(self) -> Vocabulary:
        with self._lock:
            if self._vocabulary is None:
                run = self.run
                ends = list(run.tokens.eos_ids)
                if self.template is not None:
                    ends += stop_ids_for(run.tokenizer, run.tokens.eos_ids, self.template)
                self._vocabulary = Vocabulary(run.tokenizer, run.model.cfg.vocab_size, ends)
            return self._vocabulary

    async def response_grammar(self, fmt: ResponseFormat | None) -> Grammar | None:
        if fmt is None:
            return None
        schema = answer_schema(fmt)
        return await self._compile(("schema", json.dumps(schema, sort_keys=True)),
                                   lambda v: Grammar.json_schema(v, schema, param(fmt)), param(fmt))

    async def chat_grammar(self, req: ChatRequest, fmt: ToolFormat | None) -> Grammar | None:
        """The grammar of a chat reply (see the module docstring), or None for free text."""
        if fmt is None:
            return await self.response_grammar(req.response_format)
        for i, tool in enumerate(req.tools):
            at = f"tools[{i}].function.parameters"
            try:
                check_schema(tool.parameters, at)
            except SchemaError as err:
                raise APIError(400, err.message, at, "invalid_schema") from None
        forced = req.tool_choice != "auto"
        tools = [t for t in req.tools if req.tool_choice in ("auto", "required") or t.name == req.tool_choice]
        answer = None if forced or req.response_format is None else answer_schema(req.response_format)
        if not forced and answer is None:
            return None
        if answer is not None:
            try:
                check_schema(answer, param(req.response_format))
            except SchemaError as err:
                raise APIError(400, err.message, param(req.response_format), "invalid_schema") from None
        text = fmt.grammar(tools, req.parallel_tool_calls, answer)
        return await self._compile(("lark", text), lambda v: Grammar.lark(v, text), "tools")

    async def _compile(self, key: tuple[str, str], build: Any, param_name: str) -> Grammar:
        """The grammar `build` makes, compiled in a worker thread; the last GRAMMARS_KEPT are kept
        (an agent sends the same tools and schema with every request), each row getting its own
        matcher from one (Grammar.constraint)."""
        with self._lock:
            if key in self._grammars:
                self._grammars.move_to_end(key)
                return self._grammars[key]

        def compile_() -> Grammar:
            return build(self.vocabulary())

        try:
            grammar = await asyncio.to_thread(compile_)
        except GrammarEngineMissing as err:
            raise APIError(400, str(err), param_name, "grammar_engine_missing") from None
        except SchemaError as err:
            raise APIError(400, err.message, param_name, "invalid_schema") from None
        except ValueError as err:  # a run that lists no end token
            raise APIError(400, f"structured output is not possible here: {err}", param_name) from None
        with self._lock:
            self._grammars[key] = grammar
            while len(self._grammars) > GRAMMARS_KEPT:
                self._grammars.popitem(last=False)
        return grammar


def answer_schema(fmt: ResponseFormat) -> dict[str, Any]:
    return json_object_schema() if fmt.type == "json_object" else fmt.schema


def param(fmt: ResponseFormat) -> str:
    return fmt.schema_field if fmt.type == "json_schema" else fmt.field


__all__ = ["Structured"]
