"""One decision, read everywhere: answers.csv, leaderboard.csv, report.md, the viewer's data and
the plots' data say the same thing for every (task, student, regime) group.

A real grid on the test zoo (three trace draws paired with three training seeds, two regimes)
is run and analysed once; every output is then read back and compared with analysis.json's
decisions, group by group and teacher by teacher.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import sandbox_grid

from harness.analysis import report
from harness.config.loading import load_experiment
from harness.present import view
from harness.sandbox import zoo


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def analysed(tmp_path_factory) -> Path:
    zoo.build(profile="test", progress=False)
    tmp = tmp_path_factory.mktemp("agree")
    data = sandbox_grid(
        "agree", tmp / "results", regimes=["per_teacher", "intersection"], seeds=[0, 1, 2]
    )
    data["generate"] = {**data["generate"], "seeds": [0, 1, 2]}
    del data["generate"]["seed"]
    data["train"]["replicates"] = "paired"
    data["analysis"]["effect_of_interest"] = 10
    config = tmp / "agree.yaml"
    config.write_text(yaml.safe_dump(data))
    for args in (("run", str(config)), ("view", str(config))):
        subprocess.run(
            [sys.executable, "-m", "harness", *args], check=True, capture_output=True, text=True
        )
    return load_experiment(config).root / "analysis"


def test_every_output_states_the_same_decision(analysed: Path) -> None:
    result = json.loads((analysed / "analysis.json").read_text())
    groups = {(g["task"], g["student"], g["regime"]): g for g in result["groups"] if g["decision"]}
    assert len(groups) == 2
    answers = {(r["task"], r["student"], r["regime"]): r for r in _csv(analysed / "answers.csv")}
    board = [r for r in _csv(analysed / "leaderboard.csv") if r["row_type"] == "distilled"]
    plots = _csv(analysed / "plot_data.csv")
    text = (analysed / "report.md").read_text(encoding="utf-8")
    page, _ = view.embedded((analysed / "viewer.html").read_text(encoding="utf-8"))
    vcol = {c: i for i, c in enumerate(page["columns"])}
    acol = {c: i for i, c in enumerate(page["answers"]["columns"])}
    viewer_answers = {
        (r[acol["task"]], r[acol["student"]], r[acol["regime"]]): r for r in page["answers"]["rows"]
    }
    for key, g in groups.items():
        d = g["decision"]
        assert {t["n_replicates"] for t in d["teachers"]} == {3}
        a = answers[key]
        assert a["answer"] == d["answer"] and a["distill"] == d["distill"]
        none = d["answer"] == "none"  # recommends no teacher: names none
        assert a["best_set"] == ("" if none else ";".join(d["best_set"]))
        assert float(a["gain"]) == round(100 * d["headline"]["gain"], 1)  # points
        va = viewer_answers[key]
        assert va[acol["answer"]] == d["answer"] and (va[acol["teacher"]] or "") == a["teacher"]
        assert (va[acol["quoted_teacher"]] or "") == a["quoted_teacher"]
        named = d["answer"] not in ("none", "inconclusive")  # a teacher is recommended
        assert a["teacher"] == (d["answer"] if named else "")
        assert a["quoted_teacher"] == ("" if none else d["headline"]["teacher"])
        # the report's answers-table row is the decision's own
        assert (
            report.md_table(report.ANSWER_HEADER, [report.answer_row(g)]).splitlines()[2]
            in (text.split("## Appendices")[0])
        )
        for t in d["teachers"]:
            mine = [r for r in board if (r["task"], r["student"], r["regime"]) == key
                    and r["teacher"] == t["teacher"]]  # fmt: skip
            assert len(mine) == 3  # one row per replicate, each carrying the teacher's verdict
            for r in mine:
                assert r["verdict"] == t["verdict"]
                assert float(r["teacher_gain"]) == pytest.approx(t["gain"])
                assert float(r["teacher_gain_low"]) == pytest.approx(t["gain_low"])
                assert (r["in_best_set"] == "True") == (t["teacher"] in d["best_set"])
            rows = [r for r in page["rows"] if r[vcol["row_type"]] == "distilled"
                    and (r[vcol["task"]], r[vcol["student"]], r[vcol["regime"]]) == key
                    and r[vcol["teacher"]] == t["teacher"]]  # fmt: skip
            assert {r[vcol["verdict"]] for r in rows} == {t["verdict"]}
            (p,) = [p for p in plots if (p["task"], p["student"], p["regime"]) == key
                    and p["teacher"] == t["teacher"]]  # fmt: skip
            assert p["verdict"] == t["verdict"]
            assert float(p["gain_low"]) == pytest.approx(t["gain_low"])
            assert float(p["gain_high"]) == pytest.approx(t["gain_high"])
