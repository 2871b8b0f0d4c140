"""Training-set regimes: which teachers' traces a dataset cell reads, what its key holds beyond
the common fields, and how it selects the examples. All regime logic lives here.

    per_teacher   the teacher's usable traces
    intersection  the teacher's usable traces on questions every teacher solved
    matched       the teacher's examples, subsampled (seeded) to the smallest teacher's set, in
                  examples or in completion tokens (`train.matched_by`)

A trace is usable when it is correct and finished; an example is a usable trace rendered for the
student that fits `train.max_length` (over-long ones are dropped, never truncated). With
`train.filter_by` (nll, mean_rank or rsr: harness/screen.py), every regime then drops the
`train.filter_drop` share of its examples that the student finds least learnable.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

NAMES = ("per_teacher", "intersection", "matched")
MATCHED_SEED = 0  # dataset cells have no seed: every training seed sees the same matched subset

Records = list[dict[str, Any]]
Render = Callable[[Records], tuple[Records, int]]  # records -> (examples, dropped as over-long)


def inputs(regime: str, teacher: str, every_teacher: Sequence[str]) -> tuple[str, ...]:
    """The traces cells a dataset reads: its teacher's, or (intersection, matched) every teacher's."""
    return (teacher,) if regime == "per_teacher" else tuple(every_teacher)


def key_fields(regime: str, train: Any) -> dict[str, Any]:
    """What of the training config a dataset's key holds besides max_length (per-item filtering
    only when set: it was added after keys were published)."""
    fields = {"matched_by": train.matched_by if regime == "matched" else None}
    if train.filter_by is not None:
        fields["filter"] = {"by": train.filter_by, "drop": train.filter_drop}
    return fields


def filter_worst(examples: Records, scores: list[float], drop: float) -> Records:
    """`examples` without the `drop` share with the lowest `scores` (higher = more learnable;
    ties: the later example goes first), in their order."""
    n_drop = int(len(examples) * drop)
    worst = sorted(range(len(examples)), key=lambda i: (scores[i], -i))[:n_drop]
    gone = set(worst)
    return [e for i, e in enumerate(examples) if i not in gone]


def select(
    regime: str, teacher: str, usable: dict[str, Records], render: Render, matched_by: str | None
) -> tuple[Records, int]:
    """The examples of `teacher` (a traces key in `usable`, which maps every input to its usable
    traces) under `regime`, and how many of the teacher's were dropped as over-long."""
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
