"""Where task YAMLs are found: the built-in tasks, $COTGAP_TASK_PATH and an experiment's `task_paths`.

    cotgap ls tasks --include-path my_tasks/

A task in an earlier folder shadows one of the same name in a later one; harness.tasks.suite
reads the files these functions find.
"""

from __future__ import annotations

import os
import typing
from pathlib import Path


def tasks_dir() -> Path:
    """The directory of the built-in task YAMLs: $COTGAP_TASKS_DIR, else the copy a wheel ships
    (harness/tasks_data/, made from tasks/ by setup.py), else the repository's top-level tasks/
    (a source checkout or an editable install reads it in place)."""
    env = os.environ.get("COTGAP_TASKS_DIR")
    if env:
        return Path(env)
    package = Path(__file__).resolve().parents[1]
    shipped = package / "tasks_data"
    return shipped if shipped.is_dir() else package.parent / "tasks"


def task_dirs() -> list[Path]:
    """Where task YAMLs are found, in order: the folders of $COTGAP_TASK_PATH (separated like
    PATH), then the built-in tasks (`tasks_dir()`). A task in an earlier folder shadows one of the
    same name in a later one."""
    extra = [Path(p) for p in os.environ.get("COTGAP_TASK_PATH", "").split(os.pathsep) if p]
    return [*extra, tasks_dir()]


def include_task_paths(paths: typing.Iterable[str | Path]) -> None:
    """Add task folders to this process's search path, and so to its workers' (they inherit
    COTGAP_TASK_PATH): after the folders already there, before the built-in tasks."""
    current = [p for p in os.environ.get("COTGAP_TASK_PATH", "").split(os.pathsep) if p]
    new = [str(Path(p).expanduser().resolve()) for p in paths]
    added = [p for p in dict.fromkeys(new) if p not in current]
    if added:
        os.environ["COTGAP_TASK_PATH"] = os.pathsep.join([*current, *added])


def task_file(name: str) -> Path | None:
    """The YAML of task `name` in the first of `task_dirs()` that holds one."""
    for d in task_dirs():
        path = d / f"{name}.yaml"
        if path.is_file():
            return path
    return None


def shadowed_builtin(name: str) -> tuple[Path, Path] | None:
    """(the user's file, the built-in file) when a task folder of the user holds a task named
    like a built-in one, which it then replaces; None otherwise."""
    mine, builtin = task_file(name), tasks_dir() / f"{name}.yaml"
    if mine is None or not builtin.is_file() or mine.resolve() == builtin.resolve():
        return None
    return mine, builtin


def task_names() -> list[str]:
    return sorted({p.stem for d in task_dirs() for p in d.glob("*.yaml")})
