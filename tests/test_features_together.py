"""Features that work together, and configs that fail at `validate` instead of after the compute:
mix with screening and top-k, export and analysis of mix grids, every infeasible setting reported
at once.

    python -m pytest tests/test_features_together.py -m "not slow"
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from helpers import sandbox_grid

from harness.analysis.analyze import regime_comparison
from harness.config.loading import load_experiment
from harness.config.schema import Experiment
from harness.workflow import checks

REPO = Path(__file__).resolve().parents[1]
MIX = [{"teacher": "t-large", "weight": 1}, {"teacher": "t-small", "weight": 2}]


def cotgap(*args: str, cwd: Path = REPO, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=1800,
    )


def write(tmp_path: Path, data: dict, name: str = "grid.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def one_paragraph_error(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr
    return out.stderr


# --- validation -----------------------------------------------------------------------------------


def test_a_non_finite_mix_weight_is_a_config_error(tmp_path):
    data = sandbox_grid("w", tmp_path, regimes=["mix"], mix=[{**MIX[0], "weight": 1e999}, MIX[1]])
    path = write(tmp_path, data)
    err = one_paragraph_error(cotgap("validate", str(path)))
    assert "train.mix[0].weight" in err and "finite" in err, err


def test_every_infeasible_setting_is_reported_at_once(tmp_path, monkeypatch):
    """Duplicate and vanishing mix teachers, a filter leaving less than a batch, few-shot selection
    on a task without exemplars, budget regimes not trained, trackers not installed: one run of
    `validate`, one line each, exit 2; `plan` and `run` refuse the same config."""
    data = sandbox_grid(
        "bad",
        tmp_path,
        teachers=[
            {"name": "t-small", "path": "sandbox:test-teacher-s"},
            {"name": "t-large", "path": "sandbox:test-teacher-l"},
            {"name": "t-tiny", "path": "sandbox:test-teacher-s"},
        ],
        regimes=["per_teacher", "mix"],
        mix=[*MIX, {"teacher": "t-small", "weight": 3}, {"teacher": "t-tiny", "weight": 1e-9}],
        budget={"align": ["updates"], "regimes": ["intersection"]},
        filter_by="nll",
        filter_drop=0.999,
    )
    data["select"] = {"min_points": 10}  # few_shot_cot by default: coin flip has no exemplars
    data["tracking"] = {"mlflow": {}, "wandb": {}}
    path = write(tmp_path, data)
    out = cotgap("validate", str(path))
    err = one_paragraph_error(out)
    wanted = [
        "train.mix[2].teacher: 't-small' is already train.mix[1]",
        "train.mix[3].weight: 1e-09 against the largest 3 gives teacher 't-tiny' no example",
        "train.filter_drop: 0.999 keeps at most 0 of the 64 traces",
        "select.prompt_style: few_shot_cot, but task sandbox_coin_flip (tasks[0]) has no",
        "train.budget.regimes: ['intersection'] not in train.regimes",
    ]
    import importlib.util

    wanted += [  # only where the package is missing (the test venv has neither by default)
        f"tracking.{m}: the {m} package is not installed"
        for m in ("mlflow", "wandb")
        if importlib.util.find_spec(m) is None
    ]
    flat = " ".join(err.split())
    for line in wanted:
        assert line in flat, (line, err)
    assert flat.count(str(path)) >= len(wanted)  # every line names the file
    for command in ("plan", "run"):
        assert "train.filter_drop: 0.999" in " ".join(
            one_paragraph_error(cotgap(command, str(path))).split()
        )


def test_budget_regimes_outside_the_trained_regimes_are_refused(tmp_path):
    exp = Experiment.model_validate(
        sandbox_grid("b", tmp_path, budget={"align": "updates", "regimes": ["mix"]})
    )
    assert checks.problems(exp) == [
        "train.budget.regimes: ['mix'] not in train.regimes ['per_teacher']; add them to "
        "train.regimes or remove them here"
    ]


def test_a_feasible_grid_has_no_problems(tmp_path):
    data = sandbox_grid("ok", tmp_path, regimes=["per_teacher", "mix"], mix=MIX)
    data["train"].update(filter_by="nll", filter_drop=0.5)
    assert checks.problems(load_experiment(write(tmp_path, data))) == []


def test_regimes_compared_without_a_per_teacher_regime():
    """A mix-only grid compares no per-teacher regime: the comparison is empty, not an error."""
    dist = pd.DataFrame(
        [{"task": "t", "student": "s", "teacher": "mix", "seed": 0, "regime": "mix",
          "post_acc": 0.5, "gain": 0.1}]
    )  # fmt: skip
    out = regime_comparison(dist, [])
    assert out["n_pairs"] == 0 and out["per_regime"] == {} and "best" not in out


# --- mix with screening, top-k, export, analysis: one real run on the test zoo ---------------------


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory):
    from harness.sandbox import zoo

    zoo.build(profile="test", progress=False)
    tmp = tmp_path_factory.mktemp("mix")
    data = sandbox_grid(
        "mixed",
        tmp / "results",
        train_limit=16,
        test_limit=12,
        regimes=["mix"],
        mix=MIX,
        teachers_per_student="top_k",
        top_k=1,
        max_steps=4,
    )
    data["screen"] = {"max_examples": 16}
    config = write(tmp, data)
    return config, tmp / "results" / "mixed", cotgap("run", str(config))


@pytest.mark.slow
@pytest.mark.heavy  # the mixed-features grid: make test-slow
@pytest.mark.xdist_group("mixed")  # one worker builds the grid for both
def test_mix_with_screen_and_top_k_runs_to_a_leaderboard(mixed_run):
    config, root, out = mixed_run
    assert out.returncode == 0, out.stderr[-3000:]
    with open(root / "analysis" / "leaderboard.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["regime"] for r in rows if r["row_type"] == "distilled"] == ["mix"]
    screens = list((root / "cells" / "screen").glob("*/manifest.json"))
    assert len(screens) == 1  # the mix set was screened
    again = cotgap("screen", str(config))
    assert again.returncode == 0, again.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.xdist_group("mixed")  # one worker builds the grid for both
def test_a_mix_grid_exports_with_its_teachers_traces_named(mixed_run, tmp_path):
    config, root, _ = mixed_run
    out = cotgap("export", str(config), "--out", str(tmp_path / "export"))
    assert out.returncode == 0, out.stderr[-3000:]
    card = (tmp_path / "export" / "README.md").read_text()
    mix_section = card[card.index("_mix.parquet`") :].split("###")[0]
    assert mix_section.count("cells/traces/") == 2, mix_section


# --- outputs never overwrite inputs ---------------------------------------------------------------


@pytest.fixture()
def results(tmp_path) -> dict[str, Path]:
    """A results directory as a run leaves it (one finished eval cell, the analysis), by hand:
    the refusals happen before anything is read from it."""
    config = write(tmp_path, sandbox_grid("g", tmp_path / "results"))
    root = tmp_path / "results" / "g"
    cell = root / "cells" / "eval" / ("0" * 20)
    cell.mkdir(parents=True)
    (cell / "predictions.jsonl").write_text('{"id": "0", "completion": "heads"}\n')
    (cell / "manifest.json").write_text("{}\n")
    (root / "analysis").mkdir()
    (root / "analysis" / "report.md").write_text("# report\n")
    other = tmp_path / "notes.txt"
    other.write_text("mine\n")
    return {"config": config, "root": root, "cell": cell, "other": other, "tmp": tmp_path}


def _unchanged(paths: list[Path], run) -> str:
    before = {p: p.read_bytes() for p in paths}
    err = one_paragraph_error(run())
    assert {p: p.read_bytes() for p in paths} == before
    return " ".join(err.split())


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_view_out_refuses_cells_and_its_own_inputs(results, force):
    preds, report = (
        results["cell"] / "predictions.jsonl",
        results["root"] / "analysis" / "report.md",
    )
    for target, why in [
        (preds, "the results cells only cotgap's stages write"),
        (results["config"], "is this command's own input"),
        (report, "is this command's own input"),
    ]:
        err = _unchanged(
            [preds, report, results["config"]],
            lambda t=target: cotgap("view", str(results["config"]), "--out", str(t), *force),
        )
        assert why in err and "Nothing was written" in err, err


def test_view_out_refuses_an_existing_file_without_force_and_a_directory(results):
    err = _unchanged(
        [results["other"]],
        lambda: cotgap("view", str(results["root"]), "--out", str(results["other"])),
    )
    assert "exists; pass --force to replace it" in err, err
    err = one_paragraph_error(cotgap("view", str(results["root"]), "--out", str(results["tmp"])))
    assert "is a directory; give a file path" in err and "disk space" not in err, err


def test_score_out_never_replaces_the_predictions(results):
    preds = results["tmp"] / "preds.jsonl"
    preds.write_text('{"id": "0", "completion": "heads"}\n')
    args = ["score", "--task", "sandbox_coin_flip", "--predictions", str(preds)]
    err = _unchanged([preds], lambda: cotgap(*args, "--out", str(preds), "--force"))
    assert "is this command's own input" in err, err
    in_cell = results["cell"] / "predictions.jsonl"
    err = _unchanged(
        [in_cell],
        lambda: cotgap("score", "--task", "sandbox_coin_flip", "--predictions", str(in_cell)),
    )
    assert "the results cells" in err, err  # its default output would land in the cell


def test_export_and_ls_items_out_refusals(results):
    err = one_paragraph_error(
        cotgap("export", str(results["config"]), "--out", str(results["cell"] / "x"))
    )
    assert "the results cells" in err, err
    args = ["ls", "items", "sandbox_coin_flip", "--out", str(results["other"])]
    assert "exists; pass --force" in " ".join(
        _unchanged([results["other"]], lambda: cotgap(*args)).split()
    )
    assert cotgap(*args, "--force").returncode == 0
    assert results["other"].read_text().startswith('{"id"')


# --- text and files ---------------------------------------------------------------------------------


def test_a_lone_surrogate_in_predictions_is_a_user_error(tmp_path):
    preds = tmp_path / "preds.jsonl"
    preds.write_text('{"id": "x", "completion": "The answer is \\ud800 heads"}\n')
    out = cotgap("score", "--task", "sandbox_coin_flip", "--predictions", str(preds))
    err = " ".join(one_paragraph_error(out).split())
    assert f"{preds}: line 1: holds a lone UTF-16 surrogate escape (\\ud800)" in err, err
    assert not (tmp_path / "preds.scored.jsonl").exists()


def test_an_export_reading_a_leaderboard_that_is_not_utf8_fails_clearly(results):
    board = results["root"] / "analysis" / "leaderboard.csv"
    board.write_bytes(b"row_type,task\nteacher,caf\xe9\n")
    out = cotgap("export", str(results["config"]), "--out", str(results["tmp"] / "export"))
    err = " ".join(one_paragraph_error(out).split())
    assert f"{board}: line 2: not UTF-8 text" in err, err
    assert not [p for p in results["tmp"].iterdir() if "export" in p.name]  # nothing half-written


def test_an_export_removes_what_a_killed_export_left(results):
    gone = subprocess.Popen(["true"])
    gone.wait()
    left = [results["tmp"] / f".export.tmp-{gone.pid}", results["tmp"] / f".export.old-{gone.pid}"]
    for d in left:
        (d / "traces").mkdir(parents=True)
    mine = results["tmp"] / f".export.tmp-{os.getpid()}-not-a-pid"
    mine.mkdir()
    out = cotgap("export", str(results["config"]), "--out", str(results["tmp"] / "export"))
    assert out.returncode == 0, out.stderr
    assert not any(d.exists() for d in left) and mine.exists()
    assert (results["tmp"] / "export" / "README.md").is_file()


@pytest.mark.parametrize("argv", [["models", "import", ""], ["models", "import", "gguf:"]])
def test_an_empty_gguf_reference_is_a_user_error(argv):
    err = " ".join(one_paragraph_error(cotgap(*argv)).split())
    assert "gguf: names no file or package; give gguf:<path>.gguf" in err, err


def test_a_config_with_an_empty_gguf_path_fails_validate(tmp_path):
    data = sandbox_grid("g", tmp_path, teachers=[{"name": "t", "path": "gguf:"}])
    err = " ".join(one_paragraph_error(cotgap("validate", str(write(tmp_path, data)))).split())
    assert "model 't': gguf: names no file or package" in err, err


def test_gguf_facts_are_read_again_when_the_file_changes_in_place(tmp_path, monkeypatch):
    """Same path, same size, mtime set back: the content changed, so must the sha256."""
    gguf_lib = pytest.importorskip("gguf")
    import numpy as np

    from harness.models import gguf
    from harness.store import sha256_file

    monkeypatch.setenv("COTGAP_GGUF_DIR", str(tmp_path / "cache"))
    path = tmp_path / "m.gguf"

    def make(value: float) -> None:
        w = gguf_lib.GGUFWriter(str(path), "llama")
        w.add_name("tiny")
        w.add_tensor("w", np.full((4, 4), value, dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    make(1.0)
    first = gguf.facts(path)
    st = path.stat()
    make(2.0)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    second = gguf.facts(path)
    assert second["sha256"] == sha256_file(path) != first["sha256"]
    assert gguf.facts(path) == second  # and cached from then on


# --- offline by construction ------------------------------------------------------------------------


class Listener:
    """A socket on 127.0.0.1 that every proxy variable points at: it accepts, records and closes
    each connection, so any request a library makes (through a proxy, as they all honour these
    variables) is counted instead of leaving the machine."""

    def __init__(self) -> None:
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port, self.seen = self.sock.getsockname()[1], []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.settimeout(2)
            try:
                self.seen.append(conn.recv(200).decode("latin-1").splitlines()[:1])
            except OSError:
                self.seen.append(["(no request line)"])
            conn.close()

    def env(self) -> dict[str, str]:
        url = f"http://127.0.0.1:{self.port}"
        names = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
        return {**{n: url for n in names}, **{n.lower(): url for n in names}}


def local_task(tmp_path: Path) -> tuple[Path, Path]:
    """A tasks directory with every shipped task and `local_coin_flip`: the sandbox coin flips as
    an original file under a data dir (the test zoo answers them), with a hub source named too,
    which loading from the files must never use; returns (tasks dir, data dir)."""
    import shutil

    from harness.tasks import suite as tasks

    tasks_dir, data = tmp_path / "tasks", tmp_path / "data"
    shutil.copytree(tasks.tasks_dir(), tasks_dir)
    items = tasks.load_items("sandbox_coin_flip", "test")[:100]
    (data / "local").mkdir(parents=True)
    rows = [{"question": it.question, "answer": it.gold} for it in items]
    (data / "local" / "coin_flip.json").write_text(json.dumps(rows))
    spec = {
        "name": "local_coin_flip", "version": 1, "description": "sandbox coin flips, from a file",
        "splits_note": "one pool of 100, 3:2", "answer_type": "yes_no", "extractor": "yes_no",
        "headline": "strict",
        "source": {
            "hub": {"id": "cotgap-tests/coin-flip", "config": "default", "revision": "main",
                    "splits": {"all": ["train"]}},
            "files": {"format": "json", "splits": {"all": ["local/coin_flip.json"]}},
        },
        "fields": {"question": "question", "answer": "answer"},
        "split": {"ratio": [3, 2], "seed": 1234},
        "sizes": {"all": 100, "train": 60, "test": 40},
        "prompt": {"zero_shot_cot": "{question}"},
    }  # fmt: skip
    (tasks_dir / "local_coin_flip.yaml").write_text(yaml.safe_dump(spec))
    return tasks_dir, data


@pytest.mark.slow
def test_a_local_grid_makes_no_network_request_whatever_the_environment(tmp_path):
    """Sandbox models and a task whose original file is in a data_dir given relative to the
    config file (the task names a hub source too): with the offline variables unset and every
    proxy variable at a local listener, `run` (traces, training, evals, the analysis and the
    viewer, which shows the distilled rows' questions from the data_dir) connects to nothing."""
    from harness.present import view
    from harness.sandbox import zoo

    zoo.build(profile="test", progress=False)
    tasks_dir, data_dir = local_task(tmp_path)
    data = sandbox_grid(
        "offline",
        "results",
        teachers=[{"name": "t-large", "path": "sandbox:test-teacher-l"}],
        max_steps=2,
    )
    data["tasks"] = [{"name": "local_coin_flip", "train_limit": 16, "test_limit": 8}]
    config = tmp_path / "study" / "grid.yaml"
    config.parent.mkdir()
    data["data_dir"] = os.path.relpath(data_dir, config.parent)
    config.write_text(yaml.safe_dump(data))
    listener = Listener()
    env = {k: v for k, v in os.environ.items() if "OFFLINE" not in k and "PROXY" not in k.upper()}
    env.update(listener.env(), HF_HOME=str(tmp_path / "hf"), COTGAP_TASKS_DIR=str(tasks_dir))
    out = subprocess.run(
        [sys.executable, "-m", "harness", "run", str(config)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=1800,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert listener.seen == [], listener.seen
    page = (tmp_path / "study" / "results" / "offline" / "analysis" / "viewer.html").read_text()
    index, _ = view.embedded(page)
    assert index["notes"] == []  # no "questions not shown": they came from the data_dir
    assert [r for r in index["distilled"].values() if "counts" in r], index["distilled"]
