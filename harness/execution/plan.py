"""Plans and runs an experiment: what is there, what would run and how much work it is; runs it
on the chosen executor; evaluates an ad-hoc adapter.

    cotgap plan configs/sandbox.yaml
    cotgap run configs/sandbox.yaml [--only generate,train,evaluate]

The cells come from harness/workflow/grid.py, the order from harness/execution/schedule.py. Every cell that is
complete on disk is skipped, so a killed run resumes and a second run computes nothing.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from typing import Any

from harness.config.schema import Experiment
from harness.errors import UserError
from harness.execution import schedule
from harness.models import sources as models
from harness.store import Store
from harness.tasks import suite as tasks
from harness.workflow import grid as grids
from harness.workflow import selection
from harness.workflow.cells import Cell, Eval


def run(
    exp: Experiment,
    store: Store,
    wanted: Iterable[Cell] | None = None,
    options: schedule.RunOptions = schedule.RunOptions(),
    log: Callable[[str], None] = print,
    rounds: Callable[[], list[Cell]] | None = None,
) -> dict[str, int]:
    """Compute every missing cell among `wanted` (default: the whole grid) and the missing cells
    they depend on, on the chosen executor; returns the computed cells by kind.

    `rounds` (train.race, with the whole grid wanted): the cells the race wants so far, read
    from the store (harness/analysis/race.py replays the race); it is asked again after every
    round, until it asks for nothing new. Each round's cells are ordinary cells: a killed race
    resumes from what is cached, and a rerun asks for the same ones."""
    if rounds is None or wanted is not None or exp.train.race is None:
        return _run_once(exp, store, wanted, options, log)
    total: dict[str, int] = {}
    seen: set[str] = set()
    for n in range(1, exp.train.race.max_replicates - exp.train.race.min_replicates + 3):
        cells = rounds()
        keys = {c.key for c in cells}
        if keys == seen:
            break  # the race asks for nothing new: every group is decided or at its maximum
        seen = keys
        counts = _run_once(exp, store, cells, options, log)
        for kind, k in counts.items():
            total[kind] = total.get(kind, 0) + k
        log(f"race: round {n} done ({sum(counts.values())} cell(s) computed)")
    return total


def _run_once(
    exp: Experiment,
    store: Store,
    wanted: Iterable[Cell] | None,
    options: schedule.RunOptions,
    log: Callable[[str], None] = print,
) -> dict[str, int]:
    g = grids.expand(exp)
    wanted = g if wanted is None else wanted
    events = schedule.Events(store, log)
    sched = schedule.Schedule(
        g,
        wanted,
        store,
        options.only,
        events,
        g.gates,
        task_gates=selection.gates(g),
        decide=_decider(exp, g, store),
    )
    if options.executor == "ray":
        from harness.execution import ray_executor

        return ray_executor.run(exp, store, sched, address=options.address or exp.ray.address)
    return schedule.run_local(exp, store, sched)


def _decider(exp: Experiment, g: grids.Grid, store: Store) -> Any:
    def decide(task: str) -> tuple[bool | None, str]:
        d = selection.decide(exp, g, store)[task]
        return d.runs, d.reason

    return decide


def missing(store: Store, cells: Iterable[Cell]) -> list[Cell]:
    return [c for c in cells if not store.complete(c.kind, c.key)]


def evaluate_adapter(
    exp: Experiment, store: Store, model: str, adapter_dir: Any, task: str | None
) -> list[str]:
    """Evaluate an arbitrary PEFT adapter directory on `model` under the experiment's eval config."""
    from pathlib import Path

    from harness.stages import evaluate

    d = Path(adapter_dir).expanduser().resolve()
    if not (d / "adapter_config.json").exists():
        raise UserError(
            f"--adapter {adapter_dir}: no adapter_config.json there; give a PEFT adapter directory."
        )
    ident = models.identity(exp.model(model))
    fingerprint = {"local": str(d), "fingerprint": models._weights_fingerprint(d)}
    cells = [
        Eval.of(exp, ident, model, t, fingerprint, role="adhoc", adapter_dir=str(d))
        for t in ([task] if task else [t.name for t in exp.tasks])
    ]
    todo = missing(store, cells)
    if todo:
        evaluate.run(exp, store, todo)
    return [c.key for c in cells]


def estimate(exp: Experiment, cells: list[Cell]) -> dict[str, float]:
    """Upper bounds of the work, from configs and split sizes (`split_sizes`); loads no model."""
    out: dict[str, float] = {
        "generated_tokens_max": 0,
        "eval_tokens_max": 0,
        "train_steps": 0,
        "train_tokens_max": 0,
    }
    names = {"generate": "generated_tokens_max", "evaluate": "eval_tokens_max"}
    for (stage, _), work in work_by_model(exp, cells).items():
        if stage == "train":
            out["train_steps"] += work["steps"]
            out["train_tokens_max"] += work["tokens"]
        else:
            out[names[stage]] += work["tokens"]
    return out


def split_sizes(exp: Experiment) -> dict[str, dict[str, int]]:
    """Items of each split of the experiment's tasks: the task file's `sizes`, else, for a task
    read from local files (no hub source), the items counted as `cotgap ls items` counts them;
    a split that cannot be counted here is left out (unknown)."""
    return {t.name: tasks.counted_sizes(t.name, exp.data_dir) for t in exp.tasks}


def _n_items(task: dict[str, Any], sizes: dict[str, dict[str, int]]) -> int:
    """The items a cell's task config reads: its limit, at most the split's size (0: unknown)."""
    size = sizes.get(task.get("name", ""), {}).get(task.get("split", ""))
    limit = task.get("limit")
    return min(limit, size) if limit and size else limit or size or 0


def work_by_model(exp: Experiment, cells: list[Cell]) -> dict[tuple[str, str], dict[str, int]]:
    """Tokens (upper bounds) and optimizer steps of each (stage, model): generate, evaluate,
    train."""
    sizes = split_sizes(exp)
    out: dict[tuple[str, str], dict[str, int]] = {}
    for c in cells:
        t = c.config.get("task", {})
        n_items = _n_items(t, sizes)
        steps, tokens, stage = 0, 0, c.stage
        if c.kind == "traces":
            tokens = n_items * exp.generate.n * exp.generate.max_tokens
        elif c.kind == "eval":
            tokens, stage = n_items * exp.evaluate.n * exp.evaluate.max_tokens, "evaluate"
        elif c.kind == "adapter":
            own = c.train  # type: ignore[attr-defined]
            steps = train_steps(exp, c, sizes)
            tokens = steps * _batch(own) * exp.train.max_length
            if c.method == "on_policy":  # type: ignore[attr-defined]
                _on_policy_work(exp, c, tokens, steps * _batch(own), out)
        else:
            continue
        work = out.setdefault((stage, c.model), {"tokens": 0, "steps": 0})
        work["tokens"] += tokens
        work["steps"] += steps
    return out


def _on_policy_work(
    exp: Experiment, cell: Cell, tokens: int, examples: int, out: dict[tuple[str, str], dict]
) -> None:
    """An on_policy adapter's extra work: the student's samples (generation, upper bound) and the
    teacher's forward passes (a third of training's cost a token: forward only)."""
    cfg = exp.train.on_policy
    sampled = int(examples * (1 - cfg.teacher_share) * cfg.max_new_tokens)
    out.setdefault(("generate", cell.model), {"tokens": 0, "steps": 0})["tokens"] += sampled
    teacher = out.setdefault(("train", cell.teacher), {"tokens": 0, "steps": 0})  # type: ignore[attr-defined]
    teacher["tokens"] += tokens // 3


def _batch(cfg: Any) -> int:
    return cfg.per_device_batch_size * cfg.grad_accum * cfg.num_processes


def train_steps(exp: Experiment, cell: Cell, sizes: dict[str, dict[str, int]]) -> int:
    """The optimizer updates an adapter cell runs (at most), at the batch it trains with (a mix
    may train with its own). Aligned to `updates`, it runs its reference's, counted at the
    experiment's batch; to `examples` or `tokens`, as many of its own as see the reference's."""
    tr, own = exp.train, cell.train  # type: ignore[attr-defined]
    limit = exp.task(cell.task).train_limit or sizes.get(cell.task, {}).get("train", 0)

    def at(batch: int) -> int:
        return tr.max_steps or math.ceil((tr.epochs or 0) * limit * exp.generate.n / batch)

    align = cell.align  # type: ignore[attr-defined]
    if align in ("none", "batch"):
        return at(_batch(own))
    if align == "updates":
        return at(_batch(tr))
    return math.ceil(at(_batch(tr)) * _batch(tr) / _batch(own))


def show(exp: Experiment, store: Store, every_cell: bool = False) -> list[Cell]:
    """Print the plan: cells in run order (grouped by phase, kind, role and model when there are
    many), their state, what they ask of a machine, and the work to do."""
    from rich.table import Table

    from harness import devices, progress
    from harness.workflow.cells import KINDS, PHASES

    grid = grids.expand(exp)
    cells = sorted(grid.unique(), key=lambda c: c.phase)
    empty = schedule.left_empty(store, cells)
    todo = [c for c in missing(store, cells) if c.key not in empty]
    console = progress.console()
    here = bool(devices.node_gpus())
    title = (
        f"{exp.name}: {'cells' if every_cell or len(cells) <= 200 else 'cell groups'} in run order"
    )
    if every_cell or len(cells) <= 200:
        table = Table("#", "phase", "stage", "cell", "key", "state", "needs", title=title)
        for i, c in enumerate(cells, 1):
            state = "to run" if c in todo else "no training set" if c.key in empty else "complete"
            table.add_row(
                str(i), str(c.phase), c.stage, c.label, c.key, state, _needs(exp, c, here)
            )
    else:
        table = Table(
            "phase", "stage", "kind", "role", "model", "cells", "to run", "needs", title=title
        )
        groups: dict[tuple, list[Cell]] = {}
        for c in cells:
            groups.setdefault((c.phase, c.kind, getattr(c, "role", "") or "", c.model), []).append(
                c
            )
        waiting = {c.key for c in todo}
        for (phase, kind, role, model), group in groups.items():
            n_todo = sum(1 for c in group if c.key in waiting)
            row = (str(phase), PHASES[phase][0], kind, role, model, str(len(group)), str(n_todo))
            table.add_row(*row, _needs(exp, group[0], here))
    console.print(table)
    kinds = [k for k in KINDS if any(c.kind == k for c in cells)]
    counts = {k: sum(1 for c in todo if c.kind == k) for k in kinds}
    console.print(f"to run: {len(todo)} of {len(cells)} cells {counts}")
    if empty:
        console.print(
            f"not run: {len(empty)} cells downstream of a training set left empty (its teacher "
            "gave no usable trace): nothing to train on"
        )
    for k, v in estimate(exp, todo).items():
        console.print(f"  {k}: {v:,.0f}")
    console.print(replicates_line(exp))
    for line in cost_lines(exp, todo):
        console.print(line)
    for line in race_lines(exp, store, grid, todo):
        console.print(line)
    for line in selection_lines(exp, store, grid, todo):
        console.print(line)
    for line in detectable_gains(exp, store, grid):
        console.print(line)
    for line in claim_lines(exp):
        console.print(line)
    return cells


def replicates_line(exp: Experiment) -> str:
    """How many replicates stand behind each teacher: trace draws, training seeds, and how they
    combine (train.replicates)."""
    draws, seeds, reps = exp.generate.trace_seeds, exp.train.seeds, exp.replicates()
    source = "generate.seeds" if exp.generate.seeds is not None else "generate.seed"
    how = f"{exp.train.replicates}: " if len(draws) > 1 and len(seeds) > 1 else ""
    units = replicate_units(exp)
    counted = (
        f"; {len(reps)} adapters, the rule counts each trace draw once, its training seeds averaged"
        if units != len(reps)
        else ""
    )
    return (
        f"replicates per teacher: {units} ({how}{len(draws)} trace draw(s), {source} "
        f"{', '.join(map(str, draws))}; {len(seeds)} training seed(s), train.seeds "
        f"{', '.join(map(str, seeds))}{counted}) for each (task, student, regime)"
    )


def replicate_units(exp: Experiment) -> int:
    """The replicates the report's rule counts per teacher (teacher_level.replicate_units): the
    trace draws, each with its training seeds averaged; with one draw, its training seeds."""
    draws = exp.generate.trace_seeds
    return len(draws) if len(draws) > 1 else len(exp.train.seeds)


def selection_lines(exp: Experiment, store: Store, grid: grids.Grid, todo: list[Cell]) -> list[str]:
    """Per candidate task (`select:`): its teachers' accuracies, spread and decision, and the work
    a gated task saves (its cells still to run, besides the select cells)."""
    decisions, sel = selection.decide(exp, grid, store), exp.select
    if not decisions or sel is None:  # decisions are empty without a select: section
        return []
    lines = [
        f"task pre-selection ({sel.by} >= {sel.min_points:g} pts, {sel.prompt_style}, "
        f"{sel.split} split{': [red]a leak, the test items also score the students[/]' if sel.split == 'test' else ''}):"
    ]
    saved: list[Cell] = []
    waiting = [t for t, d in decisions.items() if d.passed is None]
    if waiting:
        lines.append(
            f"  undecided until their select cells run: {len(waiting)} task(s) "
            f"({', '.join(waiting[:6])}{', …' if len(waiting) > 6 else ''})"
        )
    for task, d in decisions.items():
        if d.passed is None:
            continue
        accs = ", ".join(
            f"{t} {'?' if a is None else f'{100 * a:.1f}'}" for t, a in d.accuracies.items()
        )
        state = {None: "undecided", True: "goes on", False: "[yellow]gated[/]"}[d.passed]
        lines.append(f"  {task}: {state} ({accs}): {d.reason}")
        if d.runs is False:
            gate = set(selection.gates(grid)[task])
            saved += [c for c in todo if c.task == task and c.key not in gate]
    if saved:
        counts = {
            k: sum(1 for c in saved if c.kind == k)
            for k in ("traces", "dataset", "adapter", "eval")
        }
        work = ", ".join(f"{k} {v:,.0f}" for k, v in estimate(exp, saved).items())
        lines.append(f"  gating saves {len(saved)} cells {counts}: {work}")
    return lines


def claim_lines(exp: Experiment) -> list[str]:
    """Per cross-group claim of the studies (harness/stats/grid_level.py): whether this grid's
    teachers (students) can ever reach the claim's level, and how many it would need."""
    from harness.stats import grid_level

    a = exp.analysis
    alpha = 1 - a.ci
    n_t, n_s = len(exp.teachers), len(exp.students)
    lines = [
        f"cross-group claims (teachers or students as the unit, every order of their labels over "
        f"the grid; alpha {alpha:g}; {n_t} teacher(s), {n_s} student(s), "
        f"{len(exp.tasks)} task(s)):"
    ]
    for c in grid_level.design(n_t, n_s, alpha, max(1, len(a.gap_bins) - 1)):
        head = f"  {c['claim']}: "
        if c["supported"]:
            lines.append(
                f"{head}can be tested ({c['n']} {c['unit']}: p can reach {c['smallest_p']:.3g} "
                f"≤ {c['level']:.3g})"
            )
        else:
            lines.append(
                f"{head}[yellow]too few: needs ≥ {c['needed']} {c['unit']}[/] (has {c['n']}: "
                f"p can reach {c['smallest_p']:.3g} at best, above {c['level']:.3g}); the "
                "report will say 'too few'"
            )
    lines.append(_leader_line(len(exp.tasks), n_t))
    return lines


def _leader_line(n_tasks: int, n_teachers: int) -> str:
    """Whether a group can name a teacher as the leader its grid's other tasks put first
    (docs/statistics.md, "The teacher named")."""
    from harness.stats import teacher_level

    head = "  the teacher named, per group: "
    if n_teachers < 2:
        return head + "one teacher: named when its gain is shown (one-sided, at alpha)"
    if n_tasks < 2:
        return (
            head + "[yellow]one task: no other task to read a leader from[/]; each group names a "
            "teacher by its own best set at all of alpha (about half the power of a grid of "
            "several tasks at 3 replicates, benchmarks/README.md); a second task with the same "
            "teachers adds the leader route"
        )
    return (
        head + f"each group's leader is read from the other {n_tasks - 1} task(s), tested at "
        f"{teacher_level.LEADER_SHARE:g} alpha; its own best set at the rest"
    )


# A baseline at 50% has the most discordant items, so assuming it where none is measured gives the
# largest (most cautious) minimum detectable gain.
_UNMEASURED_BASE = 0.5


def detectable_gains(exp: Experiment, store: Store, grid: grids.Grid | None = None) -> list[str]:
    """One line per task and baseline: the smallest gain over the baseline, and the smallest
    difference between two teachers, that the report's own rule (harness/stats/teacher_level.py) calls
    `better` with power 0.8, at this grid's test items, teachers and replicates, with a
    replicate SD of analysis.replicate_sd (a prior until replicates have run); against the
    measured baseline of each student, else a 50% one. How often the baseline and a distilled
    student agree on an item (`teacher_level.concordance`) is taken as measured in the last
    analysis, else as no more than chance, the least favourable case, so the MDE never
    overstates power. A warning when the design cannot reach analysis.effect_of_interest, and
    the replicates that would."""
    from harness.stats import teacher_level

    a = exp.analysis
    sizes = split_sizes(exp)
    effect = a.effect_of_interest
    reps = replicate_units(exp)
    m = len(exp.teachers)
    prior, measured = a.replicate_sd / 100, _replicate_sds(exp)
    concordances = _concordances(exp)
    designs: dict[tuple[str, int, float | None, float, float], list[str]] = {}
    for (task, student), cell in (grid or grids.expand(exp)).baselines.items():
        t = cell.config.get("task", {})
        n = _n_items(t, sizes)
        base = ((store.manifest("eval", cell.key) or {}).get("summary") or {}).get("accuracy")
        sd = measured.get((task, student), math.nan)
        conc = concordances.get((task, student), 0.0)
        designs.setdefault((task, n, base, sd, conc), []).append(student)
    lines = [
        f"minimum detectable effects under the report's rule (alpha {1 - a.ci:g}, power 0.8, "
        f"{m} teacher(s), {reps} replicate(s) each, between-replicate SD as measured in the last "
        f"analysis, else {a.replicate_sd:g} pts assumed; item concordance of baseline and "
        f"distilled student as measured, else none assumed; effect of interest {effect:g} pts):"
    ]
    if reps < a.min_replicates:
        lines.append(
            f"  [yellow]{reps} replicate(s) per teacher < analysis.min_replicates "
            f"{a.min_replicates}: exploratory, no verdict but inconclusive[/]; at "
            f"{a.min_replicates} replicates:"
        )
    planned = max(reps, a.min_replicates)
    for (task, n, base, sd, conc), students in designs.items():
        who = f"  {task} / {', '.join(students)}"
        sd_text = "assumed" if math.isnan(sd) else "measured"
        sd = prior if math.isnan(sd) else sd
        if not n:
            lines.append(f"{who}: test-set size unknown; no MDE")
            continue
        source = "not measured yet, assumed" if base is None else "measured"
        base = _UNMEASURED_BASE if base is None else float(base)
        gain = teacher_level.minimum_detectable_gain(
            n, base, planned, sd, m, 1 - a.ci, concordance=conc, sims=500
        )
        diff = teacher_level.minimum_detectable_difference(
            n, _UNMEASURED_BASE, planned, sd, m, 1 - a.ci, concordance=conc, sims=500
        )
        line = (
            f"{who}: {n} test items, baseline {100 * base:.1f}% ({source}), between-replicate SD "
            f"{100 * sd:.1f} pts ({sd_text}), concordance {conc:.2f}: gain {_pts(gain)}, "
            f"teacher vs teacher {_pts(diff)}"
        )
        if math.isnan(gain) or gain * 100 > effect:
            line += f"[yellow]; the effect of interest ({effect:g} pts) is out of reach[/]"
            more = _replicates_for(n, base, sd, m, 1 - a.ci, effect / 100, conc)
            line += f" ({more})" if more else ""
        lines.append(line)
    return lines


def _last_groups(exp: Experiment) -> list[dict]:
    """The groups of the last analysis (analysis.json), or none."""
    import json

    path = exp.root / "analysis" / "analysis.json"
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("groups") or []
    except (OSError, ValueError):
        return []


def _concordances(exp: Experiment) -> dict[tuple[str, str], float]:
    """Per (task, student): the smallest item concordance of baseline and distilled students
    measured in the last analysis (any regime)."""
    out: dict[tuple[str, str], float] = {}
    for g in _last_groups(exp):
        c = ((g.get("decision") or {}).get("mde") or {}).get("concordance")
        if c is not None and not math.isnan(c):
            key = (g["task"], g["student"])
            out[key] = min(out.get(key, 1.0), float(c))
    return out


def _replicate_sds(exp: Experiment) -> dict[tuple[str, str], float]:
    """Per (task, student): the largest between-replicate SD of post accuracy measured in the last
    analysis (teachers with >= 2 replicates, any regime)."""
    out: dict[tuple[str, str], float] = {}
    for g in _last_groups(exp):
        for t in (g.get("decision") or {}).get("teachers", []):
            if t.get("n_replicates", 0) >= 2 and t.get("rep_sd") is not None:
                key = (g["task"], g["student"])
                out[key] = max(out.get(key, 0.0), float(t["rep_sd"]))
    return out


def _pts(x: float) -> str:
    return "none within reach" if math.isnan(x) else f"{100 * x:.1f} pts"


def _replicates_for(
    n: int, base: float, sd: float, m: int, alpha: float, effect: float, conc: float
) -> str:
    """The fewest replicates (up to 20) at which the rule detects `effect` at these items."""
    from harness.stats import teacher_level

    def reaches(r: int) -> bool:
        power = teacher_level.gain_power(n, base, effect, r, sd, m, alpha, conc, sims=500)
        return power >= 0.8

    if not reaches(20):
        return "20 replicates do not reach it at these test items"
    r = next(r for r in (3, 5, 8, 12, 20) if reaches(r))
    return f"{r} replicates would reach it"


def device_line() -> str:
    """The accelerator this machine has, found without importing torch (plan stays fast)."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        gpus = [line.split(" (UUID")[0] for line in out.splitlines() if line.startswith("GPU ")]
        if gpus:
            return f"this machine: {len(gpus)} GPU(s): {'; '.join(gpus)}"
    return (
        "this machine: CPU only (no NVIDIA GPU found): GPU needs and GPU-hours below are what a "
        "GPU machine would need; here the CPU engines run the cells"
    )


def cost_lines(exp: Experiment, cells: list[Cell]) -> list[str]:
    """GPU memory each model needs and whether it fits `estimate.gpu_memory_gb` GPUs, then the
    GPU-hours of each stage (harness/workflow/estimate.py says how they are estimated)."""
    from harness import devices
    from harness.workflow import estimate

    lines = [device_line(), f"GPU memory per model (GPUs of {exp.costs.gpu_memory_gb:g} GB):"]
    students = {m.name for m in exp.students}
    for m in (*exp.teachers, *exp.students):
        max_tokens = max(exp.generate.max_tokens, exp.evaluate.max_tokens)
        serve = estimate.serving_memory(exp, m, max_tokens)
        if m.served:
            lines.append(f"  {m.name}: served at {m.engine.base_url} (no GPU memory here)")
            continue
        if not serve:
            why = "not on this machine, not in estimate.KNOWN"
            if m.path and m.path.startswith("gguf:"):
                why = f"not converted yet: `cotgap models import {m.path.removeprefix('gguf:')}`"
            lines.append(f"  {m.name}: shape unknown ({why})")
            continue
        fit = "fits" if serve["fits"] else "[red]does not fit[/]"
        dp = serve["replicas"]
        where = f"{serve['gpus']} GPU" + (f" x {dp} replicas for traces" if dp > 1 else "")
        lines.append(
            f"  {m.name}: serve on {where}: weights {serve['weights_gb']:.1f} GB + KV "
            f"{serve['kv_per_seq_gb']:.2f} GB a sequence ({serve['kv_batch_gb']:.0f} GB for a full "
            f"batch); {fit} in {serve['have_gb']:.0f} GB, {serve['concurrent_seqs']} sequences at once"
        )
        if m.name in students:
            tr = estimate.training_memory(exp, m)
            fit = "fits" if tr["fits"] else "[red]does not fit[/]"
            gc = "on" if tr["checkpointing"] else "off"
            shard = f" (1/{tr['shards']} each, FSDP)" if tr["shards"] > 1 else ""
            lines.append(
                f"  {m.name}: train {exp.train.method}: state {tr['state_gb']:.1f} GB{shard} + "
                f"activations {tr['activations_gb']:.1f} GB (gradient checkpointing {gc}) = "
                f"{tr['need_gb']:.1f} GB a process; {fit} in {tr['have_gb']:.0f} GB"
            )
    work = work_by_model(exp, cells)
    tokens = {k: float(v["tokens"]) for k, v in work.items()}
    hours = estimate.gpu_hours(exp, tokens)
    sources = sorted({estimate.tokens_per_s(exp, exp.model(m), st)[1] for st, m in work
                      if not exp.model(m).served})  # fmt: skip
    lines.append(f"GPU-hours to run (upper bounds; throughput: {', '.join(sources) or '-'}):")
    for stage in ("generate", "evaluate", "train"):
        if stage in hours:
            lines.append(f"  {stage}: {_hours(hours[stage])}")
    lines.append(f"  total: {_hours(sum(hours.values()))}")
    for model, cost in estimate.served_cost(exp, tokens).items():
        price = "no price in costs.prices" if cost != cost else f"at most {cost:,.2f}"
        lines.append(f"  served {model}: completion tokens {price} (prompt tokens not included)")
    if not devices.node_gpus():
        cores = (
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1
        )
        adapters = sum(1 for c in cells if c.kind == "adapter")
        secs = estimate.cpu_seconds(exp, work, adapters, cores)
        lines.append(
            f"CPU wall time here, {cores} cores (rough upper bound: every sample runs to max_tokens; "
            "rates assumed in harness/workflow/estimate.py):"
        )
        for stage in ("generate", "evaluate", "train"):
            if stage in secs:
                lines.append(f"  {stage}: {_minutes(secs[stage])}")
        lines.append(f"  total: {_minutes(sum(secs.values()))}")
    return lines


def race_lines(exp: Experiment, store: Store, grid: grids.Grid, todo: list[Cell]) -> list[str]:
    """Under train.race: the adapters and GPU-hours at most (every teacher at max_replicates,
    the cost above), at least (every group decided at its first look) and expected (the race
    simulated on one group of this grid: `racing.expected_adapters`, at the fewest test items of
    any task and analysis.replicate_sd, teachers' true gains spread evenly over 0-15 points)."""
    from harness.stats import racing
    from harness.workflow import race

    design = race.race_plan(exp)
    if design is None:
        return []
    a, race_cfg = exp.analysis, exp.train.race
    assert race_cfg is not None
    m = race_cfg.start or len(exp.teachers)  # with a prior, the start best-ranked race
    # before the prior is computed it is not known which teachers race: the cost is the same
    # for any `m` of them, so the plan prices the first m of the config
    entrants = {
        (t, d.eval.model, d.eval.regime): [x.name for x in exp.teachers[:m]]
        for (t, *_), d in grid.distilled.items()
    }
    first = schedule.closure(
        list(grid.unique()), race.round_cells(exp, grid, {}, entrants), store, grid.gates
    )
    done = {c.key for c in todo}
    least = [c for c in first if c.key in done]
    if race_cfg.start is not None:  # at most: the m raced teachers at the maximum
        at_most = {g: {"replicates": {}, "running": ts, "next_replicates": design.max_replicates}
                   for g, ts in entrants.items()}  # fmt: skip
        most = schedule.closure(
            list(grid.unique()), race.round_cells(exp, grid, at_most, entrants), store, grid.gates
        )
        todo = [c for c in most if c.key in done]
    sizes = split_sizes(exp)
    n = min((_n_items(c.config.get("task", {}), sizes) for c in grid.baselines.values()), default=0)
    per_group = m * race.adapters_per_draw(exp)
    low, high = per_group * design.looks[0], per_group * design.max_replicates
    mean: float = high
    if n:
        mean = race.adapters_per_draw(exp) * racing.expected_adapters(
            m, n, design, a.replicate_sd / 100, effect=a.effect_of_interest / 100,
            min_replicates=a.min_replicates,
        )  # fmt: skip
    share = (mean - low) / (high - low) if high > low else 1.0
    groups = len({(t, d.eval.model, d.eval.regime) for (t, *_), d in grid.distilled.items()})
    hours_high, hours_low = _gpu_hours(exp, todo), _gpu_hours(exp, least)
    hours_mean = hours_low + share * (hours_high - hours_low)
    screened = (
        f" ({len(exp.teachers) - m} of {len(exp.teachers)} screened out by train.race.prior: "
        f"{race_cfg.prior} before any training)"
        if m < len(exp.teachers)
        else ""
    )
    return [
        f"race (train.race: {design.looks[0]} to {design.max_replicates} trace draws, alpha spent over "
        f"{len(design.looks)} looks), per (task, student, regime) group of {m} teachers{screened}: "
        f"adapters at most {high}, at least {low}, expected about {mean:.0f} (simulated: "
        f"{n} test items, replicate SD {a.replicate_sd:g} pts, true gains spread evenly over "
        "0-15 points; equal teachers race to the maximum)",
        f"  the grid's {groups} group(s): adapters at most {groups * high}, expected about "
        f"{groups * mean:.0f}; GPU-hours to run at most {_hours(hours_high)}, at least "
        f"{_hours(hours_low)}, expected about {_hours(hours_mean)}",
    ]


def _gpu_hours(exp: Experiment, cells: list[Cell]) -> float:
    """GPU-hours of `cells` (harness/workflow/estimate.py), every stage together."""
    from harness.workflow import estimate

    work = work_by_model(exp, cells)
    return sum(estimate.gpu_hours(exp, {k: float(v["tokens"]) for k, v in work.items()}).values())


def _amount(x: float, spec: str) -> str:
    """A number, or why there is none (a NaN comes from a model whose size is unknown)."""
    return (
        "unknown (a model's size is unknown: give its `size` in the config)"
        if x != x
        else f"{x:,{spec}}"
    )


def _hours(x: float) -> str:
    """GPU-hours to one decimal; some work that rounds to 0.0 is "under 0.1", never nothing."""
    return "under 0.1" if 0 < x < 0.05 else _amount(x, ".1f")


def _minutes(secs: float) -> str:
    if secs != secs:
        return _amount(secs, ".1f")
    return f"{secs / 60:,.1f} min" if secs >= 60 else f"{secs:.0f} s"


def _needs(exp: Experiment, c: Cell, gpus_here: bool = True) -> str:
    """What a cell asks of a machine; on one without GPUs, that a GPU machine would be asked."""
    r = c.resources(exp)
    mem = f", {r['memory_gb']:g} GB" if r["memory_gb"] else ""
    gpus = f"{r['gpus']:g} GPU"
    if r["gpus"] and not gpus_here:
        gpus = f"CPU here ({gpus} on a GPU machine)"
    return f"{gpus}, {r['cpus']:g} CPU{mem}"
