"""The served-model engine (engine.kind: openai): retries, journal, usage, key handling, config.

The upstream here is `served.FakeUpstream`, a stand-in for an OpenAI-compatible server (no model
server can start in the fast suite); the fault proxy in front of it is the real one, and the
client is the real `openai` package. tests/test_served.py runs the same against vLLM's server.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
from served import FakeUpstream, FaultProxy, Misbehaving

from harness.config.loading import parse
from harness.config.schema import ModelSpec
from harness.engines import Request, Sampling, load
from harness.engines.openai_engine import RequestsFailed, backoff, retry_after
from harness.errors import UserError


def _spec(url: str, **engine) -> ModelSpec:
    settings = {"kind": "openai", "base_url": url, "model": "m", "max_concurrency": 4, **engine}
    return ModelSpec.model_validate({"name": "served", "engine": settings})


def _requests(k: int) -> list[Request]:
    return [Request(f"q{i}", prompt=f"What is {i}+{2 * i + 1}?") for i in range(k)]


SAMPLED = Sampling(n=2, temperature=0.7, max_tokens=32, seed=3)


def test_faults_are_retried_and_every_request_is_answered_once(tmp_path: Path) -> None:
    with FakeUpstream() as up, FaultProxy(up.url, seed=7, rate=0.4, slow_s=1.5) as proxy:
        engine = load("vllm", _spec(proxy.url, timeout_s=0.5, max_attempts=30))
        engine.journal_to(tmp_path / "journal.jsonl")
        got = dict(engine.stream(_requests(30), SAMPLED))
        usage = engine.usage()
    assert sorted(got) == list(range(30))
    for i, samples in got.items():
        assert [s.text for s in samples] == [FakeUpstream.answer(f"{i}+{2 * i + 1}")] * 2
    assert sum(proxy.injected.values()) > 0 and set(proxy.injected) == set(FaultProxy("").faults)
    # every injected fault cost exactly one retry, and none was answered twice
    assert usage["retries"] == sum(proxy.injected.values())
    assert set(proxy.delivered.values()) == {1} and len(proxy.delivered) == 30
    assert usage["requests"] == 30 and usage["failed_requests"] == 0
    assert usage["served_model"] == "fake-m"
    lines = [json.loads(x) for x in (tmp_path / "journal.jsonl").read_text().splitlines()]
    assert len({r["key"] for r in lines}) == len(lines) == 30
    assert sum(r["attempts"] - 1 for r in lines) == usage["retries"]


def test_a_journaled_request_is_never_asked_again(tmp_path: Path) -> None:
    journal = tmp_path / "journal.jsonl"
    with FakeUpstream() as up:
        first = load("vllm", _spec(up.url))
        first.journal_to(journal)
        before = first.generate(_requests(10)[:6], SAMPLED)
        # a kill cut the last line in half: it is dropped and that request asked again
        journal.write_bytes(journal.read_bytes()[:-20])
        asked = len(up.requests)
        again = load("vllm", _spec(up.url))
        again.journal_to(journal)
        after = again.generate(_requests(10), SAMPLED)
        assert len(up.requests) - asked == 5  # the cut one and the four new ones
    assert after[:6] == before
    assert again.usage()["resumed_requests"] == 5


def test_a_request_that_keeps_failing_is_recorded_with_its_reason(tmp_path: Path) -> None:
    journal = tmp_path / "journal.jsonl"
    with FakeUpstream() as up, FaultProxy(up.url, rate=1.0, faults=("500",)) as proxy:
        engine = load("vllm", _spec(proxy.url, max_attempts=3))
        engine.journal_to(journal)
        with pytest.raises(RequestsFailed, match=r"3 of 3 requests .* after 3 attempt.*HTTP 500"):
            list(engine.stream(_requests(3), SAMPLED))
        failed = [json.loads(x) for x in journal.read_text().splitlines()]
        assert [r["failed"].split(":")[0] for r in failed] == ["HTTP 500"] * 3
        proxy.rate = 0.0  # the server recovers: a re-run asks again, and counts what was lost
        engine.journal_to(journal)
        assert len(engine.generate(_requests(3), SAMPLED)) == 3
        assert engine.usage()["retries"] == 9


def test_retry_after_holds_the_next_attempt_back(tmp_path: Path) -> None:
    with FakeUpstream() as up, FaultProxy(up.url, rate=1.0, faults=("429",)) as proxy:
        proxy.retry_after_s = 1.5
        engine = load("vllm", _spec(proxy.url, max_attempts=2))
        with pytest.raises(RequestsFailed, match="HTTP 429"):
            engine.generate(_requests(1), SAMPLED)
    first, second = proxy.arrivals
    assert second - first >= 1.5  # a lower bound the client must keep, not a speed


def test_a_bad_request_is_not_retried(tmp_path: Path) -> None:
    with FakeUpstream() as up:
        spec = _spec(up.url.replace("/v1", "/nowhere"), max_attempts=5)
        engine = load("vllm", spec)
        engine.journal_to(tmp_path / "j.jsonl")
        with pytest.raises(RequestsFailed, match="after 1 attempt"):
            engine.generate(_requests(1), SAMPLED)


def test_greedy_asks_once_and_copies(tmp_path: Path) -> None:
    with FakeUpstream() as up:
        engine = load("vllm", _spec(up.url))
        out = engine.generate(_requests(2), Sampling(n=3, temperature=0.0, max_tokens=8))
        assert [len(o) for o in out] == [3, 3] and len(up.requests) == 2
        assert all("seed" not in r and r.get("n", 1) == 1 for r in up.requests)


def test_backoff_honours_retry_after() -> None:
    rng = random.Random(0)
    assert all(backoff(1, rng, 5.0) >= 5.0 for _ in range(20))
    waits = [backoff(a, rng) for a in range(1, 12)]
    assert waits[0] < 1.0 and max(waits) <= 60.0 and waits[6] > waits[0]
    assert retry_after({"retry-after": "3"}) == 3.0
    assert retry_after({"retry-after-ms": "250"}) == 0.25
    assert retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0
    assert retry_after({}) is None


def test_an_echoed_api_key_is_not_journaled(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("COTGAP_TEST_SERVED_KEY", "sk-echoed-91f2")
    with FakeUpstream() as up:
        # a route the stand-in does not have: its 404 message echoes the key
        spec = _spec(up.url.replace("/v1", "/nowhere"), api_key_env="COTGAP_TEST_SERVED_KEY")
        engine = load("vllm", spec)
        engine.journal_to(tmp_path / "j.jsonl")
        with pytest.raises(RequestsFailed) as e:
            engine.generate(_requests(1), SAMPLED)
    assert "<api key>" in str(e.value) and "sk-echoed-91f2" not in str(e.value)
    assert "sk-echoed-91f2" not in (tmp_path / "j.jsonl").read_text()


def test_the_api_key_comes_from_the_environment_only(monkeypatch) -> None:
    spec = _spec("http://127.0.0.1:9/v1", api_key_env="COTGAP_TEST_SERVED_KEY")
    monkeypatch.delenv("COTGAP_TEST_SERVED_KEY", raising=False)
    with pytest.raises(UserError, match="COTGAP_TEST_SERVED_KEY, which is not set"):
        load("vllm", spec)


def _exp(**teacher) -> dict:
    return {
        "name": "x",
        "teachers": [{"name": "t", **teacher}],
        "students": [{"name": "s", "path": "sandbox:student-xs"}],
        "tasks": ["sandbox_addition"],
        "train": {"max_steps": 1},
    }


@pytest.mark.parametrize(
    ("teacher", "message"),
    [
        ({"engine": {"kind": "openai", "base_url": "localhost:8000", "model": "m"}}, "http"),
        ({"engine": {"kind": "vllm"}}, "unknown engine kind"),
        ({"engine": {"dtype": "float32"}}, "give its path"),
        (
            {
                "engine": {
                    "kind": "openai",
                    "base_url": "http://h/v1",
                    "model": "m",
                    "max_concurency": 2,
                }
            },
            "did you mean 'max_concurrency'",
        ),
        (
            {
                "engine": {
                    "kind": "openai",
                    "base_url": "http://h/v1",
                    "model": "m",
                    "endpoint": "completions",
                }
            },
            "cannot apply the chat template",
        ),
    ],
)
def test_config_errors_name_the_key(teacher: dict, message: str) -> None:
    from harness.config.schema import Experiment

    with pytest.raises(UserError, match=message) as e:
        parse(Experiment, _exp(**teacher), "exp.yaml")
    assert "exp.yaml: teachers[0]" in str(e.value)


def test_a_student_cannot_be_served() -> None:
    from harness.config.schema import Experiment

    data = _exp(path="sandbox:teacher-s")
    data["students"][0]["engine"] = {"kind": "openai", "base_url": "http://h/v1", "model": "m"}
    with pytest.raises(UserError, match="only a teacher may be a served model"):
        parse(Experiment, data, "exp.yaml")


def test_the_generate_stage_with_a_served_teacher(tmp_path: Path, monkeypatch) -> None:
    """The traces stage end to end against the stand-in upstream: records and usage in the cell,
    the generation cost from the price table, and the API key in no file of the results."""
    from harness.analysis import spend
    from harness.config.schema import Experiment
    from harness.stages import generate
    from harness.store import Store
    from harness.workflow import grid as grids

    key = "sk-fake-3c9e1b7d-never-on-disk"
    monkeypatch.setenv("COTGAP_TEST_SERVED_KEY", key)
    with FakeUpstream() as up:
        engine = {
            "kind": "openai",
            "base_url": up.url,
            "model": "m",
            "api_key_env": "COTGAP_TEST_SERVED_KEY",
        }
        data = _exp(engine=engine, chat_template=False)
        data["tasks"] = [{"name": "sandbox_addition", "train_limit": 10}]
        data["generate"] = {"n": 2, "temperature": 0.7}
        data["results_dir"] = str(tmp_path / "results")
        data["costs"] = {
            "prices": [{"model": "t", "input_per_million": 2.0, "output_per_million": 4.0}]
        }
        exp = parse(Experiment, data, "exp.yaml")
        store, cells = Store(exp.root), list(grids.expand(exp).traces.values())
        summaries = generate.run(exp, store, cells, progress=False, inprocess=True)
    [summary] = summaries.values()
    usage = summary["usage"]
    assert summary["n_samples"] == 20 and summary["yield"] == 1.0  # the stand-in adds correctly
    assert usage["requests"] == 10 and usage["served_model"] == "fake-m"
    assert summary["engine"]["served_model"] == "fake-m"
    cost = spend.traces_cost(exp, store, "t", cells[0].key)
    sent = [r["messages"][-1]["content"] for r in up.requests]
    assert cost["gen_prompt_tokens"] == sum(
        len(p) for p in sent
    )  # the stand-in's usage: characters
    expected = (cost["gen_prompt_tokens"] * 2.0 + cost["gen_completion_tokens"] * 4.0) / 1e6
    assert cost["gen_cost"] == pytest.approx(expected) and cost["gen_device_s"] == 0
    leaked = [p for p in tmp_path.rglob("*") if p.is_file() and key.encode() in p.read_bytes()]
    assert leaked == []


def test_plan_prices_a_served_teacher_and_leaves_it_out_of_gpu_hours() -> None:
    from harness.config.schema import Experiment
    from harness.workflow import estimate

    engine = {"kind": "openai", "base_url": "http://h/v1", "model": "m"}
    data = _exp(engine=engine)
    data["teachers"].append({"name": "u", "engine": {**engine, "model": "other"}})
    data["costs"] = {
        "prices": [{"model": "t", "input_per_million": 1.0, "output_per_million": 3.0}]
    }
    exp = parse(Experiment, data, "exp.yaml")
    tokens = {("generate", "t"): 2e6, ("evaluate", "t"): 1e6, ("generate", "u"): 5e5}
    assert estimate.served_cost(exp, tokens)["t"] == pytest.approx(9.0)
    assert (
        estimate.served_cost(exp, tokens)["u"] != estimate.served_cost(exp, tokens)["u"]
    )  # no price
    assert estimate.gpu_hours(exp, tokens) == {}


def test_the_rate_limit_spends_a_minute_budget() -> None:
    import asyncio
    import time

    from harness.engines.openai_engine import RateLimit

    async def run() -> float:
        limit = RateLimit(120)  # two a second
        await limit.take(120)  # a full minute's budget at once
        t0 = time.monotonic()
        await limit.take(2)  # then it refills at two a second
        return time.monotonic() - t0

    assert asyncio.run(run()) >= 0.9  # a lower bound the limit must keep, not a speed


def test_kd_and_on_policy_refuse_a_served_teacher() -> None:
    """A served teacher gives text, not its next-token distribution: kd and on_policy are refused
    at validate time with the way out; sft alone validates."""
    from harness.config.schema import Experiment
    from harness.workflow import grid

    served = {"engine": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"}}
    for method in ("kd", "on_policy"):
        data = _exp(**served)
        data["train"]["methods"] = ["sft", method]
        problems = grid.expand_problems(parse(Experiment, data, "exp.yaml"))
        assert len(problems) == 1 and "a served teacher (t; engine.kind: openai)" in problems[0]
        assert "keep only sft in train.methods" in problems[0]
    assert not grid.expand_problems(parse(Experiment, _exp(**served), "exp.yaml"))


def test_the_eval_stage_counts_only_what_an_earlier_run_journaled(tmp_path: Path) -> None:
    """A served teacher's eval cell: nothing resumed on a fresh run, however often the stage
    points the engine at the cell's journal (window after window, then to finish the cell); a
    re-run after the cell's predictions were lost asks for nothing and resumes every request."""
    from harness.config.schema import Experiment
    from harness.stages import evaluate
    from harness.store import Store
    from harness.workflow import grid as grids

    with FakeUpstream() as up:
        data = _exp(engine={"kind": "openai", "base_url": up.url, "model": "m"})
        data["tasks"] = [{"name": "sandbox_addition", "test_limit": 8}]
        data["results_dir"] = str(tmp_path / "results")
        exp = parse(Experiment, data, "exp.yaml")
        store, cell = Store(exp.root), grids.expand(exp).teachers["sandbox_addition", "t"]
        # windows of 3 items: the journal is pointed at three times before the cell finishes
        evaluate.run(exp, store, [cell], progress=False, inprocess=True, chunk_seqs=3)
        usage = json.loads((store.cell_dir("eval", cell.key) / "metrics.json").read_text())["usage"]
        assert usage["requests"] == 8 and usage["resumed_requests"] == 0
        asked = len(up.requests)
        journal = store.cell_dir("eval", cell.key) / evaluate.JOURNAL
        kept = journal.read_bytes()
        shutil.rmtree(store.cell_dir("eval", cell.key))
        journal.parent.mkdir(parents=True)
        journal.write_bytes(kept)
        evaluate.run(exp, store, [cell], progress=False, inprocess=True, chunk_seqs=3)
        again = json.loads((store.cell_dir("eval", cell.key) / "metrics.json").read_text())
        assert len(up.requests) == asked
        assert again["usage"]["resumed_requests"] == 8 and again["usage"]["requests"] == 8


@pytest.mark.parametrize(
    ("route", "status", "hint"),
    [
        ("refused", None, "is the server running"),
        ("model", 404, "engine.model"),
        ("key", 401, "api_key_env"),
        ("garbled", 200, "not an OpenAI-compatible"),
        ("busy", 429, "requests_per_minute"),
    ],
)
def test_a_failed_served_request_is_one_paragraph_and_exit_2(
    tmp_path: Path, route: str, status: int | None, hint: str
) -> None:
    """Every way a served teacher's requests can end failed (nothing listening, a wrong model
    name, a refused key, a body that is not the API's, 429 until the attempts run out) is a user
    error: exit code 2 and one paragraph that names the model and says what to check."""
    from harness.errors import UserError as Error

    with Misbehaving(route) as server:
        url = "http://127.0.0.1:9/v1" if route == "refused" else server.url
        engine = load("vllm", _spec(url, max_attempts=2, timeout_s=5))
        with pytest.raises(RequestsFailed) as e:
            engine.generate(_requests(2), SAMPLED)
    assert isinstance(e.value, Error) and e.value.exit_code == 2
    message = str(e.value)
    assert "\n" not in message and "'m'" in message and hint in message
    if status is not None:
        assert server.statuses and set(server.statuses) == {status}


def test_a_long_retry_after_is_said_once_with_the_wait(monkeypatch, capsys) -> None:
    """Honouring a server's Retry-After holds every request back: the run says so (once per
    longer hold, not once per request), with the wait and the attempts left."""
    from harness.engines import openai_engine

    monkeypatch.setattr(openai_engine, "RETRY_NOTE_S", 1.0)
    with FakeUpstream() as up, FaultProxy(up.url, rate=1.0, faults=("429",)) as proxy:
        proxy.retry_after_s = 1.5
        engine = load("vllm", _spec(proxy.url, max_attempts=2))
        with pytest.raises(RequestsFailed):
            engine.generate(_requests(3), SAMPLED)
    said = [x for x in capsys.readouterr().err.splitlines() if "as the server asks" in x]
    assert 1 <= len(said) < 3 and "waits 2 s" in said[0] and "max_attempts 2" in said[0]
