"""Every study analysis on a real sandbox grid: four teachers of graded strength (the zoo's
test-teacher-l, teacher-s, teacher-m and teacher-l), two students, two tasks, each regime (and the
mix under every budget alignment), a pre-selection that gates one task and runs it anyway, two
replicates per teacher. The grid is tiny (24 items, 3 optimizer updates): its numbers are noise,
and the point is that every analysis reaches the report, analysis.json and the viewer with its
interval and a reading that says when the data cannot tell.

    python -m pytest tests/test_studies_grid.py -m slow
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.config.loading import load_experiment
from harness.present import view
from harness.sandbox import zoo

# make test-slow: a 380-cell grid, built once (one worker holds both tests)
pytestmark = [pytest.mark.slow, pytest.mark.combos, pytest.mark.xdist_group("studies_grid")]
STUDIES = ("stronger_teacher", "quantity_quality", "regime_flips", "capacity_gap", "delta_pairs",
           "families", "mix_parts", "selection_effect")  # fmt: skip
WORDS = ("inconclusive", "too few", "better", "worse", "equivalent", "same", "flip", "wins",
         "gain", "inverted U")  # fmt: skip


def study_grid(results: Path) -> dict:
    teachers = [("t1", "test-teacher-l"), ("t2", "teacher-s"), ("t3", "teacher-m"),
                ("t4", "teacher-l")]  # fmt: skip
    return {
        "name": "studies",
        "results_dir": str(results),
        "teachers": [{"name": n, "path": f"sandbox:{m}"} for n, m in teachers],
        "students": [
            {"name": "s-xs", "path": "sandbox:test-student"},
            {"name": "s-s", "path": "sandbox:student-xs"},
        ],  # fmt: skip
        "tasks": [
            {"name": t, "train_limit": 24, "test_limit": 24}
            for t in ("sandbox_coin_flip", "sandbox_sums")
        ],  # fmt: skip
        # measured on this zoo (48 items): coin flip's teacher spread ~45 pts, sums' ~90
        "select": {"prompt_style": "zero_shot_cot", "min_points": 60, "run_gated": 1.0},
        "generate": {"n": 2, "temperature": 0.8, "max_tokens": 160, "seeds": [0, 1]},
        "train": {
            "lr": 5e-3,
            "max_steps": 3,
            "per_device_batch_size": 4,
            "max_length": 256,
            "lora": {"r": 4, "alpha": 8},
            "seeds": [0, 1],
            "replicates": "paired",
            "regimes": ["per_teacher", "intersection", "matched", "mix"],
            "mix": [{"teacher": "t4", "weight": 1}, {"teacher": "t2", "weight": 4}],
            "mix_batch": {"per_device_batch_size": 8},
            "budget": {
                "align": ["none", "updates", "batch"],
                "reference": "t2",
                "regimes": ["mix"],
            },
        },  # fmt: skip
        "evaluate": {"max_tokens": 160},
        "analysis": {
            "bootstrap_samples": 200,
            "min_replicates": 2,
            "effect_of_interest": 10,
            "delta_large": ["t4", "t1"],
            "delta_long": ["t3", "t2"],
            "families": [{"name": "sandbox", "tasks": ["sandbox_*"]}],
        },  # fmt: skip
    }


@pytest.fixture(scope="module")
def analysed(tmp_path_factory) -> Path:
    zoo.build(profile="test", progress=False)
    zoo.build(profile="demo", progress=False)
    tmp = tmp_path_factory.mktemp("studies")
    config = tmp / "studies.yaml"
    config.write_text(yaml.safe_dump(study_grid(tmp / "results")))
    for args in (("run", str(config)), ("view", str(config))):
        out = subprocess.run(
            [sys.executable, "-m", "harness", *args], capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr[-4000:]
    return load_experiment(config).root / "analysis"


def test_every_study_is_in_the_report_json_and_viewer(analysed: Path) -> None:
    result = json.loads((analysed / "analysis.json").read_text())
    text = (analysed / "report.md").read_text(encoding="utf-8")
    page, _ = view.embedded((analysed / "viewer.html").read_text(encoding="utf-8"))
    assert set(result["studies"]) == set(STUDIES)
    for name in STUDIES:
        study = result["studies"][name]
        assert f"### {study['title']}" in text
        assert page["studies"][name]["title"] == study["title"]
        assert study["readings"], name
        for reading in study["readings"]:
            assert f"- {reading}." in text
            assert any(w in reading for w in WORDS), reading
        # each study with data has a table whose rows carry an interval (low, high) or a word
        assert any(t["rows"] for t in study["tables"]), name
        assert page["studies"][name]["tables"] == study["tables"]


def test_the_studies_see_the_grid(analysed: Path) -> None:
    s = json.loads((analysed / "analysis.json").read_text())["studies"]
    regimes = {f["regime"] for f in s["stronger_teacher"]["fits"]}
    assert {"per_teacher", "intersection", "matched"} <= regimes
    # the mix against both its parts, as configured and under both alignments
    mixes = {(c["regime"], c["part"]) for c in s["mix_parts"]["comparisons"]}
    assert {r for r, _ in mixes} == {"mix", "mix@updates", "mix@batch"}
    assert {p for _, p in mixes} == {"t4", "t2"}
    assert {p["name"] for p in s["delta_pairs"]["pairs"]} == {"ΔLarge", "ΔLong"}
    assert s["quantity_quality"]["matched"], "per_teacher against matched"
    assert {f["regime"] for f in s["regime_flips"]["flips"]} >= {"intersection", "matched"}
    assert {a["family"] for a in s["families"]["averages"]} == {"sandbox"}
    (contrast,) = [c for c in s["selection_effect"]["contrasts"] if c["regime"] == "per_teacher"]
    assert contrast["selected"] == ["sandbox_sums"]
    assert contrast["gated"] == ["sandbox_coin_flip"]
    # every verdict is one of the rule's words, and a reading never claims without an interval
    for c in s["mix_parts"]["comparisons"]:
        e = c["estimate"]
        assert e["low"] <= e["estimate"] <= e["high"]
        assert c["verdict"] in ("better", "worse", "equivalent", "inconclusive")
        if c["verdict"] == "better":
            assert e["low"] > 0
