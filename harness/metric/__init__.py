"""cotgap's scoring as a Hugging Face `evaluate` metric, shipped inside the package: offline,
`evaluate.load(metric.path())` loads a local script, not a hub name (example: cotgap_accuracy.py)."""

from __future__ import annotations

from pathlib import Path


def path() -> str:
    """The metric script's path, for `evaluate.load`."""
    return str(Path(__file__).resolve().with_name("cotgap_accuracy.py"))
