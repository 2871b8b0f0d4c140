"""Training-set regimes: which teachers' traces a dataset cell reads, what its key holds beyond
the common fields, and how it selects the examples. All regime logic lives here.

    per_teacher   the teacher's usable traces
    intersection  the teacher's usable traces on questions every teacher solved
    matched       the teacher's examples, subsampled (seeded) to the smallest teacher's set, in
                  examples or in completion tokens (`train.matched_by`)
    mix           several teachers' examples in the proportions of their weights (`train.mix`,
                  Li et al.'s Mix Distillation): the largest seeded subsample of each teacher's set
                  whose sizes stand in the weights' ratio; one set per (student, task), its rows
                  named by MIX_TEACHER

How adapters of different regimes are compared is the training budget (`train.budget.align`):
`row_regime` names a row by regime, alignment and distillation method (`mix`, `mix@updates`,
`per_teacher+kd`; sft, the default method, adds nothing), so that every analysis grouped by row
regime is per method.

A trace is usable when it is correct and finished; an example is a usable trace rendered for the
student that fits `train.max_length` (over-long ones are dropped, never truncated). With
`train.filter_by` (nll, mean_rank or rsr: harness/stages/screen.py), every regime then drops the
`train.filter_drop` share of its examples that the student finds least learnable.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

NAMES = ("per_teacher", "intersection", "matched", "mix")
MATCHED_SEED = 0  # dataset cells have no seed: every training seed sees the same matched subset
MIX_TEACHER = "mix"  # the `teacher` of a mix row: its set is several teachers'

Records = list[dict[str, Any]]
Render = Callable[[Records], tuple[Records, int]]  # records -> (examples, dropped as over-long)


def inputs(
    regime: str, teacher: str, every_teacher: Sequence[str], mixed: Sequence[str] = ()
) -> tuple[str, ...]:
    """The traces cells a dataset reads: its teacher's, (intersection, matched) every teacher's,
    or (mix) the mixed teachers'."""
    if regime == "mix":
        return tuple(mixed)
    return (teacher,) if regime == "per_teacher" else tuple(every_teacher)


def key_fields(regime: str, train: Any, traces: dict[str, str] | None = None) -> dict[str, Any]:
    """What of the training config a dataset's key holds besides max_length (`traces`: the traces
    key of each teacher, which the mix's weights are keyed by; per-item filtering only when set,
    so the key of an unfiltered set does not depend on it)."""
    fields: dict[str, Any] = {"matched_by": train.matched_by if regime == "matched" else None}
    if regime == "mix":  # only the mix's keys hold this field
        assert traces is not None  # a mix's weights are keyed by its teachers' traces
        fields["mix"] = sorted([traces[p.teacher], p.weight] for p in train.mix)
    if train.filter_by is not None:
        fields["filter"] = {"by": train.filter_by, "drop": train.filter_drop}
    return fields


def row_regime(regime: str, align: str, method: str = "sft") -> str:
    """A distilled row's regime: the set's regime, the budget alignment unless none, and the
    distillation method unless sft."""
    name = regime if align == "none" else f"{regime}@{align}"
    return name if method == "sft" else f"{name}+{method}"


def method_of(row: str) -> str:
    """The distillation method of a row regime (`row_regime`'s inverse for the method)."""
    return row.rsplit("+", 1)[1] if "+" in row else "sft"


def aligned(train: Any, regime: str, align: str) -> bool:
    """Whether a regime has adapters under a budget alignment (`none`: every regime; `batch`,
    the mix at the training's own batch: the mix only)."""
    if align == "batch":
        return regime == "mix"
    chosen = train.budget.regimes
    return align == "none" or chosen is None or regime in chosen


def row_regimes(train: Any) -> list[str]:
    """Every row regime of a training config, in report order."""
    return [
        row_regime(r, a, m)
        for m in train.methods
        for a in train.budget.align
        for r in train.regimes
        if aligned(train, r, a)
    ]


def filter_worst(examples: Records, scores: list[float], drop: float) -> Records:
    """`examples` without the `drop` share with the lowest `scores` (higher = more learnable;
    ties: the later example goes first), in their order."""
    n_drop = int(len(examples) * drop)
    worst = sorted(range(len(examples)), key=lambda i: (scores[i], -i))[:n_drop]
    gone = set(worst)
    return [e for i, e in enumerate(examples) if i not in gone]


def select(
    regime: str,
    teacher: str | None,
    usable: dict[str, Records],
    render: Render,
    matched_by: str | None,
    mix: Sequence[tuple[str, float]] = (),
) -> tuple[Records, int]:
    """The examples of `teacher` (a traces key in `usable`, which maps every input to its usable
    traces) under `regime`, and how many of the teacher's were dropped as over-long. For mix,
    `mix` holds (traces key, weight) pairs; each example names its traces cell (`source`)."""
    if regime == "mix":
        return _mix({key: render(usable[key]) for key, _ in mix}, dict(mix))
    assert teacher is not None  # every regime but mix trains on one teacher's traces
    if regime == "intersection":  # solved: a correct trace, whether or not it fits
        solved = set.intersection(*({r["id"] for r in rs} for rs in usable.values()))
        usable = {teacher: [r for r in usable[teacher] if r["id"] in solved]}
    elif regime == "per_teacher":
        usable = {teacher: usable[teacher]}
    rendered = {key: render(rs) for key, rs in usable.items()}
    examples, dropped = rendered[teacher]
    if regime == "matched":
        examples = _match(examples, [ex for ex, _ in rendered.values()], matched_by or "examples")
    return examples, dropped


def _match(examples: Records, sets: list[Records], matched_by: str) -> Records:
    """A seeded subsample of `examples` as large as the smallest teacher's set: in examples, or in
    completion tokens (the tokens the loss is on, where verbose and terse teachers differ)."""
    order = list(range(len(examples)))
    random.Random(MATCHED_SEED).shuffle(order)
    if matched_by == "examples":
        chosen = order[: min(len(s) for s in sets)]
    else:
        budget = min(sum(e["n_completion_tokens"] for e in s) for s in sets)
        chosen, used = [], 0
        for i in order:
            if used + examples[i]["n_completion_tokens"] <= budget:
                chosen.append(i)
                used += examples[i]["n_completion_tokens"]
    return [examples[i] for i in sorted(chosen)]


def _mix(
    rendered: dict[str, tuple[Records, int]], weights: dict[str, float]
) -> tuple[Records, int]:
    """The largest mix in the weights' ratio: k = min(available / weight); each source gives
    floor(k * weight) examples, a seeded subsample in its original order."""
    k = min(len(rendered[key][0]) / w for key, w in weights.items())
    out: Records = []
    for key in sorted(weights):
        examples = rendered[key][0]
        order = list(range(len(examples)))
        random.Random(f"{MATCHED_SEED}/{key}").shuffle(order)
        # rounding guards float error (k * w just under an integer): never more than available
        take = min(len(examples), int(k * weights[key] + 1e-9))
        out += [{**examples[i], "source": key} for i in sorted(order[:take])]
    return out, sum(d for _, d in rendered.values())


def realised_mix(examples: Records, names: dict[str, str]) -> dict[str, int]:
    """Examples per teacher of a mix set (`names`: traces key -> teacher)."""
    counts = {name: 0 for name in names.values()}
    for e in examples:
        counts[names[e["source"]]] += 1
    return counts
