"""Expands an experiment into cells with dependencies, and runs the missing ones in order.

    cotgap plan configs/sandbox.yaml
    cotgap run configs/sandbox.yaml [--only traces|train|eval]

This is the one place that computes cell keys. Baselines are one eval cell per (student, task),
shared by every teacher; a teacher's traces are one cell per (teacher, task); every cell that is
complete on disk is skipped, so a killed run resumes and a second run computes nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterable
from typing import Any

from harness import answers, models, tasks
from harness.config import Experiment, canonical
from harness.errors import UserError
from harness.store import Store, cell_key, package_versions, vllm_version

STAGE_OF_KIND = {"traces": "traces", "dataset": "train", "adapter": "train", "eval": "eval"}
TRAIN_PACKAGES = ("torch", "transformers", "peft", "accelerate")


@dataclasses.dataclass(frozen=True)
class CellSpec:
    """One unit of work: `config` is what its key hashes; `meta` names its models, task, regime, seed."""

    kind: str
    key: str
    config: dict[str, Any]
    upstream: tuple[str, ...] = ()
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def label(self) -> str:
        parts = [self.meta.get(k) for k in ("role", "model", "teacher", "task", "regime", "seed")]
        return f"{self.kind}:" + "/".join(str(p) for p in parts if p is not None)


def engine_versions(engine: str) -> dict[str, str]:
    if engine == "vllm":
        return {"vllm": vllm_version(), **package_versions(["transformers"])}
    return package_versions(["torch", "transformers", "peft"])


def task_identity(exp: Experiment, name: str, split: str) -> dict[str, Any]:
    return _task_identity(exp, name, split)


@functools.lru_cache(maxsize=4096)
def _task_identity(exp: Experiment, name: str, split: str) -> dict[str, Any]:
    ref = exp.task(name)
    spec = tasks.load_task(name)
    limit = ref.train_limit if split == "train" else ref.test_limit
    extractor = exp.evaluate.extractor or spec.extractor
    # The extractor's name (it picks the answer type), not its version: traces and eval cells keep
    # their completions when extraction changes and are re-scored where they are read (analyze,
    # the dataset stage), so a version bump regenerates nothing.
    return {
        "name": name,
        "version": spec.version,
        "split": split,
        "limit": limit,
        "extractor": extractor,
    }


def check(exp: Experiment) -> list[str]:
    """Every problem `expand` would stop at, all at once, without planning: a model that cannot be
    identified (a missing local path, an unknown zoo model), a task file that does not load (no
    `version`, an unknown extractor). `cotgap validate` reports them."""
    problems = []
    for m in (*exp.teachers, *exp.students):
        try:
            models.identity(m)
        except UserError as e:
            problems.append(str(e))
    for t in exp.tasks:
        try:
            task_identity(exp, t.name, "test")
        except UserError as e:
            problems.append(str(e))
    if not problems:
        try:
            expand(exp)
        except UserError as e:
            problems.append(str(e))
    return problems


def expand(exp: Experiment) -> list[CellSpec]:
    """Every cell of the grid, each after the cells it depends on."""
    ids = {m.name: models.identity(m) for m in (*exp.teachers, *exp.students)}
    cells: list[CellSpec] = []
    for task in (t.name for t in exp.tasks):
        traces = {t.name: _traces_cell(exp, ids, t.name, task) for t in exp.teachers}
        cells.extend(traces.values())
        cells.extend(_eval_cell(exp, ids, t.name, task, None, role="teacher") for t in exp.teachers)
        for s in exp.students:
            cells.append(_eval_cell(exp, ids, s.name, task, None, role="baseline", student=s.name))
            for regime in exp.train.regimes:
                for t in exp.teachers:
                    cells.extend(_distilled_cells(exp, ids, s.name, t.name, task, regime, traces))
    return _dedupe(cells)


def _traces_cell(exp: Experiment, ids: dict, teacher: str, task: str) -> CellSpec:
    config = {
        "model": ids[teacher],
        "task": task_identity(exp, task, "train"),
        "generate": canonical(exp.generate),
    }
    key = cell_key("traces", config, (), engine_versions(exp.generate.engine))
    return CellSpec("traces", key, config, (), {"role": "teacher", "model": teacher, "task": task})


def _eval_cell(
    exp: Experiment, ids: dict, model: str, task: str, adapter: CellSpec | None, **meta: Any
) -> CellSpec:
    config = {
        "model": ids[model],
        "adapter": adapter.key if adapter else None,
        "task": task_identity(exp, task, "test"),
        "evaluate": canonical(exp.evaluate),
    }
    up = (adapter.key,) if adapter else ()
    key = cell_key("eval", config, up, engine_versions(exp.evaluate.engine))
    return CellSpec("eval", key, config, up, {"model": model, "task": task, **meta})


def _distilled_cells(
    exp: Experiment, ids: dict, student: str, teacher: str, task: str, regime: str, traces: dict
) -> list[CellSpec]:
    """dataset -> adapter (one per seed) -> eval, for one (student, teacher, task, regime)."""
    tr = exp.train
    # per_teacher reads one teacher's traces; intersection and matched read every teacher's
    up = (
        (traces[teacher].key,) if regime == "per_teacher" else tuple(c.key for c in traces.values())
    )
    ident = task_identity(exp, task, "train")
    dconfig = {
        "student": ids[student],
        "task": ident,
        "regime": regime,
        "teacher": traces[teacher].key,
        "teachers": sorted(up),
        "max_length": tr.max_length,
        "matched_by": tr.matched_by if regime == "matched" else None,
        # the dataset selects by the current extractor's verdicts, so a version bump rebuilds it
        "extractor_version": answers.EXTRACTORS[ident["extractor"]].version,
    }
    meta = {"student": student, "teacher": teacher, "regime": regime}
    dkey = cell_key("dataset", dconfig, up, {})
    dataset = CellSpec("dataset", dkey, dconfig, up, {"model": student, "task": task, **meta})
    out = [dataset]
    settings = canonical(tr.model_copy(update={"seeds": (), "regimes": ()}))
    # When to checkpoint is a runtime choice (a resumed run reaches the same weights), so it stays
    # out of the key: changing it, or adding it with a default, recomputes nothing.
    # (checkpoint_every predates this rule and stays in the key: removing it would change keys.)
    settings.pop("checkpoint_seconds")
    for seed in tr.seeds:
        aconfig = {"student": ids[student], "train": settings, "seed": seed}
        akey = cell_key("adapter", aconfig, (dataset.key,), package_versions(TRAIN_PACKAGES))
        adapter = CellSpec(
            "adapter",
            akey,
            aconfig,
            (dataset.key,),
            {"model": student, "task": task, **meta, "seed": seed},
        )
        out.append(adapter)
        out.append(
            _eval_cell(exp, ids, student, task, adapter, role="distilled", **meta, seed=seed)
        )
    return out


def _dedupe(cells: Iterable[CellSpec]) -> list[CellSpec]:
    """Drop repeats; a cell shared by two roles (a model that is both a teacher and a student has one
    eval cell) stays listed once per role, so the analysis finds it under either."""
    seen: dict[tuple[str, str, Any], CellSpec] = {}
    for c in cells:
        seen.setdefault((c.kind, c.key, c.meta.get("role")), c)
    return list(seen.values())


def unique(cells: Iterable[CellSpec]) -> list[CellSpec]:
    """One spec per cell key (the work to do), in order."""
    seen: dict[str, CellSpec] = {}
    for c in cells:
        seen.setdefault(c.key, c)
    return list(seen.values())


def select(cells: list[CellSpec], **filters: str | None) -> list[CellSpec]:
    """Cells whose meta matches every given filter (None = any), e.g. `select(cells, task="gsm8k")`."""
    return [c for c in cells if all(v is None or c.meta.get(k) == v for k, v in filters.items())]


def missing(store: Store, cells: list[CellSpec]) -> list[CellSpec]:
    return [c for c in cells if not store.complete(c.kind, c.key)]


def todo(
    exp: Experiment,
    cells: list[CellSpec],
    store: Store,
    only: str | None = None,
    log: Callable[[str], None] = print,
) -> list[CellSpec]:
    """The missing cells among `cells` and the missing cells they depend on, in dependency order."""
    work = _with_dependencies(expand(exp), cells, store)
    if only:
        work = [c for c in work if STAGE_OF_KIND[c.kind] == only]
        ready = {c.key for c in work}
        blocked = [
            c for c in work if any(u not in ready and not store.complete_any(u) for u in c.upstream)
        ]
        if blocked:
            log(
                f"skipping {len(blocked)} cell(s) whose inputs are not computed yet "
                f"(e.g. {blocked[0].label}); run the earlier stages first"
            )
            work = [c for c in work if c not in blocked]
    return work


def execute(
    exp: Experiment,
    cells: list[CellSpec],
    store: Store,
    only: str | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, int]:
    """Compute every missing cell among `cells` (and the missing cells they depend on), locally."""
    work = todo(exp, cells, store, only=only, log=log)
    counts = {"traces": 0, "dataset": 0, "adapter": 0, "eval": 0}
    skipped: set[str] = set()
    done = 0
    # Stage order; within a stage, cells of one model share an engine session.
    for i, (kind, title) in enumerate(_STAGES.items(), 1):
        real_kind = "eval" if kind == "eval_pre" else kind
        batch = [c for c in _batch(work, kind) if not skip(store, c, skipped, log)]
        if not batch:
            continue
        began = time.perf_counter()
        log(f"stage {i}/{len(_STAGES)} {title}: {len(batch)} cell(s)")
        for group in _group(batch):
            log(f"[{done}/{len(work)} cells done] {group_label(real_kind, group)}")
            run_group(exp, store, real_kind, group)
            counts[real_kind] += len(group)
            done += len(group)
        took = time.perf_counter() - began
        log(f"stage {i}/{len(_STAGES)} {title}: {len(batch)} cell(s) done in {took:.1f} s")
    return counts


_STAGES = {  # the local executor's order; eval_pre = evals that need no adapter
    "traces": "teacher traces",
    "eval_pre": "teacher and baseline evals",
    "dataset": "training sets",
    "adapter": "LoRA adapters",
    "eval": "distilled evals",
}


def group_label(kind: str, group: list[CellSpec]) -> str:
    """`traces:teacher/t/task` for one cell, `eval: 12 cells of student-s` for a group."""
    if len(group) == 1:
        return group[0].label
    models = sorted({str(c.meta.get("model") or c.meta.get("student")) for c in group})
    return f"{kind}: {len(group)} cells of {', '.join(models)}"


def skip(store: Store, cell: CellSpec, skipped: set[str], log: Callable[[str], None]) -> bool:
    """Adapters of an empty training set (a teacher that solved nothing usable) and the evals of
    those adapters are not run; the leaderboard shows their rows as missing, with the reason."""
    empty = cell.kind == "adapter" and empty_dataset(store, cell.upstream[0])
    if empty or any(u in skipped for u in cell.upstream):
        if empty:
            log(f"skipping {cell.label}: its teacher left no training examples")
        skipped.add(cell.key)
        return True
    return False


def empty_dataset(store: Store, key: str) -> bool:
    manifest = store.manifest("dataset", key)
    return bool(manifest) and manifest["summary"].get("n_examples") == 0


def ready_groups(ready: list[CellSpec]) -> list[tuple[str, list[CellSpec]]]:
    """Cells whose inputs are complete, grouped as the local executor groups them."""
    out = []
    for kind in ("traces", "eval", "dataset", "adapter"):
        out.extend((kind, g) for g in _group([c for c in ready if c.kind == kind], False))
    return out


def resources(exp: Experiment, cell: CellSpec, gpus_available: bool = True) -> dict[str, float]:
    """What a cell group asks of a scheduler: the model's `resources`, or derived from its size."""
    if cell.kind == "dataset":  # selection and tokenization only
        return {"gpus": 0.0, "cpus": 1.0, "memory_gb": 0.0}
    spec = exp.model(cell.meta["model"])
    r, e = spec.resources, spec.engine
    parallel = e.tensor_parallel_size * e.pipeline_parallel_size * e.data_parallel_size
    if cell.kind in ("adapter",):
        parallel = exp.train.num_processes
    gpus = r.gpus if r.gpus is not None else float(parallel)
    if not gpus_available:
        gpus = 0.0
    memory = r.memory_gb
    if memory is None and spec.size:
        memory = round(spec.size * 2 * 1.3 / 2**30 + 2, 1)  # bf16 weights + 30% + runtime
    return {"gpus": gpus, "cpus": r.cpus, "memory_gb": memory or 0.0}


def _batch(todo: list[CellSpec], kind: str) -> list[CellSpec]:
    if kind == "eval_pre":  # teacher evals and baselines need no adapter: run them with the traces
        return [c for c in todo if c.kind == "eval" and not c.upstream]
    if kind == "eval":
        return [c for c in todo if c.kind == "eval" and c.upstream]
    return [c for c in todo if c.kind == kind]


def _group(batch: list[CellSpec], share_workers: bool = True) -> list[list[CellSpec]]:
    """Traces and eval cells of one model share an engine session; with `share_workers` (local
    runs), every adapter shares one training worker process (`train.run_many`). On Ray each
    adapter is a task of its own, so that adapters train in parallel."""
    groups: dict[str, list[CellSpec]] = {}
    for c in batch:
        if c.kind == "adapter":  # one worker for every student: torch & co. start once
            key = "all" if share_workers else c.key
        else:
            key = c.meta.get("model") if c.kind in ("traces", "eval") else c.key
        groups.setdefault(f"{c.kind}:{key}", []).append(c)
    return list(groups.values())


def run_group(exp: Experiment, store: Store, kind: str, group: list[CellSpec]) -> None:
    if kind == "traces":
        from harness import generate

        generate.run(exp, store, group)
    elif kind == "eval":
        from harness import evaluate

        evaluate.run(exp, store, group)
    elif kind == "dataset":
        from harness import train

        for c in group:
            train.build_dataset(exp, store, c)
    elif kind == "adapter":
        from harness import train

        train.run_many(exp, store, group)


def _with_dependencies(
    all_cells: list[CellSpec], wanted: list[CellSpec], store: Store
) -> list[CellSpec]:
    by_key = {c.key: c for c in all_cells}
    need: dict[str, CellSpec] = {}

    def visit(c: CellSpec) -> None:
        if c.key in need or store.complete(c.kind, c.key):
            return
        for up in c.upstream:
            if up in by_key:
                visit(by_key[up])
        need[c.key] = c

    for c in wanted:
        visit(c)
    order = {c.key: i for i, c in enumerate(all_cells)}
    return sorted(need.values(), key=lambda c: order.get(c.key, 0))


def run_all(
    exp: Experiment,
    store: Store,
    only: str | None = None,
    executor: str = "local",
    address: str | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, int]:
    """Every missing cell of the experiment, on the chosen executor."""
    cells = expand(exp)
    if executor == "ray":
        from harness import ray_executor

        address = address or exp.ray.address
        return ray_executor.run(exp, store, cells, only=only, address=address, log=log)
    return execute(exp, cells, store, only=only, log=log)


def evaluate_adapter(
    exp: Experiment, store: Store, model: str, adapter_dir: Any, task: str | None
) -> list[str]:
    """Evaluate an arbitrary PEFT adapter directory on `model` under the experiment's eval config."""
    from pathlib import Path

    from harness import evaluate
    from harness.models import _weights_fingerprint

    d = Path(adapter_dir).expanduser().resolve()
    if not (d / "adapter_config.json").exists():
        raise UserError(
            f"--adapter {adapter_dir}: no adapter_config.json there; give a PEFT adapter directory."
        )
    spec = exp.model(model)
    fingerprint = {"local": str(d), "fingerprint": _weights_fingerprint(d)}
    cells = []
    for t in [task] if task else [t.name for t in exp.tasks]:
        config = {
            "model": models.identity(spec),
            "adapter": fingerprint,
            "task": task_identity(exp, t, "test"),
            "evaluate": canonical(exp.evaluate),
        }
        key = cell_key("eval", config, (), engine_versions(exp.evaluate.engine))
        meta = {"role": "adhoc", "model": model, "task": t, "adapter_dir": str(d)}
        cells.append(CellSpec("eval", key, config, (), meta))
    todo = missing(store, cells)
    if todo:
        evaluate.run(exp, store, todo)
    return [c.key for c in cells]


def estimate(exp: Experiment, cells: list[CellSpec]) -> dict[str, float]:
    """Upper bounds of the work, from configs and declared split sizes; loads no model or data."""
    sizes = {row["name"]: row.get("sizes") or {} for row in tasks.list_tasks_table()}
    out = {"generated_tokens_max": 0, "eval_tokens_max": 0, "train_steps": 0, "train_tokens_max": 0}
    tr = exp.train
    eff_batch = tr.per_device_batch_size * tr.grad_accum * tr.num_processes
    for c in cells:
        t = c.config.get("task", {})
        n_items = t.get("limit") or sizes.get(t.get("name"), {}).get(t.get("split"), 0) or 0
        if c.kind == "traces":
            out["generated_tokens_max"] += n_items * exp.generate.n * exp.generate.max_tokens
        elif c.kind == "eval":
            out["eval_tokens_max"] += n_items * exp.evaluate.n * exp.evaluate.max_tokens
        elif c.kind == "adapter":
            steps = tr.max_steps or 0
            if tr.epochs:
                n_train = sizes.get(c.meta.get("task"), {}).get("train", 0) * exp.generate.n
                steps = int(tr.epochs * n_train / eff_batch) + 1
            out["train_steps"] += steps
            out["train_tokens_max"] += steps * eff_batch * tr.max_length
    return out


def show(exp: Experiment, store: Store, every_cell: bool = False) -> list[CellSpec]:
    """Print the plan: cells (grouped when there are many), their state, and the work to do."""
    from rich.table import Table

    from harness import progress

    cells = unique(expand(exp))
    todo = missing(store, cells)
    console = progress.console()
    if every_cell or len(cells) <= 200:
        table = Table(
            "#", "kind", "cell", "key", "state", "needs", title=f"{exp.name}: cells in run order"
        )
        for i, c in enumerate(cells, 1):
            state = "complete" if store.complete(c.kind, c.key) else "to run"
            table.add_row(str(i), c.kind, c.label, c.key, state, _needs(exp, c))
    else:
        table = Table(
            "stage",
            "kind",
            "role",
            "model",
            "cells",
            "to run",
            "needs",
            title=f"{exp.name}: cell groups in run order",
        )
        groups: dict[tuple, list[CellSpec]] = {}
        for c in cells:
            stage = {"traces": 1, "dataset": 3, "adapter": 4}.get(
                c.kind, 2 if not c.upstream else 5
            )
            groups.setdefault((stage, c.kind, c.meta.get("role", ""), c.meta["model"]), []).append(
                c
            )
        for (stage, kind, role, model), group in sorted(groups.items(), key=lambda kv: kv[0][0]):
            n_todo = sum(1 for c in group if not store.complete(c.kind, c.key))
            table.add_row(
                str(stage), kind, role, model, str(len(group)), str(n_todo), _needs(exp, group[0])
            )
    console.print(table)
    counts = {
        k: sum(1 for c in todo if c.kind == k) for k in ("traces", "dataset", "adapter", "eval")
    }
    console.print(f"to run: {len(todo)} of {len(cells)} cells {counts}")
    for k, v in estimate(exp, todo).items():
        console.print(f"  {k}: {v:,.0f}")
    return cells


def _needs(exp: Experiment, c: CellSpec) -> str:
    r = resources(exp, c)
    mem = f", {r['memory_gb']:g} GB" if r["memory_gb"] else ""
    return f"{r['gpus']:g} GPU, {r['cpus']:g} CPU{mem}"
