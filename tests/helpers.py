"""The test-zoo sandbox grid, shared by the pipeline, fault and Ray tests; and the pinning of
zoo model identities for the goldens."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

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


def pin_zoo_ids(monkeypatch: pytest.MonkeyPatch, golden: object) -> None:
    """Identify zoo models as the ids recorded in `golden` (any JSON-able value) do: a golden
    pins the code that turns a model's identity into keys, not the shipped weights, which a zoo
    rebuild replaces (their sha256 is part of the id). Names the golden does not hold keep theirs."""
    from harness.sandbox import zoo

    pattern = r"sandbox:([a-z0-9-]+)@[0-9a-f]+(?:/sha256:[0-9a-f]+)?"
    ids = {m.group(1): m.group(0) for m in re.finditer(pattern, json.dumps(golden))}
    real = zoo.model_id
    monkeypatch.setattr(zoo, "model_id", lambda name: ids.get(name) or real(name))


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


def where_am_i() -> tuple[int, list[int], str | None]:
    """In a child (harness.engines.run_in_child): its pid, the cores it runs on, its threads."""
    import os

    return os.getpid(), sorted(os.sched_getaffinity(0)), os.environ.get("OMP_NUM_THREADS")
