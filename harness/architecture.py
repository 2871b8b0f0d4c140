"""The layers of `harness`, lowest first: the one table the layering test (tests/unit/test_architecture.py)
checks the imports against and the contributor map (docs/contributing.md) is generated from.

    python docs/gen_reference.py          # rewrites the map in docs/contributing.md

A module may import from its own package, from any package of its own layer, and from the layers
below; never from a layer above, even inside a function. Data only: this module imports nothing.
"""

from __future__ import annotations

# (layer, its packages or top-level modules, what the layer is for)
LAYERS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (
        "leaves",
        ("architecture", "errors", "progress", "devices", "precision", "stats"),
        "user errors, progress display, GPUs, float precision, statistics (no harness imports)",
    ),
    ("config", ("config",), "the experiment schema: strict, frozen pydantic models; YAML loading"),
    ("store", ("store",), "content-addressed cell directories, atomic writes, manifests, locks"),
    ("sandbox", ("sandbox",), "synthetic tasks and the zoo of tiny models trained on them"),
    ("models", ("models",), "where a model lives and what identifies its weights"),
    ("engines", ("engines",), "one generation interface: vLLM, transformers, served (OpenAI API)"),
    ("tasks", ("tasks",), "task files to items and prompts; answer extraction; scoring"),
    (
        "workflow",
        ("workflow",),
        "cells, the pure grid, regimes, selection, the checks validate runs",
    ),
    ("stages", ("stages", "metric"), "one module per cell kind: load, do, write"),
    ("execution", ("execution",), "the plan, the scheduler, the local and Ray executors"),
    ("analysis", ("analysis",), "leaderboard, answers, studies, screening validation, report"),
    ("present", ("present",), "the viewer, exports, tracking"),
    ("commands", ("quick", "cli", "__main__", ""), "the `cotgap` command line"),
)

LAYER_OF: dict[str, int] = {pkg: i for i, (_, pkgs, _) in enumerate(LAYERS) for pkg in pkgs}


def package_of(module: str) -> str:
    """The package (or top-level module) a dotted harness module name belongs to ('' = harness)."""
    return module.split(".", 1)[0]
