"""The playground page's routes: the page itself at `/`, and the look-ups it makes under
`/playground/api/` (its own routes, independent of the OpenAI API's batching engine):

    GET  /playground/api/models      the served models: id, task and sizes
    POST /playground/api/generate    {model, prompt, max_tokens, temperature, top_k, top_p, seed,
                                     chat (the prompt as a user message in the run's chat template)}
                                     -> server-sent events: "start" (the prompt's tokens, the seed),
                                     one "token" per new token (id, token, text so far, and the whole
                                     next-token distribution it was sampled from), then "done"
    POST /playground/api/attention   {model, ids, position} -> per layer and head, the attention of
                                     that position over ids[:position + 1]
    POST /playground/api/explorer    {model, ids, split} -> {"html"}: the attention explorer's page
    POST /playground/api/translate   {model, text, beam} -> the output, its cross-attention, the
                                     explorer's page of every attention map

Model work runs in a worker thread under the model's lock, one forward pass at a time, so the event
loop never waits on a model. Bad input gets a JSON error in OpenAI's shape (400, 404 for an unknown
model, 401 without the API key when the server has one, 413 for a body over 1 MiB) naming the field
and the fix.
"""

from __future__ import annotations

import hmac
import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from importlib import resources
from typing import Any, TypeVar

from anyio import to_thread
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse

from handformer.generation.chat import stop_ids_for
from handformer.generation.chat_template import ChatTemplate, load_chat_template
from handformer.generation.generate import max_new_tokens_for
from handformer.serve import playground_lookups as lookups
from handformer.serve.errors import read_capped
from handformer.serve.registry import ServedModel

MAX_BODY = 1 << 20  # bytes a look-up request may send
MAX_SEED = 2**63 - 1
DEFAULT_MAX_TOKENS = 64
# The page's own server only: no CDN, no other host, nothing but inline script and style.
CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; "
       "connect-src 'self'; frame-src 'self'; base-uri 'none'; form-action 'none'")

Result = TypeVar("Result")


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


ERROR_TYPES = {401: "authentication_error", 404: "not_found_error"}  # else invalid_request_error


def error_response(message: str, status: int = 400) -> JSONResponse:
    """OpenAI's error shape, as the API routes answer."""
    kind = ERROR_TYPES.get(status, "invalid_request_error")
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status,
                        headers={"WWW-Authenticate": "Bearer"} if status == 401 else None)


def page_html() -> str:
    return resources.files("handformer.serve").joinpath("static/playground.html").read_text("utf-8")


# --- reading a request -------------------------------------------------------------------------

async def read_body(request: Request) -> dict[str, Any]:
    """The body's JSON object; refused (413) as soon as it passes MAX_BODY bytes, never read whole."""
    body = await read_capped(request, MAX_BODY)
    if body is None:
        raise BadRequest(f"the request body is over the limit of {MAX_BODY} bytes; send less", 413)
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise BadRequest(f"the request body is not valid JSON ({err}); send a JSON object") from None
    if not isinstance(data, dict):
        raise BadRequest("the request body must be a JSON object")
    return data


def served(models: Mapping[str, ServedModel], data: dict[str, Any], task: str) -> ServedModel:
    name = data.get("model")
    if not isinstance(name, str):
        raise BadRequest(f"model must be a model id (a string); served: {', '.join(models)}")
    if name not in models:
        raise BadRequest(f"unknown model {name!r}; served: {', '.join(models)}", 404)
    model = models[name]
    if model.task != task:
        other = "the Translate tab" if model.task == "translation" else "the Generate tab"
        raise BadRequest(f"model {name!r} is a {model.task} run; use it from {other}")
    return model


def optional(data: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any) -> Any:
    """data[name] when present and not null, checked to be of `kind` (never a bool for a number)."""
    value = data.get(name)
    if value is None:
        return default
    if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
        what = {int: "an integer", bool: "true or false"}.get(kind, "a number")
        raise BadRequest(f"{name} must be {what} or null, got {value!r}")
    return value


async def in_thread(model: ServedModel, work: Callable[[], Result]) -> Result:
    """Run `work` in a worker thread under the model's lock; ValueError becomes a 400."""
    def locked() -> Result:
        with model.lock:
            return work()

    try:
        return await to_thread.run_sync(locked)
    except ValueError as err:
        raise BadRequest(str(err)) from None


def sse(event: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(event, ensure_ascii=False, allow_nan=False)}\n\n".encode()


# --- the routes --------------------------------------------------------------------------------

def playground_router(models: Mapping[str, ServedModel], *, api_key: str | None = None) -> APIRouter:
    """The page at `/` and its JSON routes under `/playground/api/`. With `api_key`, every route but
    the page itself (which holds no model data) needs `Authorization: Bearer KEY`: the page asks for
    the key when the server answers 401."""
    router = APIRouter()
    page = page_html()
    templates = chat_templates(models)
    expected = None if api_key is None else api_key.encode("utf-8")

    def authorize(request: Request) -> None:
        if expected is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        # compared in constant time: the time taken does not tell how much of a guess was right
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode("utf-8"), expected):
            raise BadRequest("this server needs its API key: enter it on the page (it is sent as "
                             "'Authorization: Bearer KEY')", 401)

    def api(path: str, method: str = "POST") -> Callable:
        """Register handler(data) -> Response at /playground/api/PATH: the key is checked, the body
        read, and a BadRequest anywhere becomes its JSON error."""
        def register(handler: Callable[[dict[str, Any]], Awaitable[Response]]) -> Callable:
            async def endpoint(request: Request) -> Response:
                try:
                    authorize(request)
                    return await handler(await read_body(request) if method == "POST" else {})
                except BadRequest as err:
                    return error_response(str(err), err.status)

            router.add_api_route(f"/playground/api/{path}", endpoint, methods=[method], name=handler.__name__)
            return handler
        return register

    @router.get("/", include_in_schema=False)
    async def index() -> Response:
        return HTMLResponse(page, headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache",
                                           "X-Content-Type-Options": "nosniff"})

    @api("models", "GET")
    async def list_models(data: dict[str, Any]) -> Response:
        return JSONResponse({"models": [describe(m, templates) for m in models.values()]})

    @api("generate")
    async def generate(data: dict[str, Any]) -> Response:
        model, generation = await start_generation(models, templates, data)
        return StreamingResponse(stream(model, generation), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @api("attention")
    async def attention(data: dict[str, Any]) -> Response:
        model = served(models, data, "lm")
        ids = check_ids(model, data.get("ids"))
        position = data.get("position", len(ids) - 1)
        return JSONResponse(await in_thread(model, lambda: lookups.attention_row(model.lm, ids, position)))

    @api("explorer")
    async def explorer(data: dict[str, Any]) -> Response:
        model = served(models, data, "lm")
        ids = check_ids(model, data.get("ids"))
        split = optional(data, "split", int, None)
        if split is not None and not 0 <= split <= len(ids):
            raise BadRequest(f"split must be a position in [0, {len(ids)}] (where generation began)")
        html = await in_thread(model, lambda: lookups.lm_explorer(model.lm, ids, split))
        return JSONResponse({"html": html})

    @api("translate")
    async def translate(data: dict[str, Any]) -> Response:
        model = served(models, data, "translation")
        text = data.get("text")
        if not isinstance(text, str):
            raise BadRequest("text must be a string: the sentence to translate")
        beam = optional(data, "beam", int, 1)
        return JSONResponse(await in_thread(model, lambda: lookups.translate(model.translator, text, beam)))

    return router


def chat_templates(models: Mapping[str, ServedModel]) -> dict[str, ChatTemplate]:
    """The chat template of every language model that has one (a broken one counts as none here;
    `handformer chat` and the API's chat route report it)."""
    templates = {}
    for name, model in models.items():
        if model.task == "lm":
            try:
                template = load_chat_template(model.run_dir)
            except ValueError:
                template = None
            if template is not None:
                templates[name] = template
    return templates


def describe(model: ServedModel, templates: Mapping[str, ChatTemplate]) -> dict[str, Any]:
    """What the page needs to know of a served model to set up its controls."""
    if model.lm is not None:
        cfg = model.lm.model.cfg
        return {"id": model.id, "task": model.task, "vocab_size": cfg.vocab_size,
                "context": cfg.max_positions, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
                "bos": model.lm.tokens.bos_id is not None, "chat": model.id in templates}
    assert model.translator is not None
    cfg = model.translator.model.cfg
    return {"id": model.id, "task": model.task, "vocab_size": cfg.tgt_vocab_size,
            "context": cfg.max_positions, "n_layers": cfg.n_decoder_layers, "n_heads": cfg.n_heads,
            "beam": model.translator.job.decode.beam}


def check_ids(model: ServedModel, ids: Any) -> list[int]:
    cfg = model.lm.model.cfg
    try:
        return lookups.check_ids(ids, cfg.vocab_size, cfg.max_positions)
    except ValueError as err:
        raise BadRequest(str(err)) from None


async def start_generation(models: Mapping[str, ServedModel], templates: Mapping[str, ChatTemplate],
                           data: dict[str, Any]) -> tuple[ServedModel, lookups.Generation]:
    """The checked request as a Generation ready to step (nothing run yet but the tokenizer)."""
    model = served(models, data, "lm")
    prompt = data.get("prompt", "")
    if not isinstance(prompt, str):
        raise BadRequest(f"prompt must be a string, got {prompt!r}")
    chat = optional(data, "chat", bool, False)
    template = templates.get(model.id) if chat else None
    if chat and template is None:
        raise BadRequest(f"model {model.id!r} has no chat template; send the prompt as it is (chat: false)")
    stop = None if template is None else stop_ids_for(model.lm.tokenizer, model.lm.tokens.eos_ids, template)
    seed = optional(data, "seed", int, None)
    if seed is None:
        seed = random.randrange(2**31)  # sent back in the "start" event, so the run can be replayed
    elif not 0 <= seed <= MAX_SEED:
        raise BadRequest(f"seed must be an integer in [0, {MAX_SEED}], got {seed}")
    try:
        ids = lookups.prompt_ids(model.lm, prompt, template)
        limit = max_new_tokens_for(len(ids), model.lm.model.cfg.max_positions)
        return model, lookups.Generation(
            model.lm, ids, optional(data, "max_tokens", int, min(DEFAULT_MAX_TOKENS, limit)),
            optional(data, "temperature", (int, float), 1.0), optional(data, "top_k", int, None),
            optional(data, "top_p", (int, float), None), seed, stop)
    except ValueError as err:
        raise BadRequest(str(err)) from None


async def stream(model: ServedModel, generation: lookups.Generation) -> AsyncIterator[bytes]:
    """The generation's events. A client that goes away stops it before the next step: the response
    stops pulling from this generator."""
    lm = model.lm
    yield sse({"type": "start", "ids": generation.ids, "tokens": lm.tokenizer.tokens(generation.ids),
               "seed": generation.seed, "temperature": generation.temperature, "top_k": generation.top_k,
               "top_p": generation.top_p})
    try:
        while not generation.done:
            token, logits = await in_thread(model, generation.step)
            dist = await to_thread.run_sync(lookups.distribution, logits, lm.tokenizer)
            p = lookups.sampled_probability(logits, token, generation.temperature, generation.top_k,
                                            generation.top_p)
            # held back while it ends in U+FFFD: the next byte-level token may complete the character
            text = generation.text() if generation.done else generation.text().rstrip("\ufffd")
            yield sse({"type": "token", "id": token, "token": lm.tokenizer.tokens([token])[0],
                       "probability": p, "text": text, "distribution": dist})
        yield sse({"type": "done", "finish_reason": generation.finish_reason, "text": generation.text(),
                   "ids": generation.ids + generation.new})
    except (BadRequest, ValueError, RuntimeError) as err:  # the headers are sent: report in the stream
        yield sse({"type": "error", "message": str(err)})

