"""Test doubles and servers for served models (engine.kind: openai).

- `FaultProxy`: a local HTTP proxy that injects, at seeded points, 429 with Retry-After, 500,
  slow answers (past the client's timeout), truncated JSON and dropped connections, and
  forwards everything else to an upstream; it counts what it injected.
- `FakeUpstream`: a stand-in for an OpenAI-compatible server where none can run (the fast
  tests): /v1/completions and /v1/chat/completions answering "What is a+b?" with a worked sum.
  It is not a model; the slow tests put the proxy in front of vLLM's real server instead.
- `vllm_server`: `python -m vllm.entrypoints.openai.api_server` on a sandbox model, on a free
  port, in its own process group, killed (the whole group) when the context ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FAULTS = ("429", "500", "slow", "truncated", "drop")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Server:
    """A ThreadingHTTPServer on a free localhost port, in a daemon thread."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
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
            return _reply(self, 404, b'{"error": {"message": "no such route"}}')
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


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        self._forward(b"", "GET")

    def do_POST(self) -> None:  # noqa: N802
        data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        proxy: FaultProxy = self.server.owner  # type: ignore[attr-defined]
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

    def next_fault(self) -> str | None:
        with self.lock:
            if self.rng.random() >= self.rate:
                return None
            fault = self.rng.choice(self.faults)
            self.injected[fault] += 1
            return fault


@contextlib.contextmanager
def vllm_server(
    model_dir: str | Path, name: str, log: Path, api_key: str | None = None
) -> Iterator[str]:
    """vLLM's OpenAI-compatible server on `model_dir`, served as `name`; yields its /v1 URL.
    With `api_key`, the server refuses requests without it.
    The server runs in a process group of its own; the whole group is killed on the way out,
    whatever happened (its engine core is a second process)."""
    port = free_port()
    env = {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_OMP_THREADS_BIND": "0-1",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "HF_HUB_OFFLINE": "1",
    }
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes", str(1 << 30),
        # a prompt prefilled whole: seeded sampling on a CPU cannot rewind its generator
        "--no-enable-chunked-prefill", "--seed", "0",
    ]  # fmt: skip
    if api_key:
        env["VLLM_API_KEY"] = api_key  # read by the server; kept off its command line
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}/v1"
    try:
        _wait_ready(url, proc, log, api_key)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _wait_ready(
    url: str, proc: subprocess.Popen, log: Path, api_key: str | None, limit_s: float = 300
) -> None:
    deadline = time.monotonic() + limit_s
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"vLLM server exited ({proc.returncode}):\n{log.read_text()[-3000:]}"
            )
        probe = urllib.request.Request(url + "/models", headers=headers)
        with contextlib.suppress(OSError), urllib.request.urlopen(probe, timeout=2) as r:
            if r.status == 200:
                return
        time.sleep(1)
    raise RuntimeError(f"vLLM server not ready after {limit_s} s:\n{log.read_text()[-3000:]}")
