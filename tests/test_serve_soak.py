"""benchmarks/serve_soak.py starts its server on a port that is free when chosen: when another
program binds that port first, the server exits with "address already in use" and another port
is tried; an answer from that other program is never taken for the server's (the server's own
API key is asked for)."""

import http.server
import itertools
import socket
import sys
import threading
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from serve_soak import free_port, start_server  # noqa: E402

# a stand-in for `handformer serve`: loads for a while, then binds the port (failing as uvicorn
# fails when the port is taken) and answers /v1/models with the key only
FAKE_SERVER = r"""
import http.server, sys, time
port, key = int(sys.argv[1]), sys.argv[2]
time.sleep(0.1)
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.headers.get("Authorization") == "Bearer " + key and self.path == "/v1/models"
        self.send_response(200 if ok else 401)
        self.end_headers()
    def log_message(self, *args):
        pass
try:
    server = http.server.HTTPServer(("127.0.0.1", port), Handler)
except OSError as err:
    sys.exit(f"error while attempting to bind on address: {err}")
server.serve_forever()
"""


class AnswersEverything(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)  # the other program answers 200 to anything, without a key
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_port_taken_before_the_server_binds_it_is_given_up_for_another():
    other = http.server.HTTPServer(("127.0.0.1", 0), AnswersEverything)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    taken = other.server_address[1]
    ports = itertools.chain([taken], iter(free_port, None))  # then a fresh free port at every try
    try:
        proc, url = start_server(lambda port: [sys.executable, "-c", FAKE_SERVER, str(port), "k3y"], {},
                                 "k3y", ports=lambda: next(ports), timeout=30)
    finally:
        other.shutdown()
    try:
        assert not url.endswith(f":{taken}")
        assert httpx.get(url + "/v1/models", headers={"Authorization": "Bearer k3y"}).status_code == 200
    finally:
        proc.kill()
        proc.wait()


def test_a_server_that_fails_otherwise_stops_the_run_with_its_message():
    with pytest.raises(SystemExit, match="no such run"):
        start_server(lambda port: [sys.executable, "-c", "import sys; sys.exit('error: no such run')"], {}, "k")
    with socket.socket() as s:  # a port taken every time: given up after the attempts
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        with pytest.raises(SystemExit, match="taken 2 times"):
            start_server(lambda port: [sys.executable, "-c", FAKE_SERVER, str(port), "k"], {}, "k",
                         ports=lambda: taken, attempts=2, timeout=30)
