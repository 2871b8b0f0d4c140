"""Stage: student training. Selects a teacher's traces into a dataset cell, then fine-tunes the
student on them (LoRA through peft, or full) in worker processes (harness/stages/train_worker.py),
one adapter cell after another, and waits for them.

    cotgap run configs/sandbox.yaml --only train

`run` writes each adapter cell's `job.json` (what the worker needs to train it, and its training
budget, counted here from the datasets before training) and starts the workers:

    python -m harness.stages.train_worker --cell-dir results/<exp>/cells/adapter/<key>     # num_processes: 1
    python -m accelerate.commands.launch --num_processes N [--config_file F | --multi_gpu ...] \\
        -m harness.stages.train_worker --cell-dir results/<exp>/cells/adapter/<key>        # num_processes: N

A single process is a child too: its memory (GPU memory above all) returns when it exits, a crash
cannot take the executor down, and one code path serves 1 and N processes. On CPU it is
`--multi_gpu` that starts N gloo processes (`--cpu` would start one). A worker completes each cell
as soon as it is trained; a killed run keeps every cell the workers finished.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from harness import devices
from harness.config.schema import Experiment, TrainConfig
from harness.errors import UserError
from harness.models import sources as models
from harness.stages import distill_methods
from harness.stages.train_worker import micro_batches, train_precision
from harness.store import Store, read_jsonl
from harness.workflow.cells import Adapter

# --- adapter cells: the parent side -------------------------------------------------------------


def run(exp: Experiment, store: Store, cells: list[Adapter]) -> dict[str, dict]:
    """Train adapter cells; returns their summaries by key. Single-process cells share one worker
    process that trains them one after another: Python, torch, transformers and peft start once,
    not once a cell (about 5 s a cell on a laptop CPU, where a sandbox LoRA run takes 1-2 s).
    Each cell still seeds, resumes and saves on its own, so the weights equal a worker of its own.
    Cells that need `accelerate launch` (several processes) get a launch each."""
    done = {c.key: m["summary"] for c in cells if (m := store.manifest("adapter", c.key))}
    todo = [c for c in cells if c.key not in done]
    for c in todo:
        if not store.complete("dataset", c.upstream[0]):
            raise UserError(
                f"dataset cell {c.upstream[0]} is not complete; build it before training."
            )
    shared = [c for c in todo if _single_process(c.train)]
    if shared:
        workers, threads = _workers(exp, shared)
        n = min(workers, len(shared))
        done.update(_train_cells(exp, store, [shared[i::n] for i in range(n)], threads))
    for c in todo:
        if c.key not in {s.key for s in shared}:
            done.update(_train_cells(exp, store, [[c]]))
    return done


def _workers(exp: Experiment, cells: list[Adapter]) -> tuple[int, int | None]:
    """(single-process workers training at once, intra-op threads each; None: torch's default).

    On a CPU, students under models.SMALL_MODEL parameters train one worker per core, one thread each:
    their steps are mostly per-op overhead that a second thread does not share (the demo's 24
    adapters: 66.0 s in one two-thread worker, 29.7 s in two one-thread workers, on 2 cores).
    Larger students train in one worker with every thread; on GPUs, one worker per GPU the
    group may use (harness/devices.py), each seeing its own. The thread count
    depends on the machine's cores only, never on how many cells are left, so a resumed run trains
    each cell as an uninterrupted one would (an adapter's weights depend on its thread count,
    not on its worker). COTGAP_TRAIN_WORKERS=N sets N workers of cores/N threads (1: torch's
    default)."""
    cores = os.cpu_count() or 1
    env = os.environ.get("COTGAP_TRAIN_WORKERS", "")
    if env.isdigit() and int(env) > 0:
        n = int(env)
        return n, (max(1, cores // n) if n > 1 else None)
    if torch.cuda.is_available():
        return max(1, len(devices.usable())), None
    if cores == 1:
        return 1, None
    if models.all_small(exp.model(s) for s in dict.fromkeys(c.student for c in cells)):
        return cores, 1
    return 1, None


def _single_process(cfg: TrainConfig) -> bool:
    return cfg.num_processes == 1 and cfg.accelerate_config is None


def _train_cells(
    exp: Experiment, store: Store, groups: list[list[Adapter]], threads: int | None = None
) -> dict[str, dict]:
    """Open the cells (their locks held throughout) and run one worker per group, the groups at
    once, each with `threads` intra-op threads (None: torch's default). A worker completes each
    cell as soon as it is trained, so a kill loses at most the cells in training (back to their
    last checkpoints); the first cell left incomplete is reported."""
    with contextlib.ExitStack() as stack:
        cells = [c for g in groups for c in g]
        outs = {
            c.key: stack.enter_context(store.open_cell("adapter", c.key, c.config, c.upstream))
            for c in cells
        }
        for c in cells:
            outs[c.key].write_json("job.json", _job(exp, store, c))
            # a killed run's summary is not this worker's (it writes its own before completing)
            (outs[c.key].dir / "summary.json").unlink(missing_ok=True)
        commands = [
            worker_command([outs[c.key].dir.resolve() for c in g], g[0].train) for g in groups
        ]
        rc = _run_workers(commands, threads)
        summaries = {}
        for c in cells:
            manifest = store.manifest("adapter", c.key)
            if manifest is None:
                raise UserError(
                    f"training of adapter cell {c.label} ({c.key}) stopped (worker exit code {rc}, "
                    f"its error is above); fix that and re-run to resume from "
                    f"{outs[c.key].dir / 'checkpoints'}."
                )
            summaries[c.key] = manifest["summary"]
    return summaries


def _job(exp: Experiment, store: Store, c: Adapter) -> dict:
    """What the worker needs to train one cell, and to complete it through the store."""
    student = exp.model(c.student)
    examples = store.output("dataset", c.upstream[0], "examples.jsonl")
    dataset = store.completed("dataset", c.upstream[0])["summary"]
    budget = plan_budget(exp, store, c)  # counted from the datasets before training
    return {
        "model_dir": str(Path(models.resolve(student)).resolve()),
        "chat_template": student.chat_template,
        "trust_remote_code": student.trust_remote_code,
        "examples": str(examples.resolve()),
        "train": {
            **c.config["train"],
            "max_steps": budget["updates"],
            "epochs": None,
            "gradient_checkpointing": exp.train.gradient_checkpointing,  # not in the key
        },
        "budget": budget,
        "seed": c.seed,
        "merge": c.merge,
        "label": c.label,
        "checkpoint_seconds": exp.train.checkpoint_seconds,
        "cell": {"root": str(store.root.resolve()), "key": c.key, "upstream": c.upstream},
        "n_dropped_overlong": dataset["n_dropped_overlong"],
        **_method_job(exp, store, c),
    }


def _method_job(exp: Experiment, store: Store, c: Adapter) -> dict[str, Any]:
    """What the distillation method needs: kd, the teacher's top-k files (by traces key, and the
    key of the set's own teacher: a mix example names its own `source`); on_policy, the teacher."""
    method = c.config.get("method") or {"name": "sft"}
    out: dict[str, Any] = {"method": method}
    if method["name"] == "kd":
        from harness.workflow.cells import Traces, model_identities

        traces = store.completed("dataset", c.upstream[0])["upstream"]
        paths = {k: str(store.output("traces", k, distill_methods.TOPK).resolve()) for k in traces}
        own = None
        if c.teacher in {t.name for t in exp.teachers}:
            ident = model_identities(exp)[c.teacher]
            own = Traces.of(exp, ident, c.teacher, c.task, c.trace_seed).key
        out["topk"] = {"own": own, "paths": paths}
    if method["name"] == "on_policy":
        teacher = exp.model(c.teacher)
        out["teacher"] = {
            "model_dir": str(Path(models.resolve(teacher)).resolve()),
            "trust_remote_code": teacher.trust_remote_code,
        }
    return out


def _run_workers(commands: list[list[str]], threads: int | None) -> int:
    """Run the workers (with `threads` intra-op threads each, when given) and wait for all; the
    first non-zero exit code, else 0. When this process is interrupted, stop them (SIGTERM, then
    SIGKILL) with their own children (the ranks of `accelerate launch`), so nothing trains on
    after we are gone."""
    from harness.progress import Relay

    env = {**devices.child_env(), **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    # several workers on GPUs: one GPU each (a launch of several processes keeps them all)
    gpus = devices.one_each(len(commands), devices.usable() if len(commands) > 1 else [])
    if not torch.cuda.is_available():
        gpus = [{} for _ in commands]
    with Relay(len(commands)) as relay:  # the workers' bars on our display, on a terminal
        procs = []
        for i, cmd in enumerate(commands):
            out = relay.output(i)
            child = {**env, **gpus[i], **relay.env(i)}
            procs.append(subprocess.Popen(cmd, env=child, stdout=out, stderr=out))
            if out is not None:
                out.close()  # the child holds its own
        try:
            codes = [p.wait() for p in procs]
        except BaseException:
            for p in procs:
                stop_tree(p.pid)
            raise
        for i, rc in enumerate(codes):
            if rc:
                relay.failed(i)
    return next((rc for rc in codes if rc), 0)


def stop_tree(pid: int, grace: float = 10.0) -> None:
    """SIGTERM a process and its descendants, SIGKILL what is left after `grace` seconds."""
    import psutil  # a dependency of accelerate

    with contextlib.suppress(psutil.NoSuchProcess):
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.terminate()
        _, alive = psutil.wait_procs(procs, timeout=grace)
        for p in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(alive, timeout=grace)


def worker_command(cell_dirs: Path | Sequence[Path], cfg: TrainConfig) -> list[str]:
    """The command that trains adapter cells, one after another (see the module docstring)."""
    dirs = [cell_dirs] if isinstance(cell_dirs, Path) else list(cell_dirs)
    worker = [
        "-m",
        "harness.stages.train_worker",
        *(a for d in dirs for a in ("--cell-dir", str(d))),
    ]
    worker += ["--owner-pid", str(os.getpid())]
    if _single_process(cfg):
        return [sys.executable, *worker]
    launch = [sys.executable, "-m", "accelerate.commands.launch"]
    launch += ["--num_processes", str(cfg.num_processes)]
    if cfg.accelerate_config:
        return [*launch, "--config_file", cfg.accelerate_config, *worker]
    with socket.socket() as s:  # a free port: two trainings on one machine must not collide
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launch += f"--multi_gpu --num_machines 1 --main_process_port {port} --dynamo_backend no".split()
    launch += ["--mixed_precision", "bf16" if train_precision(cfg) == "bf16" else "no"]
    if not torch.cuda.is_available():
        threads = max(1, (os.cpu_count() or 1) // cfg.num_processes)
        launch += ["--num_cpu_threads_per_process", str(threads)]
    return [*launch, *worker]


# --- training budgets: counted from the datasets before training -------------------------------


def plan_budget(exp: Experiment, store: Store, cell: Adapter) -> dict[str, Any]:
    """The optimizer updates the adapter trains for and the examples and tokens they see, from its
    dataset (and, when aligned, its reference's) before training: the data order is a function of
    the seed (`micro_batches`), so the counts are exact. Aligned to `updates`, the cell trains the
    reference's updates; to `examples` or `tokens`, the fewest updates that see at least as many
    as the reference (they match it within one effective batch)."""
    cfg = cell.train
    lengths = _lengths(store, cell.upstream[0])
    out: dict[str, Any] = {"align": cell.align}
    if cell.align in ("none", "batch"):  # batch: its own budget at the training's batch
        steps = updates(cfg, len(lengths))
    else:
        ref_lengths = _lengths(store, cell.upstream[1])
        ref_steps = updates(exp.train, len(ref_lengths))
        ref_examples, ref_tokens = seen(ref_lengths, exp.train, cell.seed, ref_steps)
        ref = {"examples": ref_examples, "tokens": ref_tokens}
        out["reference"] = {"dataset": cell.upstream[1], "updates": ref_steps, **ref}
        steps = _aligned_steps(cell.align, ref_steps, ref, lengths, cfg, cell.seed)
    examples, tokens = seen(lengths, cfg, cell.seed, steps)
    batch = cfg.per_device_batch_size * cfg.grad_accum * cfg.num_processes
    return {
        **out,
        "updates": steps,
        "effective_batch": batch,
        "examples": examples,
        "tokens": tokens,
    }


def updates(cfg: TrainConfig, n_examples: int) -> int:
    """Optimizer updates of a training config on a set (max_steps, or epochs over the set)."""
    size, ga, world = cfg.per_device_batch_size, cfg.grad_accum, cfg.num_processes
    if cfg.max_steps:
        return cfg.max_steps
    assert cfg.epochs is not None  # TrainConfig: exactly one of max_steps and epochs
    return math.ceil(cfg.epochs * math.ceil(n_examples / size) / (ga * world))


def seen(lengths: Sequence[int], cfg: TrainConfig, seed: int, steps: int) -> tuple[int, int]:
    """Examples and tokens (prompt + completion + EOS) that `steps` updates see."""
    if not lengths:
        return 0, 0
    batches = micro_batches(lengths, cfg.per_device_batch_size, cfg.group_by_length, seed)
    taken = [next(batches) for _ in range(steps * cfg.grad_accum * cfg.num_processes)]
    return sum(map(len, taken)), sum(lengths[i] for b in taken for i in b)


def _aligned_steps(
    align: str, ref_steps: int, ref: dict, lengths: list[int], cfg: TrainConfig, seed: int
) -> int:
    if align == "updates":
        return ref_steps
    per_step = cfg.grad_accum * cfg.num_processes
    batches = micro_batches(lengths, cfg.per_device_batch_size, cfg.group_by_length, seed)
    steps, got = 0, 0
    while got < ref[align]:
        step = [next(batches) for _ in range(per_step)]
        got += sum(len(b) if align == "examples" else sum(lengths[i] for i in b) for b in step)
        steps += 1
    return max(steps, 1)


def _lengths(store: Store, dataset_key: str) -> list[int]:
    path = store.output("dataset", dataset_key, "examples.jsonl")
    return [e["n_tokens"] for e in read_jsonl(path)]
