"""Optional experiment tracking, off by default: every complete cell's metrics, config and
provenance logged to MLflow (a local file store, no server) and/or W&B in offline mode.

    pip install 'cotgap[tracking]'        # mlflow-skinny; wandb for the W&B section
    # in the experiment YAML:  tracking: {mlflow: {uri: "file:mlruns"}, wandb: {project: cotgap}}
    cotgap analyze configs/sandbox.yaml   # logs after the analysis (so does `cotgap run`)

MLflow: one run per complete cell, named by its label and tagged with its kind, key, names
(task, model, teacher, regime, trace_seed, seed), git commit and package versions; params are its
resolved config (config.yaml, flattened); metrics the numbers of its manifest summary, and for a
distilled eval its leaderboard row (gain, CI, McNemar p). A cell is immutable, so a cell already
logged (its key in the `cotgap.key` tag) is not logged again. W&B: one offline run per call, holding
the cells table and the leaderboard; `wandb sync <dir>` uploads it later.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from harness.config.schema import Experiment
from harness.errors import UserError
from harness.store import Store
from harness.workflow import grid as grids
from harness.workflow.cells import Cell

_NAMES = ("task", "model", "role", "teacher", "regime", "trace_seed", "seed")
_BOARD_METRICS = ("gain", "gain_ci_low", "gain_ci_high", "mcnemar_p", "base_acc", "post_acc")


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """{"train.lora.r": 8, ...}: nested config as MLflow params (lists as their text)."""
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): obj}


def _numbers(summary: dict[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in flatten(summary).items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


def cell_record(store: Store, cell: Cell, board_row: dict[str, Any] | None) -> dict[str, Any]:
    """What is logged for one complete cell: tags, params, metrics, the manifest."""
    d = store.cell_dir(cell.kind, cell.key)
    manifest = store.manifest(cell.kind, cell.key) or {}
    config = yaml.safe_load((d / "config.yaml").read_text(encoding="utf-8")) or {}
    tags = {"cotgap.kind": cell.kind, "cotgap.key": cell.key, "cotgap.label": cell.label}
    tags.update({f"cotgap.{n}": str(getattr(cell, n)) for n in _NAMES if hasattr(cell, n)})
    git = manifest.get("git") or {}
    tags["cotgap.git_commit"] = str(git.get("commit"))
    tags["cotgap.git_dirty"] = str(git.get("dirty"))
    tags.update(
        {f"cotgap.package.{k}": str(v) for k, v in (manifest.get("packages") or {}).items()}
    )
    metrics = _numbers(manifest.get("summary") or {})
    metrics["wall_s"] = float(manifest.get("wall_s") or 0.0)
    if board_row is not None:
        metrics.update(_numbers({f"leaderboard.{k}": board_row.get(k) for k in _BOARD_METRICS}))
    params = {k: str(v)[:500] for k, v in flatten(config).items()}  # MLflow caps a value's length
    return {
        "name": cell.label,
        "tags": tags,
        "params": params,
        "metrics": metrics,
        "manifest": manifest,
    }


def _records(exp: Experiment, store: Store) -> list[dict[str, Any]]:
    import pandas as pd

    board_path = exp.root / "analysis" / "leaderboard.csv"
    rows: dict[str, dict] = {}
    if board_path.exists():
        board = pd.read_csv(board_path)
        rows = {r["eval_key"]: r for r in board[board.row_type == "distilled"].to_dict("records")}
    return [
        cell_record(store, c, rows.get(c.key))
        for c in grids.expand(exp).unique()
        if store.complete(c.kind, c.key)
    ]


def _resolve(exp: Experiment, path: str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else exp.root / p


def log_mlflow(exp: Experiment, records: list[dict[str, Any]]) -> tuple[str, int]:
    """Log the records not logged yet; returns the tracking URI and how many runs were added."""
    try:
        import mlflow
    except ImportError:
        raise UserError(
            "tracking.mlflow is set but mlflow is not installed; pip install 'cotgap[tracking]' "
            "(mlflow-skinny), or remove the tracking.mlflow section."
        ) from None
    # MLflow 3.x refuses its file store ("maintenance mode") unless told otherwise; the file store
    # is what a run without a server or a database needs, and it still reads and writes runs.
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    cfg = exp.tracking.mlflow
    assert cfg is not None  # called when tracking.mlflow is set
    uri = "file:" + str(_resolve(exp, cfg.uri.removeprefix("file:")))
    client = mlflow.MlflowClient(tracking_uri=uri)
    name = cfg.experiment or exp.name
    found = client.get_experiment_by_name(name)
    exp_id = found.experiment_id if found else client.create_experiment(name)
    logged = {
        r.data.tags.get("cotgap.key") for r in client.search_runs([exp_id], max_results=50_000)
    }
    added = 0
    for rec in records:
        if rec["tags"]["cotgap.key"] in logged:
            continue
        run = client.create_run(exp_id, run_name=rec["name"], tags=rec["tags"])
        rid = run.info.run_id
        from mlflow.entities import Metric, Param, RunTag

        now = int(run.info.start_time)
        client.log_batch(
            rid,
            metrics=[Metric(k, v, now, 0) for k, v in rec["metrics"].items()],
            params=[Param(k, v) for k, v in rec["params"].items()],
            tags=[RunTag("mlflow.runName", rec["name"])],
        )
        client.log_dict(rid, rec["manifest"], "manifest.json")
        client.set_terminated(rid)
        added += 1
    return uri, added


def log_wandb(exp: Experiment, records: list[dict[str, Any]]) -> str:
    """One offline W&B run with the cells table and the leaderboard; returns its directory."""
    try:
        import wandb
    except ImportError:
        raise UserError(
            "tracking.wandb is set but wandb is not installed; pip install wandb, or remove the "
            "tracking.wandb section."
        ) from None
    cfg = exp.tracking.wandb
    assert cfg is not None  # called when tracking.wandb is set
    out = _resolve(exp, cfg.dir)
    out.mkdir(parents=True, exist_ok=True)
    run = wandb.init(
        project=cfg.project,
        name=exp.name,
        dir=str(out),
        mode="offline",
        config=exp.model_dump(mode="json"),
    )
    columns = ["label", "kind", "key", "git_commit", "metrics"]
    table = wandb.Table(columns=columns)
    for rec in records:
        t = rec["tags"]
        table.add_data(
            rec["name"],
            t["cotgap.kind"],
            t["cotgap.key"],
            t["cotgap.git_commit"],
            yaml.safe_dump(rec["metrics"], sort_keys=True),
        )
    logged: dict[str, Any] = {"cells": table}
    board = exp.root / "analysis" / "leaderboard.csv"
    if board.exists():
        import pandas as pd

        logged["leaderboard"] = wandb.Table(dataframe=pd.read_csv(board))
    run.log(logged)
    run.finish()
    return str(out)


def log(exp: Experiment, store: Store, say: Callable[[str], None] = print) -> None:
    """Log the grid's complete cells to every tracker the config turns on (none: nothing)."""
    t = exp.tracking
    if t.mlflow is None and t.wandb is None:
        return
    records = _records(exp, store)
    if t.mlflow is not None:
        uri, added = log_mlflow(exp, records)
        say(
            f"tracking: mlflow {uri}: {added} new run(s), {len(records) - added} cell(s) logged before"
        )
    if t.wandb is not None:
        say(f"tracking: wandb offline run in {log_wandb(exp, records)} (`wandb sync` uploads it)")
