"""The `cotgap` command line: one thin command per stage; heavy imports stay inside commands.

    cotgap --help
    cotgap validate configs/sandbox.yaml
    cotgap run configs/sandbox.yaml

User errors print one paragraph and exit with code 2 (usage errors print the usage line, also
exit 2); `--debug` shows the traceback instead. SIGINT (Ctrl-C) and SIGTERM stop the run and its
workers, keep every completed cell and exit 130 / 143: the same command resumes.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from harness import progress
from harness.errors import Interrupted, UserError, stop_on_signals

# Plain help (rich_markup_mode=None): click rewraps each paragraph to the terminal and shows no
# type labels such as `<bool>` next to flags.
_PLAIN = {"no_args_is_help": True, "rich_markup_mode": None}
app = typer.Typer(
    help="cotgap: score every CoT-distilled student against its own pre-distillation baseline.",
    pretty_exceptions_enable=False,
    add_completion=False,
    **_PLAIN,
)
ls_app = typer.Typer(help="List tasks, cells or a task's items.", **_PLAIN)
sandbox_app = typer.Typer(
    help="The CPU sandbox: synthetic tasks and a tiny pretrained model zoo.", **_PLAIN
)
models_app = typer.Typer(help="Model sources that need a step first (GGUF files).", **_PLAIN)
app.add_typer(ls_app, name="ls")
app.add_typer(sandbox_app, name="sandbox")
task_app = typer.Typer(help="Your own tasks: write a task file to start from.", **_PLAIN)
app.add_typer(models_app, name="models")
app.add_typer(task_app, name="task")

_STATE: dict = {"debug": False, "results": None}

# OSErrors the user fixes on their side (disk, permissions, a file where a directory belongs):
# one paragraph and exit 2 like a UserError, not a traceback.
_OS_FIXES = {
    errno.ENOSPC: "free disk space",
    errno.EDQUOT: "free disk space (quota exceeded)",
    errno.EROFS: "use a writable file system",
    errno.EACCES: "fix the permissions or choose another path",
    errno.EPERM: "fix the permissions or choose another path",
    errno.ENOTDIR: "a file stands where a directory is expected; fix the path",
    errno.EISDIR: "a directory stands where a file is expected; fix the path",
    errno.EEXIST: "a file stands where a directory is expected; fix the path",
}

ConfigArg = Annotated[
    Path, typer.Argument(help="experiment YAML", show_default=False, metavar="CONFIG")
]
Stage = Annotated[
    str | None,
    typer.Option(help="run only these stages: generate, train, evaluate, screen (comma-separated)"),
]
Force = Annotated[bool, typer.Option("--force", help="replace an existing --out file")]
Wait = Annotated[
    float, typer.Option(help="seconds to wait for another run holding the results directory")
]
IncludePath = Annotated[
    list[Path] | None,
    typer.Option(
        "--include-path",
        metavar="DIR",
        help="a folder of your own task YAMLs, searched before the built-in tasks (repeatable)",
    ),
]


def _include(paths: list[Path] | None) -> None:
    """Add --include-path folders to the task search path (COTGAP_TASK_PATH, so workers too)."""
    from harness.config.task_paths import include_task_paths

    for p in paths or []:
        if not p.is_dir():
            raise UserError(f"--include-path {p}: no such folder; give a folder of task YAMLs.")
    include_task_paths(paths or [])


def _version(value: bool) -> None:
    if value:
        from harness import __version__

        typer.echo(f"cotgap {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="show tracebacks")] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="print the version and exit"
        ),
    ] = False,
) -> None:
    _STATE["debug"] = debug


def _console(stderr: bool = True) -> Console:
    return progress.console(stderr)


def _log(message: str) -> None:
    """What a run is doing, on stderr with the progress bars (stdout keeps the results)."""
    from rich.markup import escape

    _console().print(escape(message))


def _load(config: Path, runnable: bool = False, include_path: list[Path] | None = None):
    """The experiment of `config`, its tasks also searched in the --include-path folders;
    `runnable`: also refuse one that cannot run as it says (harness/workflow/checks.py), before any cell
    is planned."""
    from harness.config.loading import load_experiment

    _include(include_path)
    exp = load_experiment(config)
    from harness.workflow import offline

    offline.settle(exp)  # before any library that could reach the network is imported
    if runnable:
        from harness.workflow import checks

        checks.check(exp, str(config))
    _STATE["results"] = exp.root  # named by the line an interrupted command prints
    _say_shadowed(exp)
    return exp


def _say_shadowed(exp: Any) -> None:
    """A note for each task of `exp` whose file in a user's task folder replaces a built-in."""
    from harness.config.task_paths import shadowed_builtin

    for t in exp.tasks:
        if found := shadowed_builtin(t.name):
            _log(
                f"note: task {t.name} is read from {found[0]}, which replaces the built-in task "
                f"of that name ({found[1]}); rename your task to use both"
            )


@app.command()
def validate(
    configs: Annotated[list[Path], typer.Argument(help="experiment YAML files", metavar="CONFIG")],
    include_path: IncludePath = None,
) -> None:
    """Check experiment YAML files: file, key path and suggestion for every error: the fields'
    and the unknown tasks at once, then (once the fields parse) the model and data checks."""
    _include(include_path)
    errors: list[str] = []
    for path in configs:
        try:
            exp = _load(path)
            from harness.workflow import grid

            problems = grid.expand_problems(exp)
            if problems:
                errors.extend(f"{path}: {p}" for p in problems)
                continue
            typer.echo(
                f"ok  {path}: {len(exp.teachers)} teachers x {len(exp.students)} students x {len(exp.tasks)} tasks"
            )
            for w in exp.replicate_warnings():
                typer.echo(f"    warning: {w}")
            for (
                m
            ) in exp.teachers:  # the key is read when the engine starts: say now if it is not set
                var = m.engine.api_key_env if m.served else None
                if var and not os.environ.get(var):
                    typer.echo(
                        f"    note: teacher {m.name} reads its API key from ${var}, not set here"
                    )
        except UserError as e:
            errors.append(str(e))
    if errors:
        raise UserError("\n".join(errors))


@ls_app.command("tasks")
def ls_tasks(
    include_path: IncludePath = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            help="directory with your tasks' data files (default $COTGAP_DATA_DIR): the items of "
            "a task read from local files are counted there"
        ),
    ] = None,
) -> None:
    """Every task with its version, splits, sizes and answer type."""
    from rich.table import Table

    _include(include_path)
    from harness.tasks import suite as tasks

    table = Table("task", "version", "answer type", "extractor", "splits")
    root = tasks.data_dir_or_env(data_dir)
    rows = tasks.list_tasks_table(root)
    for row in rows:
        table.add_row(
            str(row["name"]),
            str(row["version"]),
            str(row["answer_type"]),
            str(row["extractor"]),
            str(row["splits"]),
        )
    _console(stderr=False).print(table)
    unsized = [r["name"] for r in rows if r["source"] == "files only" and not r["sizes"]]
    if unsized:
        names = ", ".join(unsized)
        if root:
            _log(f"sizes of {names}: unknown, their data files are not under {root}")
        else:
            _log(f"sizes of {names}: counted from their data files with --data-dir DIR")


@task_app.command("new")
def task_new(
    name: Annotated[str, typer.Argument(help="the task's name: a-z, 0-9, _", metavar="NAME")],
    data: Annotated[
        Path,
        typer.Option(
            help="folder with train.jsonl and test.jsonl, or one .jsonl pool; its parent is the "
            "data dir (--data-dir, data_dir:)"
        ),
    ],
    answer_type: Annotated[str, typer.Option(help="number, choice or text")] = "number",
    out: Annotated[
        Path, typer.Option(help="the folder of your own tasks to write NAME.yaml into")
    ] = Path("my-tasks"),
    force: Force = False,
) -> None:
    """Write a task file for JSONL items (fields question and answer; choices for choice tasks),
    ready for `--include-path` / `task_paths:`; edit its description, fields and prompt."""
    from harness.store import atomic_write_text, output_path
    from harness.tasks import suite as tasks

    if not data.is_dir():
        raise UserError(f"--data {data}: no such folder; give the folder holding the JSONL files.")
    text, notes = tasks.new_task_text(name, data.resolve(), answer_type)
    path = output_path(out / f"{name}.yaml", "--out", [], force)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)
    for note in notes:
        _log(f"note: {note}")
    typer.echo(f"{path}")
    _log(
        f"next: cotgap ls items {name} --include-path {out} --data-dir {data.parent}  "
        f"(or task_paths: [{out}] and data_dir: {data.parent} in a config)"
    )


@ls_app.command("items")
def ls_items(
    task: Annotated[str, typer.Argument(help="task name (see `cotgap ls tasks`)", metavar="TASK")],
    split: Annotated[str, typer.Option(help="train or test")] = "test",
    data_dir: Annotated[Path | None, typer.Option(help="directory with the original files")] = None,
    out: Annotated[Path | None, typer.Option(help="write JSONL here instead of stdout")] = None,
    force: Force = False,
    include_path: IncludePath = None,
) -> None:
    """Write a task's items as JSONL: id, source_index, question, gold; on stderr, the count and
    the source rows the task excludes, with why."""
    _include(include_path)
    from harness.store import output_path
    from harness.tasks import suite as tasks

    out = output_path(out, "--out", [], force) if out is not None else None

    n = tasks.items_jsonl(task, split, data_dir, out)
    excluded = tasks.excluded(task)
    _log(f"{task} {split}: {n} items; {len(excluded)} source rows excluded")
    for e in excluded:
        _log(f"  excluded source_index {e['source_index']}: {e['reason']}")


@ls_app.command("cells")
def ls_cells(config: ConfigArg, include_path: IncludePath = None) -> None:
    """The cells of an experiment on disk: kind, key, state, label, wall time."""
    from rich.table import Table

    from harness.store import Store
    from harness.workflow import grid

    exp = _load(config, include_path=include_path)
    store = Store(exp.root)
    labels = {c.key: c.label for c in grid.expand(exp)}
    table = Table("kind", "key", "state", "cell", "wall s")
    for kind, key, manifest in store.cells():
        state = "complete" if manifest else "partial"
        wall = f"{manifest['wall_s']:.1f}" if manifest else ""
        table.add_row(kind, key, state, labels.get(key, "(not in this config)"), wall)
    _console(stderr=False).print(table)


@app.command("plan")
def plan_cmd(
    config: ConfigArg,
    every_cell: Annotated[
        bool, typer.Option("--all", help="list every cell, also in large grids")
    ] = False,
    include_path: IncludePath = None,
) -> None:
    """Show the cells of an experiment, which exist, which would run, and the work estimate."""
    from harness.execution import plan
    from harness.store import Store

    exp = _load(config, runnable=True, include_path=include_path)
    plan.show(exp, Store(exp.root), every_cell=every_cell)


@app.command()
def run(
    config: ConfigArg,
    only: Stage = None,
    executor: Annotated[
        str | None, typer.Option(help="local | ray (default: the config's)")
    ] = None,
    address: Annotated[str | None, typer.Option(help="Ray cluster address")] = None,
    wait: Wait = 0,
    include_path: IncludePath = None,
) -> None:
    """Run every missing cell of an experiment, then analyse it."""
    from harness.execution import plan
    from harness.execution.schedule import RunOptions, parse_only
    from harness.store import Store

    exp = _load(config, runnable=True, include_path=include_path)
    _say_engine(exp)
    options = RunOptions(parse_only(only), executor or exp.executor, address)
    store = Store(exp.root)
    start = time.time()
    rounds: Callable[[], list] | None = None
    wanted: list | None = None
    if exp.train.race is not None:  # a race: one round after another; --only: its current one
        from harness.analysis import analyze as analysis

        def race_round() -> list:
            return analysis.race_round(exp, store)

        if only is None:
            rounds = race_round
        else:
            wanted = race_round()

    with store.lock(timeout=wait):
        counts = plan.run(exp, store, wanted, options=options, log=_log, rounds=rounds)
        if only is None:
            from harness.analysis import analyze

            _log("analysis: leaderboard, capacity-gap statistics, report and plots")
            out = analyze.run(exp, store)
            _print_summary(out / "answers.csv")
            _console().print(f"answers:     {out / 'answers.csv'}")
            _console().print(f"leaderboard: {out / 'leaderboard.csv'}")
            _console().print(f"report:      {out / 'report.md'}")
            _console().print(f"plots:       {out}/*.png ({len(list(out.glob('*.png')))} files)")
            _console().print(_write_viewer(exp.root, exp.data_dir))
            _track(exp, store)
    _console().print(
        f"computed {sum(counts.values())} cell(s) {counts} in {time.time() - start:.1f} s"
    )
    _say_problems(exp, store)


def _say_problems(exp, store, cells=None) -> None:
    """After a run: index.csv and its by-name links, then every complete cell among `cells`
    (default: the grid's) that gives nothing usable, with the number and the fix."""
    from rich.markup import escape

    from harness.analysis import health
    from harness.workflow import grid, index

    cells = grid.expand(exp).cells if cells is None else cells
    index.write(
        store, cells, note=lambda m: _console().print(f"note: {escape(m)}", highlight=False)
    )
    for line in health.problems(exp, store, cells):
        _console().print(f"[yellow]warning:[/] {escape(line)}", highlight=False, soft_wrap=True)


def _say_engine(exp) -> None:
    from harness.config.schema import vllm_installed

    if "hf" in (exp.generate.engine, exp.evaluate.engine) and not vllm_installed():
        _log("vLLM is not installed here: traces and evaluations run on the transformers engine.")


def _print_summary(answers: Path) -> None:
    """The answer of every (task, student, regime) group (answers.csv): a teacher, none or
    inconclusive, with the quoted teacher's gain and its interval over items and replicates."""
    import csv

    from rich.markup import escape
    from rich.table import Table

    with open(answers, encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    cols: tuple[str, ...] = ("task", "student", "regime", "answer", "distill?", "action")
    cols += (escape("quoted teacher: gain [interval]"), "best set")  # [..] is not markup
    table = Table(*cols, "replicates", title="answers (points; the report explains each word)")

    def pts(v: str) -> str:  # answers.csv holds points
        return "-" if v in ("", "nan") else f"{float(v):+.1f}"

    for r in rows:
        gain = (
            f"{r['quoted_teacher']} {pts(r['gain'])} [{pts(r['gain_low'])}, {pts(r['gain_high'])}]"
        )
        exploratory = " (exploratory)" if r["exploratory"] == "yes" else ""
        gain = gain.strip()  # no teacher is named where the answer is none
        table.add_row(r["task"], r["student"], r["regime"], r["answer"] + exploratory,
                      r["distill"], r["action"], gain, r["best_set"].replace(";", ", "),
                      r["n_replicates"])  # fmt: skip
    _console(stderr=False).print(table)


def _check_names(exp, **filters: str | None) -> None:
    """A model or task named on the command line exists in the experiment (else a UserError)."""
    for key, name in filters.items():
        if name is not None and key in ("model", "teacher", "student"):
            exp.model(name)
        if name is not None and key == "task":
            exp.task(name)


def _stage(
    config: Path,
    stage: str,
    wait: float,
    include_path: list[Path] | None,
    merge: bool = False,
    **filters: str | None,
) -> None:
    from harness.execution import plan
    from harness.execution.schedule import RunOptions
    from harness.store import Store
    from harness.workflow import grid

    exp = _load(config, runnable=True, include_path=include_path)
    if merge:  # merged adapters are other cells (merge is part of an adapter's key)
        exp = exp.model_copy(update={"train": exp.train.model_copy(update={"merge": True})})
    _check_names(exp, **filters)
    store = Store(exp.root)
    cells = grid.expand(exp).select(**filters)
    with store.lock(timeout=wait):
        counts = plan.run(exp, store, cells, RunOptions(frozenset({stage})), log=_log)
    _console().print(f"{stage}: computed {sum(counts.values())} cell(s)")
    _say_problems(exp, store)


@app.command()
def generate(
    config: ConfigArg,
    teacher: Annotated[str | None, typer.Option(help="only this teacher")] = None,
    task: Annotated[str | None, typer.Option(help="only this task")] = None,
    wait: Wait = 0,
    include_path: IncludePath = None,
) -> None:
    """Generate teacher CoT traces (n samples per question, scored) with the configured engine
    (vLLM, or transformers where vLLM is not installed)."""
    _stage(config, "generate", wait, include_path, model=teacher, task=task)


@app.command()
def train(
    config: ConfigArg,
    student: Annotated[str | None, typer.Option(help="only this student")] = None,
    teacher: Annotated[
        str | None, typer.Option(help="only adapters trained on this teacher's traces")
    ] = None,
    task: Annotated[str | None, typer.Option(help="only this task")] = None,
    merge: Annotated[
        bool,
        typer.Option(help="also write a merged model next to the adapter (as train.merge: true)"),
    ] = False,
    wait: Wait = 0,
    include_path: IncludePath = None,
) -> None:
    """Fine-tune students with LoRA (accelerate + peft) on teacher traces."""
    _stage(config, "train", wait, include_path, merge, model=student, teacher=teacher, task=task)


@app.command()
def evaluate(
    config: ConfigArg,
    model: Annotated[str | None, typer.Option(help="only this model (teacher or student)")] = None,
    adapter: Annotated[
        Path | None, typer.Option(help="evaluate this PEFT adapter dir on --model")
    ] = None,
    task: Annotated[str | None, typer.Option(help="only this task")] = None,
    wait: Wait = 0,
    include_path: IncludePath = None,
) -> None:
    """Evaluate teachers, student baselines and distilled students under the one eval config."""
    if adapter is not None:
        from harness.execution import plan
        from harness.store import Store

        if model is None:
            raise UserError(
                "--adapter needs --model NAME: the base model the adapter was trained on."
            )
        exp = _load(config, include_path=include_path)
        store = Store(exp.root)
        with store.lock(timeout=wait):
            keys = plan.evaluate_adapter(exp, store, model, adapter, task)
        _console().print(f"eval cells: {', '.join(keys)}")
        return
    _stage(config, "evaluate", wait, include_path, model=model, task=task)


ResultsDir = Annotated[
    Path,
    typer.Option(
        help="the results folder the cells go to: <results_dir>/<name> of a grid sharing them"
    ),
]
MaxTokens = Annotated[int, typer.Option(help="max new tokens of a completion")]
DataDir = Annotated[
    Path | None, typer.Option(help="directory with the task files' data (as data_dir:)")
]
Dtype = Annotated[str, typer.Option(help="model dtype (auto, float32, bfloat16, ...)")]


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise UserError(f"--seeds {text}: give integers separated by commas, e.g. 0,1,2.") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise UserError(f"--seeds {text}: give one or more distinct integers, e.g. 0,1,2.")
    return seeds


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


@app.command("eval")
def eval_cmd(
    model: Annotated[
        str,
        typer.Argument(
            help="a local folder, hub id, sandbox:<zoo model> or gguf:<file>", metavar="MODEL"
        ),
    ],
    tasks: Annotated[str, typer.Option(help="task names, comma-separated (`cotgap ls tasks`)")],
    limit: Annotated[int | None, typer.Option(help="first N test items of each task")] = None,
    results_dir: ResultsDir = Path("results/quick"),
    max_tokens: MaxTokens = 512,
    dtype: Dtype = "auto",
    data_dir: DataDir = None,
    include_path: IncludePath = None,
) -> None:
    """Evaluate one model on named tasks without a YAML: accuracy with its 95% interval per task.
    The eval cells are the grid's own: a grid with the same model, task limit and eval settings
    in the same results folder reuses them."""
    from rich.table import Table

    from harness import quick
    from harness.store import Store
    from harness.workflow import grid

    _include(include_path)
    names = [t.strip() for t in tasks.split(",") if t.strip()]
    settings = quick.Settings(max_tokens=max_tokens, dtype=dtype)
    exp = quick.experiment([model], [model], names, limit, results_dir, settings, data_dir=data_dir)
    _STATE["results"] = exp.root
    _say_shadowed(exp)
    _say_engine(exp)
    rows, counts = quick.evaluate(exp, log=_log)
    table = Table("task", "model", "items", "accuracy % [95% interval]", "cell")
    for r in rows:
        acc = f"{_pct(r['accuracy'])} [{_pct(r['low'])}, {_pct(r['high'])}]"
        table.add_row(r["task"], r["model"], str(r["n"]), acc, r["path"])
    _console(stderr=False).print(table)
    _console().print(f"computed {sum(counts.values())} cell(s) in {exp.root}")
    evaluated = grid.expand(exp).select(kind="eval", role="baseline")  # not the model as teacher
    _say_problems(exp, Store(exp.root), evaluated)


@app.command()
def distill(
    teacher: Annotated[str, typer.Option(help="the teacher: folder, hub id, sandbox:, gguf:")],
    student: Annotated[str, typer.Option(help="the student: folder, hub id, sandbox:, gguf:")],
    task: Annotated[str, typer.Option(help="task name (`cotgap ls tasks`)")],
    limit: Annotated[int | None, typer.Option(help="first N test items")] = None,
    train_limit: Annotated[
        int | None, typer.Option(help="first N train items the teacher writes traces for")
    ] = 400,
    seeds: Annotated[
        str, typer.Option(help="replicates: trace draw k trains with seed k (3 for a verdict)")
    ] = "0",
    max_steps: Annotated[int, typer.Option(help="training steps of each adapter")] = 100,
    lr: Annotated[float, typer.Option(help="learning rate")] = 2e-4,
    batch_size: Annotated[int, typer.Option(help="per-device batch size")] = 8,
    samples: Annotated[int, typer.Option(help="traces per training question")] = 2,
    temperature: Annotated[float, typer.Option(help="sampling temperature of the traces")] = 0.7,
    effect: Annotated[
        float,
        typer.Option(
            help="effect of interest in points (the equivalence margin; "
            "analysis.effect_of_interest's default)"
        ),
    ] = 3.0,  # analysis.effect_of_interest's default (tests/test_quick.py holds them equal)
    results_dir: ResultsDir = Path("results/quick"),
    max_tokens: MaxTokens = 512,
    dtype: Dtype = "auto",
    data_dir: DataDir = None,
    include_path: IncludePath = None,
) -> None:
    """One teacher-student pair without a YAML: generate traces, train, evaluate, then the gain
    over the student's baseline with its interval and verdict. Cells are the grid's own."""
    from harness import quick
    from harness.store import Store

    _include(include_path)
    settings = quick.Settings(
        max_tokens=max_tokens, dtype=dtype, samples=samples, temperature=temperature,
        max_steps=max_steps, lr=lr, batch_size=batch_size, effect=effect,
    )  # fmt: skip
    exp = quick.experiment(
        [teacher],
        [student],
        [task],
        limit,
        results_dir,
        settings,
        train_limit,
        _seeds(seeds),
        data_dir,
    )
    _STATE["results"] = exp.root
    _say_shadowed(exp)
    _say_engine(exp)
    r, counts = quick.distill(exp, log=_log)
    out = _console(stderr=False)
    out.print(
        f"{r['task']}: {r['student']} from {r['teacher']} ({r['n']} test items, "
        f"{r['replicates']} replicate(s))"
    )
    baseline = (
        f"  baseline {_pct(r['baseline'])}% [{_pct(r['baseline_low'])}, {_pct(r['baseline_high'])}]"
    )
    if not r["replicates"]:
        examples = ", ".join("?" if n is None else str(n) for n in r["examples"])
        out.print(baseline)
        out.print(
            f"  no distilled student: the teacher's traces gave no training example (examples "
            f"per trace draw: {examples}), so nothing was trained or evaluated; the warnings "
            "below say why and what to change"
        )
        _console().print(f"computed {sum(counts.values())} cell(s) {counts} in {exp.root}")
        _say_problems(exp, Store(exp.root))
        return
    level = f"{100 * r['level']:g}%"
    out.print(f"{baseline}, distilled {_pct(r['post_acc'])}%")
    out.print(
        f"  gain {100 * r['gain']:+.1f} pts [{100 * r['gain_low']:+.1f}, "
        f"{100 * r['gain_high']:+.1f}] ({level} interval): {r['verdict']}"
    )
    if r["exploratory"]:
        out.print(
            f"  exploratory: {r['replicates']} replicate(s); a verdict needs "
            f"{exp.analysis.min_replicates} (--seeds 0,1,2)"
        )
    else:
        out.print(f"  distill? {r['distill']}")
    _console().print(f"computed {sum(counts.values())} cell(s) {counts} in {exp.root}")
    _say_problems(exp, Store(exp.root))


@app.command()
def score(
    task: Annotated[str | None, typer.Option(help="task name (see `cotgap ls tasks`)")] = None,
    predictions: Annotated[Path | None, typer.Option(help="JSONL of {id, completion}")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="directory with the original files")] = None,
    split: Annotated[str, typer.Option(help="split the ids belong to")] = "test",
    out: Annotated[
        Path | None, typer.Option(help="per-item results JSONL (default: next to predictions)")
    ] = None,
    explain: Annotated[
        bool,
        typer.Option(
            "--explain", help="per item: answers, the rule and span they came from, or why none"
        ),
    ] = False,
    results: Annotated[
        Path | None,
        typer.Option(help="re-score every eval cell of this results directory instead"),
    ] = None,
    partial: Annotated[
        bool,
        typer.Option("--partial", help="score a file that misses items (they count as incorrect)"),
    ] = False,
    force: Force = False,
    include_path: IncludePath = None,
) -> None:
    """Re-score stored completions without any engine; prints the summary as JSON (with its
    coverage: items with a prediction / items). A file that misses items is refused unless
    --partial. With --results, every eval cell of a results directory (cells untouched; --out
    is the folder)."""
    _include(include_path)
    from harness.store import output_path
    from harness.tasks import scoring

    if results is not None:
        out = output_path(out, "--out", [results], directory=True) if out else None
        summaries = scoring.rescore_results(results, data_dir, out)
        typer.echo(json.dumps(summaries, indent=2))
        return
    if task is None or predictions is None:
        raise UserError("give --task and --predictions, or --results DIR.")
    default = predictions.with_name(predictions.stem + ".scored.jsonl")  # replaced on each run
    out = output_path(out or default, "--out", [predictions], force or out is None)
    summary = scoring.score_file(
        task, predictions, data_dir=data_dir, split=split, out_path=out, partial=partial
    )
    _log(f"coverage: {summary['n'] - summary['missing']} of {summary['n']} items have a prediction")
    if summary.get("missing"):
        _log(
            f"{summary['missing']} of {summary['n']} items have no prediction "
            "(scored incorrect; their ids are in missing_ids; accuracy over the predicted items: "
            f"{summary['accuracy_on_predicted']:.4f})"
        )
    if explain:
        for line in scoring.explain_file(summary["out"]):
            typer.echo(line)
    typer.echo(json.dumps(summary, indent=2))


@app.command()
def check(
    target: Annotated[
        Path,
        typer.Argument(
            help="experiment YAML, or its results directory", show_default=False, metavar="TARGET"
        ),
    ],
    include_path: IncludePath = None,
) -> None:
    """Verify every complete cell's files against its manifest; list the damaged cells."""
    from harness.store import Store

    root = _load(target, include_path=include_path).root if target.is_file() else target
    if not (root / "cells").is_dir():
        raise UserError(f"{root}: no cells/ here; give an experiment YAML or <results_dir>/<name>.")
    store = Store(root)
    broken = store.check()
    cells = [d for d in (root / "cells").glob("*/*") if d.is_dir()]
    complete = sum(1 for d in cells if (d / "manifest.json").exists())
    if broken:
        listed = "; ".join(f"{kind}/{key}: {why}" for kind, key, why in broken)
        raise UserError(
            f"{root}: {len(broken)} of {complete} complete cells are damaged: {listed}. Delete "
            f"those cell directories (under {root / 'cells'}) and re-run to recompute them."
        )
    typer.echo(
        f"ok  {root}: {complete} complete cells match their manifests; "
        f"{len(cells) - complete} unfinished (a re-run resumes them)"
    )


@app.command()
def screen(
    config: ConfigArg,
    student: Annotated[str | None, typer.Option(help="only this student")] = None,
    task: Annotated[str | None, typer.Option(help="only this task")] = None,
    wait: Wait = 0,
    include_path: IncludePath = None,
) -> None:
    """Screen teachers before training: one forward pass of each student over each training set
    (NLL, token ranks, rank-surprisal ratio), then analysis/screen.csv. No adapter is trained."""
    from harness.analysis import analyze as analysis
    from harness.analysis import screening
    from harness.execution import plan
    from harness.store import Store
    from harness.workflow import grid

    exp = screening.screened(_load(config, runnable=True, include_path=include_path))
    _check_names(exp, student=student, task=task)
    store = Store(exp.root)
    cells = grid.expand(exp).select(kind="screen", model=student, task=task)
    with store.lock(timeout=wait):
        counts = plan.run(exp, store, cells, log=_log)  # with the traces and datasets they need
        board = analysis.leaderboard(exp, store)[0]
        out = store.root / "analysis"
        out.mkdir(parents=True, exist_ok=True)
        posts = lambda: analysis.item_posts(exp, store, board)  # noqa: E731
        result = screening.write(out, exp, store, board, posts)
    _console().print(f"screen: computed {counts.get('screen', 0)} screen cell(s)")
    if result:
        _console().print(f"screen table: {out / 'screen.csv'}")


@app.command()
def analyze(config: ConfigArg, wait: Wait = 0, include_path: IncludePath = None) -> None:
    """Rebuild leaderboard.csv, analysis.json, report.md and plots from the cells."""
    from harness.analysis import analyze as analysis
    from harness.store import Store

    exp = _load(config, include_path=include_path)
    store = Store(exp.root)
    with store.lock(timeout=wait):
        out = analysis.run(exp, store)
        viewer = _write_viewer(exp.root, exp.data_dir)
        _track(exp, store)
    _console().print(f"leaderboard: {out / 'leaderboard.csv'}\nreport:      {out / 'report.md'}")
    _console().print(viewer)


def _track(exp, store) -> None:
    """Log the cells to the trackers `tracking:` turns on (MLflow, W&B offline); off by default."""
    if exp.tracking.mlflow is not None or exp.tracking.wandb is not None:
        from harness.present import tracking

        tracking.log(exp, store, say=_log)


def _write_viewer(root: Path, data_dir: str | None) -> str:
    """The HTML viewer next to the fresh analysis (seconds), and the line that names it; a problem
    with it is a warning, since the analysis itself is complete. `data_dir`: the config's, where
    the questions of file-sourced tasks are read."""
    from rich.markup import escape

    from harness.present import view

    try:
        path = view.write(root, data_dir=Path(data_dir) if data_dir else None)
    except UserError as e:
        return escape(f"viewer:      not written: {e} (`cotgap view {root}` retries)")
    return escape(f"viewer:      {path} ({path.stat().st_size / 1e6:.2f} MB, opens from file://)")


@app.command()
def view(
    target: Annotated[
        Path,
        typer.Argument(
            help="experiment YAML, or its results directory", show_default=False, metavar="TARGET"
        ),
    ],
    out: Annotated[
        Path | None, typer.Option(help="where to write (default: analysis/viewer.html)")
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(help="benchmark files, for the questions (default: the config's data_dir)"),
    ] = None,
    force: Force = False,
    include_path: IncludePath = None,
) -> None:
    """Write one self-contained HTML file (leaderboard, figures, per-item flips) and print its path."""
    from harness.present import view as viewer
    from harness.store import output_path

    _include(include_path)
    if out is not None:
        analysis = viewer.resolve_root(target)[0] / "analysis"
        read = [p for p in analysis.glob("*") if p.name != "viewer.html"]
        out = output_path(out, "--out", [target, *read], force)

    path = viewer.write(target, out, data_dir)
    typer.echo(
        f"{path}  ({path.stat().st_size / 1e6:.2f} MB; open it in a browser, no server needed)"
    )


@app.command()
def export(
    config: ConfigArg,
    out: Annotated[Path, typer.Option(help="directory to write (replaced whole if an export)")],
    include_path: IncludePath = None,
) -> None:
    """Traces, training sets, predictions and the leaderboard as Hugging Face Parquet + a card."""
    from harness.present import export as exporter
    from harness.store import output_path

    exp = _load(config, include_path=include_path)
    out = output_path(out, "--out", [config, exp.root], directory=True)
    path, counts = exporter.run(exp, out, log=_log)
    typer.echo(f"{path}  ({counts['files']} Parquet files, {counts['rows']} rows; card: README.md)")


@sandbox_app.command("build")
def sandbox_build(
    names: Annotated[
        list[str] | None,
        typer.Argument(help="zoo models (default: all of the profile)", metavar="NAME"),
    ] = None,
    profile: Annotated[str, typer.Option(help="demo or test")] = "demo",
    check: Annotated[
        bool, typer.Option("--check", help="compare the rebuild's accuracies with the shipped zoo")
    ] = False,
    ship: Annotated[
        bool,
        typer.Option("--ship", help="maintainers: replace the shipped models with the rebuild"),
    ] = False,
    seed: Annotated[
        int | None,
        typer.Option(min=0, max=2**32 - 1, help="replace every recipe's seed (a robustness check)"),
    ] = None,
) -> None:
    """Rebuild the tiny model zoo from scratch on CPU into the cache (the demo uses the shipped one).

    The precision follows the CPU (bf16 where native, else fp32); COTGAP_PRECISION=fp32 forces it."""
    from harness.sandbox import zoo

    zoo.build_cli(names or None, profile, check=check, ship=ship, seed=seed)


@sandbox_app.command("verify")
def sandbox_verify() -> None:
    """Check every shipped zoo file against its sha256."""
    import time

    from harness.sandbox import zoo

    start = time.perf_counter()
    names = [n for n in zoo.ZOO if zoo.shipped(n)]
    for name in names:
        zoo.verify_shipped(name)
    stale = sorted(set(zoo.ZOO) - set(names))
    msg = (
        f"shipped zoo: {len(names)} models verified (sha256) in {time.perf_counter() - start:.2f} s"
    )
    _console().print(
        msg + (f"; not shipped for today's recipe: {', '.join(stale)}" if stale else "")
    )


@models_app.command("import")
def models_import(
    source: Annotated[
        str,
        typer.Argument(help="a .gguf file or an installed package holding one", metavar="SOURCE"),
    ],
) -> None:
    """De-quantise a GGUF file into a cached Hugging Face directory and print it (then use
    `path: gguf:<the same>` in a config)."""
    from harness.models import gguf

    print(gguf.convert(source.removeprefix(gguf.PREFIX), f"cotgap models import {source}"))


def _usage_error() -> type[Exception]:
    """click's ClickException as typer raises it (typer vendors click as typer._click)."""
    return next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def main() -> None:
    from harness.workflow.offline import NO_TELEMETRY

    for name, value in NO_TELEMETRY.items():  # usage statistics and telemetry: never needed
        os.environ.setdefault(name, value)
    # OpenMP threads that sleep rather than spin while they wait, read when torch is first
    # imported (here or in a stage's child): with any other busy process on a small CPU, spinning
    # threads made vLLM's CPU generation about 5x slower (benchmarks/README.md)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    stop_on_signals()
    try:
        code = app(standalone_mode=False, prog_name="cotgap")
    except UserError as e:
        if _STATE["debug"]:
            raise
        from rich.markup import escape  # messages hold key paths and lists: `teachers[0]`, `[a, b]`

        _console().print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        sys.exit(e.exit_code)
    except (Interrupted, KeyboardInterrupt) as e:
        signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
        results = _STATE["results"]
        kept = f"results in {results} are kept" if results else "nothing was lost"
        print(
            f"interrupted ({signal.Signals(signum).name}): {kept}; re-run the same command to "
            "resume.",
            file=sys.stderr,
        )
        sys.exit(128 + signum)
    except Exception as e:
        if isinstance(e, _usage_error()):  # usage: the usage line and the problem, exit 2
            e.show()  # type: ignore[attr-defined]  # click's ClickException.show
            sys.exit(2)
        fix = _OS_FIXES.get(e.errno) if isinstance(e, OSError) and e.errno is not None else None
        if fix is None or _STATE["debug"] or not isinstance(e, OSError):
            raise
        from rich.markup import escape

        where = f"{e.filename}: " if e.filename else ""
        msg = f"{where}{e.strerror}; {fix}, then re-run (completed cells are kept)."
        _console().print(f"[bold red]error:[/] {escape(msg)}", highlight=False, soft_wrap=True)
        sys.exit(2)
    if isinstance(code, int) and code:  # typer.Exit(code), and typer's Ctrl-C outside a command
        sys.exit(code)
