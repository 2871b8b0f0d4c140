"""`cotgap export`: every cell's records as Hugging Face Parquet that `datasets.load_dataset`
reads back unchanged, the leaderboard too, and a dataset card with each file's provenance.

    .venv/bin/pytest tests/test_export.py
The store is test_view's hand-made one (real sandbox items, hand-set verdicts).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import datasets
import pandas as pd
import pytest
import yaml
from test_view import _experiment, _populate

from harness.analysis import analyze
from harness.errors import UserError
from harness.present import export
from harness.store import Store, read_jsonl
from harness.workflow import grid as grids

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("export")
    exp = _experiment(tmp)
    store = Store(exp.root)
    _populate(exp, store)
    analyze.run(exp, store, log=lambda _: None)
    out, counts = export.run(exp, tmp / "out", log=lambda _: None)
    return exp, store, out, counts


def _load(path: Path, cache: Path) -> list[dict]:
    ds = datasets.load_dataset("parquet", data_files=str(path), split="train", cache_dir=str(cache))
    return ds.to_list()


def test_load_dataset_round_trips_every_cell(exported, tmp_path: Path) -> None:
    exp, store, out, counts = exported
    grid = grids.expand(exp)
    checked = 0
    for rel, cell in export._files(exp, grid):
        records = read_jsonl(store.cell_dir(cell.kind, cell.key) / export._FILES[cell.kind])
        assert _load(out / rel, tmp_path / "cache") == records, rel
        checked += 1
    # traces: 2 teachers; evals: 2 teachers, 1 baseline, 2 distilled; 2 training sets; + leaderboard
    assert checked == counts["files"] - 1 == 9
    assert counts["missing"] == 0 and counts["rows"] > 0


def test_leaderboard_parquet_equals_the_csv(exported, tmp_path: Path) -> None:
    exp, _, out, _ = exported
    csv = pd.read_csv(exp.root / "analysis" / "leaderboard.csv", dtype=analyze._DTYPES)
    loaded = pd.DataFrame(_load(out / "leaderboard.parquet", tmp_path / "cache"))
    assert list(loaded.columns) == list(analyze.COLUMNS) and len(loaded) == len(csv) == 5

    def cells(frame: pd.DataFrame) -> list[list]:
        return frame.astype(object).where(frame.notna(), None).values.tolist()

    assert cells(loaded) == cells(csv)
    assert loaded.degraded.tolist() == [None, None, None, False, True]


def test_card_names_every_file_and_its_provenance(exported) -> None:
    _, _, out, counts = exported
    card = (out / "README.md").read_text()
    front = yaml.safe_load(card.split("---")[1])
    paths = [c["data_files"][0]["path"] for c in front["configs"]]
    assert len(paths) == counts["files"] and all((out / p).exists() for p in paths)
    splits = {c["data_files"][0]["path"].split("/")[0]: c["data_files"][0]["split"]
              for c in front["configs"]}  # fmt: skip
    expected = {"traces": "train", "train": "train", "predictions": "test"}
    assert splits == {**expected, "leaderboard.parquet": "train"}, splits
    traces = card.split("### `traces/")[1].split("###")[0]
    for needle in ("sandbox_coin_flip v", "prompt_style", "temperature=", "teacher", "git"):
        assert needle in traces
    train = card.split("### `train/")[1].split("###")[0]
    for needle in (
        "regime per_teacher: correct, finished teacher traces",
        "prompt_style",
        "temperature=",
    ):
        assert needle in train


def test_out_holding_other_files_is_refused(exported, tmp_path: Path) -> None:
    exp, *_ = exported
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(UserError, match="not an earlier cotgap export"):
        export.run(exp, tmp_path)
    assert (tmp_path / "mine.txt").read_text() == "keep me"


def test_cli_export_rewrites_an_earlier_export(exported) -> None:
    exp, _, out, counts = exported
    cfg = out.parent / "toy.yaml"
    cfg.write_text(yaml.safe_dump(exp.model_dump(mode="json", exclude_none=True)))
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "harness", "export", str(cfg), "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180)
    assert done.returncode == 0, done.stderr
    assert f"{counts['files']} Parquet files" in done.stdout
    assert not list(out.parent.glob(f".{out.name}.*"))  # no temporary directory left behind


def test_file_names_name_the_trace_draw_when_there_are_several(tmp_path: Path) -> None:
    one = _experiment(tmp_path)
    plain = [rel for rel, _ in export._files(one, grids.expand(one))]
    assert not any("_trace" in rel for rel in plain)
    exp = one.model_copy(
        update={
            "generate": one.generate.model_copy(update={"seed": 0, "seeds": (0, 1)}),
            "train": one.train.model_copy(update={"seeds": (0, 1), "replicates": "paired"}),
        }
    )
    files = export._files(exp, grids.expand(exp))
    names = [rel for rel, _ in files]
    assert len(names) == len(set(names)) == 2 * len(plain) - len(exp.teachers) - 1
    for rel, cell in files:
        draw = getattr(cell, "trace_seed", None)
        if cell.kind == "traces" or cell.kind == "dataset":
            assert rel.endswith(f"_trace{draw}.parquet")
        elif getattr(cell, "role", None) == "distilled":
            assert rel.endswith(f"_trace{draw}_seed{cell.seed}.parquet")
        else:  # teacher evals and baselines are shared by the draws
            assert "_trace" not in rel
