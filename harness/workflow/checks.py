"""Whether an experiment can do what it says: the checks beyond the schema, run by `validate`,
`plan` and every command that computes, before any engine starts.

    cotgap validate configs/sandbox.yaml

Each check returns `key path: problem; what to do` lines, all at once. The rules:

- `train.budget.regimes` names only regimes of `train.regimes` (otherwise its alignments train
  nothing), every alignment other than `none` aligns at least one of them, and `batch` (the mix
  at the training's own batch) has a mix to align.
- `train.mix`: each teacher once, and no weight so small that its teacher cannot give one example:
  teacher i gives at most floor(N x w_i / w_max) examples, N = train items x `generate.n`.
- `train.filter_drop`: what can remain, floor(N x (1 - filter_drop)), fills one optimizer batch
  (per_device_batch_size x grad_accum x num_processes).
- A `few_shot_cot` prompt (select, generate, evaluate) needs the task's few-shot file.
- `train.race` races over trace draws: `generate.seeds` lists `max_replicates` of them, and the
  first look has at least `analysis.min_replicates` (else it could stop nothing).
- `tracking:` sections need their package installed (the `tracking` extra).
- A task's items can be read: a task of local files alone has a data dir, and a data dir holds
  the files of every task (with one, every task but a sandbox one reads its files).
"""

from __future__ import annotations

import importlib.util
import math

from harness.config.schema import Experiment
from harness.errors import UserError
from harness.tasks import answers
from harness.tasks import suite as tasks


def problems(exp: Experiment) -> list[str]:
    """Every problem of `exp`, one `key path: problem; what to do` line each."""
    return [
        *_task_files(exp),
        *_extractor(exp),
        *_budget(exp),
        *_mix(exp),
        *_filter(exp),
        *_few_shot(exp),
        *_tracking(exp),
        *_race(exp),
    ]


def check(exp: Experiment, source: str) -> None:
    """Raise a UserError listing every problem of `exp` (read from `source`), if any."""
    if lines := problems(exp):
        raise UserError("\n".join(f"{source}: {line}" for line in lines))


def _extractor(exp: Experiment) -> list[str]:
    name = exp.evaluate.extractor
    if name is None or name in answers.EXTRACTORS:
        return []
    valid = ", ".join(sorted(answers.EXTRACTORS))
    return [f"evaluate.extractor: unknown extractor {name!r}; valid: {valid}"]


def _budget(exp: Experiment) -> list[str]:
    train, out = exp.train, []
    chosen = train.budget.regimes
    if chosen is not None:
        stray = [r for r in chosen if r not in train.regimes]
        if stray:
            out.append(
                f"train.budget.regimes: {stray} not in train.regimes {list(train.regimes)}; "
                "add them to train.regimes or remove them here"
            )
        elif not set(chosen) & set(train.regimes) and set(train.budget.align) - {"none"}:
            out.append(
                f"train.budget: align {list(train.budget.align)} aligns none of train.regimes "
                f"{list(train.regimes)}: no adapter would train under it"
            )
    if "batch" in train.budget.align and "mix" not in train.regimes:
        out.append(
            "train.budget.align: batch trains the mix at the training's own batch, but "
            f"train.regimes {list(train.regimes)} has no mix; add mix or remove batch"
        )
    return out


def _task_files(exp: Experiment) -> list[str]:
    out = []
    for i, ref in enumerate(exp.tasks):
        try:
            problem = tasks.files_problem(ref.name, exp.data_dir)
        except UserError:
            continue  # an unloadable task is reported by the task checks
        if problem:
            out.append(f"tasks[{i}]: {problem}")
    return out


def _most_examples(exp: Experiment) -> dict[str, int]:
    """Per task, the most examples a teacher's training set can hold: train items x generate.n."""
    out = {}
    for ref in exp.tasks:
        try:
            size = tasks.split_sizes(ref.name).get("train")
        except UserError:
            continue  # an unloadable task is reported by the task checks
        if size is not None:
            out[ref.name] = min(size, ref.train_limit or size) * exp.generate.n
    return out


def _mix(exp: Experiment) -> list[str]:
    parts, out = exp.train.mix, []
    names = [p.teacher for p in parts]
    for i, p in enumerate(parts):
        if names.index(p.teacher) != i:
            out.append(
                f"train.mix[{i}].teacher: {p.teacher!r} is already train.mix"
                f"[{names.index(p.teacher)}]; give each teacher once, with its total weight"
            )
    if not parts:
        return out
    top = max(p.weight for p in parts)
    for task, n in _most_examples(exp).items():
        for i, p in enumerate(parts):
            if math.floor(n * p.weight / top + 1e-9) < 1:
                out.append(
                    f"train.mix[{i}].weight: {p.weight:g} against the largest {top:g} gives "
                    f"teacher {p.teacher!r} no example on task {task} (at most {n} traces per "
                    f"teacher: it gives at most {n} x {p.weight:g} / {top:g}); raise the weight "
                    "or drop the teacher from the mix"
                )
    return out


def _filter(exp: Experiment) -> list[str]:
    train = exp.train
    if not train.filter_drop:
        return []
    batch = train.per_device_batch_size * train.grad_accum * train.num_processes
    out = []
    for task, n in _most_examples(exp).items():
        kept = math.floor(n * (1 - train.filter_drop))
        if kept < batch:
            out.append(
                f"train.filter_drop: {train.filter_drop:g} keeps at most {kept} of the {n} "
                f"traces a teacher can give on task {task}, less than one optimizer batch "
                f"({batch}); lower filter_drop to at most {1 - batch / n:.3g} or use more items"
            )
    return out


def _few_shot(exp: Experiment) -> list[str]:
    styles = {"generate": exp.generate.prompt_style, "evaluate": exp.evaluate.prompt_style}
    if exp.select is not None:
        styles["select"] = exp.select.prompt_style
    wanted = [k for k, style in styles.items() if style == "few_shot_cot"]
    out = []
    for i, ref in enumerate(exp.tasks):
        try:
            spec = tasks.load_task(ref.name)
        except UserError:
            continue
        out += [
            f"{key}.prompt_style: few_shot_cot, but task {ref.name} (tasks[{i}]) has no few-shot "
            "exemplars; use zero_shot_cot or add a fewshot: file to its task YAML"
            for key in wanted
            if spec.fewshot is None
        ]
    return out


def _tracking(exp: Experiment) -> list[str]:
    out = []
    for key, module in (("mlflow", "mlflow"), ("wandb", "wandb")):
        if getattr(exp.tracking, key) is not None and importlib.util.find_spec(module) is None:
            out.append(
                f"tracking.{key}: the {module} package is not installed; "
                "`pip install 'cotgap[tracking]'` or remove the section"
            )
    return out


def _race(exp: Experiment) -> list[str]:
    race = exp.train.race
    if race is None:
        return []
    out, draws = [], len(exp.generate.trace_seeds)
    if draws != race.max_replicates:
        out.append(
            f"train.race.max_replicates: {race.max_replicates}, but generate.seeds lists {draws} "
            "trace draw(s); a race adds one trace draw per round, so list exactly max_replicates "
            "seeds in generate.seeds (and as many train.seeds with train.replicates: paired)"
        )
    if race.min_replicates < exp.analysis.min_replicates:
        out.append(
            f"train.race.min_replicates: {race.min_replicates} is below "
            f"analysis.min_replicates {exp.analysis.min_replicates}, so the first look would be "
            "exploratory and stop no teacher; raise min_replicates to at least "
            f"{exp.analysis.min_replicates}"
        )
    return out
