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
