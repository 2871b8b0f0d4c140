"""The layering of harness/ as rules between packages (harness/architecture.py): imports only go
down or sideways, the import graph of modules and of packages (imports inside functions included)
has no cycle, and planning imports no stage, engine, torch or vLLM."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.architecture import LAYER_OF, LAYERS, package_of

HARNESS = Path(__file__).resolve().parents[2] / "harness"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(HARNESS).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(HARNESS.rglob("*.py"))}


def _resolve(name: str) -> str | None:
    """The harness module `name` (dotted, without `harness.`) refers to: itself, or the longest
    prefix that is a module (`harness.tasks.suite.load` -> `tasks.suite`)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name if name in MODULES else None


def imports(path: Path) -> tuple[set[str], set[str]]:
    """harness modules `path` imports at module level, and inside functions."""
    tree = ast.parse(path.read_text())
    top, inner = set(), set()
    module_level = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("harness"):
            names = [f"{node.module}.{a.name}" for a in node.names]
        found = set()
        for n in names:
            if n == "harness" or n.startswith("harness."):
                m = _resolve(n.removeprefix("harness").lstrip("."))
                if m is not None:
                    found.add(m)
        (top if id(node) in module_level else inner).update(found)
    return top, inner


GRAPH = {name: set().union(*imports(path)) - {name} for name, path in MODULES.items()}


def test_every_package_has_a_layer() -> None:
    assert sorted({package_of(m) for m in MODULES} - set(LAYER_OF)) == []
    assert sorted(set(LAYER_OF) - {package_of(m) for m in MODULES}) == []  # no stale entry


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_go_down_or_sideways(name: str) -> None:
    mine = LAYER_OF[package_of(name)]
    up = sorted(m for m in GRAPH[name] if LAYER_OF[package_of(m)] > mine)
    assert up == [], f"{name} ({LAYERS[mine][0]}) imports from higher layers: {up}"


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(m: str, path: list[str]) -> list[str] | None:
        state[m] = 1
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return [*path, m, n]
            if n not in state and (found := visit(n, [*path, m])):
                return found
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m, [])):
            return found
    return None


def test_modules_have_no_import_cycle() -> None:
    """No cycle among harness modules, counting imports made inside functions too."""
    cycle = _cycle(GRAPH)
    assert cycle is None, f"import cycle: {' -> '.join(cycle or [])}"


def test_packages_have_no_import_cycle() -> None:
    """No cycle between packages either: a package's modules may import each other, but two
    packages never import from each other (the root package, the CLI's home, is left out)."""
    graph: dict[str, set[str]] = {}
    for m, deps in GRAPH.items():
        if package_of(m):
            graph.setdefault(package_of(m), set()).update(
                package_of(d) for d in deps if package_of(d) not in ("", package_of(m))
            )
    cycle = _cycle(graph)
    assert cycle is None, f"package cycle: {' -> '.join(cycle or [])}"


def test_the_rules_catch_an_upward_import(tmp_path: Path) -> None:
    """The check itself can fail: a stats module that imports a stage is found."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from harness.stages import train\n")
    _, inner = imports(bad)
    assert inner == {"stages.train"}
    assert LAYER_OF[package_of("stages.train")] > LAYER_OF["stats"]


def test_planning_imports_no_stage_engine_torch_or_vllm() -> None:
    code = (
        "import json, sys; import harness.execution.plan, harness.workflow.grid, "
        "harness.workflow.cells, harness.execution.schedule; "
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout))
    heavy = {"torch", "vllm", "transformers", "peft", "accelerate", "ray"}
    stages = {m for m in loaded if m.startswith(("harness.stages", "harness.engines"))}
    assert sorted(m for m in loaded if m.split(".")[0] in heavy) + sorted(stages) == []
