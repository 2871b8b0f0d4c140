"""The module layering of harness/ (docs/contributing.md): imports only go down or sideways, the
import graph (imports inside functions included) has no cycle, and planning imports no stage, engine, torch or vLLM."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[1] / "harness"
LAYERS = [  # lowest first; a module may import its own layer and the ones below
    {
        "errors",
        "stats",
        "inference",
        "answers",
        "progress",
        "regimes",
        "precision",
        "sandbox.tokenizer",
    },
    {"config", "devices"},
    {"store", "costs"},
    {"tasks", "models", "gguf", "sandbox", "sandbox.tasks", "sandbox.zoo", "sandbox.random_model"},
    {
        "scoring",
        "encoding",
        "engines",
        "engines.base",
        "engines.hf_engine",
        "engines.vllm_engine",
        "distill",
        "engines.openai_engine",
    },
    {"cells"},
    {"grid", "selection", "feasible", "offline", "spend"},
    {"generate", "evaluate", "dataset", "train", "screen", "metric", "metric.cotgap_accuracy"},
    {"schedule", "ray_executor"},
    {
        "plan",
        "analyze",
        "studies",
        "report",
        "screening",
        "view",
        "export",
        "tracking",
        "health",
        "index",
    },
    {"quick"},
    {"cli", "__main__", ""},
]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(HARNESS).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> tuple[set[str], set[str]]:
    """harness modules `path` imports at module level, and inside functions."""
    tree, known = ast.parse(path.read_text()), set(LAYER)
    top, inner = set(), set()
    module_level = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("harness"):
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        found = {n.removeprefix("harness").lstrip(".") for n in names if n.startswith("harness")}
        found = {n for n in found if n in known and n}
        (top if id(node) in module_level else inner).update(found)
    return top, inner


MODULES = {module_name(p): p for p in sorted(HARNESS.rglob("*.py"))}


def test_every_module_has_a_layer() -> None:
    assert sorted(set(MODULES) - set(LAYER)) == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_go_down_or_sideways(name: str) -> None:
    top, inner = imports(MODULES[name])
    up = sorted(m for m in top | inner if LAYER[m] > LAYER[name])
    assert up == [], f"{name} (layer {LAYER[name]}) imports from higher layers: {up}"


def test_imports_have_no_cycle() -> None:
    """No cycle among harness modules, counting imports made inside functions too."""
    graph = {name: set().union(*imports(path)) - {name} for name, path in MODULES.items()}
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                raise AssertionError(f"import cycle: {' -> '.join([*path, m, n])}")
            if n not in state:
                visit(n, [*path, m])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])


def test_planning_imports_no_stage_engine_torch_or_vllm() -> None:
    code = (
        "import json, sys; import harness.plan, harness.grid, harness.cells, harness.schedule; "
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout))
    heavy = {"torch", "vllm", "transformers", "peft", "accelerate", "ray"}
    stages = {f"harness.{m}" for m in ("generate", "evaluate", "dataset", "train", "engines")}
    assert sorted(m for m in loaded if m.split(".")[0] in heavy or m in stages) == []
