"""The FastAPI application: OpenAI-compatible routes over the served models.

    GET  /v1/models                the served model ids
    POST /v1/completions           continue a prompt (language-model runs)
    POST /v1/chat/completions      reply to messages with the run's chat template (tools too)
    POST /v1/embeddings            pooled last hidden states of texts (language-model runs)
    POST /v1/translations          translate texts with beam search (translation runs; not OpenAI's)
    GET  /health, GET /metrics     for probes and Prometheus (operations.py)

Language models decode in their `BatchEngine` thread (continuous batching); embeddings and
translations run in a worker thread under the model's lock. The event loop only parses, checks
and forwards; compiling a grammar (structured output, forced tool calls) runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, StreamingResponse
from tokenizers import Tokenizer as HFTokenizer

from handformer.data.tokenizer import Tokenizer
from handformer.generation.chat import stop_ids_for
from handformer.generation.chat_template import ChatTemplate, load_chat_template
from handformer.generation.generate import max_new_tokens_for, positions_needed
from handformer.generation.prefix_cache import default_prefix_cache_mb
from handformer.generation.tool_calls import ToolCallParser, ToolFormat, tool_template
from handformer.serve.choices import Choices, ChoiceSink, Event, watch_client
from handformer.serve.door import APIError, auth, error_body, read_json
from handformer.serve.engine import BatchEngine, Sequence
from handformer.serve.errors import add_error_handlers, error_code
from handformer.serve.messages import add_messages_routes
from handformer.serve.metrics import Metrics, MetricsMiddleware
from handformer.serve.openai_schema import (
    ChatRequest,
    GenerationRequest,
    parse_chat,
    parse_completion,
    parse_embeddings,
    parse_translation,
)
from handformer.serve.operations import Lifecycle, operations_router
from handformer.serve.playground import playground_router
from handformer.serve.registry import ServedModel
from handformer.serve.responses import add_responses_routes
from handformer.serve.structured import Structured
from handformer.serve.text import IncrementalText, chat_decoder, completion_decoder
from handformer.serve.thinking import (
    ThinkingBudget,
    ThinkingFormat,
    ThinkingSplitter,
    capped_budget,
    opens_thinking,
    reasoning_tokens,
    thinking_format,
)


@dataclass
class ThinkingPlan:
    """A chat request's thinking: the run's tokens, whether the prompt opened the section, the budget."""

    fmt: ThinkingFormat
    opened: bool
    asked: int | None  # the budget asked for (None: only the answer's room)
    max_tokens: int

    def splitter(self) -> ThinkingSplitter:
        return ThinkingSplitter(self.opened)

    def budget(self, stop_ids: frozenset[int]) -> ThinkingBudget:
        spend = capped_budget(self.asked, self.max_tokens, len(self.fmt.closing))
        return ThinkingBudget(self.fmt, spend, self.opened, stop_ids)

    def reasoning_tokens(self, tokens: list[int]) -> int:
        return reasoning_tokens(tokens, self.fmt, self.opened)


@dataclass
class ChatPlan:
    """What a chat request decodes: its prompt's ids, limits, end tokens, grammar, parsers."""

    served: ServedModel
    ids: list[int]
    max_tokens: int
    stop_ids: frozenset[int]
    decode: Callable[[list[int]], str]
    grammar: Any = None  # Grammar or None
    parser: Callable[[], ToolCallParser] | None = None
    thinking: ThinkingPlan | None = None


class Submitted(NamedTuple):
    seqs: list[Sequence]
    queue: asyncio.Queue  # the choices' Events
    usage: Callable[[], dict[str, Any]]


log = logging.getLogger("handformer.serve")
MAX_BODY_BYTES = 1 << 20  # 1 MiB: far more than any prompt a served context can hold


def create_app(models: Mapping[str, ServedModel], *, api_key: str | None = None,
               cors_origins: list[str] | None = None, max_body_bytes: int = MAX_BODY_BYTES,
               max_batch: int = 32, prefix_cache_mb: float | None = None) -> FastAPI:
    """The server's application. `api_key`: every route but the page at `/` needs it, sent as
    `Authorization: Bearer KEY` or `x-api-key: KEY` (door.auth).
    `cors_origins`: origins allowed to call the API from a browser (none by default).
    `prefix_cache_mb`: each model's prefix cache (None: 256 MiB or 10 % of RAM, the smaller; 0: off)."""
    mb = default_prefix_cache_mb() if prefix_cache_mb is None else prefix_cache_mb
    if mb < 0:
        raise ValueError(f"prefix_cache_mb must be >= 0 (0 turns the prefix cache off), got {mb}")
    lms = [name for name, m in models.items() if m.task == "lm"]
    metrics, lifecycle = Metrics(lms), Lifecycle()
    engines = {name: BatchEngine(models[name].lm.model, models[name].lock, max_batch, mb,
                                 metrics.models[name]) for name in lms}
    templates = {name: load_chat_template(models[name].run_dir) for name in lms}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        for engine in engines.values():
            engine.start()
        yield
        lifecycle.draining = True  # /health answers 503 from here on
        for engine in engines.values():
            await asyncio.to_thread(engine.stop)

    # No /docs or /redoc: they load their scripts from a CDN.
    app = FastAPI(title="handformer", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.models = dict(models)
    app.state.engines, app.state.metrics, app.state.lifecycle = engines, metrics, lifecycle
    add_error_handlers(app, auth(api_key))
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    if cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type", "x-api-key", "anthropic-version"])
    api = APIRouter(prefix="/v1", dependencies=[Depends(auth(api_key))])
    routes = Routes(dict(models), engines, templates, max_body_bytes)
    app.state.structured = routes.structured  # each model's grammars (tests read them)
    app.state.tool_templates = routes.tool_templates  # each model's tool template, once found
    api.add_api_route("/models", routes.list_models, methods=["GET"])
    api.add_api_route("/models/{model_id}", routes.get_model, methods=["GET"])
    api.add_api_route("/completions", routes.completions, methods=["POST"])
    api.add_api_route("/chat/completions", routes.chat_completions, methods=["POST"])
    api.add_api_route("/embeddings", routes.embeddings, methods=["POST"])
    api.add_api_route("/translations", routes.translations, methods=["POST"])
    app.state.responses = add_responses_routes(api, routes)
    add_messages_routes(api, routes)
    app.include_router(api)
    app.include_router(playground_router(models, api_key=api_key))
    app.include_router(operations_router(engines, metrics, lifecycle, api_key))
    return app


class Routes:
    def __init__(self, models: dict[str, ServedModel], engines: dict[str, BatchEngine],
                 templates: dict[str, ChatTemplate | None], max_body_bytes: int) -> None:
        self.models, self.engines, self.templates = models, engines, templates
        self.max_body_bytes = max_body_bytes
        self.created = int(time.time())
        # The event loop encodes with its own copy of each tokenizer: encoding a chat prompt
        # switches the tokenizer's special-token setting, which must not happen under the engine
        # thread's decoding (the Rust object refuses a change while it is borrowed).
        self.encoders = {name: Tokenizer(HFTokenizer.from_str(m.lm.tokenizer.hf.to_str()))
                         for name, m in models.items() if m.task == "lm"}
        self.unseen_noted: dict[str, set[str]] = {}  # characters noted in the log, by model
        self.structured = {name: Structured(m.lm, templates[name])
                           for name, m in models.items() if m.task == "lm"}
        # Each model's tool format and template (or why it has none), found on its first request
        # with tools: finding it reads the vocabulary (50k entries) and compiles a Jinja template.
        self.tool_templates: dict[str, tuple[ToolFormat, ChatTemplate] | str] = {}
        self.thinking = {name: thinking_format(templates[name], m.lm.tokenizer)  # None: it does not think
                         for name, m in models.items() if m.task == "lm"}

    async def body(self, request: Request) -> dict[str, Any]:
        return await read_json(request, self.max_body_bytes)

    # --- models ---------------------------------------------------------------------------
    def _model_card(self, m: ServedModel) -> dict[str, Any]:
        net = m.lm.model if m.lm is not None else m.translator.model
        return {"id": m.id, "object": "model", "created": self.created, "owned_by": "handformer",
                "task": m.task, "max_positions": net.cfg.max_positions,
                "chat": self.templates.get(m.id) is not None}

    async def list_models(self) -> dict[str, Any]:
        return {"object": "list", "data": [self._model_card(m) for m in self.models.values()]}

    async def get_model(self, model_id: str) -> dict[str, Any]:
        return self._model_card(self._model(model_id, None))

    def _model(self, model_id: str, task: str | None) -> ServedModel:
        served = self.models.get(model_id)
        if served is None:
            raise APIError(404, f"the model {model_id!r} does not exist; this server has "
                           f"{', '.join(sorted(self.models))} (GET /v1/models)", "model", "model_not_found")
        if task is not None and served.task != task:
            route = "/v1/translations" if served.task == "translation" else "/v1/completions"
            raise APIError(400, f"{model_id!r} is a {served.task} run; use {route}", "model")
        return served

    # --- completions ----------------------------------------------------------------------
    async def completions(self, request: Request) -> Any:
        req = parse_completion(await read_json(request, self.max_body_bytes))
        served = self._model(req.model, "lm")
        run = served.lm
        prompts = []
        for text_or_ids in req.prompts:
            if isinstance(text_or_ids, str):  # as `handformer generate`: BOS, then the text
                self._note_unseen(served, [("prompt", text_or_ids)])
                bos = [run.tokens.bos_id] if run.tokens.bos_id is not None else []
                ids = bos + self.encoders[served.id].encode(text_or_ids)
            else:
                ids = list(text_or_ids)
                vocab = run.model.cfg.vocab_size
                if any(not 0 <= t < vocab for t in ids):
                    raise APIError(400, f"prompt holds a token id outside the vocabulary [0, {vocab})",
                                   "prompt")
            if not ids:
                raise APIError(400, "the prompt is empty and the model has no BOS token; give some text",
                               "prompt")
            self._check_length(served, len(ids), req.max_tokens, "prompt")
            prompts.append(ids)
        stop_ids = frozenset(run.tokens.eos_ids)
        grammar = await self.structured[served.id].response_grammar(req.response_format)
        plans = [(ids, req.max_tokens, completion_decoder(run.tokenizer, ids)) for ids in prompts]
        return await self._generate(request, served, req, plans, stop_ids, "text", grammar)

    async def chat_completions(self, request: Request) -> Any:
        req = parse_chat(await read_json(request, self.max_body_bytes))
        plan = await self.prepare_chat(req)
        return await self._generate(request, plan.served, req, [(plan.ids, plan.max_tokens, plan.decode)],
                                    plan.stop_ids, "chat", plan.grammar, plan.parser, plan.thinking)

    async def prepare_chat(self, req: ChatRequest) -> ChatPlan:
        """A chat request's prompt, limits, grammar, tool parser and thinking (every chat-like route)."""
        served, template, fmt, text, ids = self.render_chat(req)
        run = served.lm
        stop_ids = frozenset(stop_ids_for(run.tokenizer, run.tokens.eos_ids, template))
        if not stop_ids:
            raise APIError(400, f"{served.id!r} lists no end token, so a reply would never end", "model")
        max_tokens = self._max_tokens(served, len(ids), req)
        grammar = await self.structured[served.id].chat_grammar(req, fmt)
        forced = fmt is not None and req.tool_choice != "auto"
        parser = None if fmt is None else (lambda: fmt.parser(req.tools, req.parallel_tool_calls, forced))
        plan = ChatPlan(served, ids, max_tokens, stop_ids, chat_decoder(run.tokenizer), grammar, parser)
        if self._thinks(served, req, fmt):
            plan.thinking = ThinkingPlan(self.thinking[served.id], opens_thinking(text), req.thinking.budget,
                                         max_tokens)
        return plan

    def render_chat(self, req: ChatRequest) -> tuple[ServedModel, ChatTemplate, ToolFormat | None, str,
                                                    list[int]]:
        """The served model, the template that renders the request (with its tools), its tool
        format, the prompt and its ids."""
        served = self._model(req.model, "lm")
        template = self.templates[served.id]
        if template is None:
            raise APIError(400, f"{served.id!r} has no chat template (chat_template.jinja or a chat_template "
                           "in tokenizer_config.json), so it cannot chat; use /v1/completions", "model",
                           "no_chat_template")
        self._note_unseen(served, [(f"messages[{i}].content", m["content"])
                                     for i, m in enumerate(req.messages)])
        fmt, template = self._tool_template(served, req, template)
        tools = [t.as_template_data() for t in req.tools] if fmt is not None else None
        thinks = {"enable_thinking": self._thinks(served, req, fmt)} if self.thinking[served.id] else {}
        try:
            text = template.render(req.messages, True, tools, **thinks)
            ids = self.encoders[served.id].encode_with_special_tokens(text)
        except ValueError as err:
            raise APIError(400, str(err), "messages") from None
        return served, template, fmt, text, ids

    def _note_unseen(self, served: ServedModel, texts: list[tuple[str, str]]) -> None:
        """Say in the server's log which characters of a request's text (each with the field it came
        from) the model's character tokenizer never saw, each character once a model, as `handformer
        generate` says it once on stderr. The request is answered: the model reads <unk> for each,
        and clients' own text (an agent framework's instructions) holds characters a small
        character-level model never met; refusing it would refuse every such client."""
        noted, tokenizer = self.unseen_noted.setdefault(served.id, set()), self.encoders[served.id]
        for where, text in texts:
            new = [c for c in tokenizer.unseen_characters(text) if c not in noted]
            if new:
                noted.update(new)
                log.warning("%s, %s: %s", served.id, where, tokenizer.unseen_note("".join(new)))

    def _thinks(self, served: ServedModel, req: ChatRequest, fmt: ToolFormat | None) -> bool:
        """Whether the reply thinks: a run that can, asked to, and no grammar shaping the answer."""
        forced = fmt is not None and req.tool_choice != "auto"
        return self.thinking[served.id] is not None and req.thinking.enabled and not forced \
            and req.response_format is None

    def _max_tokens(self, served: ServedModel, prompt_length: int, req: ChatRequest) -> int:
        """The request's max_tokens; None: until an end token or the end of the context. With
        `req.fit_context` (the Responses and Messages routes, whose clients ask for more tokens than a
        small model's context), a max_tokens past the context is cut to what fits."""
        room = max_new_tokens_for(prompt_length, served.lm.model.cfg.max_positions)
        max_tokens = req.max_tokens
        if max_tokens is None or (req.fit_context and room >= 1):
            max_tokens = room if max_tokens is None else min(max_tokens, room)
        self._check_length(served, prompt_length, max(max_tokens, 1), "messages")
        return max_tokens

    def submit(self, request: Request, plan: ChatPlan, req: GenerationRequest) -> Submitted:
        """One choice of a chat plan, submitted: its sequence and the queue of its events (the
        Responses and Messages routes read them)."""
        return self._submit(plan.served, req, [(plan.ids, plan.max_tokens, plan.decode)], plan.stop_ids,
                            plan.grammar, plan.parser, plan.thinking)

    def _tool_template(self, served: ServedModel, req: ChatRequest,
                       own: ChatTemplate) -> tuple[ToolFormat | None, ChatTemplate]:
        """The tool format and the template that renders the tools, when the request has tools
        (and tool_choice is not "none"); else no format and the run's own template."""
        if not req.tools or req.tool_choice == "none":
            return None, own
        if served.id not in self.tool_templates:  # one entry per served model, kept for the run
            try:
                self.tool_templates[served.id] = tool_template(own, served.lm.tokenizer)
            except ValueError as err:
                self.tool_templates[served.id] = str(err)
        found = self.tool_templates[served.id]
        if isinstance(found, str):
            raise APIError(400, f"{served.id!r} cannot take tools: {found}", "tools")
        return found

    # --- embeddings -----------------------------------------------------------------------
    async def embeddings(self, request: Request) -> dict[str, Any]:
        req = parse_embeddings(await read_json(request, self.max_body_bytes))
        served = self._model(req.model, "lm")
        run = served.lm
        cfg = run.model.cfg
        if req.dimensions is not None and req.dimensions > cfg.d_model:
            raise APIError(400, f"dimensions={req.dimensions} is over the model's width of {cfg.d_model}; "
                           f"ask for at most {cfg.d_model}", "dimensions")
        texts = []
        for i, item in enumerate(req.inputs):
            where = "input" if len(req.inputs) == 1 else f"input[{i}]"
            if isinstance(item, str):
                self._note_unseen(served, [(where, item)])
                bos = [run.tokens.bos_id] if run.tokens.bos_id is not None else []
                ids = bos + self.encoders[served.id].encode(item)
            else:
                ids = list(item)
                if any(not 0 <= t < cfg.vocab_size for t in ids):
                    raise APIError(400, f"{where} holds a token id outside the vocabulary "
                                   f"[0, {cfg.vocab_size})", "input")
            if len(ids) > cfg.max_positions:
                raise APIError(400, f"{where} is {len(ids)} tokens, longer than the model's context of "
                               f"{cfg.max_positions} tokens; shorten it", "input", "context_length_exceeded")
            texts.append(ids)

        def run_model() -> Any:
            from handformer.tasks.lm.embeddings import embed

            with served.lock:
                return embed(run.model, texts, req.pooling, dimensions=req.dimensions)

        vectors = (await asyncio.to_thread(run_model)).cpu()
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(v.numpy().astype("<f4").tobytes()).decode("ascii")
                 if req.encoding_format == "base64" else v.tolist()} for i, v in enumerate(vectors)]
        tokens = sum(len(t) for t in texts)
        return {"object": "list", "data": data, "model": served.id,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    def _check_length(self, served: ServedModel, prompt_length: int, max_tokens: int, param: str) -> None:
        context = served.lm.model.cfg.max_positions
        if prompt_length > context:
            raise APIError(400, f"the prompt is {prompt_length} tokens, longer than the model's context of "
                           f"{context} tokens; shorten it", param, "context_length_exceeded")
        if positions_needed(prompt_length, max_tokens) > context:
            raise APIError(400, f"a prompt of {prompt_length} tokens plus max_tokens={max_tokens} does "
                           f"not fit in the model's context of {context} tokens; lower max_tokens to at most "
                           f"{max_new_tokens_for(prompt_length, context)}", "max_tokens",
                           "context_length_exceeded")

    async def _generate(self, request: Request, served: ServedModel, req: GenerationRequest,
                        plans: list, stop_ids: frozenset[int], schema: str, grammar: Any = None,
                        parser: Any = None, thinking: ThinkingPlan | None = None) -> Any:
        """Submit n sequences per prompt to the model's engine; answer whole or as a stream."""
        seqs, queue, usage = self._submit(served, req, plans, stop_ids, grammar, parser, thinking)
        forced = schema == "chat" and parser is not None and req.tool_choice != "auto"
        choices = Choices(schema, len(seqs), req.sampling.top_logprobs is not None, forced)
        head = {"id": f"{'cmpl' if schema == 'text' else 'chatcmpl'}-{uuid.uuid4().hex}",
                "object": "text_completion" if schema == "text" else "chat.completion",
                "created": int(time.time()), "model": served.id}
        if req.stream:
            return StreamingResponse(self._stream(seqs, queue, choices, head, usage, req.include_usage),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        watch = asyncio.create_task(watch_client(request, queue, lambda: [seq.cancel() for seq in seqs]))
        try:
            pending = len(seqs)
            while pending:
                event = await queue.get()
                if event.kind == "gone":  # cancelled while its tokens flowed; nobody reads this answer
                    log.info("%s: the client went away after %d generated tokens; its %d sequence(s) are "
                             "cancelled (499)", request.url.path, usage()["completion_tokens"], len(seqs))
                    return JSONResponse(error_body(499, "the client went away"), 499)
                if event.kind == "error":
                    raise APIError(event.status, event.reason, code=error_code(event.status, event.reason))
                choices.add(event)
                pending -= event.kind == "finish"
        finally:
            watch.cancel()
            for seq in seqs:
                seq.cancel()  # no-op for finished ones; a client gone mid-way frees its rows
        return {**head, "choices": choices.whole(), "usage": usage()}

    def _submit(self, served: ServedModel, req: GenerationRequest, plans: list, stop_ids: frozenset[int],
                grammar: Any, parser: Any, thinking: ThinkingPlan | None) -> Submitted:
        """n sequences per prompt, submitted to the model's engine. Choice i of a prompt is seeded
        with seed + i, so each prompt gets what it would alone. `grammar`: each choice's text
        follows it; `parser()`: a tool-call parser per choice; `thinking`: each choice's budget."""
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()
        tokenizer = served.lm.tokenizer

        def token_text(token_id: int) -> str:
            return tokenizer.hf.decode([token_id], skip_special_tokens=False)

        seqs = []
        for ids, max_tokens, decode in plans:
            for i in range(req.n):
                sink = ChoiceSink(loop, queue, len(seqs), IncrementalText(decode, req.stop), token_text,
                                  parser() if parser is not None else None,
                                  thinking.splitter() if thinking is not None else None)
                constraint = grammar.constraint(stop_ids) if grammar is not None else None
                budget = (thinking.budget(stop_ids),) if thinking is not None else ()
                seqs.append(Sequence(ids, max_tokens, req.sampling, stop_ids, sink, constraint, i, budget))
        for seq in seqs:
            self.engines[served.id].submit(seq)
        prompt_tokens = sum(len(ids) for ids, _, _ in plans)

        def usage() -> dict[str, int]:
            completion = sum(seq.generated for seq in seqs)
            reasoning = sum(thinking.reasoning_tokens(seq.row.tokens) for seq in seqs) if thinking else 0
            return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                    "total_tokens": prompt_tokens + completion} | (
                {"completion_tokens_details": {"reasoning_tokens": reasoning}} if thinking else {})

        return Submitted(seqs, queue, usage)

    async def _stream(self, seqs: list[Sequence], queue: asyncio.Queue, choices: Choices, head: dict,
                      usage: Any, include_usage: bool) -> AsyncIterator[str]:
        """Server-sent events in OpenAI's chunk format, ending with `data: [DONE]`. When the client
        disconnects, Starlette cancels this generator; `finally` takes its rows out of the batch."""
        head = {**head, "object": head["object"] + ("" if head["object"] == "text_completion" else ".chunk")}
        started = [False] * len(seqs)
        try:
            pending = len(seqs)
            while pending:
                event: Event = await queue.get()
                if event.kind == "error":
                    body = error_body(event.status, event.reason, code=error_code(event.status, event.reason))
                    yield f"data: {json.dumps(body)}\n\n"
                    return
                pending -= event.kind == "finish"
                choices.add(event)
                chunk = choices.chunk(event, first=not started[event.index])
                started[event.index] = True
                yield f"data: {json.dumps({**head, 'choices': [chunk]})}\n\n"
            if include_usage:
                yield f"data: {json.dumps({**head, 'choices': [], 'usage': usage()})}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            # A dropped stream ends in a CancelledError that anyio keeps in a reference cycle (its
            # frame holds the error, whose traceback holds that frame and this one), so this frame
            # lives until the cycle collector runs: it is left holding none of the sequences (no
            # loop variable either), and their rows, grammars and sinks are freed at once
            while seqs:
                seqs.pop().cancel()

    # --- translations ---------------------------------------------------------------------
    async def translations(self, request: Request) -> dict[str, Any]:
        req = parse_translation(await read_json(request, self.max_body_bytes))
        served = self._model(req.model, "translation")
        translator = served.translator

        def translate() -> tuple[list[list[int]], list[list[int]]]:
            with served.lock:
                return translator.translate_ids(req.inputs, beam=req.beam_size)

        source_ids, outputs = await asyncio.to_thread(translate)
        data = [{"index": i, "text": translator.tgt_tok.decode(ids)} for i, ids in enumerate(outputs)]
        prompt = sum(len(ids) for ids in source_ids)
        completion = sum(len(ids) for ids in outputs)
        return {"object": "list", "model": served.id, "data": data,
                "beam_size": req.beam_size or translator.job.decode.beam,
                "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                          "total_tokens": prompt + completion}}


__all__ = ["MAX_BODY_BYTES", "create_app"]
