"""The local executor on a node with several GPUs: independent engine groups run at the same
time, each on the GPUs its model's `resources.gpus` asks for, and no GPU is held twice. On a
machine without GPUs and with small models, engine groups run at once in slots of one CPU core.

The node's GPU count is mocked (`devices.node_gpus` returns four ids: this machine has no GPU),
and so are its cores where a test needs a number of them (`devices.node_cores`). The schedule,
the allocators and the threads are the real ones; the stage functions are fakes that complete
their cells in the real store and record when they ran and which CUDA_VISIBLE_DEVICES and CPU
cores their children would see. The last tests run real children and real engines.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from helpers import sandbox_grid

from harness import devices
from harness.config.loading import parse
from harness.config.schema import Experiment
from harness.execution import schedule
from harness.store import Store
from harness.workflow import grid
from harness.workflow.cells import KINDS

TEACHERS = {  # zoo model, GPUs it asks for
    "a": ("test-teacher-s", 1),
    "b": ("test-teacher-l", 1),
    "c": ("teacher-s", 2),
    "d": ("teacher-m", 3),
}


class Recorder(dict):
    def __init__(self) -> None:
        super().__init__({kind: self._stage for kind in KINDS})
        self.runs: list[dict] = []
        self.lock = threading.Lock()

    def _stage(self, exp: Experiment, store: Store, cells: list) -> None:
        start = time.monotonic()
        visible = devices.child_env().get("CUDA_VISIBLE_DEVICES")
        cores = devices.child_env().get("COTGAP_CPU_CORES")
        time.sleep(0.3 if cells[0].kind == "traces" else 0.0)
        for c in cells:
            with store.open_cell(c.kind, c.key, c.config, c.upstream) as out:
                out.finish({"n_examples": 5})
        with self.lock:
            self.runs.append(
                {
                    "kind": cells[0].kind,
                    "model": cells[0].model,
                    "gpus": visible.split(",") if visible else [],
                    "cores": cores.split(",") if cores else [],
                    "start": start,
                    "end": time.monotonic(),
                }
            )


@pytest.fixture
def four_gpus(monkeypatch) -> None:
    monkeypatch.setattr(devices, "node_gpus", lambda: ["0", "1", "2", "3"])  # the mock


def _experiment(root: Path, first_size: float = 1e5) -> Experiment:
    config = sandbox_grid("gpus", root)
    config["teachers"] = [
        {"name": n, "path": f"sandbox:{z}", "size": 1e5 * (i + 1), "resources": {"gpus": g}}
        for i, (n, (z, g)) in enumerate(TEACHERS.items())
    ]
    config["teachers"][0]["size"] = first_size
    config["students"][0]["resources"] = {"gpus": 1}
    return parse(Experiment, config, "gpus.yaml")


def _runs_in_order(exp: Experiment) -> list[dict]:
    """The grid run on the recording fake stages: its groups' runs, by start."""
    g = grid.expand(exp)
    store, stages = Store(exp.root), Recorder()
    schedule.run_local(exp, store, schedule.Schedule(g, g, store, None), stages)
    return sorted(stages.runs, key=lambda r: r["start"])


def test_groups_share_a_four_gpu_node_without_overcommitting(tmp_path, four_gpus):
    exp = _experiment(tmp_path)
    g = grid.expand(exp)
    store, stages = Store(exp.root), Recorder()
    schedule.run_local(exp, store, schedule.Schedule(g, g, store, None), stages)
    assert all(store.complete(c.kind, c.key) for c in g)

    traces = [r for r in stages.runs if r["kind"] == "traces"]
    assert sorted(r["model"] for r in traces) == sorted(TEACHERS)
    for r in traces:  # each group saw exactly the GPUs its model asks for
        assert len(r["gpus"]) == TEACHERS[r["model"]][1], r
    # at no moment do the running groups hold more than 4 GPUs, or one GPU twice
    for r in stages.runs:
        at = r["start"]
        running = [o for o in stages.runs if o["start"] <= at < o["end"]]
        held = [gpu for o in running for gpu in o["gpus"]]
        assert len(held) == len(set(held)) <= 4, running
    # and independent groups did overlap: a (1) + b (1) + c (2) fit at once; d (3) waits
    overlapping = {
        frozenset((x["model"], y["model"]))
        for x in traces
        for y in traces
        if x is not y and x["start"] < y["end"] and y["start"] < x["end"]
    }
    assert overlapping, "no two traces groups ran at the same time"
    assert frozenset(("c", "d")) not in overlapping  # 2 + 3 GPUs > 4


def test_without_several_gpus_groups_run_one_after_another(tmp_path, monkeypatch):
    monkeypatch.setattr(devices, "node_gpus", lambda: [])  # the mock: a CPU machine
    runs = _runs_in_order(_experiment(tmp_path))
    assert all(a["end"] <= b["start"] for a, b in zip(runs, runs[1:], strict=False))
    assert all(r["gpus"] == [] for r in runs)


def test_the_allocator_waits_for_free_gpus_and_clamps_large_asks():
    alloc = devices.Allocator(["0", "1"])
    assert alloc.want(0) == 0 and alloc.want(0.5) == 1 and alloc.want(8) == 2
    got: list[tuple[str, ...]] = []
    with alloc.hold(2) as first:
        t = threading.Thread(target=lambda: got.append(alloc.hold(1).__enter__()))
        t.start()
        t.join(0.2)
        assert t.is_alive() and got == []  # both GPUs are held
        assert devices.child_env()["CUDA_VISIBLE_DEVICES"] == "0,1"
    t.join(5)
    assert first == ("0", "1") and len(got) == 1 and len(got[0]) == 1
    assert "CUDA_VISIBLE_DEVICES" not in devices.child_env({})


def test_training_workers_get_one_gpu_each(four_gpus):
    """On GPUs, single-process adapters train in one worker per GPU the group may use: the
    node's when it runs alone, the ones it holds under the allocator."""
    assert devices.usable() == ["0", "1", "2", "3"]
    envs = devices.one_each(3, devices.usable())
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "1", "2"]
    assert devices.one_each(2, []) == [{}, {}]
    with devices.Allocator(["2", "3"]).hold(2):
        assert devices.usable() == ["2", "3"]
        envs = devices.one_each(3, devices.usable())
        assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["2", "3", "2"]


# --- data-parallel generation: the real transformers engine on this CPU ---------------------------


def _traces_cell(exp: Experiment):
    (cell,) = grid.expand(exp).select(kind="traces")
    return cell


def test_data_parallel_generation_writes_what_one_engine_writes(tmp_path, four_gpus, monkeypatch):
    """engine.data_parallel_size 2 on the fake 4-GPU node: the traces group holds 2 GPUs, two
    engine children (real transformers engines on this CPU) each see one of them, generate half
    of the items at the same time (one resuming the share a killed run left), and the cell holds
    the bytes of a one-engine run; the key does not change, and evaluation (one engine) asks for
    one GPU."""
    from harness import engines
    from harness.stages import generate

    config = sandbox_grid("dp", tmp_path / "two", train_limit=8)  # 2 samples each, sampled
    config["teachers"] = [{**config["teachers"][0], "engine": {"data_parallel_size": 2}}]
    config["generate"] = {**config["generate"], "engine": "hf", "max_tokens": 32}
    two = parse(Experiment, config, "dp.yaml")
    config["teachers"][0]["engine"] = {}
    config["results_dir"] = str(tmp_path / "one")
    one = parse(Experiment, config, "dp.yaml")
    cell = _traces_cell(two)
    assert cell.key == _traces_cell(one).key  # data_parallel_size changes no output
    assert cell.resources(two)["gpus"] == 2
    evals = grid.expand(two).select(kind="eval", model="t-small")
    assert evals and all(c.resources(two)["gpus"] == 1 for c in evals)

    # one engine first; then replica 1 finds its first item (and a cut line) from a killed run
    ref = generate.run(one, Store(one.root), [_traces_cell(one)], progress=False)[cell.key]
    lines = (Store(one.root).cell_dir("traces", cell.key) / "traces.jsonl").read_bytes()
    lines = lines.splitlines(keepends=True)
    store = Store(two.root)
    planted = store.cell_dir("traces", cell.key) / generate.replica_file(1, 2)
    planted.parent.mkdir(parents=True)
    planted.write_bytes(b"".join(lines[8:10]) + lines[10][:20])  # item 4 of 8: share 1's first

    calls, lock, real = [], threading.Lock(), engines.run_in_child

    def spy(fn, *args, **kwargs):  # records what the child would see, then runs it for real
        start = time.monotonic()
        out = real(fn, *args, **kwargs)
        with lock:
            calls.append((devices.child_env().get("CUDA_VISIBLE_DEVICES"), start, time.monotonic()))
        return out

    monkeypatch.setattr(engines, "run_in_child", spy)
    with devices.Allocator(devices.node_gpus()).hold(cell.resources(two)["gpus"]) as held:
        summary = generate.run(two, store, [cell], progress=False, inprocess=False)[cell.key]
    assert sorted(v for v, *_ in calls) == sorted(held) and len(held) == 2  # one GPU each
    (a0, a1), (b0, b1) = [(s, e) for _, s, e in calls]
    assert a0 < b1 and b0 < a1  # the two replicas ran at the same time
    assert summary["engine"]["replicas"] == 2 and summary["resumed_items"] == 1
    got = store.cell_dir("traces", cell.key)
    assert (got / "traces.jsonl").read_bytes() == b"".join(lines)
    assert summary["n_samples"] == ref["n_samples"] == 2 * 8
    assert not list(got.glob(".replica-*"))  # the shares are gone once joined


# --- a machine without GPUs: engine groups of small models in slots of one core -------------------


@pytest.fixture
def two_cores(monkeypatch) -> None:
    monkeypatch.setattr(devices, "node_gpus", lambda: [])  # the mocks: a CPU machine, 2 cores
    monkeypatch.setattr(devices, "node_cores", lambda: [0, 1])
    monkeypatch.setattr(devices, "_memory_gb", lambda: 16.0)
    monkeypatch.delenv("COTGAP_CPU_SLOTS", raising=False)


def _overlap(x: dict, y: dict) -> bool:
    return x is not y and x["start"] < y["end"] and y["start"] < x["end"]


def test_small_models_run_their_engine_groups_at_once_one_core_each(tmp_path, two_cores):
    exp = _experiment(tmp_path)  # every model declares under 1M parameters
    g = grid.expand(exp)
    store, stages = Store(exp.root), Recorder()
    schedule.run_local(exp, store, schedule.Schedule(g, g, store, None), stages)
    assert all(store.complete(c.kind, c.key) for c in g)
    engine = [r for r in stages.runs if r["kind"] in ("traces", "eval")]
    assert engine and all(len(r["cores"]) == 1 for r in engine)  # a slot of one core each
    for r in stages.runs:  # never two groups on one core, never more groups than cores
        running = [o for o in stages.runs if o["start"] <= r["start"] < o["end"]]
        held = [c for o in running for c in o["cores"]]
        assert len(held) == len(set(held)) and len(running) <= 2, running
    traces = [r for r in engine if r["kind"] == "traces"]
    assert any(_overlap(x, y) for x in traces for y in traces), "no two traces groups overlapped"
    for r in stages.runs:  # training sets and adapters: not engine groups, one at a time
        if r["kind"] in ("dataset", "adapter"):
            assert r["cores"] == [] and not any(_overlap(r, o) for o in stages.runs), r
    run = next(e for e in schedule.read_events(store) if e["event"] == "run")
    assert run["cpu_slots"] == [[0], [1]]


def test_a_model_that_is_not_small_keeps_one_group_at_a_time_on_every_core(tmp_path, two_cores):
    runs = _runs_in_order(_experiment(tmp_path, first_size=7e9))
    assert all(a["end"] <= b["start"] for a, b in zip(runs, runs[1:], strict=False))
    assert all(r["cores"] == [] for r in runs)


def test_a_slot_has_its_own_warm_child_bound_to_its_core():
    """Real children (no engine): each slot's child runs on the slot's core with one thread and
    serves call after call; the child without a slot runs on every core this process may use."""
    from helpers import where_am_i

    from harness import engines

    cores = devices.node_cores()
    log = Path("/tmp") / f"cotgap-slot-test-{os.getpid()}.log"
    try:
        with devices.CoreSlots([(cores[-1],)]).hold():
            first = engines.run_in_child(where_am_i, label="slot", log_path=log, reuse=True)
            again = engines.run_in_child(where_am_i, label="slot", log_path=log, reuse=True)
        free = engines.run_in_child(where_am_i, label="no slot", log_path=log, reuse=True)
    finally:
        for worker in list(engines._Worker.warm.values()):
            worker.stop()
        log.unlink(missing_ok=True)
    assert first == again  # the same warm child
    assert first[1] == [cores[-1]] and first[2] == "1"
    assert free[0] != first[0] and free[1] == cores


def test_cells_computed_in_slots_hold_the_bytes_of_one_group_at_a_time(tmp_path, monkeypatch):
    """Real vLLM engines: one teacher's four trace draws, cut into two runs of two cells on two
    slots of one core, and the teacher and baseline evals in a slot each, write the files that
    one engine group at a time on every core writes."""
    cores = devices.node_cores()
    if len(cores) < 2:
        pytest.skip("needs two CPU cores")
    monkeypatch.setattr(devices, "_memory_gb", lambda: 16.0)  # the mock: room for two slots
    from harness import engines

    config = sandbox_grid("slots", tmp_path, train_limit=8, test_limit=8)
    config["teachers"] = config["teachers"][:1]
    config["generate"] = {**config["generate"], "seeds": [0, 1, 2, 3], "max_tokens": 96}
    outputs = {}
    monkeypatch.setattr(engines._Worker, "warm", {})  # this test's warm children, stopped below
    for slots in ("2", "1"):
        monkeypatch.setenv("COTGAP_CPU_SLOTS", slots)
        config["results_dir"] = str(tmp_path / f"slots-{slots}")
        exp = parse(Experiment, config, "slots.yaml")
        g = grid.expand(exp)
        store = Store(exp.root)
        sched = schedule.Schedule(g, g, store, frozenset({"generate", "evaluate"}))
        try:
            schedule.run_local(exp, store, sched)
        finally:
            for worker in list(engines._Worker.warm.values()):
                worker.stop()
        done = [c for c in g if c.kind in ("traces", "eval") and store.complete(c.kind, c.key)]
        outputs[slots] = {
            c.key: {
                f: h
                for f, h in store.manifest(c.kind, c.key)["outputs"].items()
                if f.endswith(".jsonl")
            }
            for c in done
        }
        run = next(e for e in schedule.read_events(store) if e["event"] == "run")
        assert len(run["cpu_slots"]) == int(slots)
    assert len(outputs["2"]) == 4 + 2  # four trace draws, the teacher's and the baseline's eval
    assert outputs["2"] == outputs["1"]
