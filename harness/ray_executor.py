"""The Ray executor: every ready cell group becomes a Ray task with its resource request.

    cotgap run configs/grid.yaml --executor ray --address auto

Cells run in parallel as soon as their inputs are complete. Results land in the shared results
directory through the same store (atomic, content-addressed, cell-locked), so a cell finished by any
worker is never redone. A worker that dies has its cell retried (`ray.max_retries` times), then the
run fails naming the cell and its log under `<results>/<experiment>/logs/`.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

from harness import plan
from harness.config import Experiment
from harness.errors import UserError
from harness.store import Store


def _cell_task(exp_data: dict, root: str, kind: str, group: list[plan.CellSpec]) -> list[str]:
    """Body of one Ray task: compute a cell group, logging to a file named after its first cell."""
    exp = Experiment.model_validate(exp_data)
    store = Store(root)
    log_dir = store.root / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    name = f"{kind}-{group[0].key}"
    (log_dir / f"{name}.pid").write_text(str(os.getpid()))
    with open(log_dir / f"{name}.log", "a") as log:
        os.dup2(log.fileno(), sys.stdout.fileno())
        os.dup2(log.fileno(), sys.stderr.fileno())
        todo = [c for c in group if not store.complete(c.kind, c.key)]
        if todo:
            plan.run_group(exp, store, kind, todo)
    return [c.key for c in group]


def _init(address: str | None) -> Any:
    try:
        import ray
    except ImportError:
        raise UserError("executor: ray needs Ray installed: pip install 'cotgap[ray]'.") from None
    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=os.cpu_count(), log_to_driver=False, include_dashboard=False)
    return ray


def run(
    exp: Experiment,
    store: Store,
    cells: list[plan.CellSpec],
    only: str | None = None,
    address: str | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, int]:
    """Compute every missing cell among `cells` on a Ray cluster; same results as the local executor."""
    ray = _init(address)
    has_gpus = ray.cluster_resources().get("GPU", 0) > 0
    todo = plan.todo(exp, cells, store, only=only, log=log)
    remote = ray.remote(_cell_task)
    pending = {c.key: c for c in todo}
    done: set[str] = set()
    in_flight: dict[Any, tuple[str, list[plan.CellSpec]]] = {}
    counts = {"traces": 0, "dataset": 0, "adapter": 0, "eval": 0}
    exp_data = exp.model_dump(mode="json")

    def ready(c: plan.CellSpec) -> bool:
        """Every input is done, skipped, or not this run's work (complete already, or not asked
        for); an input still pending or running is not ready."""
        return all(
            u in done or u in skipped or (u not in pending and u not in running) for u in c.upstream
        )

    skipped: set[str] = set()
    running: set[str] = set()
    while pending or in_flight:
        for kind, group in plan.ready_groups([c for c in pending.values() if ready(c)]):
            for c in group:
                pending.pop(c.key)
            group = [c for c in group if not plan.skip(store, c, skipped, log)]
            if not group:
                continue
            need = plan.resources(exp, group[0], gpus_available=has_gpus)
            ref = remote.options(
                num_cpus=need["cpus"],
                num_gpus=need["gpus"],
                max_retries=exp.ray.max_retries,
                retry_exceptions=False,
                name=f"cotgap-{kind}-{group[0].key}",
            ).remote(exp_data, str(store.root.resolve()), kind, group)  # workers' cwd may differ
            in_flight[ref] = (kind, group)
            running.update(c.key for c in group)
            log(f"[{len(done)}/{len(todo)} cells done] {plan.group_label(kind, group)} (Ray task)")
        if not in_flight:
            if pending:
                raise UserError(f"{len(pending)} cell(s) can never run: their inputs are missing.")
            break
        finished, _ = ray.wait(list(in_flight), num_returns=1)
        for ref in finished:
            kind, group = in_flight.pop(ref)
            try:
                ray.get(ref)
            except Exception as e:  # Ray wraps worker deaths and task errors in several types
                raise _failure(exp, store, kind, group, e) from None
            running.difference_update(c.key for c in group)
            done.update(c.key for c in group)
            counts[kind] += len(group)
        time.sleep(0.01)
    return counts


def _failure(
    exp: Experiment, store: Store, kind: str, group: list[plan.CellSpec], e: Exception
) -> UserError:
    """One paragraph naming the cell and its log: the task's own error (not retried: it would fail
    the same way again), or the death of its worker after the bounded retries."""
    log = store.root / "logs" / f"{kind}-{group[0].key}.log"
    cell = f"cell {group[0].label} ({kind}/{group[0].key})"
    cause = getattr(e, "cause", None)  # RayTaskError: the exception raised in the task
    if isinstance(cause, Exception):
        why = f"failed: {type(cause).__name__}: {cause}"
    else:
        first = str(e).splitlines()[0] if str(e) else ""
        why = f"failed after {exp.ray.max_retries} retries: {type(e).__name__}: {first}"
    return UserError(
        f"{cell} {why}; its log is {log}. Completed cells are kept: fix the cause and re-run."
    )
