"""The test-zoo sandbox grid, shared by the pipeline, fault and Ray tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TEST_TEACHERS = [
    {"name": "t-small", "path": "sandbox:test-teacher-s", "size": 2.3e5},
    {"name": "t-large", "path": "sandbox:test-teacher-l", "size": 6.0e5},
]


def sandbox_grid(
    name: str,
    results_dir: Path,
    *,
    teachers: list[dict] = TEST_TEACHERS,
    train_limit: int = 32,
    test_limit: int = 24,
    **train: Any,
) -> dict:
    """A test-zoo experiment on sandbox_coin_flip (test zoo: `zoo.build(profile="test")`);
    `train` entries override the training section."""
    return {
        "name": name,
        "results_dir": str(results_dir),
        "teachers": teachers,
        "students": [{"name": "stu", "path": "sandbox:test-student", "size": 8.9e4}],
        "tasks": [
            {"name": "sandbox_coin_flip", "train_limit": train_limit, "test_limit": test_limit}
        ],
        "generate": {"n": 2, "temperature": 0.8, "max_tokens": 160, "seed": 0},
        "train": {
            "lr": 5e-3,
            "max_steps": 12,
            "per_device_batch_size": 8,
            "max_length": 256,
            **train,
        },
        "evaluate": {"max_tokens": 160},
        "analysis": {"bootstrap_samples": 200},
    }


_OPENED: list[list[str]] = []


def _audit(event: str, args: tuple) -> None:
    if event == "open" and _OPENED and isinstance(args[0], (str, bytes, Path)):
        _OPENED[-1].append(str(args[0]))


class opened_files:
    """Record every file path this process opens inside the `with` block (a PEP 578 audit hook):
    a count of work that a loaded machine cannot change, unlike a wall-clock figure."""

    _hooked = False

    def __enter__(self) -> list[str]:
        import sys

        if not opened_files._hooked:
            sys.addaudithook(_audit)
            opened_files._hooked = True
        _OPENED.append([])
        return _OPENED[-1]

    def __exit__(self, *exc: Any) -> None:
        _OPENED.pop()
