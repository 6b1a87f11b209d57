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
    POST /playground/api/explorer    {model, ids, split, lang} -> {"html"}: the attention explorer's page
                                     (lang: en or zh, the page's language)
    POST /playground/api/translate   {model, text, beam, lang} -> the output, its cross-attention, the
                                     explorer's page of every attention map

Model work runs in a worker thread under the model's lock, one forward pass at a time, so the event
loop never waits on a model. The routes come in by the server's one door (door.py): the same body
parser, sampling options, API key and error (400, 404 for an unknown model, 401 without the API key
when the server has one, 413 for a body over 1 MiB), naming the field and the fix.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace
from importlib import resources
from typing import Any, TypeVar

from anyio import to_thread
from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse

from handformer.generation.chat import stop_ids_for
from handformer.generation.chat_template import ChatTemplate, load_chat_template
from handformer.generation.generate import max_new_tokens_for
from handformer.see.explorer import LANGUAGES as EXPLORER_LANGUAGES
from handformer.serve import playground_lookups as lookups
from handformer.serve.door import APIError, Fields, auth, read_json, read_sampling
from handformer.serve.registry import ServedModel

MAX_BODY = 1 << 20  # bytes a look-up request may send
DEFAULT_MAX_TOKENS = 64
# The page's own server only: no CDN, no other host, nothing but inline script and style.
CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; "
       "connect-src 'self'; frame-src 'self'; base-uri 'none'; form-action 'none'")

Result = TypeVar("Result")


def page_html() -> str:
    return resources.files("handformer.serve").joinpath("static/playground.html").read_text("utf-8")


async def in_thread(model: ServedModel, work: Callable[[], Result]) -> Result:
    """Run `work` in a worker thread under the model's lock; ValueError becomes a 400."""
    def locked() -> Result:
        with model.lock:
            return work()

    try:
        return await to_thread.run_sync(locked)
    except ValueError as err:
        raise APIError(400, str(err)) from None


def sse(event: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(event, ensure_ascii=False, allow_nan=False)}\n\n".encode()


# --- the routes --------------------------------------------------------------------------------

def playground_router(models: Mapping[str, ServedModel], *, api_key: str | None = None) -> APIRouter:
    """The page at `/` and its JSON routes under `/playground/api/`. With `api_key`, every route but
    the page itself (which holds no model data) needs the key: the page asks for it when the server
    answers 401. Its errors are rendered by the app's handlers (errors.add_error_handlers)."""
    routes = Playground(models)
    router = APIRouter()
    router.add_api_route("/", routes.index, methods=["GET"], include_in_schema=False)
    api = APIRouter(prefix="/playground/api", dependencies=[Depends(auth(api_key))])
    api.add_api_route("/models", routes.list_models, methods=["GET"])
    for name in ("generate", "attention", "explorer", "translate"):
        api.add_api_route(f"/{name}", getattr(routes, name), methods=["POST"])
    router.include_router(api)
    return router


class Playground:
    """The page's routes over the served models (their computations: playground_lookups.py)."""

    def __init__(self, models: Mapping[str, ServedModel]) -> None:
        self.models, self.page, self.templates = models, page_html(), chat_templates(models)

    async def index(self) -> Response:
        return HTMLResponse(self.page, headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache",
                                                "X-Content-Type-Options": "nosniff"})

    async def list_models(self) -> Response:
        return JSONResponse({"models": [describe(m, self.templates) for m in self.models.values()]})

    async def generate(self, request: Request) -> Response:
        f = Fields(await read_json(request, MAX_BODY),
                   {"model", "prompt", "max_tokens", "temperature", "top_k", "top_p", "seed", "chat"})
        model, generation = start_generation(self.models, self.templates, f)
        return StreamingResponse(stream(model, generation), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def attention(self, request: Request) -> Response:
        f = Fields(await read_json(request, MAX_BODY), {"model", "ids", "position"})
        model = served(self.models, f, "lm")
        ids = check_ids(model, f.body.get("ids"))
        position = f.body.get("position", len(ids) - 1)
        return JSONResponse(await in_thread(model, lambda: lookups.attention_row(model.lm, ids, position)))

    async def explorer(self, request: Request) -> Response:
        f = Fields(await read_json(request, MAX_BODY), {"model", "ids", "split", "lang"})
        model = served(self.models, f, "lm")
        ids = check_ids(model, f.body.get("ids"))
        split = f.integer("split", 0)
        if split is not None and not 0 <= split <= len(ids):
            raise APIError(400, f"split must be a position in [0, {len(ids)}] (where generation began)",
                           "split")
        lang = page_language(f)
        html = await in_thread(model, lambda: lookups.lm_explorer(model.lm, ids, split, lang))
        return JSONResponse({"html": html})

    async def translate(self, request: Request) -> Response:
        f = Fields(await read_json(request, MAX_BODY), {"model", "text", "beam", "lang"})
        model = served(self.models, f, "translation")
        text = f.body.get("text")
        if not isinstance(text, str):
            raise APIError(400, "text must be a string: the sentence to translate", "text")
        beam = f.body.get("beam", 1)  # checked by lookups.translate, with its range
        lang = page_language(f)
        return JSONResponse(await in_thread(model, lambda: lookups.translate(model.translator, text, beam,
                                                                             lang)))


def page_language(f: Fields) -> str:
    """The page's language (the `lang` field: en, the default, or zh): the explorer's words."""
    lang = f.body.get("lang", "en")
    if lang not in EXPLORER_LANGUAGES:
        raise f.fail("lang", f"one of {', '.join(EXPLORER_LANGUAGES)} (the page's language)")
    return lang


def served(models: Mapping[str, ServedModel], f: Fields, task: str) -> ServedModel:
    name = f.body.get("model")
    if not isinstance(name, str):
        raise APIError(400, f"model must be a model id (a string); served: {', '.join(models)}", "model")
    if name not in models:
        raise APIError(404, f"unknown model {name!r}; served: {', '.join(models)}", "model",
                       "model_not_found")
    model = models[name]
    if model.task != task:
        other = "the Translate tab" if model.task == "translation" else "the Generate tab"
        raise APIError(400, f"model {name!r} is a {model.task} run; use it from {other}", "model")
    return model


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
        raise APIError(400, str(err), "ids") from None


def start_generation(models: Mapping[str, ServedModel], templates: Mapping[str, ChatTemplate],
                     f: Fields) -> tuple[ServedModel, lookups.Generation]:
    """The checked request as a Generation ready to step (nothing run yet but the tokenizer)."""
    model = served(models, f, "lm")
    prompt = f.body.get("prompt", "")
    if not isinstance(prompt, str):
        raise f.fail("prompt", "a string")
    chat = f.boolean("chat")
    template = templates.get(model.id) if chat else None
    if chat and template is None:
        raise APIError(400, f"model {model.id!r} has no chat template; send the prompt as it is "
                       "(chat: false)", "chat")
    stop = None if template is None else stop_ids_for(model.lm.tokenizer, model.lm.tokens.eos_ids, template)
    sampling = read_sampling(f)
    if sampling.seed is None:  # sent back in the "start" event, so the run can be replayed
        sampling = replace(sampling, seed=random.randrange(2**31))
    try:
        ids = lookups.prompt_ids(model.lm, prompt, template)
    except ValueError as err:
        raise APIError(400, str(err), "prompt") from None
    limit = max_new_tokens_for(len(ids), model.lm.model.cfg.max_positions)
    max_tokens = f.integer("max_tokens", 1, limit, default=min(DEFAULT_MAX_TOKENS, limit))
    return model, lookups.Generation(model.lm, ids, max_tokens, sampling, stop)


async def stream(model: ServedModel, generation: lookups.Generation) -> AsyncIterator[bytes]:
    """The generation's events. A client that goes away stops it before the next step: the response
    stops pulling from this generator."""
    lm, sampling = model.lm, generation.sampling
    yield sse({"type": "start", "ids": generation.ids, "tokens": lm.tokenizer.tokens(generation.ids),
               "seed": sampling.seed, "temperature": sampling.temperature, "top_k": sampling.top_k,
               "top_p": sampling.top_p})
    try:
        while not generation.done:
            token, logits = await in_thread(model, generation.step)
            dist = await to_thread.run_sync(lookups.distribution, logits, lm.tokenizer)
            p = lookups.sampled_probability(logits, token, sampling)
            # held back while it ends in U+FFFD: the next byte-level token may complete the character
            text = generation.text() if generation.done else generation.text().rstrip("\ufffd")
            yield sse({"type": "token", "id": token, "token": lm.tokenizer.tokens([token])[0],
                       "probability": p, "text": text, "distribution": dist})
        yield sse({"type": "done", "finish_reason": generation.finish_reason, "text": generation.text(),
                   "ids": generation.ids + generation.new})
    except (APIError, ValueError, RuntimeError) as err:  # the headers are sent: report in the stream
        yield sse({"type": "error", "message": str(err)})
