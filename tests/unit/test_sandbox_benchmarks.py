"""benchmarks/screening_sandbox.py and benchmarks/race_sandbox.py: the units their figures are
computed over, on small made-up tables (the benchmarks themselves read a finished grid)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from benchmarks import race_sandbox, screening_sandbox
from harness.analysis import screening
from harness.config.schema import AnalysisConfig

EVERY = [*screening.SIGNALS, "teacher_acc", "teacher_train_acc", "n_examples"]


def _table(nll: list[list[float]], gain: list[list[float]]) -> pd.DataFrame:
    """One group (task, student, regime) of teachers t0, t1, ..., one row per trace draw."""
    rows = []
    for t, (xs, ys) in enumerate(zip(nll, gain, strict=True)):
        for draw, (x, y) in enumerate(zip(xs, ys, strict=True)):
            rows.append({"task": "sums", "student": "s", "regime": "per_teacher",
                         "teacher": f"t{t}", "trace_seed": draw, "nll": x, "gain": y,
                         "train_s": 1.0, "screen_rank": 1.0, **{k: np.nan for k in EVERY if k != "nll"}})  # fmt: skip
    return pd.DataFrame(rows)


def test_groups_average_the_draws_before_ranking() -> None:
    # in draw 1 t1 has the lower nll but t0 the more gain; averaged, lower nll has more gain
    tbl = _table(nll=[[1.0, 3.0], [2.5, 2.0], [5.0, 5.0]], gain=[[0.30, 0.20], [0.05, 0.10],
                                                                 [-0.2, -0.1]])  # fmt: skip
    groups = screening_sandbox.per_group(tbl, EVERY)
    assert len(groups) == 3 and groups["train_s"].tolist() == [2.0, 2.0, 2.0]
    a = AnalysisConfig(bootstrap_samples=200)
    by_group = screening.validate(groups, a, "nll")
    by_draw = screening.validate(tbl, a, "nll")
    assert by_group and by_draw
    assert by_group["correlation"]["nll"]["mean"] == pytest.approx(1.0)
    assert by_draw["correlation"]["nll"]["per_group"] == pytest.approx([1.0, 0.5])
    assert by_group["top1"]["nll"]["hit_rate"] == 1.0


def test_truth_replaces_the_gain_where_it_covers_every_cell() -> None:
    groups = screening_sandbox.per_group(_table([[1.0], [2.0]], [[0.1], [0.2]]), EVERY)
    truth = [{"task": "sums", "student": "s", "regime": "per_teacher", "teacher": f"t{t}",
              "gain": g} for t, g in ((0, 20.0), (1, -5.0))]  # fmt: skip
    got = screening_sandbox.with_truth(groups, truth)
    assert got.set_index("teacher")["gain"].to_dict() == {"t0": 0.2, "t1": -0.05}
    assert screening_sandbox.with_truth(groups, truth[:1]) is None  # not the sandbox's grid


def test_pooled_rho_is_signed_by_the_signal_direction() -> None:
    tbl = pd.DataFrame({"nll": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], "gain": [6, 5, 4, 3, 1, 2.0]})
    got = screening_sandbox.pooled(tbl, "nll", samples=200, seed=0)
    # lower nll predicts more gain: the ranks agree but for one swap
    assert got["rho"] == pytest.approx(1 - 6 * 2 / (6 * 35))
    assert got["ci_low"] <= got["rho"] <= got["ci_high"] and got["n"] == 6


def test_a_race_counts_its_adapters_against_the_uniform_design() -> None:
    run = {
        ("sums", "s", "per_teacher"): {"replicates": "a:3;b:5;c:3", "adapters_saved": "4"},
        ("coin", "s", "per_teacher"): {"replicates": "a:5;b:5;c:5", "adapters_saved": "0.0"},
    }
    assert race_sandbox.adapters(run) == {"trained": 26, "uniform_at_max": 30, "saved": 4}
    with pytest.raises(SystemExit, match="a race"):
        race_sandbox.adapters({("x",): {"replicates": "a:3", "adapters_saved": ""}})


def test_a_perfect_prior_races_the_best_and_a_null_prior_any() -> None:
    from benchmarks import racing

    rng = np.random.default_rng(0)
    gains = [0.0, 15.0, 5.0, 10.0]
    assert racing.entrants(rng, gains, 1.0, 2) == [1, 3]  # rho 1: the two largest gains
    # rho 0: each teacher races about start/m of the time, whatever its gain
    picks = np.zeros(4)
    for _ in range(2000):
        for k in racing.entrants(rng, gains, 0.0, 2):
            picks[k] += 1
    assert np.allclose(picks / 2000, 0.5, atol=0.05), picks


def test_styles_architectures_read_layers_width_and_styles() -> None:
    from benchmarks import sandbox_styles

    arch = sandbox_styles.parse_arch("4x128x512:fine,long", "sums")
    assert arch == {"layers": 4, "hidden": 128, "intermediate": 512, "heads": 4,
                    "styles": ("fine", "long")}  # fmt: skip
    assert sandbox_styles.parse_arch("1x64x256", "sums")["styles"] == ("fine", "chunk", "long")
