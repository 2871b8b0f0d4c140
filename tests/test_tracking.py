"""Optional tracking: the `tracking:` config section is strict, and MLflow's local file store
holds every complete cell's metrics, config and provenance, read back here through MLflow.

    .venv/bin/pytest tests/test_tracking.py
Skipped (with the reason) where mlflow is not installed (`pip install 'cotgap[tracking]'`).
"""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
from test_view import _experiment, _populate

from harness.analysis import analyze
from harness.config.loading import parse
from harness.config.schema import Experiment
from harness.errors import UserError
from harness.present import tracking
from harness.store import Store
from harness.workflow import grid as grids

BASE = {
    "name": "x",
    "teachers": [{"name": "a", "path": "sandbox:teacher-s"}],
    "students": [{"name": "b", "path": "sandbox:student-s"}],
    "tasks": ["sandbox_addition"],
    "train": {"max_steps": 1},
}


def test_tracking_is_off_by_default_and_strict() -> None:
    exp = parse(Experiment, BASE, "x.yaml")
    assert exp.tracking.mlflow is None and exp.tracking.wandb is None
    on = parse(Experiment, {**BASE, "tracking": {"mlflow": {}}}, "x.yaml")
    assert on.tracking.mlflow.uri == "file:mlruns"
    for section, message in [
        ({"mlflow": {"url": "file:x"}}, "tracking.mlflow.url: unknown key; did you mean 'uri'"),
        ({"neptune": {}}, "tracking.neptune: unknown key"),
        ({"mlflow": {"uri": "http://host:5000"}}, "not a local file store"),
    ]:
        with pytest.raises(UserError, match=re.escape(message)):
            parse(Experiment, {**BASE, "tracking": section}, "x.yaml")


def test_mlflow_file_store_reads_back_every_cell(tmp_path) -> None:
    mlflow = pytest.importorskip(
        "mlflow", reason="mlflow not installed: pip install 'cotgap[tracking]'"
    )
    exp = _experiment(tmp_path)
    exp = exp.model_copy(
        update={
            "tracking": parse(Experiment, {**BASE, "tracking": {"mlflow": {}}}, "x.yaml").tracking
        }
    )
    store = Store(exp.root)
    _populate(exp, store)
    analyze.run(exp, store, log=lambda _: None)
    said: list[str] = []
    tracking.log(exp, store, say=said.append)
    cells = [c for c in grids.expand(exp).unique() if store.complete(c.kind, c.key)]
    assert said == [
        f"tracking: mlflow file:{exp.root / 'mlruns'}: {len(cells)} new run(s), 0 cell(s) logged before"
    ]

    client = mlflow.MlflowClient(tracking_uri=f"file:{exp.root / 'mlruns'}")
    runs = client.search_runs(
        [client.get_experiment_by_name("toy").experiment_id], max_results=1000
    )
    by_key = {r.data.tags["cotgap.key"]: r for r in runs}
    assert sorted(by_key) == sorted(c.key for c in cells)
    board = pd.read_csv(exp.root / "analysis" / "leaderboard.csv")
    for c in cells:
        run = by_key[c.key]
        manifest = store.manifest(c.kind, c.key)
        assert run.info.run_name == c.label and run.data.tags["cotgap.kind"] == c.kind
        assert run.data.tags["cotgap.git_commit"] == str(manifest["git"]["commit"])
        assert run.data.tags["cotgap.task"] == c.task
        key = "seed" if c.kind == "adapter" else "task.name"  # an adapter's config names its seed
        assert run.data.params[key] == str(c.config.get("seed") if c.kind == "adapter" else c.task)
        for k, v in manifest["summary"].items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                assert run.data.metrics[k] == pytest.approx(v)
        if getattr(c, "role", None) == "distilled":
            row = board[board.eval_key == c.key].iloc[0]
            assert run.data.metrics["leaderboard.gain"] == pytest.approx(row.gain)
            assert run.data.metrics["leaderboard.mcnemar_p"] == pytest.approx(row.mcnemar_p)
    # a cell is logged once: a second analysis adds nothing
    said.clear()
    tracking.log(exp, store, say=said.append)
    assert said[0].endswith(f"0 new run(s), {len(cells)} cell(s) logged before")


def test_wandb_offline_run_holds_the_cells(tmp_path, monkeypatch) -> None:
    pytest.importorskip("wandb", reason="wandb not installed: pip install 'cotgap[tracking]'")
    monkeypatch.setenv("WANDB_SILENT", "true")
    exp = _experiment(tmp_path)
    on = parse(Experiment, {**BASE, "tracking": {"wandb": {"project": "p"}}}, "x.yaml")
    exp = exp.model_copy(update={"tracking": on.tracking})
    store = Store(exp.root)
    _populate(exp, store)
    said: list[str] = []
    tracking.log(exp, store, say=said.append)
    runs = list((exp.root / "wandb").glob("wandb/offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb")), said
    cells = [c for c in grids.expand(exp).unique() if store.complete(c.kind, c.key)]
    table = next(runs[0].glob("files/media/table/cells_*.table.json"))
    data = json.loads(table.read_text())["data"]
    assert sorted(row[2] for row in data) == sorted(c.key for c in cells)
