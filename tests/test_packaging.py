"""What a task needs ships in the package: a wheel built from the repository, installed without
`-e`, lists every task and prompts BBH few-shot with no data dir; validate refuses a config whose
few-shot prompts cannot be found."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import sandbox_grid

from harness.config.loading import parse
from harness.config.schema import Experiment
from harness.config.task_paths import task_names
from harness.tasks import suite as tasks
from harness.workflow import grid

REPO = Path(__file__).resolve().parents[1]
BBH_PROMPTS = REPO / "tasks" / "bbh" / "cot-prompts"

# Run in a child whose path holds the installed wheel first, then the venv's site-packages (the
# dependencies); the repository is not on it.
CHILD = """
import json, sys
import harness
from harness.config import task_paths
from harness.tasks import suite as tasks
names = task_paths.task_names()
pre, shots = tasks.fewshot_exemplars("bbh_boolean_expressions", None)
item = tasks.Item("x", 0, "not ( True ) and ( True ) is", "False")
prompt = tasks.render_prompt("bbh_word_sorting", item, "few_shot_cot")
rows = tasks.list_tasks_table()
print(json.dumps({"file": harness.__file__, "names": names, "shots": len(shots), "pre": pre,
                  "prompt": prompt, "rows": len(rows)}))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The wheel of a copy of the repository's package files, installed into a clean target."""
    src, wheels, target = (tmp_path_factory.mktemp(n) for n in ("src", "wheels", "target"))
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy(REPO / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "harness", src / "harness", ignore=ignore)
    shutil.copytree(REPO / "tasks", src / "tasks", ignore=ignore)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(src)],
        check=True,
        capture_output=True,
        cwd=src,
    )
    (wheel,) = wheels.glob("cotgap-*.whl")
    subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
    )
    return target


def test_the_wheel_lists_every_task_and_prompts_bbh_without_a_data_dir(installed, tmp_path):
    import site

    env = {k: v for k, v in os.environ.items() if k not in ("COTGAP_TASKS_DIR", "COTGAP_DATA_DIR")}
    env["PYTHONPATH"] = os.pathsep.join([str(installed), *site.getsitepackages()])
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert Path(got["file"]).is_relative_to(installed), got["file"]
    assert got["names"] == task_names() and got["rows"] == len(task_names())
    assert {"math", "math_full", "bbh_word_sorting", "sandbox_addition"} <= set(got["names"])
    assert got["shots"] == 3 and got["pre"] == "Evaluate the result of a random Boolean expression."
    assert got["prompt"].startswith("Sort a list of words.\n\nQ: Sort the following words")
    assert got["prompt"].count("So the answer is") == 3


def test_the_wheel_lists_a_task_from_an_outside_folder_beside_the_built_in_ones(
    installed, tmp_path
):
    import site

    outside = tmp_path / "my-tasks"
    outside.mkdir()
    spec = yaml.safe_load((REPO / "tasks" / "sandbox_addition.yaml").read_text())
    (outside / "my_addition.yaml").write_text(yaml.safe_dump({**spec, "name": "my_addition"}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("COTGAP_TASK")}
    env["PYTHONPATH"] = os.pathsep.join([str(installed), *site.getsitepackages()])
    env["COLUMNS"] = "300"  # one table row per task, names unabridged
    out = subprocess.run(
        [sys.executable, "-m", "harness", "ls", "tasks", "--include-path", str(outside)],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    listed = {line.split("│")[1].strip() for line in out.stdout.splitlines() if "│" in line}
    assert listed == {*task_names(), "my_addition"}


def test_packaged_bbh_prompts_are_the_data_dirs_bytes(shared_data):
    names = sorted(p.name for p in BBH_PROMPTS.glob("*.txt"))
    assert len(names) == 27 == len([n for n in task_names() if n.startswith("bbh_")])
    for name in names:
        assert (BBH_PROMPTS / name).read_bytes() == (
            shared_data / "bbh" / "cot-prompts" / name
        ).read_bytes()
    assert "MIT License" in (BBH_PROMPTS.parent / "LICENSE").read_text()


def test_bbh_few_shot_reads_the_data_dir_copy_first(tmp_path):
    own = tmp_path / "bbh" / "cot-prompts"
    own.mkdir(parents=True)
    (own / "navigate.txt").write_text("canary\n-----\nMy own.\n\nQ: q1\nA: a1\n")
    assert tasks.fewshot_exemplars("bbh_navigate", tmp_path) == ("My own.", (("q1", "a1"),))
    packaged = tasks.fewshot_exemplars("bbh_navigate", None)
    assert tasks.fewshot_exemplars("bbh_snarks", tmp_path) == tasks.fewshot_exemplars("bbh_snarks")
    assert len(packaged[1]) == 3


def _config(data_dir: Path | None, select_style: str, task_names: list[str]) -> dict:
    config = sandbox_grid("fewshot-check", Path("results"))
    config["tasks"] = task_names
    return {
        **config,
        "data_dir": str(data_dir) if data_dir else None,
        "select": {"prompt_style": select_style},
    }


def _experiment(data_dir: Path | None, select_style: str) -> Experiment:
    config = _config(data_dir, select_style, ["bbh_navigate", "sandbox_addition"])
    return parse(Experiment, config, "fewshot-check.yaml")


def test_validate_refuses_few_shot_prompts_that_cannot_be_found(tmp_path, monkeypatch):
    """A tasks dir without the packaged prompts (a broken install, a custom COTGAP_TASKS_DIR) and
    no data dir holding them: validate names the task and the file; a sandbox task has none."""
    assert grid.expand_problems(_experiment(None, "zero_shot_cot")) == []
    copy = tmp_path / "tasks"
    shutil.copytree(tasks.tasks_dir(), copy, ignore=shutil.ignore_patterns("cot-prompts"))
    monkeypatch.setenv("COTGAP_TASKS_DIR", str(copy))
    problems = grid.expand_problems(_experiment(None, "few_shot_cot"))
    assert len(problems) == 2, problems  # each named once: no exemplars, or their file missing
    assert "task sandbox_addition (tasks[1]) has no few-shot exemplars" in problems[0]
    assert "task bbh_navigate" in problems[1] and "bbh/cot-prompts/navigate.txt" in problems[1]
    # a data dir holding the prompts: only the sandbox task is left
    (tmp_path / "data" / "bbh" / "cot-prompts").mkdir(parents=True)
    shutil.copy(BBH_PROMPTS / "navigate.txt", tmp_path / "data" / "bbh" / "cot-prompts")
    problems = grid.expand_problems(_experiment(tmp_path / "data", "few_shot_cot"))
    assert [p for p in problems if "bbh_navigate" in p and "cot-prompts" in p] == []
    # (its items are not there: that data dir is said to lack the task's file)
    (left,) = [p for p in problems if "bbh_navigate" in p]
    assert left.startswith("tasks[0]: task bbh_navigate: no file ")


def test_validate_cli_exits_2_on_missing_few_shot_prompts(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(_config(None, "few_shot_cot", ["bbh_navigate"])))
    copy = tmp_path / "tasks"
    shutil.copytree(tasks.tasks_dir(), copy, ignore=shutil.ignore_patterns("cot-prompts"))
    env = {**os.environ, "COTGAP_TASKS_DIR": str(copy)}
    out = subprocess.run(
        [sys.executable, "-m", "harness", "validate", str(config)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert out.returncode == 2, out.stderr
    assert "few-shot prompts of task bbh_navigate" in out.stderr


def test_the_paper_study_validates_with_no_data_dir(monkeypatch):
    """Its phase 0 prompts every task few-shot (BBH's cot-prompts, MATH's file), from the hub:
    every prompt is found in the package."""
    from harness.config.loading import load_experiment

    monkeypatch.delenv("COTGAP_DATA_DIR", raising=False)
    monkeypatch.delenv("COTGAP_TASKS_DIR", raising=False)
    exp = load_experiment(REPO / "configs" / "paper-study.yaml")
    assert exp.data_dir is None and exp.select.prompt_style == "few_shot_cot"
    assert grid._fewshot_problems(exp) == []
    assert len(exp.tasks) == 28


def test_phase_0_prompts_bbh_few_shot_from_the_packaged_prompts(shared_data, tmp_path):
    """The select cells of a study on BBH, with a data dir holding the items only (no
    cot-prompts): the requests phase 0 sends carry BBH's three packaged exemplars."""
    from harness.stages.generate import requests

    (tmp_path / "bbh").mkdir()
    shutil.copy(shared_data / "bbh" / "navigate.json", tmp_path / "bbh")
    config = _config(tmp_path, "few_shot_cot", ["bbh_navigate"])
    exp = parse(Experiment, config, "study.yaml")
    assert grid.expand_problems(exp) == []
    select = [c for c in grid.expand(exp).unique() if getattr(c, "role", None) == "select"]
    assert select and {c.task for c in select} == {"bbh_navigate"}
    ev = select[0].eval_config(exp)
    assert ev.prompt_style == "few_shot_cot"
    items = tasks.load_items("bbh_navigate", exp.select.split, exp.data_dir, limit=2)
    sent = requests(tasks.load_task("bbh_navigate"), items, ev, exp.data_dir)
    _, shots = tasks.fewshot_exemplars("bbh_navigate", None)
    for request, item in zip(sent, items, strict=True):
        assert all(f"Q: {q}\nA: {a}" in request.prompt for q, a in shots)
        assert request.prompt.endswith(f"Q: {item.question}\nA: Let's think step by step.")


def test_make_install_ends_by_saying_it_is_done_and_what_comes_next() -> None:
    """The last line `make install` prints (dry run: nothing is installed here)."""
    if shutil.which("make") is None:
        pytest.skip("no make")
    # --no-print-directory: under `make test` this make is a sub-make, which would otherwise
    # end with "make[1]: Leaving directory"
    out = subprocess.run(
        ["make", "--no-print-directory", "-n", "install"], cwd=REPO, capture_output=True, text=True
    )
    last = out.stdout.strip().splitlines()[-1]
    assert "make install: done" in last and "make demo" in last and "activate" in last, last
