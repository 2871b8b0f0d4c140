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
    assert counts == {
        "groups": 3,
        "decided": 2,
        "agree": 1,
        "disagree": 1,
        "same": 2,
        "same_label": 1,
    }
    assert rows[2]["demo"] == "inconclusive, distill yes, best set t1;t2"
    cfg = demo_truth.shifted(demo_truth.REPO / "configs" / "sandbox.yaml", 100, tmp_path)
    assert cfg["generate"]["seeds"] == cfg["train"]["seeds"] == [100, 101, 102, 103]


def test_none_holds_where_the_truth_names_a_teacher_below_the_effect_of_interest() -> None:
    """`none` claims that no teacher reaches the effect of interest: a truth that names a teacher
    whose whole interval lies below it (clears_effect no) bears it out; above it, or unresolved,
    it does not; a named teacher holds only where the truth names the same one."""
    assert demo_truth.holds("none", {"answer": "none", "clears_effect": "no"})
    assert demo_truth.holds("none", {"answer": "t1", "clears_effect": "no"})
    assert not demo_truth.holds("none", {"answer": "t1", "clears_effect": "inconclusive"})
    assert not demo_truth.holds("none", {"answer": "t1", "clears_effect": "yes"})
    assert not demo_truth.holds("none", {"answer": "inconclusive", "clears_effect": "yes"})
    assert demo_truth.holds("t1", {"answer": "t1", "clears_effect": "no"})
    assert not demo_truth.holds("t1", {"answer": "t2", "clears_effect": "yes"})
    assert not demo_truth.holds("t1", {"answer": "none", "clears_effect": "no"})


def test_the_truth_is_read_from_the_model_cards_table(tmp_path: Path) -> None:
    card = tmp_path / "TRUTH.md"
    card.write_text(
        "intro\n\n| task | student | regime | baseline | distilled (t-b / t-a) | answer |\n"
        "|---|---|---|---|---|---|\n"
        "| sums | s1 | per_teacher | 40.0% | 55.5 / 30.0 | t-b (+15.5 [+1, +2]; clears the effect of interest: no) |\n"
        "| coin flip | s1 | per_teacher | 90.0% | 91.0 / 89.0 | inconclusive: distil yes (+1) |\n"
        "\n| task | student | baseline | other table |\n|---|---|---|---|\n| x | y | z | w |\n"
    )
    rows = demo_truth.truth_md(card)
    # the header's order names the columns; the second table is not read
    assert [(r["task"], r["teacher"], r["gain"]) for r in rows] == [
        ("sandbox_sums", "t-b", 15.5), ("sandbox_sums", "t-a", -10.0),
        ("sandbox_coin_flip", "t-b", 1.0), ("sandbox_coin_flip", "t-a", -1.0),
    ]  # fmt: skip
    assert demo_truth.truth_answers(rows) == {
        ("sandbox_sums", "s1", "per_teacher"): {"answer": "t-b", "clears_effect": "no"},
        ("sandbox_coin_flip", "s1", "per_teacher"): {"answer": "inconclusive", "clears_effect": ""},
    }


def test_the_shipped_truth_covers_the_demo_grid() -> None:
    rows = demo_truth.truth_md()
    groups = {(r["task"], r["student"], r["regime"]) for r in rows}
    assert len(groups) == 8 and len(rows) == 24  # 2 tasks x 2 students x 2 regimes x 3 teachers
    assert all(abs(r["gain"] - (r["post_acc"] - r["base_acc"])) < 1e-9 for r in rows)
