"""make test-slow's grouped tests: under `--dist loadgroup` the tests marked
`xdist_group(name)` run in one worker, which builds their shared grid once (the studies grid,
the mixed-features grid); where the installed pytest and pytest-xdist lose the grouping, the
grouped tests fail before building anything (tests/conftest.py).

    python -m pytest tests/test_test_groups.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from conftest import lost_groups

GROUPED = """
import os
import pytest

pytestmark = pytest.mark.xdist_group("grid")


@pytest.fixture(scope="module")
def grid():
    with open("built.log", "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")


@pytest.mark.parametrize("i", range(3))
def test_uses_the_grid(grid, i):
    pass


def test_alone():
    pass
"""


def test_a_group_runs_in_one_worker_that_builds_its_fixture_once(tmp_path):
    """The installed pytest and pytest-xdist, two workers, as make test-slow runs them, with
    tests/conftest.py's check (`-p conftest`)."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    run = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-n", "2"]
    out = subprocess.run(
        [*run, "--dist", "loadgroup", "-p", "conftest", "test_grouped.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)},
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert len((tmp_path / "built.log").read_text().split()) == 1, out.stdout
    grouped = [line for line in out.stdout.splitlines() if "PASSED" in line and "test_uses" in line]
    assert len(grouped) == 3 and all(line.rstrip().endswith("@grid") for line in grouped), grouped
    assert len({line.split()[0] for line in grouped}) == 1, grouped  # one worker, "[gw0]"


def _item(nodeid: str, grouped: bool = True) -> SimpleNamespace:
    # stands in for a pytest item: the pytest whose node ids pytest-xdist cannot tag (9.2, with
    # pytest-xdist 3.8) is not the one installed here
    return SimpleNamespace(nodeid=nodeid, get_closest_marker=lambda name: grouped or None)


def test_a_grouped_test_without_its_group_suffix_is_found():
    items = [
        _item("t.py::test_a@grid"),
        _item("t.py::test_b[1]@grid"),
        _item("t.py::test_c"),
        _item("t.py::test_d[x@y]"),  # an '@' of the parameter's id is not a group
        _item("t.py::test_e", grouped=False),
    ]
    assert lost_groups(items) == ["t.py::test_c", "t.py::test_d[x@y]"]
