"""Claims across the grid with the teacher (student) as the unit (harness/stats/grid_level.py, as
the studies and the report use it): what a design can claim before any compute (`cotgap plan`),
and the simulation suite in seconds: under nulls where a teacher's quality is shared by every task and
student (with teacher x task and teacher x student effects), no cross-group reading of the
studies claims a direction more often than its level allows, and with four or fewer teachers
every teacher-level reading says "too few". The full runs: `python -m benchmarks.studies --grid`.

    python -m pytest tests/test_cross_group.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from benchmarks import studies as bench
from harness.analysis import studies as st
from harness.config.loading import load_experiment
from harness.execution import plan
from harness.stats import grid_level as gl

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


def not_above(claims: int, runs: int, alpha: float = 0.05) -> bool:
    """A count of claims consistent with a rate of at most alpha (one-sided binomial, 0.001)."""
    return claims == 0 or stats.binom.sf(claims - 1, runs, alpha) > 0.001


# --- the simulation suite, in seconds ------------------------------------------------------------


@pytest.mark.parametrize(
    ("null", "shape", "runs"),
    [("shared quality", (5, 2, 4), 40),
     ("shared quality + teacher x task", (6, 2, 12), 30),
     ("shared quality + teacher x student", (6, 4, 6), 30),
     ("shared quality + teacher x task", (5, 3, 8), 30)],
)  # fmt: skip
def test_no_cross_group_reading_claims_more_than_its_level(null, shape, runs):
    """Teacher quality shared across tasks and students (unrelated to accuracy or size): the
    naive test that permutes within tasks claims a relation often; every reading does not."""
    (row,) = bench.null_rates(runs, {null: bench.NULLS[null]}, [shape], seed=sum(shape))
    for name, rate in row["claims"].items():
        assert not_above(round(rate * runs), runs), f"{name}: {rate:.3f} of {runs}"
    assert row["naive"] > 0.1  # what the grid-level permutation replaces


@pytest.mark.parametrize("teachers", [2, 3, 4])
def test_four_or_fewer_teachers_are_too_few_for_every_teacher_level_claim(teachers):
    rng = np.random.default_rng(teachers)
    planted = bench.teacher_grid(rng, lambda a, s, n: 0.5 * a, tasks=12, teachers=teachers,
                                 students=4)  # fmt: skip
    words = bench.readings(planted)
    two_sided = [c for c, unit, alt, _ in gl.CLAIMS if unit == "teachers" and alt == gl.TWO_SIDED]
    for claim in two_sided:
        assert words[claim] and all(w.startswith(st.TOO_FEW) for w in words[claim]), claim
    # the report's line names how many it needs
    assert (
        f"too few teachers ({teachers}: no teacher-level test can reach p ≤ 0.05; it needs ≥ 5)"
        in (st.win_rate_fit(planted, 0.05, bench.BINS)["trend"])
    )


def test_a_planted_relation_is_found_at_the_teacher_level():
    """Power at a realistic effect: 2.5 points of gain per 10 points of teacher accuracy, over
    a shared teacher quality of SD 2 points, 6 teachers, 2 students, 6 tasks."""
    found = 0
    for seed in range(10):
        frame = bench.teacher_grid(np.random.default_rng(seed), lambda a, s, n: 0.25 * a,
                                   tasks=6, teachers=6, students=2, quality_sd=0.02)  # fmt: skip
        found += bench.readings(frame)["capacity gap: gain vs teacher accuracy and vs size"][0] == (
            "claim"
        )
    assert found >= 8


# --- what plan says, and that the report agrees ----------------------------------------------------


def test_plan_says_too_few_before_any_compute_with_how_many_are_needed():
    exp = load_experiment(CONFIGS[0].parent / "sandbox.yaml")
    lines = plan.claim_lines(exp)
    assert "3 teacher(s), 2 student(s)" in lines[0]
    text = "\n".join(lines)
    assert "capacity gap: gain vs teacher accuracy and vs size: [yellow]too few: needs ≥ 5 " \
           "teachers[/] (has 3: p can reach 0.333 at best" in text  # fmt: skip
    assert "each gap bin: [yellow]too few: needs ≥ 6 teachers" in text
    assert "student size x teacher property: [yellow]too few: needs ≥ 5 students" in text
    # two tasks: each group's leader comes from the other one
    assert lines[-1].endswith("each group's leader is read from the other 1 task(s), tested at "
                              "0.8 alpha; its own best set at the rest")  # fmt: skip
    one = exp.model_copy(update={"tasks": exp.tasks[:1]})
    assert "[yellow]one task: no other task to read a leader from[/]" in plan.claim_lines(one)[-1]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_every_shipped_config_reads_too_few_where_plan_says_so(config):
    """On a grid of each shipped config's teachers and students (synthetic gains with a strong
    planted relation), each claim `plan` calls too few reads 'too few' in the studies, and
    each it calls testable does not."""
    exp = load_experiment(config)
    n_t, n_s = len(exp.teachers), len(exp.students)
    frame = bench.teacher_grid(np.random.default_rng(0), lambda a, s, n: 0.5 * a, tasks=3,
                               teachers=n_t, students=max(n_s, 1))  # fmt: skip
    words = bench.readings(frame)
    bins = max(1, len(bench.BINS) - 1)
    for c in gl.design(n_t, n_s, 1 - exp.analysis.ci, bins):
        few = [w.startswith(st.TOO_FEW) for w in words[c["claim"]]]
        if not c["supported"]:
            assert all(few), (c["claim"], words[c["claim"]])
        elif c["claim"] != "inverted U (two lines, one-sided)":  # it may find no peak at all
            assert not any(few), (c["claim"], words[c["claim"]])
