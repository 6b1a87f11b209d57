"""`handformer serve`: run directories behind an OpenAI-compatible HTTP API (FastAPI + uvicorn),
with a playground page at `/`.

    registry.py     which runs are served, under which model ids, loaded once and shared
    app.py          the FastAPI application: OpenAI routes, errors, API key, CORS
    playground.py   the playground page's own routes (next-token distributions, attention)
    static/         the playground page itself (one self-contained HTML file)
"""
