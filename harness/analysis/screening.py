"""Screening analysis: the screen cells' signals per (task, student, teacher, regime, trace draw),
the teacher ranking they predict, and, where distilled results exist for the same rows, how well
they predicted.

    cotgap screen configs/sandbox.yaml     # screens, then <results>/<exp>/analysis/screen.csv
    cotgap analyze configs/sandbox.yaml    # screen.csv, a report.md section and screen_vs_gain.png

Validation, within each (task, student, regime, trace draw) group of teachers with a measured gain
(mean over the training seeds of that draw; a screen reads one draw's traces): Spearman's rho of
each signal (signed so that higher predicts more gain) with the gain, its mean over groups with
a percentile bootstrap CI over groups and one over test items (the noise of the measured gains;
per group too); the top-1 hit rate (the screen's first choice is a teacher with the best measured
gain) against the chance rate (best teachers / teachers); and the "screen, then train only the top
k" policy: the share of adapter training time saved and the gain lost (best measured gain minus
the best gain among the k trained). The directions are fixed before looking at any result: lower
NLL, rank and RSR, higher top-1/top-5 share predict more gain; teacher accuracy, train yield and
data count are shown as the naive predictors to beat.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.config.schema import AnalysisConfig, Experiment, ScreenConfig
from harness.store import Store, atomic_write_text
from harness.workflow import grid as grids
from harness.workflow.cells import SCREEN_DIRECTION, SCREEN_SIGNALS

SIGNALS = (*SCREEN_SIGNALS, "local_nll")  # local_nll: with screen.local_window only
DIRECTION = {**SCREEN_DIRECTION, "teacher_acc": 1, "teacher_train_acc": 1, "n_examples": 1}
GROUP = ["task", "student", "regime", "trace_seed"]
ROW = ["task", "student", "teacher", "regime", "trace_seed"]  # one screen cell
COUNTS = ("n_examples", "n_screened", "n_tokens", "teacher_train_acc")
COLUMNS = [
    *ROW,
    *SIGNALS,
    *COUNTS,
    "teacher_acc",
    "screen_signal",
    "screen_rank",
    "gain",
    "gain_rank",
    "train_s",
    "screen_s",
    "screened_out",
    "screen_key",
]


def screened(exp: Experiment) -> Experiment:
    """The experiment with a `screen:` section (the defaults where it has none)."""
    return exp if exp.screen else exp.model_copy(update={"screen": ScreenConfig()})


def _signal(exp: Experiment) -> str:
    """The signal that `screened(exp)` ranks teachers by."""
    return (exp.screen or ScreenConfig()).signal


def table(exp: Experiment, store: Store, board: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per complete screen cell: its signals, the rank its teacher gets within its
    (task, student, regime, trace draw) group (1 = the screen's first choice), and from `board`
    (the leaderboard) the measured gain and the teacher's test accuracy where they exist."""
    exp = screened(exp)
    g = grids.expand(exp)
    rows, skipped = [], screened_out(g, store)
    for row, cell in g.screens.items():
        m = store.manifest("screen", cell.key)
        if m is None:
            continue
        s = m["summary"]
        adapters = [d.adapter.key for r, d in g.distilled.items() if r[:5] == row]
        walls = [(store.manifest("adapter", k) or {}).get("wall_s") for k in adapters]
        known = [w for w in walls if w is not None]
        rows.append(
            {
                **dict(zip(ROW, row, strict=True)),
                **{k: s.get(k, np.nan) for k in SIGNALS},
                **{k: s[k] for k in COUNTS},
                "train_s": sum(known) if known and len(known) == len(walls) else np.nan,
                "screen_s": m["wall_s"],
                "screened_out": next((skipped[k] for k in adapters if k in skipped), None),
                "screen_key": cell.key,
            }
        )
    tbl = pd.DataFrame(rows, columns=[c for c in COLUMNS if c not in _FROM_BOARD])
    tbl = _join_board(tbl, board)
    tbl["screen_signal"] = _signal(exp)
    tbl["screen_rank"] = _rank(tbl, _signal(exp))
    tbl["gain_rank"] = tbl.groupby(GROUP)["gain"].rank(ascending=False, method="min")
    return tbl.reindex(columns=COLUMNS)


_FROM_BOARD = ("teacher_acc", "gain", "screen_signal", "screen_rank", "gain_rank")


def _join_board(tbl: pd.DataFrame, board: pd.DataFrame | None) -> pd.DataFrame:
    if board is None or board.empty:
        return tbl.assign(teacher_acc=np.nan, gain=np.nan)
    teachers = board[board["row_type"] == "teacher"][["task", "teacher", "teacher_acc"]]
    dist = board[board["row_type"] == "distilled"].astype({"trace_seed": "int64"})
    gains = dist.groupby(ROW, as_index=False)["gain"].mean()
    tbl = tbl.merge(teachers, on=["task", "teacher"], how="left")
    return tbl.merge(gains, on=ROW, how="left")


def _rank(tbl: pd.DataFrame, signal: str) -> pd.Series:
    score = DIRECTION[signal] * tbl[signal].astype(float)
    return score.groupby([tbl[c] for c in GROUP]).rank(ascending=False, method="min")


def screened_out(g: grids.Grid, store: Store) -> dict[str, str]:
    """Adapter key -> why it is not trained (its gate's reason), for the gated adapters whose
    group is screened: the scheduler's decision, made again from the same screen cells."""
    out = {}
    for key, gate in g.gates.items():
        manifests = {k: m for k in gate.group if (m := store.manifest("screen", k))}
        if all(k in manifests for k in gate.group):
            reason = gate.reason({k: m["summary"] for k, m in manifests.items()})
            if reason:
                out[key] = reason
    return out


# --- validation ----------------------------------------------------------------------------------


def validate(
    tbl: pd.DataFrame,
    a: AnalysisConfig,
    signal: str,
    posts: dict[tuple, dict[Any, float]] | None = None,
) -> dict[str, Any] | None:
    """How well each signal predicted the measured gains (module docstring); None without gains.
    `posts`: each row's (task, student, teacher, regime, trace draw) test-item correctness (mean
    over training seeds), for CIs that resample test items; without it only the CI over groups is
    given."""
    groups = [g for _, g in tbl.groupby(GROUP, sort=False) if g["gain"].notna().sum() >= 2]
    groups = [g[g["gain"].notna()] for g in groups]
    if not groups:
        return None
    predictors = [*SIGNALS, "teacher_acc", "teacher_train_acc", "n_examples"]
    correlation = {p: _correlation(groups, p, a) for p in predictors}
    if posts:
        for p in predictors:
            correlation[p].update(_item_bootstrap(groups, p, a, posts))
    return {
        "signal": signal,
        "n_groups": len(groups),
        "n_rows": int(sum(len(g) for g in groups)),
        "correlation": correlation,
        "top1": {p: _top1(groups, p) for p in predictors},
        "top_k": _top_k(groups, signal),
        "per_group": [_group_row(g, signal) for g in groups],
    }


def _score(g: pd.DataFrame, predictor: str) -> np.ndarray:
    return DIRECTION[predictor] * g[predictor].to_numpy(dtype=float)


def _correlation(groups: list[pd.DataFrame], predictor: str, a: AnalysisConfig) -> dict[str, Any]:
    """Spearman's rho per group (signed: > 0 = the predicted direction holds), its mean over the
    groups where it is defined, and a percentile bootstrap CI of that mean over groups."""
    from scipy import stats

    rhos = []
    for g in groups:
        x, y = _score(g, predictor), g["gain"].to_numpy(dtype=float)
        ok = ~np.isnan(x)
        defined = ok.sum() >= 2 and np.ptp(x[ok]) > 0 and np.ptp(y[ok]) > 0
        rhos.append(float(stats.spearmanr(x[ok], y[ok]).statistic) if defined else np.nan)
    r = np.array([v for v in rhos if not np.isnan(v)])
    out: dict[str, Any] = {"per_group": rhos, "n": int(r.size), "mean": np.nan}
    out["ci_low"] = out["ci_high"] = np.nan
    if r.size:
        rng = np.random.default_rng(a.seed)
        boot = rng.choice(r, size=(a.bootstrap_samples, r.size)).mean(1)
        tail = 100 * (1 - a.ci) / 2
        out.update(mean=float(r.mean()), ci_low=float(np.percentile(boot, tail)))
        out["ci_high"] = float(np.percentile(boot, 100 - tail))
    return out


def _item_bootstrap(
    groups: list[pd.DataFrame],
    predictor: str,
    a: AnalysisConfig,
    posts: dict[tuple, dict[Any, float]],
) -> dict[str, Any]:
    """CIs of rho that resample the test items (the noise of the measured gains): within a group
    the baseline is common, so the gains rank as the distilled accuracies on the resampled items.
    Per group, and of the mean over groups (a resample where rho is undefined is left out)."""
    from scipy import stats

    rng, tail = np.random.default_rng(a.seed), 100 * (1 - a.ci) / 2
    per_group, boots = [], []
    for g in groups:
        rows = [tuple(r) for r in g[ROW].itertuples(index=False, name=None)]
        items = sorted(set.intersection(*(set(posts.get(r, {})) for r in rows)), key=str)
        score = _score(g, predictor)
        if not items or np.isnan(score).any() or np.ptp(score) == 0:
            per_group.append([np.nan, np.nan])
            boots.append(np.full(a.bootstrap_samples, np.nan))
            continue
        acc = np.array([[posts[r][i] for i in items] for r in rows])  # teachers x items
        idx = rng.integers(0, len(items), size=(a.bootstrap_samples, len(items)))
        means = acc[:, idx].mean(2)  # teachers x samples
        x = stats.rankdata(score) - (len(score) + 1) / 2
        y = stats.rankdata(means, axis=0)
        y = y - y.mean(0)
        with np.errstate(invalid="ignore", divide="ignore"):
            rho = (x @ y) / np.sqrt((x @ x) * (y * y).sum(0))  # Spearman: Pearson of the ranks
        boots.append(rho)
        per_group.append(_percentiles(rho, tail))
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a sample where no group has a rho
        mean = np.nanmean(np.array(boots), axis=0)
    return {"per_group_item_ci": per_group, "item_ci": _percentiles(mean, tail)}


def _percentiles(x: np.ndarray, tail: float) -> list[float]:
    x = x[~np.isnan(x)]
    if not x.size:
        return [np.nan, np.nan]
    return [float(np.percentile(x, tail)), float(np.percentile(x, 100 - tail))]


def _top1(groups: list[pd.DataFrame], predictor: str) -> dict[str, Any]:
    """Share of groups where the predictor's first choice has the best measured gain; the chance
    rate of a uniformly random choice; ties in the predictor split the hit."""
    hits, chance = [], []
    for g in groups:
        score, gain = _score(g, predictor), g["gain"].to_numpy(dtype=float)
        if np.isnan(score).all():
            continue
        best = gain == gain.max()
        first: np.ndarray = score == np.nanmax(score)
        hits.append(float(best[first].mean()))
        chance.append(float(best.mean()))
    n = len(hits)
    return {
        "n": n,
        "hit_rate": float(np.mean(hits)) if n else np.nan,
        "chance": float(np.mean(chance)) if n else np.nan,
    }


def _top_k(groups: list[pd.DataFrame], signal: str) -> list[dict[str, Any]]:
    """The 'screen, then train only the k best-screened teachers' policy, for each k below the
    largest group: training time saved (share of the adapters' wall time) and gain lost."""
    n_max = max(len(g) for g in groups)
    out = []
    for k in range(1, n_max):
        saved = total = 0.0
        lost = []
        for g in groups:
            order = np.argsort(-_score(g, signal), kind="stable")
            chosen, gain, t = order[:k], g["gain"].to_numpy(float), g["train_s"].to_numpy(float)
            lost.append(float(gain.max() - gain[chosen].max()))
            total += np.nansum(t)
            saved += np.nansum(np.delete(t, chosen))
        out.append(
            {
                "k": k,
                "time_saved": saved / total if total else np.nan,
                "gain_lost_mean": float(np.mean(lost)),
                "gain_lost_max": float(np.max(lost)),
                "groups_with_loss": int(sum(v > 0 for v in lost)),
            }
        )
    return out


def _group_row(g: pd.DataFrame, signal: str) -> dict[str, Any]:
    first = g.loc[g["screen_rank"].idxmin(), "teacher"]
    best = g.loc[g["gain"].idxmax(), "teacher"]
    return {**{c: g[c].iloc[0] for c in GROUP}, "screen_first": first, "measured_best": best}


def cost(tbl: pd.DataFrame, store: Store) -> dict[str, Any]:
    """The screen cells' wall time against the adapters' (their manifests' wall_s)."""
    adapters = [m["wall_s"] for _, _, m in store.cells("adapter") if m]
    screen_s, train_s = float(tbl["screen_s"].sum()), float(sum(adapters))
    return {
        "screen_s": screen_s,
        "screen_tokens": int(tbl["n_tokens"].sum()),
        "train_s": train_s,
        "n_adapters": len(adapters),
        "ratio": screen_s / train_s if train_s else np.nan,
    }


# --- outputs -------------------------------------------------------------------------------------


def write(
    out: Path, exp: Experiment, store: Store, board: pd.DataFrame | None,
    posts: Callable[[], dict],
) -> dict | None:  # fmt: skip
    """screen.csv and screen_vs_gain.png into `out`; returns the validation for analysis.json
    (None where no screen cell is complete). `posts`: the distilled students' item scores
    (`analyze.item_posts`), read only where there is a screen to validate."""
    tbl = table(exp, store, board)
    if tbl.empty:
        return None
    atomic_write_text(out / "screen.csv", tbl.to_csv(index=False))
    result: dict[str, Any] = {"rows": len(tbl), "cost": cost(tbl, store)}
    signal = _signal(exp)
    result["validation"] = validate(tbl, exp.analysis, signal, posts())
    if result["validation"]:
        result["plot"] = plot(tbl, out / "screen_vs_gain.png", result["validation"]["signal"]).name
    return result


def plot(tbl: pd.DataFrame, path: Path, signal: str) -> Path:
    """The screen's signal against the measured gain, one panel per (task, student, regime,
    trace draw)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [(k, g) for k, g in tbl.groupby(GROUP, sort=False) if g["gain"].notna().any()]
    cols = min(4, len(groups))
    rows = -(-len(groups) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.8 * rows), squeeze=False)
    for ax, (key, g) in zip(axes.flat, groups, strict=False):
        ax.scatter(g[signal], 100 * g["gain"])
        for _, r in g.iterrows():
            ax.annotate(r["teacher"], (r[signal], 100 * r["gain"]), fontsize=7)
        ax.set_title(" / ".join(map(str, key)), fontsize=8)
        ax.set_xlabel(signal, fontsize=8)
        ax.set_ylabel("gain (points)", fontsize=8)
    for ax in list(axes.flat)[len(groups) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def section(result: dict | None) -> str:
    """The report.md section of the screening (empty without screen cells)."""
    if not result:
        return ""
    c = result["cost"]
    lines = [
        "## Screening: predicting the gain before training",
        "",
        f"{result['rows']} screen cells (student forward passes over the training sets, "
        f"{c['screen_tokens']:,} tokens) took {c['screen_s']:.1f} s against "
        f"{c['train_s']:.1f} s of training for {c['n_adapters']} adapters "
        f"({_pct(c['ratio'])} of it). Table: `screen.csv`.",
    ]
    v = result.get("validation")
    if not v:
        lines += ["", "No distilled results for the screened rows yet: nothing to validate."]
        return "\n".join(lines)
    lines += [
        "",
        f"Over {v['n_groups']} (task, student, regime, trace draw) groups ({v['n_rows']} rows); "
        "rho signed so that > 0 means the predicted direction held; CIs: percentile bootstrap over "
        "groups, and over test items (each group's items resampled; the mean over the groups "
        "where a resample defines rho).",
        "",
        "| predictor | mean Spearman rho [CI over groups] | [CI over test items] | groups "
        "| top-1 hit rate | chance |",
        "|---|---|---|---|---|---|",
    ]
    for p, corr in v["correlation"].items():
        t = v["top1"][p]
        rho, items = "n/a (constant or tied)", "n/a"
        if corr["n"]:
            rho = f"{corr['mean']:+.2f} [{corr['ci_low']:+.2f}, {corr['ci_high']:+.2f}]"
        if corr.get("item_ci") and not np.isnan(corr["item_ci"][0]):
            items = "[{:+.2f}, {:+.2f}]".format(*corr["item_ci"])
        hits = f"{_pct(t['hit_rate'])} | {_pct(t['chance'])}"
        lines.append(f"| {p} | {rho} | {items} | {corr['n']} | {hits} |")
    lines += [
        "",
        f"Screen with `{v['signal']}`, then train only the top k teachers per group:",
        "",
        "| k | training time saved | mean gain lost (points) | max lost | groups losing |",
        "|---|---|---|---|---|",
    ]
    for r in v["top_k"]:
        lost = f"{100 * r['gain_lost_mean']:.1f} | {100 * r['gain_lost_max']:.1f}"
        lines.append(f"| {r['k']} | {_pct(r['time_saved'])} | {lost} | {r['groups_with_loss']} |")
    if result.get("plot"):
        lines += ["", f"![screen vs gain]({result['plot']})"]
    return "\n".join(lines)


def _pct(x: Any) -> str:
    return "n/a" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{100 * x:.0f}%"
