"""Test doubles and servers for served models (engine.kind: openai).

- `FaultProxy`: a local HTTP proxy that injects, at seeded points, 429 with Retry-After, 500,
  slow answers (past the client's timeout), truncated JSON and dropped connections, and
  forwards everything else to an upstream; it counts what it injected.
- `FakeUpstream`: a stand-in for an OpenAI-compatible server where none can run (the fast
  tests): /v1/completions and /v1/chat/completions answering "What is a+b?" with a worked sum.
  It is not a model; the slow tests put the proxy in front of vLLM's real server instead.
- `vllm_server` (benchmarks/vllm_server.py): vLLM's OpenAI-compatible server on a sandbox model.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from benchmarks.vllm_server import vllm_server

__all__ = ["FAULTS", "FakeUpstream", "FaultProxy", "Misbehaving", "vllm_server"]

FAULTS = ("429", "500", "slow", "truncated", "drop")


class _Quiet(ThreadingHTTPServer):
    """A client that went away mid-request (a killed run, a timed-out attempt) is expected here."""

    def handle_error(self, request: object, client_address: object) -> None:
        pass


class _Server:
    """A ThreadingHTTPServer on a free localhost port, in a daemon thread."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]):
        self.httpd = _Quiet(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.httpd.owner = self  # type: ignore[attr-defined]
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _reply(handler: BaseHTTPRequestHandler, status: int, body: bytes, headers=()) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    for k, v in headers:
        handler.send_header(k, v)
    handler.end_headers()
    handler.wfile.write(body)


class _FakeHandler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            # echoes the credentials it got, as careless servers do
            said = f"no route {self.path} (credentials: {self.headers.get('Authorization')})"
            return _reply(self, 404, json.dumps({"error": {"message": said}}).encode())
        self.server.owner.requests.append(body)  # type: ignore[attr-defined]
        chat = self.path.endswith("/chat/completions")
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        text = FakeUpstream.answer(prompt)
        n = body.get("n", 1)
        choice = {"finish_reason": "stop"}
        choices = [
            {**choice, "index": k, **({"message": {"role": "assistant", "content": text}}
                                     if chat else {"text": text})}
            for k in range(n)
        ]  # fmt: skip
        usage = {"prompt_tokens": len(str(prompt)), "completion_tokens": len(text) * n}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        obj = "chat.completion" if chat else "text_completion"
        resp = {"id": "x", "object": obj, "created": 0, "model": "fake-" + body["model"],
                "choices": choices, "usage": usage}  # fmt: skip
        return _reply(self, 200, json.dumps(resp).encode())


class FakeUpstream(_Server):
    """Answers sums correctly and anything else with a fixed sentence (not a model)."""

    def __init__(self) -> None:
        super().__init__(_FakeHandler)
        self.requests: list[dict] = []

    @staticmethod
    def answer(prompt: str) -> str:
        m = re.search(r"(\d+)\s*\+\s*(\d+)", str(prompt))
        if not m:
            return "I do not know. The answer is 0."
        a, b = int(m.group(1)), int(m.group(2))
        return f"{a}+{b}={a + b}. The answer is {a + b}."


class _MisbehavingHandler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        owner = self.server.owner  # type: ignore[attr-defined]
        status, body, headers = Misbehaving.REPLIES[owner.route]
        owner.statuses.append(status)
        _reply(self, status, json.dumps(body).encode(), headers)


class Misbehaving(_Server):
    """A server that answers every request the same wrong way (`route`): a wrong model name
    (404), a refused key (401), a 200 whose body is not the API's, or 429 every time."""

    REPLIES = {
        "model": (404, {"error": {"message": "The model `m` does not exist."}}, ()),
        "key": (401, {"error": {"message": "Incorrect API key provided."}}, ()),
        "garbled": (200, {"unexpected": True}, ()),
        "busy": (429, {"error": {"message": "Rate limit reached."}}, (("Retry-After", "0"),)),
        "refused": (500, {}, ()),  # not asked: the test points the client at a closed port
    }

    def __init__(self, route: str) -> None:
        super().__init__(_MisbehavingHandler)
        self.route = route
        self.statuses: list[int] = []


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        self._forward(b"", "GET")

    def do_POST(self) -> None:  # noqa: N802
        data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        proxy: FaultProxy = self.server.owner  # type: ignore[attr-defined]
        proxy.arrivals.append(time.monotonic())
        fault = proxy.next_fault()
        if fault == "429":
            body = b'{"error": {"message": "rate limited", "type": "rate_limit"}}'
            return _reply(self, 429, body, [("Retry-After", str(proxy.retry_after_s))])
        if fault == "500":
            return _reply(self, 500, b'{"error": {"message": "injected", "type": "server"}}')
        if fault == "drop":
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return None
        if fault == "slow":
            time.sleep(proxy.slow_s)  # past the client's timeout: it gives up and retries
            self.close_connection = True
            return None
        status, body = self._upstream(data, "POST")
        if fault == "truncated":
            body = body[: max(1, len(body) // 2)]  # a well-formed HTTP answer holding half a JSON
        if status == 200 and fault is None:
            proxy.delivered[_request_key(data)] += 1
        return _reply(self, status, body)

    def _forward(self, data: bytes, method: str) -> None:
        status, body = self._upstream(data, method)
        _reply(self, status, body)

    def _upstream(self, data: bytes, method: str) -> tuple[int, bytes]:
        proxy: FaultProxy = self.server.owner  # type: ignore[attr-defined]
        req = urllib.request.Request(
            proxy.upstream.rstrip("/") + self.path.removeprefix("/v1"),
            data=data if method == "POST" else None,
            method=method,
            headers={"Content-Type": "application/json"}
            | {k: v for k, v in self.headers.items() if k.lower() == "authorization"},
        )
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()


def _request_key(data: bytes) -> str:
    body = json.loads(data)
    return json.dumps({k: body.get(k) for k in ("prompt", "messages", "seed")}, sort_keys=True)


class FaultProxy(_Server):
    """Forwards to `upstream`; each request is, with probability `rate`, given one of `faults`
    instead (drawn from a seeded generator, in arrival order). `injected` counts them;
    `delivered` counts the good answers per request (prompt, seed)."""

    def __init__(
        self, upstream: str, seed: int = 0, rate: float = 0.3, faults=FAULTS, slow_s: float = 2.0
    ):
        super().__init__(_ProxyHandler)
        self.upstream, self.rate, self.faults, self.slow_s = upstream, rate, tuple(faults), slow_s
        self.retry_after_s = 0.2
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.injected: Counter = Counter()
        self.delivered: Counter = Counter()
        self.arrivals: list[float] = []  # time.monotonic() of each request

    def next_fault(self) -> str | None:
        with self.lock:
            if self.rng.random() >= self.rate:
                return None
            fault = self.rng.choice(self.faults)
            self.injected[fault] += 1
            return fault
