"""benchmarks/demo_truth.py: the comparison of the demo's answers with the truth and a rerun."""

from __future__ import annotations

import csv
from pathlib import Path

from benchmarks import demo_truth


def _answers(tmp: Path, name: str, rows: list[tuple[str, str, str]]) -> Path:
    run = tmp / name
    (run / "analysis").mkdir(parents=True)
    with (run / "analysis" / "answers.csv").open("w", newline="") as f:
        w = csv.DictWriter(
            f, ["task", "student", "regime", "answer", "distill", "gain", "best_set"]
        )
        w.writeheader()
        for student, answer, best in rows:
            distill = "no" if answer == "none" else "yes"
            w.writerow(dict(task="sums", student=student, regime="per_teacher", answer=answer,
                            distill=distill, gain="5.0", best_set=best))  # fmt: skip
    return run


def test_decided_answers_are_checked_against_the_truth_and_the_rerun(tmp_path: Path) -> None:
    truth = _answers(tmp_path, "truth", [("a", "t1", "t1"), ("b", "none", ""), ("c", "t2", "t2")])
    demo = _answers(
        tmp_path, "demo", [("a", "t1", "t1"), ("b", "t1", "t1"), ("c", "inconclusive", "t1;t2")]
    )
    again = _answers(
        tmp_path, "again", [("a", "t1", "t1"), ("b", "none", ""), ("c", "inconclusive", "t1;t2")]
    )
    rows, counts = demo_truth.compare(*map(demo_truth.answers, (truth, demo, again)))
    # a and b are decided: a agrees with the truth, b does not; c is undecided
    assert counts == {"groups": 3, "decided": 2, "agree": 1, "disagree": 1, "same": 2}
    assert rows[2]["demo"] == "inconclusive, distill yes, best set t1;t2"
    cfg = demo_truth.shifted(demo_truth.REPO / "configs" / "sandbox.yaml", 100, tmp_path)
    assert cfg["generate"]["seeds"] == cfg["train"]["seeds"] == [100, 101, 102]
