"""Quick commands and own tasks: `cotgap eval` and `cotgap distill` without a YAML, in the grid's
own cells; task folders added by `--include-path` and `task_paths:`; `cotgap task new`.

    pytest -q tests/test_quick.py

The eval and distill tests run the shipped sandbox zoo on a few items (nothing is mocked).
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def cotgap(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "COTGAP_TASK_PATH"}
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**environ, "PYTHONPATH": str(REPO), **(env or {})},
    )


def _own_task(tmp_path: Path, answer_type: str = "number") -> tuple[Path, Path]:
    """A data dir with mine/sums/{train,test}.jsonl and the `my-tasks/` folder task new writes by
    default (never the built-in `tasks/` of a checkout it is run in)."""
    data = tmp_path / "mine" / "sums"
    data.mkdir(parents=True)
    rows = [{"question": f"What is {a} + {a + 1}?", "answer": str(2 * a + 1)} for a in range(6)]
    for split in ("train", "test"):
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = cotgap("task", "new", "my_sums", "--data", str(data), "--answer-type", answer_type,
                 cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "tasks").exists()
    return tmp_path / "my-tasks", tmp_path / "mine"


# --- own tasks -----------------------------------------------------------------------------------


def test_task_new_writes_a_task_that_loads_and_scores(tmp_path, monkeypatch):
    tasks_dir, data_dir = _own_task(tmp_path)
    assert (tasks_dir / "my_sums.yaml").is_file()
    listed = cotgap("ls", "tasks", "--include-path", str(tasks_dir), cwd=tmp_path)
    assert listed.returncode == 0 and "my_sums" in listed.stdout, listed.stderr
    without = cotgap("ls", "tasks", cwd=tmp_path)
    assert "my_sums" not in without.stdout  # only where its folder is included

    from harness.config import task_paths
    from harness.tasks import scoring
    from harness.tasks import suite as tasks

    monkeypatch.setenv("COTGAP_TASK_PATH", str(tasks_dir))
    items = tasks.load_items("my_sums", "test", data_dir)
    assert [i.question for i in items][:2] == ["What is 0 + 1?", "What is 1 + 2?"]
    assert task_paths.task_file("my_sums") == tasks_dir / "my_sums.yaml"
    preds = tmp_path / "preds.jsonl"
    right, wrong = items[2], items[3]
    preds.write_text(
        json.dumps({"id": right.id, "completion": f"So the answer is {right.gold}."}) + "\n"
        + json.dumps({"id": wrong.id, "completion": "The answer is 1000."}) + "\n"
    )  # fmt: skip
    out = tmp_path / "scored.jsonl"
    summary = scoring.score_file("my_sums", preds, data_dir=data_dir, out_path=out, partial=True)
    scored = {r["id"]: r["correct"] for r in map(json.loads, out.read_text().splitlines())}
    assert scored[right.id] is True and scored[wrong.id] is False
    assert summary["n"] == len(items)


def test_task_new_keeps_the_fields_the_data_has(tmp_path, monkeypatch):
    """Rows with their own ids (and worked solutions): the task reads them, so predictions keyed
    by the user's ids score; a field the data has is never left out of the task."""
    from harness.tasks import scoring
    from harness.tasks import suite as tasks

    data = tmp_path / "mine" / "sums"
    data.mkdir(parents=True)
    rows = [
        {"id": f"sum-{a:03d}", "question": f"What is {a} + 1?", "answer": str(a + 1),
         "rationale": f"{a} + 1 = {a + 1}."}
        for a in range(10)
    ]  # fmt: skip
    (data / "pool.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text, notes = tasks.new_task_text("own_ids", data)
    spec = yaml.safe_load(text)
    assert spec["fields"]["id"] == "id" and spec["fields"]["rationale"] == "rationale"
    assert notes == []
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "own_ids.yaml").write_text(text)
    monkeypatch.setenv("COTGAP_TASK_PATH", str(tmp_path / "tasks"))
    items = tasks.load_items("own_ids", "test", tmp_path / "mine")
    assert items and all(i.id in {r["id"] for r in rows} for i in items)
    preds = tmp_path / "preds.jsonl"
    preds.write_text(
        "".join(json.dumps({"id": i.id, "completion": f"The answer is {i.gold}."}) + "\n"
                for i in items)
    )  # fmt: skip
    summary = scoring.score_file("own_ids", preds, data_dir=tmp_path / "mine")
    assert summary["n"] == len(items) and summary["accuracy"] == 1.0


def test_task_new_choice_and_pool_validate(tmp_path):
    data = tmp_path / "d" / "quiz"
    data.mkdir(parents=True)
    row = {"question": "Which is even?", "choices": ["3", "4"], "answer": "B"}
    (data / "items.jsonl").write_text(json.dumps(row) + "\n")
    out = cotgap("task", "new", "quiz", "--data", str(data), "--answer-type", "choice",
                 cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    spec = yaml.safe_load((tmp_path / "my-tasks" / "quiz.yaml").read_text())
    assert spec["source"]["files"]["splits"] == {"all": ["quiz/items.jsonl"]}
    assert spec["answer_type"] == "choice" and spec["fields"]["choices"] == "choices"
    again = cotgap("task", "new", "quiz", "--data", str(data), cwd=tmp_path)
    assert again.returncode == 2 and "--force" in again.stderr


def test_task_new_refuses_a_folder_without_jsonl(tmp_path):
    (tmp_path / "empty").mkdir()
    out = cotgap("task", "new", "x", "--data", str(tmp_path / "empty"), cwd=tmp_path)
    assert out.returncode == 2
    assert "train.jsonl and test.jsonl" in out.stderr
    assert not (tmp_path / "my-tasks" / "x.yaml").exists()


def test_task_paths_key_is_relative_to_the_config(tmp_path):
    tasks_dir, _ = _own_task(tmp_path)
    (tmp_path / "conf").mkdir()
    cfg = {
        "name": "own",
        "task_paths": ["../my-tasks"],
        "data_dir": "../mine",
        "teachers": [{"name": "t", "path": "sandbox:teacher-s"}],
        "students": [{"name": "s", "path": "sandbox:student-xs"}],
        "tasks": ["my_sums"],
        "train": {"max_steps": 2},
    }
    path = tmp_path / "conf" / "own.yaml"
    path.write_text(yaml.safe_dump(cfg))
    ok = cotgap("validate", str(path), cwd=REPO)
    assert ok.returncode == 0, ok.stderr
    path.write_text(yaml.safe_dump({**cfg, "task_paths": ["../nowhere"]}))
    bad = cotgap("validate", str(path), cwd=REPO)
    assert bad.returncode == 2 and "task_paths[0]" in bad.stderr
    path.write_text(yaml.safe_dump({k: v for k, v in cfg.items() if k != "task_paths"}))
    unknown = cotgap("validate", str(path), cwd=REPO)
    assert unknown.returncode == 2 and "unknown task 'my_sums'" in unknown.stderr
    flag = cotgap("validate", str(path), "--include-path", str(tasks_dir), cwd=REPO)
    assert flag.returncode == 0, flag.stderr


def test_ls_tasks_counts_the_items_of_an_own_task_under_its_data_dir(tmp_path):
    """A task read from local files has no `sizes` in its YAML: `ls tasks` counts its items
    where its data dir is given (as `ls items` counts them), and says how where it is not."""
    tasks_dir, data_dir = _own_task(tmp_path)
    (data_dir / "sums" / "test.jsonl").write_text('{"question": "What is 1 + 1?", "answer": "2"}\n')

    def row(out: subprocess.CompletedProcess) -> str:
        assert out.returncode == 0, out.stderr
        return next(x for x in out.stdout.splitlines() if "my_sums" in x)

    no_env = {"COTGAP_DATA_DIR": ""}
    counted = cotgap("ls", "tasks", "--include-path", str(tasks_dir), "--data-dir", str(data_dir),
                     cwd=tmp_path, env=no_env)  # fmt: skip
    assert "train 6 / test 1" in row(counted) and "my_sums" not in counted.stderr
    from_env = cotgap("ls", "tasks", "--include-path", str(tasks_dir), cwd=tmp_path,
                      env={"COTGAP_DATA_DIR": str(data_dir)})  # fmt: skip
    assert "train 6 / test 1" in row(from_env)
    unknown = cotgap("ls", "tasks", "--include-path", str(tasks_dir), cwd=tmp_path, env=no_env)
    assert "train 6" not in row(unknown)
    assert "sizes of my_sums: counted from their data files with --data-dir DIR" in unknown.stderr
    elsewhere = cotgap("ls", "tasks", "--include-path", str(tasks_dir), "--data-dir",
                       str(tmp_path), cwd=tmp_path, env=no_env)  # fmt: skip
    assert "train 6" not in row(elsewhere) and f"not under {tmp_path}" in elsewhere.stderr


def test_an_own_task_without_its_files_fails_at_validate_and_plan(tmp_path):
    """A task read from local files alone needs a data dir holding them: validate and plan say
    so (exit 2, the task, the files, the key to set), not the first stage of a run."""
    tasks_dir, data_dir = _own_task(tmp_path)
    cfg = {
        "name": "own", "task_paths": ["my-tasks"], "results_dir": "res",
        "teachers": [{"name": "t", "path": "sandbox:teacher-s"}],
        "students": [{"name": "s", "path": "sandbox:student-xs"}],
        "tasks": ["my_sums"], "train": {"max_steps": 2},
    }  # fmt: skip
    no_env = {"COTGAP_DATA_DIR": ""}
    path = tmp_path / "own.yaml"
    path.write_text(yaml.safe_dump(cfg))
    for cmd in ("validate", "plan"):
        out = cotgap(cmd, str(path), cwd=tmp_path, env=no_env)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        said = " ".join(out.stderr.split())
        assert "tasks[0]: task my_sums reads local files only (sums/train.jsonl, " in said
        assert "set data_dir: in the config" in said
    (data_dir / "sums" / "test.jsonl").unlink()
    path.write_text(yaml.safe_dump({**cfg, "data_dir": "mine"}))
    out = cotgap("validate", str(path), cwd=tmp_path, env=no_env)
    said = " ".join(out.stderr.split())
    assert out.returncode == 2 and f"no file {data_dir / 'sums' / 'test.jsonl'};" in said, said
    assert "sums/train.jsonl" not in said  # the file that is there is not named
    assert not (tmp_path / "res").exists()


def test_eval_of_a_mistyped_folder_says_so_once_by_the_name_given(tmp_path):
    """`cotgap eval models/x`: models/ is a folder here, so models/x is a local path (not a hub
    id); the one model is evaluated in two roles, and its error is said once, by its own name."""
    (tmp_path / "models" / "my-student").mkdir(parents=True)
    out = cotgap("eval", "models/my-studnet", "--tasks", "sandbox_addition", "--limit", "2",
                 cwd=tmp_path)  # fmt: skip
    said = " ".join(out.stderr.split())
    assert out.returncode == 2 and "Traceback" not in said, said
    assert said.count("is not an existing directory") == 1, said
    assert "model 'my-studnet': path " in said
    assert f"did you mean '{tmp_path / 'models' / 'my-student'}'?" in said


def test_include_path_must_be_a_folder(tmp_path):
    out = cotgap("ls", "tasks", "--include-path", str(tmp_path / "no"), cwd=tmp_path)
    assert out.returncode == 2 and "--include-path" in out.stderr


def test_every_command_that_reads_a_config_takes_include_path():
    import typer

    from harness.cli import app

    def commands(group, prefix=""):
        for name, cmd in group.commands.items():
            if hasattr(cmd, "commands"):
                yield from commands(cmd, f"{prefix}{name} ")
            else:
                yield f"{prefix}{name}", cmd

    reads = {name: {p.name for p in cmd.params}
             for name, cmd in commands(typer.main.get_command(app))}  # fmt: skip
    takes_config = {n for n, params in reads.items() if {"config", "target"} & params}
    assert {"run", "generate", "train", "evaluate", "screen", "analyze", "export"} <= takes_config
    assert [n for n in sorted(takes_config) if "include_path" not in reads[n]] == []


def test_a_stage_command_reads_a_task_from_an_outside_folder(tmp_path):
    tasks_dir, data_dir = _own_task(tmp_path)
    cfg = {
        "name": "own",
        "results_dir": str(tmp_path / "res"),
        "data_dir": str(data_dir),
        "teachers": [{"name": "t", "path": "sandbox:teacher-s"}],
        "students": [{"name": "s", "path": "sandbox:student-xs"}],
        "tasks": [{"name": "my_sums", "train_limit": 2}],
        "generate": {"n": 1, "max_tokens": 8},
        "train": {"max_steps": 2},
    }
    path = tmp_path / "own.yaml"
    path.write_text(yaml.safe_dump(cfg))
    without = cotgap("generate", str(path), cwd=tmp_path)
    assert without.returncode == 2 and "unknown task 'my_sums'" in without.stderr
    out = cotgap("generate", str(path), "--include-path", str(tasks_dir), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "generate: computed 1 cell(s)" in out.stderr
    with open(tmp_path / "res" / "own" / "index.csv", encoding="utf-8") as f:
        (row,) = [r for r in csv.DictReader(f) if r["kind"] == "traces"]
    assert (row["task"], row["status"]) == ("my_sums", "complete")


# --- quick commands ------------------------------------------------------------------------------


def test_model_names():
    from harness.quick import model_name

    assert model_name("sandbox:teacher-s") == "teacher-s"
    assert model_name("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen2.5-0.5B-Instruct"
    assert model_name("gguf:/models/tiny q4.gguf") == "tiny-q4"
    assert model_name("./models/my model/") == "my-model"


def test_one_default_effect_of_interest():
    """`distill --effect`, the quick commands and a config without analysis: one default, so
    `none` rules out the same gain everywhere."""
    import inspect

    from harness import cli, quick
    from harness.config.schema import AnalysisConfig

    default = AnalysisConfig().effect_of_interest
    assert inspect.signature(cli.distill).parameters["effect"].default == default
    assert quick.Settings().effect == default


def test_quick_errors_exit_2(tmp_path):
    unknown = cotgap("eval", "sandbox:student-xs", "--tasks", "no_such_task", cwd=tmp_path)
    assert unknown.returncode == 2 and "no_such_task" in unknown.stderr
    seeds = cotgap("distill", "--teacher", "sandbox:teacher-s", "--student", "sandbox:student-xs",
                   "--task", "sandbox_addition", "--seeds", "0,x", cwd=tmp_path)  # fmt: skip
    assert seeds.returncode == 2 and "--seeds" in seeds.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_eval_prints_its_interval_and_a_grid_reuses_its_cell(tmp_path):
    results = tmp_path / "res" / "quick"
    args = ("--tasks", "sandbox_addition", "--limit", "6", "--max-tokens", "48")
    out = cotgap("eval", "sandbox:student-xs", *args, "--results-dir", str(results), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    # one phase of the grid's six: named without "phase 2/6"
    assert "phase 2/6" not in out.stderr and "evaluate: " in out.stderr, out.stderr
    cell = Path(re.search(r"(\S+/cells/eval/[0-9a-f]+)", out.stdout.replace("\n", "")).group(1))
    records = [json.loads(line) for line in (cell / "predictions.jsonl").read_text().splitlines()]
    correct = [r["correct"] for r in records]
    assert len(correct) == 6

    from harness.tasks import suite as tasks

    items = tasks.load_items("sandbox_addition", "test", limit=6)
    assert [r["question"] for r in records] == [it.question for it in items]
    assert all(r["question"] in r["prompt"] and "completion" in r for r in records)

    import csv

    with open(results / "index.csv", encoding="utf-8") as f:
        rows = {r["key"]: r for r in csv.DictReader(f)}
    row = rows[cell.name]
    assert (row["kind"], row["task"], row["model"], row["status"]) == (
        "eval", "sandbox_addition", "student-xs", "complete"
    )  # fmt: skip
    assert (results / row["path"]).resolve() == cell.resolve()

    from harness.stats import teacher_level

    est = teacher_level.accuracy(teacher_level.baseline_arm(np.array(correct, dtype=float)))
    expected = f"{100 * est.estimate:.1f} [{100 * est.low:.1f}, {100 * est.high:.1f}]"
    assert expected in out.stdout

    # a grid in the same folder with the same model, task limit and eval settings: nothing to do
    cfg = {
        "name": "quick",
        "results_dir": str(results.parent),
        "teachers": [{"name": "t", "path": "sandbox:teacher-s"}],
        "students": [{"name": "xs", "path": "sandbox:student-xs"}],
        "tasks": [{"name": "sandbox_addition", "test_limit": 6}],
        "train": {"max_steps": 2},
        "evaluate": {"max_tokens": 48},
    }
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(cfg))
    from harness.config.loading import load_experiment
    from harness.execution import plan
    from harness.store import Store
    from harness.workflow import grid

    exp = load_experiment(path)
    base = grid.expand(exp).baselines["sandbox_addition", "xs"]
    assert base.key == cell.name
    assert plan.missing(Store(exp.root), [base]) == []
    again = cotgap("eval", "sandbox:student-xs", *args, "--results-dir", str(results), cwd=tmp_path)
    assert again.returncode == 0 and "computed 0 cell(s)" in again.stderr


@pytest.mark.slow
def test_distill_one_pair_prints_gain_interval_and_exploratory(tmp_path):
    results = tmp_path / "res" / "quick"
    out = cotgap(
        "distill", "--teacher", "sandbox:teacher-s", "--student", "sandbox:student-xs",
        "--task", "sandbox_addition", "--limit", "4", "--train-limit", "8", "--max-steps", "2",
        "--batch-size", "4", "--samples", "1", "--max-tokens", "48", "--seeds", "0",
        "--results-dir", str(results), cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert re.search(r"gain [+-]\d+\.\d pts \[[+-]\d+\.\d, [+-]\d+\.\d\]", out.stdout), out.stdout
    assert "exploratory: 1 replicate(s)" in out.stdout
    assert ": inconclusive" in out.stdout  # one replicate: never a verdict
    kinds = {p.name for p in (results / "cells").iterdir()}
    assert {"traces", "dataset", "adapter", "eval"} <= kinds


# --- no silent failures --------------------------------------------------------------------------


@pytest.mark.slow
def test_a_teacher_with_no_usable_trace_is_said_with_the_fix(tmp_path):
    """Four tokens per completion: every trace is cut, none is correct, no example is left."""
    cfg = {
        "name": "cut",
        "results_dir": str(tmp_path / "res"),
        "teachers": [{"name": "t", "path": "sandbox:teacher-s"}],
        "students": [{"name": "s", "path": "sandbox:student-xs"}],
        "tasks": [{"name": "sandbox_addition", "train_limit": 4, "test_limit": 4}],
        "generate": {"n": 1, "max_tokens": 4},
        "train": {"max_steps": 2, "per_device_batch_size": 2},
        "evaluate": {"max_tokens": 4},
    }
    path = tmp_path / "cut.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = cotgap("run", str(path), "--only", "generate,train", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    err = " ".join(out.stderr.split())
    assert (
        "traces:teacher/t/sandbox_addition: 0 of 4 questions have a correct trace (4 samples)"
        in err
    )
    assert "100% of 4 completions were cut at max_tokens (4); raise generate.max_tokens" in err
    # the teacher is the cause: nothing was dropped, so no advice about train.max_length
    assert "0 training examples: its teacher wrote no correct trace" in err
    assert "train.max_length" not in err


@pytest.mark.slow
def test_distill_with_a_teacher_that_gives_no_example_says_so_without_a_traceback(tmp_path):
    """Four tokens per trace: none is correct, the training set is empty, nothing is trained."""
    out = cotgap(
        "distill", "--teacher", "sandbox:teacher-s", "--student", "sandbox:student-xs",
        "--task", "sandbox_addition", "--limit", "4", "--train-limit", "4", "--max-steps", "2",
        "--samples", "1", "--max-tokens", "4", "--results-dir", str(tmp_path / "quick"),
        cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    text = " ".join(out.stdout.split())
    assert "no distilled student" in text and "examples per trace draw: 0" in text, text
    assert re.search(r"baseline \d+\.\d% \[\d+\.\d, \d+\.\d\]", text), text
    err = " ".join(out.stderr.split())
    assert "0 of 4 questions have a correct trace" in err, err


# --- readable outputs ----------------------------------------------------------------------------


def _grid_config(tmp_path: Path, student: str) -> Path:
    cfg = {
        "name": "idx",
        "results_dir": str(tmp_path / "res"),
        "teachers": [{"name": "t", "path": "sandbox:teacher-s"}],
        "students": [{"name": student, "path": f"sandbox:{student}"}],
        "tasks": [{"name": "sandbox_addition", "test_limit": 4}],
        "train": {"max_steps": 2},
    }
    path = tmp_path / f"{student}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_index_names_every_cell_and_keeps_other_experiments_rows(tmp_path):
    import csv

    from harness.config.loading import load_experiment
    from harness.store import Store
    from harness.workflow import grid, index

    exp = load_experiment(_grid_config(tmp_path, "student-xs"))
    store = Store(exp.root)
    cells = grid.expand(exp)
    started = cells.baselines["sandbox_addition", "student-xs"]
    store.cell_dir("eval", started.key).mkdir(parents=True)  # begun, not finished
    path = index.write(store, cells)

    def rows() -> dict[str, dict]:
        with open(path, encoding="utf-8") as f:
            return {r["key"]: r for r in csv.DictReader(f)}

    first = rows()
    assert set(first) == {c.key for c in cells}
    assert first[started.key]["status"] == "partial"
    assert first[started.key]["label"] == started.label
    assert {r["status"] for k, r in first.items() if k != started.key} == {"missing"}
    assert first[started.key]["path"] == f"cells/eval/{started.key}"

    other = load_experiment(_grid_config(tmp_path, "student-s"))
    index.write(store, grid.expand(other))
    second = rows()
    assert started.key in second  # its folder exists: kept
    dropped = [c.key for c in cells if c.key != started.key and c.key not in second]
    assert dropped  # the first grid's cells without a folder are not listed by the second


BAD_OPTIONS = {  # a quick command's option at a value the config refuses -> the option's flag
    "max_tokens": ({"settings": {"max_tokens": 0}}, "--max-tokens"),
    "samples": ({"settings": {"samples": 0}}, "--samples"),
    "temperature": ({"settings": {"temperature": -1.0}}, "--temperature"),
    "max_steps": ({"settings": {"max_steps": 0}}, "--max-steps"),
    "lr": ({"settings": {"lr": 0.0}}, "--lr"),
    "batch_size": ({"settings": {"batch_size": 0}}, "--batch-size"),
    "effect": ({"settings": {"effect": 0.0}}, "--effect"),
    "limit": ({"limit": 0}, "--limit"),
    "train_limit": ({"train_limit": 0}, "--train-limit"),
    "seeds": ({"seeds": (2**32,)}, "--seeds"),
    "dtype": ({"settings": {"dtype": 3}}, "--dtype"),
}


@pytest.mark.parametrize("option", list(BAD_OPTIONS))
def test_a_bad_option_is_named_by_its_flag(tmp_path, option):
    """The quick commands build a config from their options; its errors name the option the
    user typed (`--max-steps`), never the config key (`train.max_steps`) they never wrote."""
    from dataclasses import fields

    from harness import quick
    from harness.errors import UserError

    assert {f.name for f in fields(quick.Settings)} | {"limit", "train_limit", "seeds"} == set(
        BAD_OPTIONS
    )  # every option a quick command copies into its config has a case
    given, flag = BAD_OPTIONS[option]
    settings = quick.Settings(**given.get("settings", {}))
    with pytest.raises(UserError) as e:
        quick.experiment(
            ["sandbox:teacher-s"], ["sandbox:student-xs"], ["sandbox_addition"],
            given.get("limit"), tmp_path / "q", settings, given.get("train_limit"),
            given.get("seeds", (0,)),
        )  # fmt: skip
    message = str(e.value)
    assert f"the command line: {flag}: " in message, message
    assert not re.search(r"\b(train|generate|evaluate|analysis|tasks)(\[\d+\])?\.", message)


def test_a_zero_option_exits_2_naming_the_flag(tmp_path):
    out = cotgap("distill", "--teacher", "sandbox:teacher-s", "--student", "sandbox:student-xs",
                 "--task", "sandbox_addition", "--max-steps", "0", cwd=tmp_path)  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "--max-steps: Input should be greater than 0" in out.stderr


def test_a_task_named_like_a_built_in_is_said_to_replace_it(tmp_path):
    """A user's task folder may replace a built-in task (it is searched first); the commands
    that read the task say so, naming both files."""
    mine = tmp_path / "tasks"
    mine.mkdir()
    builtin = REPO / "tasks" / "sandbox_addition.yaml"
    (mine / "sandbox_addition.yaml").write_text(builtin.read_text())
    cfg = {
        "name": "own",
        "task_paths": ["tasks"],
        "teachers": [{"name": "t", "path": "sandbox:teacher-s"}],
        "students": [{"name": "s", "path": "sandbox:student-xs"}],
        "tasks": ["sandbox_addition"],
        "train": {"max_steps": 1},
    }
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(cfg))
    out = cotgap("validate", "exp.yaml", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    note = " ".join(out.stderr.split())
    assert f"task sandbox_addition is read from {mine / 'sandbox_addition.yaml'}" in note
    assert "replaces the built-in task" in note and str(builtin) in note
    cfg["task_paths"] = []
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(cfg))
    other = cotgap("validate", "exp.yaml", cwd=tmp_path)
    assert other.returncode == 0 and "replaces the built-in" not in other.stderr
