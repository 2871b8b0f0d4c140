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
from typing import Any

from harness.config.schema import Experiment
from harness.config.task_paths import include_task_paths, task_dirs
from harness.errors import UserError
from harness.execution import schedule
from harness.store import Store


def _cell_task(exp_data: dict, root: str, group: schedule.Group) -> list[str]:
    """Body of one Ray task: compute a cell group, logging to a file named after its first cell."""
    exp = Experiment.model_validate(exp_data)
    include_task_paths(exp.task_paths)  # the driver's task folders (a shared file system)
    store = Store(root)
    log_dir = store.root / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    name = f"{group.kind}-{group.cells[0].key}"
    (log_dir / f"{name}.pid").write_text(str(os.getpid()))
    with open(log_dir / f"{name}.log", "a") as log:
        os.dup2(log.fileno(), sys.stdout.fileno())
        os.dup2(log.fileno(), sys.stderr.fileno())
        schedule.run_group(exp, store, group)
    return [c.key for c in group.cells]


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
    exp: Experiment, store: Store, sched: schedule.Schedule, address: str | None = None
) -> dict[str, int]:
    """Compute the schedule's work on a Ray cluster; same results as the local executor."""
    ray = _init(address)
    has_gpus = ray.cluster_resources().get("GPU", 0) > 0
    remote = ray.remote(_cell_task)
    in_flight: dict[Any, tuple[schedule.Group, float]] = {}
    exp_data = exp.model_dump(mode="json")
    # every task folder the driver searches (task_paths, --include-path, COTGAP_TASK_PATH)
    exp_data["task_paths"] = [str(d) for d in task_dirs()[:-1]]
    began = time.perf_counter()
    sched.emit("run", cells=len(sched.work), pid=os.getpid(), executor="ray")
    while not sched.finished:
        for group in sched.ready(lowest_phase=False, share_workers=False):
            need = group.cells[0].resources(exp, gpus_available=has_gpus)
            ref = remote.options(
                num_cpus=need["cpus"],
                num_gpus=need["gpus"],
                max_retries=exp.ray.max_retries,
                retry_exceptions=False,
                name=f"cotgap-{group.kind}-{group.cells[0].key}",
            ).remote(exp_data, str(store.root.resolve()), group)  # workers' cwd may differ
            in_flight[ref] = (group, time.perf_counter())
        if not in_flight:
            raise UserError(
                f"{len(sched.pending)} cell(s) can never run: their inputs are missing."
            )
        finished, _ = ray.wait(list(in_flight), num_returns=1)
        for ref in finished:
            group, t0 = in_flight.pop(ref)
            try:
                ray.get(ref)
            except Exception as e:  # Ray wraps worker deaths and task errors in several types
                raise _failure(exp, store, group, e) from None
            sched.finish(group, time.perf_counter() - t0)
        time.sleep(0.01)
    sched.emit("run_done", counts=sched.counts, seconds=round(time.perf_counter() - began, 3))
    return sched.counts


def _failure(exp: Experiment, store: Store, group: schedule.Group, e: Exception) -> UserError:
    """One paragraph naming the cell and its log: the task's own error (not retried: it would fail
    the same way again), or the death of its worker after the bounded retries."""
    first = group.cells[0]
    log = store.root / "logs" / f"{group.kind}-{first.key}.log"
    cell = f"cell {first.label} ({group.kind}/{first.key})"
    cause = getattr(e, "cause", None)  # RayTaskError: the exception raised in the task
    if isinstance(cause, Exception):
        why = f"failed: {type(cause).__name__}: {cause}"
    else:
        line = str(e).splitlines()[0] if str(e) else ""
        why = f"failed after {exp.ray.max_retries} retries: {type(e).__name__}: {line}"
    return UserError(
        f"{cell} {why}; its log is {log}. Completed cells are kept: fix the cause and re-run."
    )
