"""A teacher behind vLLM's real OpenAI-compatible server, next to the same model in-process.

    make test-slow      (or: pytest -m served tests/test_served.py)

The server (`python -m vllm.entrypoints.openai.api_server`, on the sandbox's teacher-s) starts
once for the module on a free localhost port, requires an API key, and is killed with its whole
process group at the end, whatever happens. The fault proxy (tests/served.py) sits in front of it
for the kill-and-resume test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from served import FaultProxy, vllm_server

from harness.sandbox import zoo

pytestmark = [pytest.mark.served, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
KEY_ENV, KEY = "COTGAP_TEST_SERVED_KEY", "sk-test-4f1d8a0c9e7b-never-written"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> str:
    if not zoo.is_built("teacher-s"):
        pytest.skip("the sandbox zoo is not built (cotgap sandbox build)")
    log = tmp_path_factory.mktemp("server") / "server.log"
    with vllm_server(zoo.model_dir("teacher-s"), "teacher-s", log, api_key=KEY) as url:
        yield url


def _config(tmp: Path, url: str, generate: dict, limit: int = 12, **served) -> Path:
    engine = {
        "kind": "openai",
        "base_url": url,
        "model": "teacher-s",
        "api_key_env": KEY_ENV,
        "endpoint": "completions",
        "vllm_extensions": True,
        "max_concurrency": 8,
        **served,
    }
    exp = {
        "name": "served",
        "results_dir": str(tmp / "results"),
        "teachers": [
            {"name": "local-s", "path": "sandbox:teacher-s", "engine": {"dtype": "float32"}},
            {"name": "served-s", "path": "sandbox:teacher-s", "engine": engine},
        ],
        "students": [{"name": "student-xs", "path": "sandbox:student-xs"}],
        "tasks": [{"name": "sandbox_addition", "train_limit": limit, "test_limit": 8}],
        "generate": {"max_tokens": 80, **generate},
        "train": {"max_steps": 2, "per_device_batch_size": 4, "seeds": [0]},
        "evaluate": {"decoding": "greedy", "max_tokens": 80},
        "costs": {
            "prices": [{"model": "served-s", "input_per_million": 0.5, "output_per_million": 1.5}],
            "device_hour": 2.0,
        },
    }  # fmt: skip
    path = tmp / "exp.yaml"
    path.write_text(yaml.safe_dump(exp))
    return path


def _cotgap(*args: str, **popen) -> subprocess.Popen:
    env = {**os.environ, KEY_ENV: KEY, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "harness", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **popen)  # fmt: skip


def _run(*args: str) -> str:
    proc = _cotgap(*args)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out.decode()[-3000:]
    return out.decode()


def _traces(root: Path) -> dict[str, list[dict]]:
    """Each traces cell's records, by the teacher its manifest names."""
    out = {}
    for d in (root / "cells" / "traces").iterdir():
        teacher = "served-s" if (d / ".requests.jsonl").exists() else "local-s"
        out[teacher] = [json.loads(x) for x in (d / "traces.jsonl").read_text().splitlines()]
    return out


def test_a_grid_with_a_served_teacher_runs_end_to_end(server: str, tmp_path: Path) -> None:
    """Greedy traces of the served teacher equal the in-process engine's; the cost columns are
    filled; the API key is in no file of the results."""
    _run("run", str(_config(tmp_path, server, {"n": 1, "temperature": 0})))
    root = tmp_path / "results" / "served"
    traces = _traces(root)
    assert traces["served-s"] == traces["local-s"] and len(traces["local-s"]) == 12
    import pandas as pd

    board = pd.read_csv(root / "analysis" / "leaderboard.csv")
    teachers = board[board.row_type == "teacher"].set_index("teacher")
    assert teachers.loc["served-s", "gen_completion_tokens"] == sum(
        r["completion_tokens"] for r in traces["served-s"]
    )
    assert (
        teachers.loc["served-s", "gen_device_s"] == 0
        and teachers.loc["local-s", "gen_device_s"] > 0
    )
    assert teachers.loc["served-s", "teacher_acc"] == teachers.loc["local-s", "teacher_acc"]
    distilled = board[board.row_type == "distilled"]
    assert (
        distilled[["gen_cost", "train_device_s", "total_cost", "gain_per_cost"]].notna().all().all()
    )
    assert "## Cost" in (root / "analysis" / "report.md").read_text()
    leaked = [p for p in tmp_path.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]
    assert leaked == [], f"the API key was written to {leaked}"


def test_sampled_traces_match_where_the_server_honours_seeds(server: str, tmp_path: Path) -> None:
    cfg = _config(tmp_path, server, {"n": 2, "temperature": 0.8, "seed": 5}, endpoint="chat")
    _run("generate", str(cfg))
    traces = _traces(tmp_path / "results" / "served")
    # the chat endpoint: the server applies the same chat template the in-process engine does
    assert traces["served-s"] == traces["local-s"] and len(traces["local-s"]) == 24


def _journal(root: Path) -> list[dict]:
    paths = list(root.glob("cells/traces/*/.requests.jsonl"))
    if not paths:
        return []
    lines = paths[0].read_bytes().split(b"\n")
    records = [json.loads(x) for x in lines if x.strip() and x.endswith(b"}")]
    return [r for r in records if "choices" in r]  # finished requests only


def test_killed_three_times_under_faults_every_item_once(server: str, tmp_path: Path) -> None:
    n_items, n = 40, 2
    with FaultProxy(server, seed=11, rate=0.3, slow_s=3.0) as proxy:
        cfg = _config(tmp_path, proxy.url, {"n": n, "temperature": 0.8, "seed": 1}, limit=n_items,
                      timeout_s=1.5, max_concurrency=4)  # fmt: skip
        root = tmp_path / "results" / "served"
        kills = 0
        while kills < 3:
            proc = _cotgap("generate", str(cfg), "--teacher", "served-s", start_new_session=True)
            before = len(_journal(root))
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and proc.poll() is None:
                if len(_journal(root)) >= before + 5:
                    break
                time.sleep(0.2)
            assert proc.poll() is None, "the run ended before it could be killed"
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            kills += 1
        _run("generate", str(cfg), "--teacher", "served-s")
        _run("generate", str(cfg), "--teacher", "local-s")
    traces = _traces(root)
    ids = [r["id"] for r in traces["served-s"]]
    assert len(ids) == n_items * n and all(ids.count(i) == n for i in set(ids))
    assert traces["served-s"] == traces["local-s"]  # as if nothing had happened
    journal = _journal(root)
    assert len({r["key"] for r in journal}) == len(journal) == n_items
    [journal_path] = root.glob("cells/traces/*/.requests.jsonl")
    usage = json.loads((journal_path.parent / "manifest.json").read_text())["summary"]["usage"]
    injected = sum(proxy.injected.values())
    print(f"faults injected {dict(proxy.injected)}; retries recorded {usage['retries']}")
    # a fault on a request in flight at a kill leaves no record: recorded <= injected
    assert 0 < usage["retries"] <= injected and usage["failed_requests"] == 0
    assert usage["requests"] == n_items and usage["resumed_requests"] > 0
    # only a request in flight at a kill can have been answered twice (at most 4 at once)
    assert sum(proxy.delivered.values()) - n_items <= kills * 4
