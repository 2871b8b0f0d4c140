"""The one scheduler: which cells to compute, in which groups, in which order. Both executors (this
module's local one and harness/execution/ray_executor.py) drive the same ready loop:

    sched = Schedule(grid, wanted, store, only={"train"})
    while groups := sched.ready(...):      # groups whose inputs are all complete
        ... compute them (stage table) ...
        sched.finish(group)

The work is the closure of the wanted cells over their missing inputs; `only` keeps the cells of
some stages (a cell whose inputs are neither complete nor in the work is skipped, said once).
Adapters of an empty training set (a teacher that solved nothing usable) and everything
downstream of them are skipped with the reason; so are, with `train.teachers_per_student: top_k`,
adapters whose teacher is not among the k best-screened of their group (harness/workflow/grid.py: Gate):
such an adapter waits for every screen of its group, and the choice is made again from the screen
cells on every run, so a resumed run trains the same k; and so is every cell of a task that
pre-selection gates (`select:`; its select cells run first, in phase 0). Locally, the ready groups
of the lowest phase run
first, so the run goes phase by phase (harness/workflow/cells.py: PHASES) and cells of one model share an
engine session; on Ray every ready group runs at once.

Every decision is an event, appended to `<results>/<experiment>/logs/events.jsonl` (one JSON object a
line, with the run's id) and said in the log; tests and tools read the events, not the log text.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from harness import devices, progress
from harness.config.schema import Experiment
from harness.errors import UserError
from harness.store import Store
from harness.workflow.cells import PHASES, STAGE_OF_KIND, STAGES, Cell
from harness.workflow.grid import Gate

# a stage takes the cells of its own kind (list[Traces], list[Eval], ...)
StageFn = Callable[[Experiment, Store, list[Any]], Any]


def _stage_table() -> dict[str, StageFn]:
    """Cell kind -> the stage function computing a group of its cells. The stages are imported
    here, when a group first runs, so that planning imports no stage, engine or torch."""
    from harness.stages import dataset, evaluate, generate, screen, train

    return {
        "traces": generate.run,
        "eval": evaluate.run,
        "dataset": dataset.run,
        "screen": screen.run,
        "adapter": train.run,
    }


@dataclasses.dataclass(frozen=True)
class Group:
    """Cells computed together: traces or evals of one model (one engine session), the adapters
    sharing one training worker, or a single cell."""

    kind: str
    cells: tuple[Cell, ...]

    @property
    def phase(self) -> int:
        return self.cells[0].phase

    @property
    def label(self) -> str:
        """`traces:teacher/t/task` for one cell, `eval: 12 cells of student-s` for a group."""
        if len(self.cells) == 1:
            return self.cells[0].label
        models = sorted({c.model for c in self.cells})
        return f"{self.kind}: {len(self.cells)} cells of {', '.join(models)}"


class Emit(Protocol):
    """What the scheduler sends its events to: `Events`, or the progress bar wrapping it."""

    def __call__(self, event: str, say: str | None = None, **fields: Any) -> None: ...


class Events:
    """The run's event stream: appended to `<root>/logs/events.jsonl` and rendered to the log."""

    def __init__(self, store: Store, log: Callable[[str], None] = print) -> None:
        self.path, self.log, self.run = (
            store.root / "logs" / "events.jsonl",
            log,
            uuid.uuid4().hex[:12],
        )
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, event: str, say: str | None = None, **fields: Any) -> None:
        record = {"run": self.run, "t": round(time.time(), 3), "event": event, **fields}
        with open(self.path, "a") as f:  # one line a write: readers never see half an event
            f.write(json.dumps(record) + "\n")
        if say:
            self.log(say)


def read_events(store: Store, run: str | None = None) -> list[dict[str, Any]]:
    """The events of one run (default: the last run) from `<root>/logs/events.jsonl`."""
    path = store.root / "logs" / "events.jsonl"
    if not path.exists():
        return []
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    run = run or (events[-1]["run"] if events else None)
    return [e for e in events if e["run"] == run]


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How a run goes; none of it changes a cell's files, so none of it is in a key (what does is
    in the cell specs: harness/workflow/cells.py)."""

    only: frozenset[str] | None = None  # stages to run (parse_only)
    executor: str = "local"  # local | ray
    address: str | None = None  # Ray cluster address (default: the config's ray.address)


def parse_only(only: str | Iterable[str] | None) -> frozenset[str] | None:
    """`--only generate,train` -> {"generate", "train"}; a clear error for anything else."""
    if only is None:
        return None
    names = [s.strip() for s in (only.split(",") if isinstance(only, str) else only) if s.strip()]
    wrong = [s for s in names if s not in STAGES]
    if wrong or not names:
        raise UserError(
            f"--only: {', '.join(map(repr, wrong)) or repr(only)} is not a stage; stages are "
            f"{', '.join(STAGES)} (comma-separated for several)."
        )
    return frozenset(names)


def closure(
    cells: Iterable[Cell],
    wanted: Iterable[Cell],
    store: Store,
    gates: Mapping[str, Gate] | None = None,
) -> list[Cell]:
    """The missing cells among `wanted` and the missing cells they depend on (their inputs, and
    the screens that gate an adapter), in `cells` order."""
    cells = list(cells)
    by_key = {c.key: c for c in cells}
    need: dict[str, Cell] = {}

    def visit(c: Cell) -> None:
        if c.key in need or store.complete(c.kind, c.key):
            return
        for up in needs(c, gates):
            if up in by_key:
                visit(by_key[up])
        need[c.key] = c

    for c in wanted:
        visit(c)
    order = {c.key: i for i, c in enumerate(cells)}
    return sorted(need.values(), key=lambda c: order.get(c.key, 0))


def needs(c: Cell, gates: Mapping[str, Gate] | None) -> tuple[str, ...]:
    """What a cell waits for: its inputs, and for a gated adapter every screen of its group."""
    gate = (gates or {}).get(c.key)
    return (*c.upstream, *gate.group) if gate else c.upstream


def empty_dataset(store: Store, key: str) -> bool:
    manifest = store.manifest("dataset", key) or {}
    return bool(manifest) and manifest["summary"].get("n_examples") == 0


def left_empty(store: Store, cells: Iterable[Cell]) -> set[str]:
    """Keys of the cells a run skips because a training set they need is complete and empty: an
    adapter whose dataset (or aligned budget's reference set) has no example, and every cell
    downstream of one (as `Schedule._skip` decides). They are never computed, so never "to run"."""
    out: set[str] = set()
    for c in sorted(cells, key=lambda c: c.phase):
        empty = c.kind == "adapter" and any(empty_dataset(store, u) for u in c.upstream)
        if empty or any(u in out for u in c.upstream):
            out.add(c.key)
    return out


class Schedule:
    """The ready loop's state: cells pending, running, done and skipped."""

    def __init__(
        self,
        cells: Iterable[Cell],
        wanted: Iterable[Cell],
        store: Store,
        only: frozenset[str] | None = None,
        events: Events | None = None,
        gates: Mapping[str, Gate] | None = None,
        task_gates: Mapping[str, tuple[str, ...]] | None = None,
        decide: Callable[[str], tuple[bool | None, str]] | None = None,
    ) -> None:
        """`gates`: per adapter key, its top_k screening gate (harness/workflow/grid.py: Gate);
        `task_gates`: per task, the select cells its other cells wait for; `decide(task)`: then
        whether the task goes on, and why (harness/workflow/selection.py)."""
        self.emit: Emit = events or Events(store)
        self.store, self.gates = store, gates or {}
        self.task_gates, self.decide = dict(task_gates or {}), decide
        self._decided: dict[str, tuple[bool | None, str]] = {}
        cells = list(cells)
        work = closure(cells, wanted, store, self.gates)
        if self.task_gates:  # a task's select cells are inputs of all its work, not of its keys
            tasks = {c.task for c in work}
            select = {k for t in tasks for k in self.task_gates.get(t, ())}
            extra = [c for c in cells if c.key in select]
            work = closure(cells, [*work, *extra], store, self.gates)
        if only:
            work = [c for c in work if c.stage in only]
            blocked: list[Cell] = []
            while True:  # an input neither complete nor in the work blocks the cell, transitively
                keys = {c.key for c in work}
                now = [
                    c
                    for c in work
                    if any(
                        u not in keys and not store.complete_any(u) for u in needs(c, self.gates)
                    )
                ]
                if not now:
                    break
                blocked += now
                gone = {c.key for c in now}
                work = [c for c in work if c.key not in gone]
            if blocked:
                self.emit(
                    "blocked",
                    f"skipping {len(blocked)} cell(s) whose inputs are not computed yet "
                    f"(e.g. {blocked[0].label}); run the earlier stages first",
                    cells=[c.key for c in blocked],
                )
        self.work = work
        self.pending: dict[str, Cell] = {c.key: c for c in work}
        self._cells = dict(self.pending)
        self.running: set[str] = set()
        self.done: set[str] = set()
        self.skipped: set[str] = set()
        kinds = {c.kind for c in cells}
        self.counts = {k: 0 for k in STAGE_OF_KIND if k in kinds}  # the grid's kinds
        self._phase_began: dict[int, float] = {}
        self._phase_planned: dict[int, set[str]] = {}  # the pending keys when a phase began

    def ready(
        self, lowest_phase: bool, share_workers: bool, together: frozenset[str] = frozenset()
    ) -> list[Group]:
        """Groups whose inputs are done (or not this run's work), taken out of `pending`.
        `lowest_phase`: only the groups of the lowest ready phase (the local order); where
        those are all of kinds in `together`, every ready group of those kinds joins them (the
        teacher traces and the evals that need none of them, in slots of CPU cores)."""
        while True:  # a skipped cell can make its dependents ready (to be skipped in turn)
            ready = [c for c in self.pending.values() if self._inputs_ready(c)]
            cells = [c for c in ready if not self._skip(c)]
            if cells or len(cells) == len(ready):
                break
        if lowest_phase and cells:
            first = min(c.phase for c in cells)
            lowest = [c for c in cells if c.phase == first]
            join = together and all(c.kind in together for c in lowest)
            cells = [c for c in cells if c.kind in together] if join else lowest
        groups = _group(cells, share_workers)
        for g in groups:
            self._start(g)
        return groups

    def finish(self, group: Group, seconds: float) -> None:
        keys = [c.key for c in group.cells]
        self.running.difference_update(keys)
        self.done.update(keys)
        self.counts[group.kind] += len(keys)
        self.emit("group_done", kind=group.kind, cells=keys, seconds=round(seconds, 3))
        phase = group.phase
        if not any(c.phase == phase for c in self.pending.values()) and not any(
            self._cells[k].phase == phase for k in self.running
        ):
            took = time.perf_counter() - self._phase_began.pop(phase)
            n = sum(1 for c in self.work if c.phase == phase and c.key in self.done)
            # gated and screened-out cells are found as the phase goes: the start line cannot
            # know them, the end line says how many of the planned cells ran and were skipped
            skipped = len(self._phase_planned.pop(phase, set()) & self.skipped)
            stage, title = PHASES[phase]
            self.emit(
                "phase_done",
                f"{self.phase_name(phase)}: {n} cell(s) done"
                + (f", {skipped} skipped" if skipped else "")
                + f" in {took:.1f} s",
                phase=phase,
                stage=stage,
                cells=n,
                skipped=skipped,
                seconds=round(took, 3),
            )

    @property
    def finished(self) -> bool:
        return not self.pending and not self.running

    def _inputs_ready(self, c: Cell) -> bool:
        """Every input is done, skipped, or not this run's work (complete already, or not asked
        for); an input still pending or running is not ready. A gated task's select cells are
        inputs of its other cells."""
        task_gate = self.task_gates.get(c.task, ())
        own = needs(c, self.gates)
        inputs = own if c.key in task_gate else (*own, *task_gate)
        return all(
            u in self.done or u in self.skipped or (u not in self.pending and u not in self.running)
            for u in inputs
        )

    def _gated(self, c: Cell) -> str | None:
        """Why `c` does not run when its task is gated (or not decided), else None."""
        gate = self.task_gates.get(c.task)
        if gate is None or c.key in gate or self.decide is None:
            return None
        if c.task not in self._decided:
            passed, why = self._decided[c.task] = self.decide(c.task)
            self.emit(
                "select",
                f"task {c.task}: {'goes on' if passed else 'gated'}: {why}",
                task=c.task,
                passed=passed,
                reason=why,
            )
        passed, why = self._decided[c.task]
        return None if passed else f"task {c.task} is gated by pre-selection: {why}"

    def _skip(self, c: Cell) -> bool:
        gated = self._gated(c)
        if gated:
            self.emit("skip", cell=c.key, kind=c.kind, reason=gated)
            self.skipped.add(c.key)
            self.pending.pop(c.key)
            return True
        empty = c.kind == "adapter" and empty_dataset(self.store, c.upstream[0])
        # an aligned adapter's reference set (upstream[1]) gives it its budget: none if empty
        no_budget = c.kind == "adapter" and any(
            empty_dataset(self.store, u) for u in c.upstream[1:]
        )
        empty = empty or no_budget
        gate = self.gates.get(c.key)
        screened_out = None
        if gate and not empty:
            summaries = {k: self.store.completed("screen", k)["summary"] for k in gate.group}
            screened_out = gate.reason(summaries)
        if not (empty or screened_out or any(u in self.skipped for u in c.upstream)):
            return False
        reason = "its input was skipped"
        if empty:
            reason = "its teacher left no training examples"
            if no_budget:
                reason = "its budget's reference teacher left no training examples"
        reason = screened_out or reason
        self.emit(
            "skip",
            f"skipping {c.label}: {reason}" if empty or screened_out else None,
            cell=c.key,
            kind=c.kind,
            reason=reason,
        )
        self.skipped.add(c.key)
        self.pending.pop(c.key)
        return True

    def phase_name(self, phase: int) -> str:
        """ "phase 2/6 evaluate: …" in a run of several phases (the phases of docs/results.md);
        without the number where this run's work is all of one phase (a quick `eval`)."""
        stage, title = PHASES[phase]
        if len({c.phase for c in self.work}) == 1:
            return f"{stage}: {title}"
        return f"phase {phase}/{max(PHASES)} {stage}: {title}"

    def _start(self, g: Group) -> None:
        if g.phase not in self._phase_began:
            self._phase_began[g.phase] = time.perf_counter()
            stage, title = PHASES[g.phase]
            self._phase_planned[g.phase] = {
                c.key for c in self.pending.values() if c.phase == g.phase
            }
            n = len(self._phase_planned[g.phase])
            self.emit(
                "phase",
                f"{self.phase_name(g.phase)}: {n} cell(s) planned",
                phase=g.phase,
                stage=stage,
                cells=n,
            )
        for c in g.cells:
            self.pending.pop(c.key)
            self.running.add(c.key)
        self.emit(
            "group",
            f"[{len(self.done)}/{len(self.work)} cells done] {g.label}",
            kind=g.kind,
            cells=[c.key for c in g.cells],
            label=g.label,
        )


def _group(cells: list[Cell], share_workers: bool) -> list[Group]:
    """Traces, eval and screen cells of one model share an engine session (a screen: one loaded
    student); with `share_workers` (local
    runs) every adapter shares one training worker process (`train.run`). On Ray each adapter is
    a task of its own, so that adapters train in parallel. Order: phase, then first appearance."""
    groups: dict[tuple, list[Cell]] = {}
    for c in sorted(cells, key=lambda c: c.phase):
        if c.kind == "adapter":
            key = "all" if share_workers else c.key
        else:
            key = c.model if c.kind in ("traces", "eval", "screen") else c.key
        groups.setdefault((c.phase, c.kind, key), []).append(c)
    return [Group(kind, tuple(g)) for (_, kind, _), g in groups.items()]


def stage_function(kind: str, table: Mapping[str, StageFn] | None = None) -> StageFn:
    """The stage function of a kind: from `table` where given (tests), else the stages'."""
    return (table or _stage_table())[kind]


def run_group(
    exp: Experiment, store: Store, group: Group, table: Mapping[str, StageFn] | None = None
) -> None:
    todo = [c for c in group.cells if not store.complete(c.kind, c.key)]
    if todo:
        stage_function(group.kind, table)(exp, store, todo)


def run_local(
    exp: Experiment,
    store: Store,
    sched: Schedule,
    table: Mapping[str, StageFn] | None = None,
) -> dict[str, int]:
    """Compute the schedule's work in this process's children, phase by phase. On a node with
    several GPUs the ready groups run at once, each on the GPUs its model asks for
    (harness/devices.py), as many as fit; on a machine without GPUs whose models are all small,
    the traces and eval groups run at once in slots of one core (`cpu_slots`); elsewhere one
    after another."""
    began = time.perf_counter()
    gpus = devices.node_gpus()
    slots = cpu_slots(exp, sched.work) if not gpus else []
    sched.emit("run", cells=len(sched.work), pid=os.getpid(), cpu_slots=[list(c) for c in slots])
    alloc, cores = devices.Allocator(gpus), devices.CoreSlots(slots)

    def on_gpus(g: Group) -> Any:
        return alloc.hold(max(c.resources(exp)["gpus"] for c in g.cells))

    with PhaseProgress(sched):
        together = SLOT_KINDS if len(slots) > 1 else frozenset()
        while groups := sched.ready(lowest_phase=True, share_workers=True, together=together):
            if len(gpus) > 1 and len(groups) > 1:
                _run_at_once(exp, store, sched, groups, on_gpus, table)
                continue
            if len(slots) > 1 and all(g.kind in SLOT_KINDS for g in groups):
                chunks = split_for_slots(groups, len(slots))
                _run_at_once(exp, store, sched, chunks, lambda g: cores.hold(), table, len(slots))
                continue
            for g in groups:
                t0 = time.perf_counter()
                run_group(exp, store, g, table)
                sched.finish(g, time.perf_counter() - t0)
    if not sched.finished:  # not reachable unless the grid has an input outside it
        raise UserError(f"{len(sched.pending)} cell(s) can never run: their inputs are missing.")
    sched.emit("run_done", counts=sched.counts, seconds=round(time.perf_counter() - began, 3))
    return sched.counts


# the engine groups that run in a child process of their own (engines.run_stage), so in a slot of
# CPU cores; a screen loads its student in this process, where two at once are not safe
SLOT_KINDS = frozenset({"traces", "eval"})


def cpu_slots(exp: Experiment, work: Iterable[Cell]) -> list[tuple[int, ...]]:
    """The slots of CPU cores the traces and eval groups of `work` run in on a machine without
    GPUs (harness/devices.py: core_slots): one a core where every model of the grid is small,
    else one of every core; none where `work` has no such group. From the grid's models, not
    from what is left to run, so that a resumed cell gets the cores it would have had."""
    from harness.models import sources

    if devices.inprocess() or not any(c.kind in SLOT_KINDS for c in work):
        return []
    return devices.core_slots(sources.all_small([*exp.teachers, *exp.students]))


def split_for_slots(groups: list[Group], slots: int) -> list[Group]:
    """Groups cut so that `slots` slots share a phase's work evenly: a group of at least two
    cells a slot is cut into `slots` runs (each its own engine session of the same model), run
    i taking every slots-th cell from the i-th, so that each run holds its share of every task
    and draw; the largest runs first, so that the slots, taking the next as each frees, end
    together. A cell's output does not depend on the session it is in (per-request seeds)."""
    out: list[Group] = []
    for g in groups:
        n = slots if len(g.cells) >= 2 * slots else 1
        out += [Group(g.kind, g.cells[i::n]) for i in range(n)]
    return sorted(out, key=lambda g: -len(g.cells))


def _run_at_once(
    exp: Experiment,
    store: Store,
    sched: Schedule,
    groups: list[Group],
    hold: Callable[[Group], Any],
    table: Mapping[str, StageFn] | None,
    workers: int | None = None,
) -> None:
    """Run groups at once, each in a thread holding what `hold(group)` gives it (the GPUs its
    cells ask for, or a slot of CPU cores); a group waits until that is free, and at most
    `workers` run at once (default: all). The schedule is updated from this thread only. The
    first failure is raised once every started group has ended."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    def one(g: Group) -> float:
        with hold(g):
            t0 = time.perf_counter()
            run_group(exp, store, g, table)
            return time.perf_counter() - t0

    failed: BaseException | None = None
    n = min(len(groups), workers or len(groups))
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="cotgap-group") as pool:
        futures = {pool.submit(one, g): g for g in groups}
        for f in as_completed(futures):
            if f.exception() is not None:
                failed = failed or f.exception()
                continue
            sched.finish(futures[f], f.result())
    if failed is not None:
        raise failed


class PhaseProgress:
    """On a terminal, a bar for the phase under way (its cells done, with an ETA) above the jobs'
    bars. It sits between the schedule and its event stream for the run: a phase's and a group's
    start show in the bar instead of a line each (they still go to events.jsonl), and a thread
    counts the running group's cells whose manifest has appeared, so a group of 24 adapters
    moves the bar cell by cell (groups running at once too). Off a terminal it changes nothing."""

    every = 0.5  # seconds between two looks at the running group's cells

    def __init__(self, sched: Schedule) -> None:
        self.sched, self.inner = sched, sched.emit
        self.bar = progress.PhaseBar()
        self.lock = threading.Lock()
        self.phase_keys: set[str] = set()
        self.finished: set[str] = set()
        self.running: dict[str, str] = {}  # key -> kind of the cells of the groups under way
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> PhaseProgress:
        if self.bar.active:
            self.sched.emit = self
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar.active:
            self.stopping.set()
            self.thread.join()
            self.sched.emit = self.inner
            self.bar.close()

    def __call__(self, event: str, say: str | None = None, **fields: Any) -> None:
        with self.lock:
            if event == "phase":
                self.phase_keys = {
                    c.key for c in self.sched.pending.values() if c.phase == fields["phase"]
                }
                self.finished, self.running = set(), {}
                self.bar.start(self.sched.phase_name(fields["phase"]), len(self.phase_keys))
                say = None
            elif event == "group":
                self.running.update(dict.fromkeys(fields["cells"], fields["kind"]))
                say = None
            elif event in ("group_done", "skip"):
                keys = fields["cells"] if event == "group_done" else [fields["cell"]]
                self.finished.update(keys)
                for k in keys:
                    self.running.pop(k, None)
            elif event == "phase_done":
                self.bar.finish()
        self.inner(event, say, **fields)
        if event in ("group_done", "skip"):
            self._count()

    def _count(self) -> None:
        with self.lock:
            done = len(self.finished & self.phase_keys)
            running = dict(self.running)
        # cells of the groups under way that are complete on disk already
        done += sum(self.sched.store.complete(kind, k) for k, kind in running.items())
        self.bar.set(done)

    def _loop(self) -> None:
        while not self.stopping.wait(self.every):
            self._count()
