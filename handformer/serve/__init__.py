"""`handformer serve`: run directories behind an OpenAI-compatible HTTP API (FastAPI + uvicorn),
with a playground page at `/`.

    registry.py     which runs are served, under which model ids, loaded once and shared
    door.py         the one way in for every route: API key, body parser, sampling options, errors
    app.py          the FastAPI application: OpenAI routes, CORS
    openai_schema.py  the request bodies, checked field by field; errors.py: the error type, per API shape
    engine.py       continuous batching: one decoding thread per language model
    batch.py        the batch's rows in one left-padded KV cache
    choices.py      engine tokens -> OpenAI choices and stream chunks; text.py: incremental text, stop
    playground.py   the playground page's own routes (next-token distributions, attention)
    static/         the playground page itself (one self-contained HTML file)
"""
