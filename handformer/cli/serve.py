"""`handformer serve`: run directories behind an OpenAI-compatible HTTP API (and the playground)."""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys

from handformer.cli.common import device_arg, positive_int

API_KEY_ENV = "HANDFORMER_API_KEY"
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def cmd_serve(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be from 0 to 65535, got {args.port}")
    if args.prefix_cache_mb is not None and not args.prefix_cache_mb >= 0:
        raise ValueError(f"--prefix-cache-mb must be >= 0 (0 turns the prefix cache off), "
                         f"got {args.prefix_cache_mb}")
    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None
    if api_key is not None and not api_key.strip():
        raise ValueError("--api-key is empty; give a key, or leave the option out")
    listener = listening_socket(args.host, args.port)  # a taken port fails before any model loads
    try:
        return _serve(args, listener, api_key)
    finally:
        listener.close()


def _serve(args: argparse.Namespace, listener: socket.socket, api_key: str | None) -> int:
    """Load the runs and serve them on `listener` (bound) until Ctrl-C or SIGTERM."""
    import uvicorn

    from handformer.serve.app import create_app
    from handformer.serve.registry import load_served_models

    models = load_served_models(args.runs, args.device)
    if args.host not in LOCAL_HOSTS:
        print(f"warning: serving on {args.host}, reachable from other machines"
              f"{'' if api_key else ' by anyone: set --api-key (or ' + API_KEY_ENV + ')'}; "
              "the default 127.0.0.1 is reachable from this machine only", file=sys.stderr)
    app = create_app(models, api_key=api_key, cors_origins=args.cors_origin or None,
                     max_batch=args.max_batch, prefix_cache_mb=args.prefix_cache_mb)
    ids = ", ".join(f"{m.id} ({m.task})" for m in models.values())
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"serving {ids} on http://{host}:{listener.getsockname()[1]}/v1"
          f"{' (API key required)' if api_key else ''}", file=sys.stderr, flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level=args.log_level))
    try:  # uvicorn shuts down gracefully on Ctrl-C / SIGTERM, then passes the signal on
        server.run(sockets=[listener])
    except KeyboardInterrupt:
        pass
    return 0


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to HOST:PORT as uvicorn binds one (the port it got, for --port 0); a
    ValueError naming the fix when there is none."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror:
        raise ValueError(f"--host {host}: no such address; give one of this machine (127.0.0.1, or 0.0.0.0 "
                         "for all)") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise ValueError(bind_problem(host, port, err)) from None
    sock.set_inheritable(True)
    return sock


def bind_problem(host: str, port: int, err: OSError) -> str:
    """Why the server cannot listen on HOST:PORT, with the fix."""
    if err.errno == errno.EADDRINUSE:
        return (f"port {port} of {host} is taken (address already in use: another `handformer serve`?); "
                "choose another --port, or stop the program that holds it")
    if err.errno == errno.EACCES:
        return f"port {port} needs root (ports below 1024 do); choose --port 1024 or above"
    if err.errno == errno.EADDRNOTAVAIL:
        return f"--host {host} is not an address of this machine; give 127.0.0.1, or 0.0.0.0 for all"
    return f"cannot listen on {host}:{port}: {err.strerror or err}"


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve runs over an OpenAI-compatible HTTP API, with a playground page")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR",
                   help="a run directory (model id: its name), or NAME=RUN_DIR")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this "
                   "machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--api-key", default=None, help=f"require the key ('Authorization: Bearer KEY' or "
                   f"'x-api-key: KEY') on every route but / and /health (default: ${API_KEY_ENV} if set)")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="let web pages from ORIGIN call the API (repeatable; default: none)")
    p.add_argument("--max-batch", type=positive_int, default=32,
                   help="most sequences a model decodes together (default 32; more wait their turn)")
    p.add_argument("--prefix-cache-mb", type=float, default=None, metavar="MB",
                   help="keys and values of prompt prefixes kept for reuse, per model (default: 256 or 10%% "
                   "of RAM, whichever is smaller; 0 turns it off)")
    p.add_argument("--device", type=device_arg, default="cpu")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=cmd_serve)
