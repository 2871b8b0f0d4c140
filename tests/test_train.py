"""The training stage on a tiny random-init Llama (char tokenizer) on CPU: dataset regimes on cells
from `grid.expand`, masking, batching, real training runs through the worker, resume after
SIGKILL, and the adapter served by vLLM and by transformers + peft.

    .venv/bin/pytest tests/test_train.py -q --durations=0
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
from itertools import islice
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from harness.config.schema import Experiment, TrainConfig
from harness.errors import UserError
from harness.execution import schedule
from harness.execution.schedule import Events
from harness.sandbox.random_model import random_llama
from harness.stages import dataset as datasets
from harness.stages import encoding, train, train_worker
from harness.store import Store, read_jsonl
from harness.workflow import grid as grids
from harness.workflow.cells import Cell

END = "<|end|>"
REPO = Path(__file__).resolve().parents[1]
TASK = "sandbox_addition"  # any registered task: its train split is never read here
ALL_PROJ = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module", autouse=True)
def one_thread_workers() -> Any:
    """Training workers (child processes) use one thread: on a shared CPU, a tiny model's OpenMP
    threads waiting for a busy core made the same run up to 27x slower than one thread."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        yield


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-init 2-layer Llama (hidden 64) with the sandbox char tokenizer: loads in vLLM.
    Initialised wider than the default 0.02: LoRA leaves lm_head and the final norm frozen, and at
    0.02 they cap every logit near 1, so no adapter could bring the loss far below 3.5."""
    return random_llama(
        tmp_path_factory.mktemp("tiny-llama"), tie_embeddings=False, max_positions=256
    )


def experiment(model_dir: Path, root: Path, teachers: list[str], **train: Any) -> Experiment:
    """Teachers on one local model; distinct engine.max_model_len tells their identities (hence
    their traces cells) apart."""
    teachers_ = [
        {"name": n, "path": str(model_dir), "engine": {"max_model_len": 200 + i}}
        for i, n in enumerate(teachers)
    ]
    return Experiment.model_validate(
        {
            "name": "t",
            "results_dir": str(root),
            "tasks": [TASK],
            "teachers": teachers_,
            "students": [{"name": "S", "path": str(model_dir)}],
            "train": {"max_steps": 1, **train},
        }
    )


def cells(exp: Experiment) -> dict[tuple[str, str, str | None], Cell]:
    """grid.expand's traces, dataset and adapter cells by (kind, teacher, regime)."""
    out = {}
    for c in grids.expand(exp):
        if c.kind in ("traces", "dataset", "adapter"):
            out[c.kind, getattr(c, "teacher", None) or c.model, getattr(c, "regime", None)] = c
    return out


def trace(qid: str, completion: str, correct: bool = True, **fields: Any) -> dict:
    prompt = f"question {qid}"
    return {
        "id": qid,
        "sample": 0,
        "prompt": prompt,
        "completion": completion,
        "finish_reason": "stop",
        "prompt_tokens": len(prompt),
        "completion_tokens": len(completion),
        "strict": completion[-1:] if correct else None,
        "flexible": None,
        "correct": correct,
        **fields,
    }


def add_traces(store: Store, cell: Cell, records: list[dict]) -> None:
    with store.open_cell("traces", cell.key, cell.config) as c:
        c.write_text("traces.jsonl", "".join(json.dumps(r) + "\n" for r in records))
        c.finish()


# --- rendering, masking, batching ---------------------------------------------------------------


def test_labels_are_the_completion_and_eos_only(tiny_model: Path) -> None:
    tok = encoding.load_tokenizer(str(tiny_model), chat_template=True)
    pairs = [("12+30", "12+30 is 42. The answer is 42."), ("1+1", "2")]
    encoded = [encoding.encode(tok, p, c, chat_template=True) for p, c in pairs]
    batch = encoding.collate(encoded, [0, 1], tok.pad_token_id)
    for row, ((prompt, completion), (ids, n_prompt)) in enumerate(zip(pairs, encoded, strict=True)):
        labels = batch["labels"][row]
        assert tok.decode(labels[labels != -100]) == completion + END
        rendered = tok.decode(batch["input_ids"][row][:n_prompt])
        assert rendered == f"<|user|>{prompt}{END}<|assistant|>"
        assert batch["attention_mask"][row].sum() == len(ids)
    assert (batch["labels"][1][len(encoded[1][0]) :] == -100).all()  # padding is never a target
    raw, n_raw = encoding.encode(tok, "Q: 1+1\nA:", " 2", chat_template=False)
    assert tok.decode(raw[:n_raw]) == "Q: 1+1\nA:" and tok.decode(raw[n_raw:]) == " 2" + END


def test_micro_batches_resume_split_and_group() -> None:
    lengths = [(i * 37) % 101 + 5 for i in range(200)]
    full = list(islice(train_worker.micro_batches(lengths, 8, True, seed=3), 60))
    assert (
        list(islice(train_worker.micro_batches(lengths, 8, True, seed=3, start=17), 43))
        == full[17:]
    )
    epoch = full[:25]  # 200 examples in batches of 8: each example once
    assert sorted(i for b in epoch for i in b) == list(range(200))
    assert full[25:50] != epoch  # the next epoch is reshuffled
    for rank in (0, 1):
        shard = train_worker.micro_batches(lengths, 8, True, 3, world=2, rank=rank)
        assert list(islice(shard, 10)) == full[rank:20:2]

    def non_pad(batches: list[list[int]]) -> float:
        padded = sum(max(lengths[i] for i in b) * len(b) for b in batches)
        return sum(lengths[i] for b in batches for i in b) / padded

    ungrouped = list(islice(train_worker.micro_batches(lengths, 8, False, seed=3), 25))
    assert non_pad(epoch) > 0.95 > non_pad(ungrouped)


# --- dataset regimes ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def regimes(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Experiment, Store]:
    """Teachers C, A, B (in that order) on questions q0..q9, with different yields and verbosity."""
    exp = experiment(
        tiny_model,
        tmp_path_factory.mktemp("regimes"),
        ["C", "A", "B"],
        regimes=["per_teacher", "intersection", "matched"],
        max_length=128,
    )
    store = Store(exp.root)
    a = [
        trace(f"q{i}", f"Let me think about q{i} step by step. The answer is {i}.")
        for i in range(8)
    ]
    a += [trace("q0", "x" * 200, sample=1), trace("q8", "8", correct=False)]
    a += [trace("q9", "9", finish_reason="length")]  # truncated: never an answer
    b = [trace(f"q{i}", f"It is {i}, {i}.") for i in range(2, 7)]
    c = [trace(f"q{i}", f"So {i}.", sample=s) for i in range(6) for s in (0, 1)]
    grid = cells(exp)
    for name, records in (("C", c), ("A", a), ("B", b)):
        add_traces(store, grid["traces", name, None], records)
    return exp, store


def built(
    regimes: tuple, regime: str, teacher: str, matched_by: str = "examples"
) -> tuple[dict, list[dict]]:
    exp, store = regimes
    exp = exp.model_copy(update={"train": exp.train.model_copy(update={"matched_by": matched_by})})
    cell = cells(exp)["dataset", teacher, regime]
    summary = datasets.build(exp, store, cell)
    assert store.complete("dataset", cell.key)
    return summary, read_jsonl(store.cell_dir("dataset", cell.key) / "examples.jsonl")


def test_per_teacher_keeps_correct_finished_traces_and_counts_overlong(regimes: tuple) -> None:
    summary, examples = built(regimes, "per_teacher", "A")
    assert [e["id"] for e in examples] == [f"q{i}" for i in range(8)]  # q8 wrong, q9 truncated
    assert (summary["n_examples"], summary["n_questions"], summary["n_dropped_overlong"]) == (
        8,
        8,
        1,
    )
    assert all(e["n_tokens"] <= 128 for e in examples)
    first = examples[0]
    # char tokens + <|user|>, <|end|>, <|assistant|>; the completion + EOS
    assert first["n_tokens"] - first["n_completion_tokens"] == len("question q0") + 3
    assert first["n_completion_tokens"] == len(first["completion"]) + 1
    assert summary["train_tokens"] == sum(e["n_tokens"] for e in examples)


def test_intersection_keeps_questions_every_teacher_solved(regimes: tuple) -> None:
    summary, examples = built(regimes, "intersection", "C")
    # A solved q0-q7, B q2-q6, C q0-q5 (two samples each)
    assert sorted({e["id"] for e in examples}) == ["q2", "q3", "q4", "q5"]
    assert summary["n_examples"] == 8 and summary["n_questions"] == 4
    _, for_a = built(regimes, "intersection", "A")
    assert [e["id"] for e in for_a] == ["q2", "q3", "q4", "q5"]


def test_matched_gives_every_teacher_the_same_budget(regimes: tuple) -> None:
    sizes = {t: built(regimes, "matched", t)[0]["n_examples"] for t in "ABC"}
    assert sizes == {"A": 5, "B": 5, "C": 5}  # B's 5 correct traces are the smallest set
    assert built(regimes, "matched", "C")[1] == built(regimes, "matched", "C")[1]  # seeded
    per_teacher = {t: built(regimes, "per_teacher", t)[1] for t in "ABC"}
    budget = min(sum(e["n_completion_tokens"] for e in ex) for ex in per_teacher.values())
    for t in "ABC":
        chosen = built(regimes, "matched", t, matched_by="tokens")[1]
        used = sum(e["n_completion_tokens"] for e in chosen)
        left = [e["n_completion_tokens"] for e in per_teacher[t] if e not in chosen]
        assert chosen and used <= budget and (not left or used + min(left) > budget), t


def test_a_teacher_without_usable_traces_gives_an_empty_set_and_no_adapter(
    tiny_model: Path, tmp_path: Path
) -> None:
    exp = experiment(tiny_model, tmp_path, ["W"])
    store, grid = Store(exp.root), cells(exp)
    add_traces(store, grid["traces", "W", None], [trace("q1", "1", correct=False)])
    dataset = grid["dataset", "W", "per_teacher"]
    summary = datasets.build(exp, store, dataset)
    assert summary["n_examples"] == 0 and store.complete("dataset", dataset.key)
    assert schedule.empty_dataset(store, dataset.key)
    adapter = next(
        c for c in grids.expand(exp) if c.kind == "adapter" and c.upstream == (dataset.key,)
    )
    logged: list[str] = []
    sched = schedule.Schedule(
        [dataset, adapter], [adapter], store, None, Events(store, logged.append)
    )
    assert sched.ready(lowest_phase=True, share_workers=True) == []
    assert adapter.key in sched.skipped and "left no training examples" in logged[0]
    [skip] = [e for e in schedule.read_events(store) if e["event"] == "skip"]
    assert skip["cell"] == adapter.key and skip["reason"] == "its teacher left no training examples"


# --- training -----------------------------------------------------------------------------------

TRAIN = {
    "lr": 1e-2,
    "max_steps": 40,
    "per_device_batch_size": 8,
    "grad_accum": 2,
    "warmup_ratio": 0.1,
    "checkpoint_every": 10,
    "max_length": 64,
    "lora": {"r": 8, "alpha": 16, "dropout": 0.05, "target_modules": ALL_PROJ},
}


@pytest.fixture(scope="module")
def toy(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Experiment, Store, Cell]:
    """One teacher's traces on a learnable toy task, built into its dataset cell; the adapter cell."""
    exp = experiment(tiny_model, tmp_path_factory.mktemp("toy"), ["T"], **TRAIN)
    store, grid = Store(exp.root), cells(exp)
    sums = [
        (f"{a}+{b}", f"{a}+{b}={a + b}. The answer is {a + b}.")
        for a in range(10)
        for b in range(10)
    ]
    records = [trace(q, c, prompt=q) for q, c in sums]
    records.append(trace("long", "9" * 80))  # longer than max_length: dropped
    add_traces(store, grid["traces", "T", None], records)
    datasets.build(exp, store, grid["dataset", "T", "per_teacher"])
    return exp, store, grid["adapter", "T", "per_teacher"]


@pytest.fixture(scope="module")
def trained(toy: tuple) -> tuple[Path, dict]:
    """The toy adapter trained with train.merge: another cell than the unmerged one (merge
    changes the cell's files, so it is part of its key), on the same dataset."""
    exp, store, adapter = toy
    merged = exp.model_copy(update={"train": exp.train.model_copy(update={"merge": True})})
    (cell,) = grids.expand(merged).select(kind="adapter")
    assert cell.key != adapter.key and cell.upstream == adapter.upstream and cell.merge
    summary = train.run(merged, store, [cell])[cell.key]
    return store.cell_dir("adapter", cell.key), summary


def test_training_lowers_the_loss_and_writes_a_complete_cell(trained: tuple) -> None:
    cell_dir, s = trained
    print(
        f"\nloss {s['first_loss']:.3f} -> {s['final_loss']:.3f} in {s['steps']} steps, "
        f"{s['wall_s']} s, {s['tokens_per_s']} tok/s, non-pad share {s['non_pad_share']}"
    )
    assert s["final_loss"] < 0.5 * s["first_loss"]
    assert (s["steps"], s["effective_batch"], s["examples"], s["n_dropped_overlong"]) == (
        40,
        16,
        100,
        1,
    )
    assert s["resumed_from"] is None and s["non_pad_share"] > 0.9
    log = read_jsonl(cell_dir / "train_log.jsonl")
    assert [r["step"] for r in log] == list(range(1, 41))
    lrs = [r["lr"] for r in log]  # warmup from 0, cosine down
    assert lrs[0] == 0 and max(lrs) == pytest.approx(1e-2) and lrs[-1] < 1e-3
    assert (cell_dir / "manifest.json").exists() and not (cell_dir / "checkpoints").exists()
    assert (cell_dir / "adapter" / "adapter_config.json").exists()
    assert (cell_dir / "merged" / "config.json").exists()
    weights = load_file(cell_dir / "adapter" / "adapter_model.safetensors")
    assert len(weights) == 2 * 7 * 2  # layers x target modules x (A, B)
    assert all(w.abs().max() > 0 for n, w in weights.items() if "lora_B" in n)  # B starts at 0


def test_resume_after_sigkill_matches_the_uninterrupted_run(toy: tuple, trained: tuple) -> None:
    import psutil

    exp, store, adapter = toy
    cell = dataclasses.replace(adapter, key="f" * 20)  # the same config in a directory of its own
    cell_dir = store.cell_dir("adapter", cell.key)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(train.run, exp, store, [cell])
        deadline = time.time() + 300
        while (
            not list((cell_dir / "checkpoints").glob("step-*"))
            and not first.done()
            and time.time() < deadline
        ):
            time.sleep(0.005)
        (worker,) = [
            p for p in psutil.Process().children() if "harness.stages.train_worker" in p.cmdline()
        ]
        worker.send_signal(signal.SIGKILL)
        with pytest.raises(UserError, match=f"exit code -{int(signal.SIGKILL)}"):
            first.result()
    assert not (cell_dir / "adapter").exists() and not (cell_dir / "manifest.json").exists()
    killed_at = len(read_jsonl(cell_dir / "train_log.jsonl"))
    summary = train.run(exp, store, [cell])[cell.key]
    assert summary["resumed_from"] in (10, 20, 30) and summary["resumed_from"] <= killed_at
    assert [r["step"] for r in read_jsonl(cell_dir / "train_log.jsonl")] == list(range(1, 41))
    assert summary["final_loss"] == trained[1]["final_loss"]
    resumed = load_file(cell_dir / "adapter" / "adapter_model.safetensors")
    uninterrupted = load_file(trained[0] / "adapter" / "adapter_model.safetensors")
    assert resumed.keys() == uninterrupted.keys()
    for name, w in uninterrupted.items():
        torch.testing.assert_close(resumed[name], w, rtol=0, atol=1e-6)


def test_cells_sharing_a_worker_equal_a_worker_each(
    toy: tuple, trained: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two cells trained one after another in one worker process (one start-up) get the weights
    of the cell trained in a worker of its own, bit for bit."""
    exp, store, adapter = toy
    cells = [dataclasses.replace(adapter, key=k * 20) for k in "ab"]
    monkeypatch.setenv("COTGAP_TRAIN_WORKERS", "1")
    launches = record_launches(monkeypatch)
    summaries = train.run(exp, store, cells)
    assert len(launches) == 1 and launches[0].count("--cell-dir") == 2
    alone = load_file(trained[0] / "adapter" / "adapter_model.safetensors")
    for c in cells:
        assert store.complete("adapter", c.key)
        shared = load_file(
            store.cell_dir("adapter", c.key) / "adapter" / "adapter_model.safetensors"
        )
        assert shared.keys() == alone.keys()
        assert all(torch.equal(shared[n], w) for n, w in alone.items())
        assert summaries[c.key]["final_loss"] == trained[1]["final_loss"]
    assert train.run(exp, store, cells) == summaries and len(launches) == 1  # complete: no work


def record_launches(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The worker commands `train.run` starts (and runs), in order."""
    launches: list[list[str]] = []
    real = train._run_workers

    def spy(commands: list[list[str]], threads: int | None) -> int:
        launches.extend(commands)
        return real(commands, threads)

    monkeypatch.setattr(train, "_run_workers", spy)
    return launches


def test_two_workers_train_at_once_to_the_weights_of_one(
    toy: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a CPU machine two single-process workers (one thread each) train a group's cells at
    once; each cell's weights equal those of the same cell trained in one worker of one thread."""
    exp, store, adapter = toy
    monkeypatch.setenv("COTGAP_TRAIN_WORKERS", "2")
    launches = record_launches(monkeypatch)
    pair = [dataclasses.replace(adapter, key=k * 20) for k in "78"]
    train.run(exp, store, pair)
    assert [cmd.count("--cell-dir") for cmd in launches] == [1, 1]
    monkeypatch.setenv("COTGAP_TRAIN_WORKERS", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    (one,) = [dataclasses.replace(adapter, key="9" * 20)]
    train.run(exp, store, [one])
    ref = load_file(store.cell_dir("adapter", one.key) / "adapter" / "adapter_model.safetensors")
    for c in pair:
        got = load_file(store.cell_dir("adapter", c.key) / "adapter" / "adapter_model.safetensors")
        assert all(torch.equal(got[n], w) for n, w in ref.items())


def _kill_worker_when(done: Any, run: concurrent.futures.Future, timeout: float = 300) -> None:
    """SIGKILL the training worker (a child of this process) once `done()` holds."""
    import psutil

    deadline = time.time() + timeout
    while not done() and not run.done() and time.time() < deadline:
        time.sleep(0.005)
    assert done(), "the worker never got there"
    (worker,) = [
        p for p in psutil.Process().children() if "harness.stages.train_worker" in p.cmdline()
    ]
    for p in [worker, *worker.children(recursive=True)]:  # with the ranks of a launch
        p.send_signal(signal.SIGKILL)
    with pytest.raises(UserError, match=f"exit code -{int(signal.SIGKILL)}"):
        run.result()


def test_a_kill_during_a_group_keeps_the_cells_it_finished(
    toy: tuple, trained: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker completes each cell of its group when that cell is trained: a kill during the
    second keeps the first, and the re-run trains only what is left, to the same weights."""
    exp, store, adapter = toy
    monkeypatch.setenv("COTGAP_TRAIN_WORKERS", "1")  # one worker: the kill lands in the group
    cells = [dataclasses.replace(adapter, key=k * 20) for k in "12"]
    second = store.cell_dir("adapter", cells[1].key)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        run = pool.submit(train.run, exp, store, cells)
        _kill_worker_when(lambda: (second / "train_log.jsonl").exists(), run)
    assert store.complete("adapter", cells[0].key) and not store.complete("adapter", cells[1].key)
    manifest = store.manifest("adapter", cells[0].key)
    assert manifest["summary"]["n_dropped_overlong"] == 1 and manifest["wall_s"] > 0
    assert "checkpoints" not in " ".join(manifest["outputs"])
    launches = record_launches(monkeypatch)
    train.run(exp, store, cells)
    assert len(launches) == 1 and launches[0].count("--cell-dir") == 1  # the second cell only
    alone = load_file(trained[0] / "adapter" / "adapter_model.safetensors")
    for c in cells:
        cell_dir = store.cell_dir("adapter", c.key)
        got = load_file(cell_dir / "adapter" / "adapter_model.safetensors")
        assert all(torch.equal(got[n], w) for n, w in alone.items())
        assert (cell_dir / "adapter" / "adapter_config.json").read_bytes() == (
            trained[0] / "adapter" / "adapter_config.json"
        ).read_bytes()  # target_modules in one order, whichever process wrote it
    assert not list(store.cell_dir("adapter", "1" * 20).parent.glob("*.lock"))


def test_time_based_checkpoints_resume_to_the_same_weights(toy: tuple, trained: tuple) -> None:
    """checkpoint_every 0, checkpoint_seconds 0.3: a checkpoint once 0.3 s of training went by (the
    toy trains ~2 s, so the first lands mid-run on any machine); killed after one, resumed, the
    weights equal the uninterrupted run's bit for bit."""
    exp, store, adapter = toy
    fast = exp.model_copy(
        update={"train": exp.train.model_copy(update={"checkpoint_seconds": 0.3})}
    )
    config = {**adapter.config, "train": {**adapter.config["train"], "checkpoint_every": 0}}
    cell = dataclasses.replace(adapter, key="c" * 20, config=config)
    cell_dir = store.cell_dir("adapter", cell.key)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        run = pool.submit(train.run, fast, store, [cell])
        _kill_worker_when(lambda: bool(list((cell_dir / "checkpoints").glob("step-*"))), run)
    summary = train.run(fast, store, [cell])[cell.key]
    assert summary["resumed_from"] is not None and 0 < summary["resumed_from"] < 40
    resumed = load_file(cell_dir / "adapter" / "adapter_model.safetensors")
    uninterrupted = load_file(trained[0] / "adapter" / "adapter_model.safetensors")
    assert all(torch.equal(resumed[n], w) for n, w in uninterrupted.items())


def test_checkpoint_seconds_is_not_part_of_the_adapter_key(toy: tuple) -> None:
    exp, _, adapter = toy
    other = exp.model_copy(
        update={"train": exp.train.model_copy(update={"checkpoint_seconds": 5.0})}
    )
    keys = [c.key for c in grids.expand(other) if c.kind == "adapter"]
    assert keys == [adapter.key] and "checkpoint_seconds" not in adapter.config["train"]


def test_two_processes_train_through_accelerate_launch(
    toy: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    """num_processes: 2 -> one `accelerate launch` of two DDP ranks (gloo on this CPU): each rank
    takes its own micro-batches, so the effective batch doubles; rank 0 alone writes the cell."""
    exp, store, adapter = toy
    config = {**adapter.config, "train": {**adapter.config["train"], "num_processes": 2}}
    config["train"]["max_steps"] = 12
    cell = dataclasses.replace(adapter, key="d" * 20, config=config)
    launches = record_launches(monkeypatch)
    summary = train.run(exp, store, [cell])[cell.key]
    (cmd,) = launches
    assert "accelerate.commands.launch" in cmd and cmd[cmd.index("--num_processes") + 1] == "2"
    assert (summary["steps"], summary["effective_batch"]) == (12, 2 * 8 * 2)
    assert summary["final_loss"] < 0.8 * summary["first_loss"]
    log = read_jsonl(store.cell_dir("adapter", cell.key) / "train_log.jsonl")
    assert [r["step"] for r in log] == list(range(1, 13))  # one log, written once per step
    weights = load_file(
        store.cell_dir("adapter", cell.key) / "adapter" / "adapter_model.safetensors"
    )
    assert all(w.abs().max() > 0 for n, w in weights.items() if "lora_B" in n)


def test_full_fine_tuning_by_epochs(toy: tuple, tiny_model: Path, tmp_path: Path) -> None:
    """The worker in this process: method full, an epochs budget, a constant schedule with warmup."""
    from transformers import AutoModelForCausalLM

    exp, store, adapter = toy
    cfg = TrainConfig(
        method="full", epochs=1, per_device_batch_size=16, lr=1e-3, schedule="constant"
    )
    _write_job(tmp_path, tiny_model, store, adapter, cfg)
    summary = train_worker.train_cell(tmp_path)
    assert summary["steps"] == 7 and summary["epochs"] == 1.0  # 100 examples in batches of 16
    assert [r["lr"] for r in read_jsonl(tmp_path / "train_log.jsonl")] == [0.0] + [1e-3] * 6
    assert summary["adapter"] is None and not (tmp_path / "adapter").exists()
    tuned = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert not torch.equal(tuned.lm_head.weight, base.lm_head.weight)  # every weight trains
    assert encoding.load_tokenizer(str(tmp_path / "merged"), chat_template=True).eos_token == END


def _write_job(tmp_path: Path, model: Path, store: Any, adapter: Any, cfg: TrainConfig) -> None:
    """The job.json a training worker reads, for the toy grid's first adapter's examples."""
    job = {
        "model_dir": str(model),
        "chat_template": True,
        "trust_remote_code": False,
        "examples": str(store.cell_dir("dataset", adapter.upstream[0]) / "examples.jsonl"),
        "train": cfg.model_dump(mode="json"),
        "seed": 0,
        "merge": False,
    }
    (tmp_path / "job.json").write_text(json.dumps(job))


@pytest.fixture
def fresh_accelerator() -> Any:
    """Accelerator state is per process: one made here with other settings starts afresh."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.mark.parametrize("method", ["lora", "full"])
def test_weights_are_held_in_the_dtypes_plan_counts(
    toy: tuple, tiny_model: Path, tmp_path: Path, method: str, fresh_accelerator: None
) -> None:
    """Under bf16 mixed precision what trains is held in fp32 (full fine-tuning's weights: the
    optimizer's master copy) and a frozen LoRA base in bf16: the bytes estimate.training_memory
    counts a parameter."""
    from harness.workflow import estimate

    exp, store, adapter = toy
    cfg = TrainConfig(method=method, max_steps=2, per_device_batch_size=4, precision="bf16")
    _write_job(tmp_path, tiny_model, store, adapter, cfg)
    held = train_worker.train_cell(tmp_path)["dtypes"]
    size = {"float32": 4, "bfloat16": 2}
    assert held["trained"] == "float32" and size[held["trained"]] == estimate.FULL_BYTES // 4
    if method == "lora":
        assert held["frozen"] == "bfloat16" and size["bfloat16"] == estimate.FROZEN_BYTES["bf16"]
    else:
        assert held["frozen"] is None  # every weight trains


def test_worker_commands(tmp_path: Path) -> None:
    one = train.worker_command(tmp_path, TrainConfig(max_steps=1))
    assert one == [
        sys.executable,
        "-m",
        "harness.stages.train_worker",
        "--cell-dir",
        str(tmp_path),
        "--owner-pid",
        str(os.getpid()),
    ]
    two = train.worker_command(tmp_path, TrainConfig(max_steps=1, num_processes=2))
    assert two[:3] == [sys.executable, "-m", "accelerate.commands.launch"] and two[-6:] == one[1:]
    # on CPU, `--cpu` would start one process whatever --num_processes says
    assert (
        two[two.index("--num_processes") + 1] == "2" and "--multi_gpu" in two and "--cpu" not in two
    )
    cfg = TrainConfig(max_steps=1, accelerate_config="fsdp.yaml", num_processes=4)
    three = train.worker_command(tmp_path, cfg)
    assert three[three.index("--config_file") + 1] == "fsdp.yaml" and "--multi_gpu" not in three


def test_run_needs_a_complete_dataset(toy: tuple) -> None:
    exp, store, adapter = toy
    orphan = dataclasses.replace(adapter, key="e" * 20, upstream=("0" * 20,))
    with pytest.raises(UserError, match="not complete"):
        train.run(exp, store, [orphan])[orphan.key]


FSDP_CPU = REPO / "tests" / "fsdp_cpu"


@pytest.fixture
def fsdp_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An accelerate config for FSDP2 over two processes (gloo on this CPU), and
    tests/fsdp_cpu/sitecustomize.py leading the workers' PYTHONPATH: accelerate 1.15 shards only
    on accelerators and would silently train DDP copies here; the shim flips that one decision,
    and accelerate's FSDP2 wrapping, sharded checkpoints and gathering run for real."""
    import socket

    path = [str(FSDP_CPU), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "fsdp.yaml"
    config.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nnum_machines: 1\n"
        f"num_processes: 2\nmain_process_port: {port}\nmixed_precision: 'no'\n"
        "fsdp_config:\n  fsdp_version: 2\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
        "  fsdp_state_dict_type: SHARDED_STATE_DICT\n  fsdp_reshard_after_forward: true\n"
    )
    return str(config)


def _shapes(path: Path) -> dict[str, tuple]:
    return {n: tuple(w.shape) for n, w in load_file(path).items()}


@pytest.mark.faults  # six launches of two ranks: ~45 s each on a busy 2-core machine
@pytest.mark.parametrize("method", ["lora", "full"])
def test_fsdp_on_two_processes_saves_whole_weights_and_resumes(
    toy: tuple, trained: tuple, tiny_model: Path, fsdp_config: str, method: str
) -> None:
    """FSDP2 over two CPU processes: each rank holds half of each weight while training, the
    cell's adapter and merged model hold every parameter at its full shape (gathered to rank 0),
    and a run SIGKILLed (launcher and ranks) after a sharded checkpoint resumes to the weights of
    the uninterrupted run."""
    exp, store, adapter = toy
    config = {**adapter.config, "train": {**adapter.config["train"]}}
    config["train"].update(
        num_processes=2, accelerate_config=fsdp_config, method=method, merge=True,
        max_steps=6, checkpoint_every=2, precision="fp32", lr=1e-3 if method == "full" else 1e-2,
    )  # fmt: skip
    keys = [f"{'ab'[method == 'full']}{k}" * 10 for k in "12"]  # a cell of its own per method
    whole, cut = (dataclasses.replace(adapter, key=k, config=config) for k in keys)
    summary = train.run(exp, store, [whole])[whole.key]
    assert (summary["steps"], summary["effective_batch"]) == (6, 2 * 8 * 2)
    cut_dir = store.cell_dir("adapter", cut.key)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        run = pool.submit(train.run, exp, store, [cut])
        _kill_worker_when(lambda: bool(list((cut_dir / "checkpoints").glob("step-*"))), run)
    assert not store.complete("adapter", cut.key)
    (ckpt,) = (cut_dir / "checkpoints").glob("step-*")
    assert len(list((ckpt / "pytorch_model_fsdp_0").glob("*.distcp"))) == 2  # a shard a rank
    resumed = train.run(exp, store, [cut])[cut.key]
    assert resumed["resumed_from"] in (2, 4) and resumed["final_loss"] == summary["final_loss"]
    files = ["merged/model.safetensors"]
    if method == "lora":
        files.append("adapter/adapter_model.safetensors")
        ref = _shapes(trained[0] / "adapter" / "adapter_model.safetensors")  # one process
        assert _shapes(store.cell_dir("adapter", whole.key) / files[1]) == ref
    base = _shapes(tiny_model / "model.safetensors")
    assert _shapes(store.cell_dir("adapter", whole.key) / files[0]) == base
    for name in files:
        a = load_file(store.cell_dir("adapter", whole.key) / name)
        b = load_file(cut_dir / name)
        assert all(torch.equal(b[n], w) for n, w in a.items())
    tuned = load_file(store.cell_dir("adapter", whole.key) / files[0])
    start = load_file(tiny_model / "model.safetensors")
    assert not torch.equal(tuned["model.layers.0.mlp.down_proj.weight"], start[
        "model.layers.0.mlp.down_proj.weight"])  # fmt: skip


def test_fsdp_asked_for_but_not_started_is_an_error(
    monkeypatch: pytest.MonkeyPatch, fresh_accelerator: None
) -> None:
    """Without the test shim, accelerate on a CPU starts no FSDP for an FSDP config: the worker
    refuses rather than train unsharded copies under a sharded config."""
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    cfg = TrainConfig(max_steps=1, accelerate_config="fsdp.yaml")
    with pytest.raises(UserError, match="asks for FSDP, but accelerate started NO"):
        train_worker._accelerator(cfg)


# --- serving the adapter ------------------------------------------------------------------------

PROMPTS = ["3+4", "9+9", "0+7", "5+2", "8+1"]


VLLM_GREEDY = """
import json, sys
from vllm import LLM, SamplingParams
from vllm.lora.request import LoRARequest
model, adapter, prompts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
llm = LLM(model, kv_cache_memory_bytes=1 << 30, dtype="float32", enforce_eager=True,
          enable_lora=True, max_lora_rank=8, max_model_len=256, seed=0)
sp = SamplingParams(temperature=0, max_tokens=24)
texts = lambda outs: [o.outputs[0].text for o in outs]
lora = llm.generate(prompts, sp, lora_request=LoRARequest("toy", 1, adapter), use_tqdm=False)
base = llm.generate(prompts, sp, use_tqdm=False)
print("RESULT " + json.dumps({"lora": texts(lora), "base": texts(base)}))
"""


def vllm_greedy(model: Path, adapter: Path, prompts: list[str]) -> dict[str, list[str]]:
    """Greedy completions by raw vLLM with and without the adapter, in a process of its own: a
    vLLM engine started in this pytest process after the other files' in-process engines can find
    their torch.distributed state torn down (seen when the whole suite runs)."""
    pytest.importorskip("vllm")
    args = [sys.executable, "-c", VLLM_GREEDY, str(model), str(adapter), json.dumps(prompts)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT "))


def chat(tok: Any, prompt: str) -> str:
    messages = [{"role": "user", "content": prompt}]
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def hf_greedy(model: Any, tok: Any, prompts: list[str]) -> list[str]:
    out = []
    for p in prompts:
        ids = tok(chat(tok, p), add_special_tokens=False, return_tensors="pt")
        gen = model.generate(**ids, max_new_tokens=24, do_sample=False)
        out.append(tok.decode(gen[0, ids["input_ids"].shape[1] :], skip_special_tokens=True))
    return out


def test_vllm_and_peft_serve_the_same_trained_adapter(trained: tuple, tiny_model: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    cell_dir, _ = trained
    tok = encoding.load_tokenizer(str(tiny_model), chat_template=True)
    base = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    base_text = hf_greedy(base, tok, PROMPTS)
    peft_text = hf_greedy(
        PeftModel.from_pretrained(base, cell_dir / "adapter").eval(), tok, PROMPTS
    )
    merged = AutoModelForCausalLM.from_pretrained(cell_dir / "merged").eval()
    merged_text = hf_greedy(merged, tok, PROMPTS)
    served = vllm_greedy(tiny_model, cell_dir / "adapter", [chat(tok, p) for p in PROMPTS])
    vllm_text, vllm_base = served["lora"], served["base"]
    print("\npeft:", peft_text, "\nvllm:", vllm_text, "\nbase:", base_text)
    assert vllm_text == peft_text == merged_text
    assert vllm_base == base_text
    assert all(a != b for a, b in zip(peft_text, base_text, strict=True))
    assert all("answer is" in t for t in peft_text)  # the template of every completion it saw


def test_a_worker_stopped_by_both_signals_exits_quietly(tmp_path: Path) -> None:
    """Ctrl-C reaches every process in the group and cotgap then SIGTERMs its workers, so a worker
    gets both signals, the second during its clean-up or while the interpreter runs its exit
    finalisers (CI saw torch.library's): the second must not raise again. Without the one-shot
    handler this printed a traceback from the finaliser. A real worker process, with `train`
    replaced by one that signals itself: the race made deterministic."""
    cell = tmp_path / "cell"
    (cell / ".adapter.tmp").mkdir(parents=True)
    code = f"""
import os, signal, time, weakref
from harness.stages import train_worker

class Model: pass

def stopped(cell_dir, owner_pid):
    train_worker.held = Model()  # finalised as the interpreter exits, as torch.library's are
    weakref.finalize(train_worker.held, lambda: (os.kill(os.getpid(), signal.SIGTERM), time.sleep(0.5)))
    both = {{signal.SIGINT, signal.SIGTERM}}
    signal.pthread_sigmask(signal.SIG_BLOCK, both)
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C to the process group ...
    os.kill(os.getpid(), signal.SIGTERM)  # ... and cotgap stopping its workers
    signal.pthread_sigmask(signal.SIG_UNBLOCK, both)  # both pending at once, as CI had them
    time.sleep(5)
    raise AssertionError("the signals did not interrupt the worker")

train_worker.train_cell = stopped
raise SystemExit(train_worker.main(["--cell-dir", {str(cell)!r}]))
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert done.returncode == 128 + signal.SIGINT, done.stderr
    assert not done.stderr.strip(), done.stderr  # not a traceback, nor "ignored" noise
    assert not (cell / ".adapter.tmp").exists()  # its clean-up ran to the end


def test_an_interrupted_worker_leaves_no_half_written_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker stopped (SIGTERM from cotgap, or Ctrl-C) while writing its adapter or a checkpoint
    removes the temporary folders it was writing; what it had completed stays."""
    cell = tmp_path / "cell"
    for d in (".adapter.tmp", "checkpoints/.tmp-step-7", "checkpoints/step-5"):
        (cell / d).mkdir(parents=True)
        (cell / d / "weights").write_text("x")

    def stopped_mid_save(cell_dir: Path, owner_pid: int | None) -> dict:
        os.kill(
            os.getpid(), signal.SIGTERM
        )  # the handler main() installs turns it into an interrupt
        time.sleep(5)
        raise AssertionError("the signal did not interrupt the worker")

    monkeypatch.setattr(train_worker, "train_cell", stopped_mid_save)
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert train_worker.main(["--cell-dir", str(cell)]) == 128 + signal.SIGTERM
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    assert sorted(p.relative_to(cell).as_posix() for p in cell.rglob("*") if p.is_dir()) == [
        "checkpoints",
        "checkpoints/step-5",
    ]


# --- on-policy distillation ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def on_policy(toy: tuple) -> tuple[Experiment, Cell, Path, dict]:
    """The toy set distilled on-policy (the student samples, the tiny model as teacher scores;
    half the micro-batches on the teacher's traces), uninterrupted."""
    exp, store, _ = toy
    tr = exp.train.model_copy(
        update={
            "methods": ("on_policy",),
            "max_steps": 12,
            "checkpoint_every": 4,
            "on_policy": exp.train.on_policy.model_copy(
                update={"max_new_tokens": 16, "teacher_share": 0.5}
            ),
        }
    )
    opd = exp.model_copy(update={"train": tr})
    (cell,) = grids.expand(opd).select(kind="adapter")
    assert cell.method == "on_policy" and cell.regime == "per_teacher+on_policy"
    summary = train.run(opd, store, [cell])[cell.key]
    return opd, cell, store.cell_dir("adapter", cell.key), summary


def test_on_policy_samples_and_counts_its_extra_cost(on_policy: tuple) -> None:
    _, _, _, s = on_policy
    d = s["distillation"]
    assert d["method"] == "on_policy" and s["steps"] == 12 and math.isfinite(s["final_loss"])
    assert d["student_batches"] + d["teacher_batches"] == 12 * 2  # micro-batches
    assert d["student_batches"] > 0 and d["teacher_batches"] > 0
    assert d["student_sampled_tokens"] > 0 and d["teacher_forward_tokens"] >= s["tokens"]
    assert d["sampling_s"] > 0 and d["teacher_s"] > 0


def test_on_policy_resume_after_sigkill_is_byte_identical(toy: tuple, on_policy: tuple) -> None:
    """Killed after its first checkpoint, resumed: the student samples the same completions
    (seeded by run seed and micro-batch position), so the adapter's files are byte-identical to
    the uninterrupted run's."""
    _, store, _ = toy
    opd, adapter, done_dir, done = on_policy
    cell = dataclasses.replace(adapter, key="0" * 20)
    cell_dir = store.cell_dir("adapter", cell.key)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        run = pool.submit(train.run, opd, store, [cell])
        _kill_worker_when(lambda: bool(list((cell_dir / "checkpoints").glob("step-*"))), run)
    summary = train.run(opd, store, [cell])[cell.key]
    assert summary["resumed_from"] in (4, 8)
    name = "adapter/adapter_model.safetensors"
    assert (cell_dir / name).read_bytes() == (done_dir / name).read_bytes()
    assert summary["final_loss"] == done["final_loss"]
    keep = ("student_sampled_tokens", "teacher_forward_tokens", "student_batches")
    assert {k: summary["distillation"][k] for k in keep} == {
        k: done["distillation"][k] for k in keep
    }


def test_on_policy_on_two_processes_counts_every_rank(toy: tuple, on_policy: tuple) -> None:
    """Two DDP ranks sample their own micro-batches; the cost rank 0 reports is both ranks'."""
    _, store, _ = toy
    opd, adapter, _, _ = on_policy
    config = {**adapter.config, "train": {**adapter.config["train"], "num_processes": 2}}
    config["train"]["max_steps"] = 3
    cell = dataclasses.replace(adapter, key="e" * 20, config=config)
    summary = train.run(opd, store, [cell])[cell.key]
    d = summary["distillation"]
    assert summary["steps"] == 3 and summary["effective_batch"] == 2 * 8 * 2
    assert d["student_batches"] + d["teacher_batches"] == 3 * 2 * 2  # steps x grad_accum x ranks
    assert d["teacher_forward_tokens"] == summary["tokens"]
