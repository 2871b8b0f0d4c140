"""The documentation cannot rot: every example of README.md and docs/ runs, the generated reference
pages match the code, the site builds with no broken link, and no page tells the project's history.

    pytest -q tests/test_docs.py

Examples (docs/development.md, "Examples run"): each document's fenced blocks run in order in one
temporary directory holding `configs/`, `docs/` and `harness/` (links) and an empty `tasks/`
(COTGAP_TASK_PATH: the tasks the examples write are found next to the built-in ones). ```bash blocks run in bash with `cotgap` = this working tree's CLI; ```yaml
blocks are configs passed to `cotgap validate`; an `<!-- example: ... -->` comment on the line
before a block writes it to files (`file PATH...`), validates it as part of a minimal config
(`section`), expects it to fail (`fails`) or skips it with a reason (`skip REASON`).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN = ("bash", "sh", "yaml")
DIRECTIVE = re.compile(r"^<!-- example: (\w+)\s*(.*?)\s*-->$")
# A minimal experiment that a `section` snippet is merged into (lists are replaced, maps merged).
BASE = {
    "name": "section",
    "teachers": [{"name": "t", "path": "sandbox:teacher-s"}],
    "students": [{"name": "s", "path": "sandbox:student-s"}],
    "tasks": ["sandbox_addition"],
    "train": {"max_steps": 10},
}


@dataclass
class Block:
    line: int  # 1-based line of the opening fence
    lang: str
    body: str
    directive: str = ""
    argument: str = ""


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, each with the `example:` comment just above it."""
    out: list[Block] = []
    lines = path.read_text().split("\n")
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        found = DIRECTIVE.match(lines[i - 1].strip()) if i else None
        block = Block(i + 1, fence.group(1), "\n".join(lines[i + 1 : end]) + "\n")
        if found:
            block.directive, block.argument = found.group(1), found.group(2)
        out.append(block)
        i = end + 1
    return out


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merge(out[key], value) if both else value
    return out


def _workdir(tmp: Path) -> tuple[Path, dict]:
    for name in ("configs", "harness", "docs"):
        (tmp / name).symlink_to(ROOT / name)
    (tmp / "tasks").mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "COTGAP_TASK_PATH": str(tmp / "tasks"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "MPLCONFIGDIR": str(tmp / ".mpl"),
        "PY": sys.executable,
    }
    env.pop("COTGAP_DATA_DIR", None)
    return tmp, env


def _bash(script: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    prelude = 'set -e -o pipefail\ncotgap() { "$PY" -m harness "$@"; }\npython() { "$PY" "$@"; }\n'
    return subprocess.run(
        ["bash", "-c", prelude + script], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


def run_block(block: Block, cwd: Path, env: dict, n: int) -> str | None:
    """Run one block; None when it behaved as its document says, else what went wrong."""
    if block.directive == "file":
        for target in block.argument.split():
            (cwd / target).parent.mkdir(parents=True, exist_ok=True)
            (cwd / target).write_text(block.body)
        return None
    if block.lang not in RUN or block.directive == "skip":
        return None
    if block.lang == "yaml":
        data = yaml.safe_load(block.body)
        if block.directive == "section":
            data = _merge(BASE, data)
        (cwd / f"example-{n}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
        script = f"cotgap validate example-{n}.yaml"
    else:
        script = block.body
    done = _bash(script, cwd, env)
    failed = done.returncode != 0
    if failed == (block.directive == "fails"):
        return None
    expected = "to fail" if block.directive == "fails" else "to succeed"
    return f"expected {expected}, exit {done.returncode}:\n{script}\n{done.stdout}{done.stderr}"


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_examples_run(doc: Path, tmp_path: Path) -> None:
    cwd, env = _workdir(tmp_path)
    problems = []
    for n, block in enumerate(blocks(doc)):
        problem = run_block(block, cwd, env, n)
        if problem:
            problems.append(f"{doc.name}:{block.line}: {problem}")
    assert not problems, "\n\n".join(problems)


def test_skipped_examples_say_why_and_are_few() -> None:
    skipped = [(d.name, b) for d in DOCUMENTS for b in blocks(d) if b.directive == "skip"]
    ran = [b for d in DOCUMENTS for b in blocks(d) if b.lang in RUN and b.directive != "skip"]
    assert all(b.argument for _, b in skipped), "every skip gives its reason"
    assert len(skipped) < len(ran) / 2, f"{len(skipped)} skipped, {len(ran)} run"


def test_every_directive_is_known() -> None:
    known = {"file", "section", "fails", "skip"}
    for doc in DOCUMENTS:
        for lineno, line in enumerate(doc.read_text().split("\n"), 1):
            found = DIRECTIVE.match(line.strip())
            if line.strip().startswith("<!-- example"):
                assert found and found.group(1) in known, f"{doc.name}:{lineno}: {line}"


def test_a_failing_example_is_reported(tmp_path: Path) -> None:
    """The runner itself: a config that does not validate fails its block, and passes when the
    document says it fails."""
    cwd, env = _workdir(tmp_path)
    bad = Block(1, "yaml", "name: x\nteachers: []\n")
    assert run_block(bad, cwd, env, 0) is not None
    assert run_block(Block(1, "yaml", bad.body, "fails"), cwd, env, 1) is None


def test_generated_reference_is_current() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "gen_reference.py"), "--check"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_config_reference_has_every_key() -> None:
    from harness.config.schema import Experiment

    page = (ROOT / "docs" / "config.md").read_text()
    for name in [
        *Experiment.model_fields,
        *Experiment.model_fields["train"].annotation.model_fields,
    ]:
        assert f"| `{name}` |" in page, name


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="mkdocs not installed")
def test_site_builds_without_broken_links(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "statistics" / "index.html").is_file()


def test_readme_is_a_front_door() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.split("\n")) <= 200
    for heading in ("## Install", "## Quickstart", "## Your own study", "## Reading the answer"):
        assert heading in text


def test_readme_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target


# Sentences about how the project was developed, not about what it does.
HISTORY = re.compile(
    r"\bsessions? \d|\bsession \d|\bin session\b|earlier (code|version of the code|recipe)"
    r"|\bwent from\b|\buntil session\b|\bthe old code\b",
    re.IGNORECASE,
)


def _history_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "Makefile", ROOT / "mkdocs.yml", ROOT / ".ci" / "run"]
    for folder, pattern in [
        ("docs", "*.md"), ("benchmarks", "*.md"), ("benchmarks", "*.py"), ("harness", "*.py"),
        ("configs", "*.yaml"),
    ]:  # fmt: skip
        files += sorted((ROOT / folder).rglob(pattern))
    return files


def test_no_development_history() -> None:
    found = []
    for path in _history_files():
        for lineno, line in enumerate(path.read_text().split("\n"), 1):
            if HISTORY.search(line):
                found.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()}")
    assert not found, "\n".join(found)


def test_version_flag() -> None:
    from harness import __version__

    done = subprocess.run(
        [sys.executable, "-m", "harness", "--version"],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == f"cotgap {__version__}"


def test_help_is_plain_text() -> None:
    """No type labels on flags (`<bool>`), and a help sentence is one paragraph, not cut lines."""
    page = (ROOT / "docs" / "cli.md").read_text()
    assert "<bool>" not in page
    assert "with vLLM." not in page  # generate runs on whichever engine is configured
    assert "each training\nset" not in page


def test_changelog_names_every_extractors_current_version() -> None:
    """An extractor version changes what results mean: a bump must come with its changelog line."""
    from harness.tasks.answers import EXTRACTORS

    latest = (ROOT / "CHANGELOG.md").read_text().split("\n## ", 2)[1]
    missing = [
        f"{n} {e.version}" for n, e in EXTRACTORS.items() if f"`{n}` {e.version}" not in latest
    ]
    assert missing == [], f"CHANGELOG.md's latest release does not name: {missing}"


def test_readme_answers_row_has_the_files_columns() -> None:
    """The README's annotated answers.csv row: the file's columns, in order, one value each."""
    from harness.analysis.analyze import ANSWER_COLUMNS

    (block,) = [b for b in blocks(ROOT / "README.md") if b.body.startswith("task,student,")]
    header, row = block.body.strip().split("\n")
    assert header.split(",") == list(ANSWER_COLUMNS)
    assert len(row.split(",")) == len(ANSWER_COLUMNS)
