"""The statistics behind the report's decisions that live outside harness/stats/teacher_level.py, and the
words the decisions come out in.

.venv/bin/pytest tests/test_decisions.py -q

Exact McNemar (the leaderboard's per-adapter mcnemar_p) and exact Spearman with its floor (the
within-group correlations) against scipy; `cotgap plan`'s minimum detectable effects against
fresh simulations of the report's own rule; the answers-table row of a group from
`analyze.compare_teachers`. The frequency properties of the teacher-level rule itself (error
rates, coverage, power, the capacity-gap test) are in tests/test_inference.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from harness.analysis import analyze, report
from harness.config.schema import AnalysisConfig
from harness.stats import teacher_level
from harness.stats.adapters import mcnemar_exact, min_points, smallest_exact_p, spearman_exact


def test_mcnemar_exact_is_scipys_binomtest():
    for losses, wins in ((0, 0), (0, 5), (3, 9), (10, 10), (40, 17)):
        same = 7  # concordant items do not count
        base = np.array([1] * losses + [0] * wins + [1] * same, dtype=bool)
        post = np.array([0] * losses + [1] * wins + [1] * same, dtype=bool)
        n = losses + wins
        want = 1.0 if n == 0 else sps.binomtest(losses, n, 0.5).pvalue
        assert mcnemar_exact(base, post) == pytest.approx(want)


def test_three_points_cannot_reach_5_percent():
    res = spearman_exact([1, 2, 3], [3, 2, 1])
    assert res.rho == pytest.approx(-1) and res.p == pytest.approx(1 / 3)
    assert smallest_exact_p(3) == pytest.approx(1 / 3)
    assert np.isnan(res.low) and np.isnan(res.high)
    assert spearman_exact([1, 2, 3, 4, 5], [2, 4, 6, 8, 10]).p == pytest.approx(2 / 120)
    assert min_points(0.05) == 5 and min_points(0.1) == 4


def _experiment(tmp_path, limit: int, effect: float, seeds: list[int], teachers: int):
    from harness.config.schema import Experiment

    def spec(name: str) -> dict:
        d = tmp_path / name
        d.mkdir(exist_ok=True)
        (d / "config.json").write_text(json.dumps({"model_type": "llama"}))
        return {"name": name, "path": str(d), "size": 1e8}

    return Experiment.model_validate(
        {"name": "p", "results_dir": str(tmp_path / "r"),
         "teachers": [spec(f"t{limit}-{k}") for k in range(teachers)],
         "students": [spec(f"s{limit}")], "tasks": [{"name": "gsm8k", "test_limit": limit}],
         "train": {"max_steps": 1, "seeds": seeds}, "analysis": {"effect_of_interest": effect}}
    )  # fmt: skip


def _gain_mde(line: str) -> float:
    return float(re.search(r": gain ([0-9.]+) pts", line)[1]) / 100


def test_plan_states_the_mde_of_the_reports_rule(tmp_path):
    """The gain `cotgap plan` states is one the report's rule (replicates, replicate SD,
    the group's max-t family) calls better 80% of the time: checked on fresh simulations. With
    one seed it says the design is exploratory; where the effect of interest is out of reach it
    says so and how many replicates would reach it, which fresh simulations confirm."""
    from harness.execution import plan
    from harness.store import Store

    small = plan.detectable_gains(_experiment(tmp_path, 200, 3.0, [0], 1), Store(tmp_path / "r1"))
    assert "1 teacher(s), 1 replicate(s) each, between-replicate SD as measured" in small[0]
    assert "else 3 pts assumed" in small[0]
    assert "1 replicate(s) per teacher < analysis.min_replicates 3: exploratory" in small[1]
    line = small[2]
    assert line.startswith("  gsm8k / s200: 200 test items, baseline 50.0% (not measured yet")
    assert "between-replicate SD 3.0 pts (assumed)" in line
    mde = _gain_mde(line)
    power = teacher_level.gain_power(200, 0.5, mde, 3, 0.03, 1, sims=4000, seed=21)
    assert 0.75 <= power <= 0.85, (mde, power)
    assert "; the effect of interest (3 pts) is out of reach" in line
    assert teacher_level.gain_power(200, 0.5, 0.03, 20, 0.03, 1, sims=2000, seed=22) < 0.8
    assert "20 replicates do not reach it" in line

    exp = _experiment(tmp_path, 1000, 8.0, [0, 1, 2], 2)
    big = plan.detectable_gains(exp, Store(tmp_path / "r2"))
    assert "2 teacher(s), 3 replicate(s) each" in big[0] and "effect of interest 8 pts" in big[0]
    assert "concordance 0.00" in big[1]  # nothing measured: the least favourable
    assert "exploratory" not in "\n".join(big)
    mde = _gain_mde(big[1])
    assert 0.75 <= teacher_level.gain_power(1000, 0.5, mde, 3, 0.03, 2, sims=4000, seed=23) <= 0.85
    more = int(re.search(r"\((\d+) replicates would reach it\)", big[1])[1])
    assert more > 3
    assert teacher_level.gain_power(1000, 0.5, 0.08, more, 0.03, 2, sims=4000, seed=24) >= 0.77

    wide = plan.detectable_gains(_experiment(tmp_path, 1000, 15.0, [0, 1, 2], 2), Store(tmp_path))
    assert "out of reach" not in "\n".join(wide)


def _replicates(rng: np.random.Generator, p: float, k: int = 3, n: int = 400) -> list:
    return [analyze.Replicate(None, s, rng.random(n) < p) for s in range(k)]


def test_answer_words_follow_the_evidence():
    a = AnalysisConfig()
    rng = np.random.default_rng(8)
    base = rng.random(400) < 0.3
    strong, weak, twin = (_replicates(rng, p) for p in (0.6, 0.3, 0.6))

    # two equally strong teachers: distilling helps, which teacher the data cannot tell
    c = analyze.compare_teachers(a, base, {"t-l": weak, "t-m": strong, "t-s": twin})
    assert c["distill"] == "yes" and c["answer"] == "inconclusive"
    assert sorted(c["best_set"]) == ["t-m", "t-s"]
    row = report.answer_row(_group(c))
    assert row[4:7] == ["inconclusive", "yes", c["headline"]["teacher"]]
    assert row[10] == ", ".join(c["best_set"])

    # one of them alone: it is the answer
    c = analyze.compare_teachers(a, base, {"t-l": weak, "t-m": strong})
    h = c["headline"]
    assert c["answer"] == h["teacher"] == "t-m" and h["verdict"] == "better"
    assert c["named_by"] == "best_set" and c["leader"] is None  # one group: no other task
    # the answer quotes the test that named it: a one-sided max-t over the 2 gains at 5%, so
    # its two-sided level lies between 1 - 2 * 0.05 and 1 - 2 * 0.05 / 2
    assert 1 - 2 * 0.05 < h["level"] < 1 - 0.05
    # the teacher's own row keeps the verdicts' family: 2 gains and 1 pair, between
    # Bonferroni's 0.05 / 3 and 0.05 / 2
    own = next(t for t in c["teachers"] if t["teacher"] == "t-m")
    assert 1 - 0.05 / 2 < own["level"] < 1 - 0.05 / 3 and own["gain_low"] <= h["gain_low"]
    assert c["clears_effect"] == ("yes" if h["gain_low"] > 0.03 else "inconclusive")
    assert report.answer_row(_group(c))[4:] == [
        "t-m", "yes", "t-m", report.spts(h["gain"]), report.ci(h["gain_low"], h["gain_high"]),
        c["clears_effect"], "t-m", "3",
    ]  # fmt: skip
    assert report._levels([_group(c)]) == f"{100 * h['level']:.4g}%"

    # a teacher whose students score exactly the baseline's items: none can beat it by 3 points
    same = [analyze.Replicate(None, s, base.copy()) for s in range(3)]
    c = analyze.compare_teachers(a, base, {"t-x": same})
    assert c["answer"] == "none" and c["distill"] == "no"
    assert c["teachers"][0]["verdict"] == "equivalent"
    row = report.answer_row(_group(c))
    assert row[4:7] == ["none", "no", ""] and row[10] == ""  # none recommends no teacher

    # one replicate per teacher: nothing is claimed, however large the gain
    c = analyze.compare_teachers(a, base, {"t-m": strong[:1], "t-l": weak[:1]})
    assert c["exploratory"] and c["answer"] == "inconclusive"
    row = report.answer_row(_group(c))
    assert row[4:6] == ["inconclusive (exploratory)", "inconclusive"] and row[11] == "1"


def _group(decision: dict) -> dict:
    return {"task": "task", "student": "s", "regime": "per_teacher", "decision": decision}


def test_multiplicity_is_one_family_per_group_and_grid_fdr_is_refused(tmp_path):
    """Every group's decision carries the rule's record and a per-comparison level between
    Bonferroni's and the unadjusted one (the max-t family counts the contrasts' correlation);
    the report states the rule; `validate` refuses grid_fdr with what to do."""
    rng = np.random.default_rng(12)
    groups = {
        (f"task{k}", "s", "per_teacher"): (
            rng.random(400) < 0.3,
            {"weak": _replicates(rng, 0.3), "strong": _replicates(rng, 0.5 + 0.05 * k)},
        )
        for k in range(3)
    }
    a = AnalysisConfig()
    decided = analyze.compare_groups(a, groups)
    for d in decided.values():
        assert d["multiplicity"] == {
            "rule": "group", "alpha": pytest.approx(0.05), "leader_share": 0.8,
        }  # fmt: skip
        levels = {t["level"] for t in d["teachers"]} | {q["level"] for q in d["pairs"]}
        assert len(levels) == 1 and 1 - 0.05 / 2 < levels.pop() < 1 - 0.05 / 3
        # the other two tasks put "strong" first; named at 0.8 * 5% one-sided, so the row
        # quotes that test's two-sided 92% interval
        assert d["answer"] == d["leader"] == "strong" and d["named_by"] == "leader"
        assert d["headline"]["level"] == pytest.approx(1 - 2 * 0.8 * 0.05)
    view = [{"decision": d} for d in decided.values()]
    assert "one max-t family; family-wise 5%" in report._multiplicity(a.model_dump(), view)
    with pytest.raises(ValueError, match="grid_fdr is not offered.*set it to group"):
        AnalysisConfig(multiplicity="grid_fdr")
    with pytest.raises(ValueError, match="multiplicity"):
        AnalysisConfig(multiplicity="holm")


def test_validate_warns_where_replicates_hold_one_trace_draw_and_refuses_grid_fdr(tmp_path):
    """Training seeds on one trace draw: `validate` passes (exit 0) with a warning that names
    the fix; with generate.seeds paired to them, no warning; grid_fdr is a user error (exit 2)
    that says what to set."""
    import subprocess
    import sys

    import yaml

    repo = Path(__file__).resolve().parents[1]
    data = yaml.safe_load((repo / "configs" / "sandbox.yaml").read_text())
    data["generate"].pop("seeds", None)
    data["generate"]["seed"] = 0
    data["train"]["seeds"] = [0, 1, 2]
    data["train"].pop("replicates", None)
    data["train"].pop("race", None)  # the demo's race: this is about fixed replicates

    def validate(d: dict) -> subprocess.CompletedProcess:
        path = tmp_path / "exp.yaml"
        path.write_text(yaml.safe_dump(d))
        cmd = [sys.executable, "-m", "harness", "validate", str(path)]
        return subprocess.run(cmd, capture_output=True, text=True, cwd=repo)

    out = validate(data)
    assert out.returncode == 0, out.stderr
    assert "warning: the replicates are 3 training seeds on one trace draw" in out.stdout
    assert "set generate.seeds to 3 seeds and train.replicates: paired" in out.stdout
    data["generate"]["seeds"] = [0, 1, 2]
    data["train"]["replicates"] = "paired"
    out = validate(data)
    assert out.returncode == 0 and "warning" not in out.stdout, out.stdout + out.stderr
    data["analysis"] = {**data.get("analysis", {}), "multiplicity": "grid_fdr"}
    out = validate(data)
    assert out.returncode == 2 and "grid_fdr is not offered" in out.stderr
    assert "Traceback" not in out.stderr
