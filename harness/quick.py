"""Quick commands: one model on named tasks, or one teacher-student pair, without a YAML.

    cotgap eval sandbox:student-xs --tasks sandbox_sums --limit 50
    cotgap distill --teacher sandbox:teacher-s --student sandbox:student-xs \
        --task sandbox_sums --limit 50 --seeds 0,1,2

Each command builds an in-memory `Experiment` and runs the cells it needs with the grid's own
machinery (harness/execution/plan.py), in the grid's store: a cell's key depends on the model, the task
(and its limits) and the stage settings, never on the experiment's name, so a grid with
`results_dir`/`name` naming the same folder and the same settings finds these cells computed,
and the other way round. The answers use the statistics of harness/stats/teacher_level.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.config.loading import _relative_to, parse
from harness.config.schema import AnalysisConfig, Experiment
from harness.config.task_paths import task_names
from harness.errors import UserError
from harness.execution import plan
from harness.execution.schedule import RunOptions
from harness.stats import teacher_level
from harness.store import Store, read_json, read_jsonl
from harness.tasks import scoring
from harness.workflow import checks, grid, offline

DEFAULT_RESULTS = Path("results") / "quick"


@dataclass(frozen=True)
class Settings:
    """The stage settings a quick command puts in its cells' keys (a grid with the same values
    shares them): evaluation and traces, and the training of `distill`."""

    max_tokens: int = 512
    dtype: str = "auto"
    samples: int = 2  # traces per training question
    temperature: float = 0.7  # for traces
    max_steps: int = 100
    lr: float = 2e-4
    batch_size: int = 8
    # effect of interest, points: the configs' own default, so "none" means the same everywhere
    effect: float = AnalysisConfig.model_fields["effect_of_interest"].default


# The config keys a quick command fills from its options: an error names the option, not the key
# (list indices written `[]`).
FLAGS = {
    "name": "--results-dir",
    "results_dir": "--results-dir",
    "data_dir": "--data-dir",
    "teachers[].path": "--teacher",
    "students[].path": "--student",
    "teachers[].engine.dtype": "--dtype",
    "students[].engine.dtype": "--dtype",
    "tasks[].name": "--task",
    "tasks[].test_limit": "--limit",
    "tasks[].train_limit": "--train-limit",
    "generate.n": "--samples",
    "generate.temperature": "--temperature",
    "generate.max_tokens": "--max-tokens",
    "generate.seed": "--seeds",
    "generate.seeds": "--seeds",
    "train.seeds": "--seeds",
    "train.max_steps": "--max-steps",
    "train.lr": "--lr",
    "train.per_device_batch_size": "--batch-size",
    "evaluate.max_tokens": "--max-tokens",
    "analysis.effect_of_interest": "--effect",
}


def model_name(path: str) -> str:
    """A config name for a model path: the last part of a hub id, folder, zoo or GGUF name."""
    tail = re.sub(r"^(sandbox|gguf):", "", path).rstrip("/").split("/")[-1]
    tail = tail.removesuffix(".gguf")
    return re.sub(r"[^A-Za-z0-9._-]", "-", tail).lstrip("._-")[:60] or "model"


def _root(results: Path) -> tuple[str, str]:
    """(results_dir, name) of the experiment whose folder is `results`."""
    results = Path(results).expanduser().resolve()
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", results.name):
        raise UserError(
            f"--results-dir {results}: the folder's name must be letters, digits, '.', '_' or "
            "'-' (it is the experiment's name); choose another folder."
        )
    return str(results.parent), results.name


def experiment(
    teachers: Sequence[str],
    students: Sequence[str],
    tasks: Sequence[str],
    limit: int | None,
    results: Path = DEFAULT_RESULTS,
    settings: Settings = Settings(),
    train_limit: int | None = None,
    seeds: Sequence[int] = (0,),
    data_dir: Path | None = None,
) -> Experiment:
    """The experiment of a quick command, validated like a YAML one (paths from the working
    directory). One seed: one trace draw at that seed; several: paired draws and training seeds."""
    results_dir, name = _root(results)
    engine = {"dtype": settings.dtype}
    student_names = [model_name(s) for s in students]
    teacher_specs = []
    for t in teachers:
        t_name = model_name(t)
        t_name = f"{t_name}-teacher" if t_name in student_names else t_name
        teacher_specs.append({"name": t_name, "path": t, "engine": engine})
    generate: dict[str, Any] = {
        "n": settings.samples,
        "temperature": settings.temperature,
        "max_tokens": settings.max_tokens,
    }
    if len(seeds) > 1:
        generate["seeds"] = list(seeds)
    else:
        generate["seed"] = seeds[0]
    data = {
        "name": name,
        "results_dir": results_dir,
        "data_dir": None if data_dir is None else str(data_dir),
        "teachers": teacher_specs,
        "students": [
            {"name": n, "path": s, "engine": engine}
            for n, s in zip(student_names, students, strict=True)
        ],  # fmt: skip
        "tasks": [{"name": t, "test_limit": limit, "train_limit": train_limit} for t in tasks],
        "generate": generate,
        "train": {
            "max_steps": settings.max_steps,
            "lr": settings.lr,
            "per_device_batch_size": settings.batch_size,
            "seeds": list(seeds),
            "replicates": "paired" if len(seeds) > 1 else "crossed",
        },
        "evaluate": {"max_tokens": settings.max_tokens},
        "analysis": {"effect_of_interest": settings.effect},
    }
    exp = _relative_to(parse(Experiment, data, "the command line", FLAGS), Path.cwd())
    _known_tasks(exp)
    offline.settle(exp)
    checks.check(exp, "the command line")
    problems = grid.expand_problems(exp)
    if problems:
        raise UserError("\n".join(problems))
    return exp


def _known_tasks(exp: Experiment) -> None:
    known = task_names()
    wrong = [t.name for t in exp.tasks if t.name not in known]
    if wrong:
        raise UserError(
            f"unknown task(s) {', '.join(wrong)}; `cotgap ls tasks` lists them (add your own "
            "folders with --include-path DIR)."
        )


def _run(exp: Experiment, cells: list, log: Callable[[str], None]) -> dict[str, int]:
    store = Store(exp.root)
    with store.lock():
        return plan.run(exp, store, cells, RunOptions(), log=log)


def _correct(exp: Experiment, key: str) -> dict[Any, bool]:
    """An eval cell's verdict per item id, re-scored in memory where its extractor has changed
    since (as the analysis reads it)."""
    d = Store(exp.root).cell_dir("eval", key)
    metrics = read_json(d / scoring.METRICS, f"delete {d} and re-run")
    due = scoring.rescore_due(metrics)
    records = scoring.rescore_cell(d, exp.data_dir) if due else read_jsonl(d / scoring.PREDICTIONS)
    return {r["id"]: bool(r["correct"]) for r in records}


def evaluate(
    exp: Experiment, log: Callable[[str], None] = print
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Evaluate the experiment's (one) student on each task: per task its accuracy with a 95%
    interval (Jeffreys: one greedy 0/1 run), the cell key and folder."""
    g = grid.expand(exp)
    student = exp.students[0].name
    cells = [g.baselines[t.name, student] for t in exp.tasks]
    counts = _run(exp, cells, log)
    rows = []
    for c in cells:
        correct = np.array(list(_correct(exp, c.key).values()), dtype=float)
        est = teacher_level.accuracy(teacher_level.baseline_arm(correct))
        rows.append(
            {"task": c.task, "model": student, "n": int(correct.size), "accuracy": est.estimate,
             "low": est.low, "high": est.high, "key": c.key,
             "path": str(Store(exp.root).cell_dir("eval", c.key))}
        )  # fmt: skip
    return rows, counts


def distill(
    exp: Experiment, log: Callable[[str], None] = print
) -> tuple[dict[str, Any], dict[str, int]]:
    """Generate -> train -> evaluate for the experiment's one (teacher, student, task) and the
    gain over the student's baseline, decided as a grid's group is (harness/stats/teacher_level.py)."""
    g = grid.expand(exp)
    task, student, teacher = exp.tasks[0].name, exp.students[0].name, exp.teachers[0].name
    rows = {k: d for k, d in g.distilled.items() if k[:3] == (task, student, teacher)}
    base_cell = g.baselines[task, student]
    counts = _run(exp, [base_cell, *(d.eval for d in rows.values())], log)
    base = _correct(exp, base_cell.key)
    ids = list(base)
    store = Store(exp.root)
    # a replicate whose training set came out empty has no adapter and no eval (the scheduler
    # skips them, and the run's warnings say why): the answer rests on the others
    trained = {k: d for k, d in rows.items() if store.complete("eval", d.eval.key)}
    if not trained:
        est = teacher_level.accuracy(
            teacher_level.baseline_arm(np.array([base[i] for i in ids], dtype=float)),
            exp.analysis.ci,
        )
        examples = [_examples(store, d.dataset) for d in rows.values()]
        return {
            "task": task, "teacher": teacher, "student": student, "n": len(ids),
            "baseline": est.estimate, "baseline_low": est.low, "baseline_high": est.high,
            "replicates": 0, "examples": examples,
        }, counts  # fmt: skip
    rows = trained
    draws: dict[int, list[np.ndarray]] = {}
    for (*_, trace_seed, _seed), d in rows.items():
        post = _correct(exp, d.eval.key)
        if post.keys() != base.keys():
            raise UserError(
                f"eval cells {d.eval.key} and {base_cell.key} score different items; delete "
                f"the older one under {exp.root / 'cells' / 'eval'} and re-run."
            )
        draws.setdefault(trace_seed, []).append(np.array([post[i] for i in ids], dtype=float))
    decision = teacher_level.decide_group(
        np.array([base[i] for i in ids], dtype=float),
        {teacher: [np.stack(v) for v in draws.values()]},
        alpha=1 - exp.analysis.ci,
        effect=exp.analysis.effect_of_interest / 100,
        min_replicates=exp.analysis.min_replicates,
    )
    row = decision.teachers[0]
    result = {
        "task": task, "teacher": teacher, "student": student, "n": decision.n_items,
        "baseline": decision.base_acc, "baseline_low": decision.base_low,
        "baseline_high": decision.base_high, **row, "answer": decision.answer,
        "distill": decision.distill, "replicates": len(rows),
    }  # fmt: skip
    return result, counts


def _examples(store: Store, dataset: Any) -> int | None:
    """A dataset cell's number of training examples (None where it is not computed)."""
    manifest = store.manifest("dataset", dataset.key)
    return None if manifest is None else (manifest.get("summary") or {}).get("n_examples")
