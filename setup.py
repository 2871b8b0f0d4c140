"""Ships the top-level task files in the wheel: `tasks/` (one YAML per task, few-shot files, BBH's
CoT prompts) becomes `harness/tasks_data/` inside the built package. Everything else about the
build is in pyproject.toml. A source checkout (and an editable install) reads `tasks/` in place
(harness/config/task_paths.py: tasks_dir)."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithTasks(build_py):
    def run(self) -> None:
        super().run()
        src = Path(__file__).resolve().parent / "tasks"
        dst = Path(self.build_lib) / "harness" / "tasks_data"
        if src.is_dir() and not getattr(self, "editable_mode", False):
            shutil.copytree(src, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.pyc"))


setup(cmdclass={"build_py": BuildPyWithTasks})
