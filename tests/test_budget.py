"""The mix regime and training budgets (`train.mix`, `train.budget.align`): the realised mix, the
grid's rows and keys, and budget policies that match a reference within one batch.

    python -m pytest tests/test_budget.py -m "not slow"
"""

from __future__ import annotations

import random

import pytest
from helpers import sandbox_grid

from harness.config.schema import Experiment, TrainConfig
from harness.workflow import regimes
from harness.workflow.grid import expand

MIX = [{"teacher": "t-large", "weight": 1}, {"teacher": "t-small", "weight": 4}]


def experiment(tmp_path, **train) -> Experiment:
    return Experiment.model_validate(sandbox_grid("b", tmp_path, **train))


def mix_experiment(tmp_path, align=("none", "updates"), **train) -> Experiment:
    return experiment(
        tmp_path,
        regimes=["per_teacher", "mix"],
        mix=MIX,
        mix_batch={"per_device_batch_size": 5, "grad_accum": 4},
        budget={"align": list(align), "reference": "t-small"},
        **train,
    )


# --- the mix --------------------------------------------------------------------------------------


def _examples(n: int, tag: str) -> list[dict]:
    return [{"id": f"{tag}{i}", "n_tokens": 10, "n_completion_tokens": 5} for i in range(n)]


@pytest.mark.parametrize(
    ("n_large", "n_small", "want"),
    [(10, 30, (7, 30)), (10, 40, (10, 40)), (3, 100, (3, 12)), (0, 50, (0, 0))],
)
def test_mix_takes_the_largest_set_in_the_weights_ratio(n_large, n_small, want):
    rendered = {"L": (_examples(n_large, "l"), 1), "S": (_examples(n_small, "s"), 2)}
    out, dropped = regimes._mix(rendered, {"L": 1.0, "S": 4.0})
    got = regimes.realised_mix(out, {"L": "large", "S": "small"})
    assert (got["large"], got["small"]) == want
    assert dropped == 3  # over-long examples of every source are counted
    assert len({e["id"] for e in out}) == len(out)  # a subsample: nothing twice


def test_mix_subsample_is_seeded_and_keeps_source_order():
    rendered = {"L": (_examples(20, "l"), 0), "S": (_examples(20, "s"), 0)}
    a, _ = regimes._mix(rendered, {"L": 1.0, "S": 1.5})
    b, _ = regimes._mix(rendered, {"L": 1.0, "S": 1.5})
    assert a == b
    ls = [int(e["id"][1:]) for e in a if e["source"] == "L"]
    assert ls == sorted(ls) and len(ls) == 13  # k = min(20/1, 20/1.5) = 13.3


# --- config ---------------------------------------------------------------------------------------


def test_mix_needs_its_regime_and_known_teachers(tmp_path):
    with pytest.raises(ValueError, match="mix regime needs train.mix"):
        experiment(tmp_path, regimes=["mix"])
    with pytest.raises(ValueError, match="mix regime needs train.mix"):
        experiment(tmp_path, mix=MIX)
    with pytest.raises(ValueError, match="not a teacher"):
        experiment(tmp_path, regimes=["mix"], mix=[*MIX[:1], {"teacher": "nobody", "weight": 1}])
    with pytest.raises(ValueError, match="two or more different teachers"):
        experiment(tmp_path, regimes=["mix"], mix=[MIX[0], MIX[0]])
    with pytest.raises(ValueError, match="not a teacher"):
        experiment(tmp_path, budget={"align": "updates", "reference": "nobody"})


def test_align_is_one_name_or_a_list(tmp_path):
    assert experiment(tmp_path, budget={"align": "tokens"}).train.budget.align == ("tokens",)
    with pytest.raises(ValueError, match="at most once"):
        experiment(tmp_path, budget={"align": ["none", "none"]})


# --- the grid -------------------------------------------------------------------------------------


def test_grid_has_a_mix_row_and_an_aligned_row_per_regime(tmp_path):
    exp = mix_experiment(tmp_path)
    grid = expand(exp)
    rows = {(t, r) for (_, _, t, r, _, _) in grid.distilled}
    assert rows == {
        ("t-small", "per_teacher"), ("t-large", "per_teacher"), ("mix", "mix"),
        ("t-small", "per_teacher@updates"), ("t-large", "per_teacher@updates"),
        ("mix", "mix@updates"),
    }  # fmt: skip
    d = {(t, r): row for (_, _, t, r, _, _), row in grid.distilled.items()}
    mix = d["mix", "mix"]
    traces = {t: grid.traces["sandbox_coin_flip", t, 0].key for t in ("t-small", "t-large")}
    assert set(mix.dataset.upstream) == set(traces.values())
    assert sorted(mix.dataset.config["mix"]) == sorted(
        [[traces["t-large"], 1.0], [traces["t-small"], 4.0]]
    )
    # the mix's own batch (Li et al.: 5 x 4) is in its adapter's key; the others train at 2 x 1
    assert mix.adapter.train.per_device_batch_size == 5 and mix.adapter.train.grad_accum == 4
    assert d["t-large", "per_teacher"].adapter.train.per_device_batch_size == 8
    # the reference set's adapter is its own reference: aligned or not, one cell
    ref = d["t-small", "per_teacher"].adapter
    assert d["t-small", "per_teacher@updates"].adapter.key == ref.key
    aligned = d["mix", "mix@updates"].adapter
    assert aligned.align == "updates" and aligned.upstream == (
        mix.dataset.key,
        d["t-small", "per_teacher"].dataset.key,
    )
    assert aligned.key != mix.adapter.key and mix.adapter.align == "none"


def test_budget_regimes_choose_which_regimes_are_also_aligned(tmp_path):
    exp = experiment(
        tmp_path,
        regimes=["per_teacher", "mix"],
        mix=MIX,
        budget={"align": ["none", "tokens"], "regimes": ["mix"]},
    )
    rows = {r for (_, _, _, r, _, _) in expand(exp).distilled}
    assert rows == {"per_teacher", "mix", "mix@tokens"}
    assert regimes.row_regimes(exp.train) == ["per_teacher", "mix", "mix@tokens"]


def test_new_options_at_their_defaults_leave_keys_unchanged(tmp_path):
    plain = expand(experiment(tmp_path))
    explicit = expand(experiment(tmp_path, budget={"align": "none"}, mix_batch=None))
    assert [c.key for c in plain] == [c.key for c in explicit]


def test_reference_set_is_in_the_grid_without_per_teacher(tmp_path):
    exp = experiment(tmp_path, regimes=["mix"], mix=MIX, budget={"align": "examples"})
    grid = expand(exp)
    (row,) = grid.distilled.values()
    ref_key = row.adapter.upstream[1]
    (ref,) = [c for c in grid.cells if c.key == ref_key]
    assert ref.kind == "dataset" and ref.regime == "per_teacher" and ref.teacher == "t-small"


# --- budget policies ------------------------------------------------------------------------------


def _cfg(batch: int, ga: int, **kw) -> TrainConfig:
    return TrainConfig(per_device_batch_size=batch, grad_accum=ga, **kw)


@pytest.mark.parametrize("trial", range(12))
@pytest.mark.parametrize("align", ["updates", "examples", "tokens"])
def test_aligned_counts_match_the_reference_within_one_batch(trial, align):
    from harness.stages.train import _aligned_steps, seen, updates

    rng = random.Random(trial)
    ref_lengths = [rng.randint(20, 200) for _ in range(rng.randint(5, 80))]
    lengths = [rng.randint(20, 400) for _ in range(rng.randint(5, 300))]
    ref_cfg = _cfg(rng.choice([1, 2, 4]), rng.choice([1, 2]), epochs=rng.choice([1, 2, 3]))
    cfg = _cfg(rng.choice([2, 5, 8]), rng.choice([1, 4]), epochs=ref_cfg.epochs)
    seed = rng.randint(0, 3)
    ref_steps = updates(ref_cfg, len(ref_lengths))
    ref_examples, ref_tokens = seen(ref_lengths, ref_cfg, seed, ref_steps)
    assert ref_examples == pytest.approx(
        ref_cfg.epochs * len(ref_lengths), abs=ref_cfg.grad_accum * ref_cfg.per_device_batch_size
    )
    ref = {"examples": ref_examples, "tokens": ref_tokens}
    steps = _aligned_steps(align, ref_steps, ref, lengths, cfg, seed)
    examples, tokens = seen(lengths, cfg, seed, steps)
    batch = cfg.per_device_batch_size * cfg.grad_accum
    if align == "updates":
        assert steps == ref_steps
    elif align == "examples":
        assert ref_examples <= examples < ref_examples + batch
    else:
        last = tokens - seen(lengths, cfg, seed, steps - 1)[1]  # the last update's tokens
        assert ref_tokens <= tokens < ref_tokens + last + 1
        assert last <= batch * max(lengths)


def test_unaligned_mix_takes_the_published_factor_fewer_updates():
    """Li et al.'s configs: batch 20 for the mix against 2 per teacher; on one set, one epoch,
    the mix takes 10x fewer optimizer updates; aligned to updates it takes the reference's."""
    from harness.stages.train import updates

    single, mix = _cfg(2, 1, epochs=1), _cfg(5, 4, epochs=1)
    assert updates(single, 400) == 200 and updates(mix, 400) == 20


def test_seen_counts_what_the_worker_reads():
    """`seen` replays the worker's data order: the examples of the first N updates."""
    from harness.stages.train import seen
    from harness.stages.train_worker import micro_batches

    lengths = list(range(10, 47))
    cfg = _cfg(3, 2, max_steps=4)
    stream = micro_batches(lengths, 3, True, 7)
    taken = [next(stream) for _ in range(8)]
    assert seen(lengths, cfg, 7, 4) == (24, sum(lengths[i] for b in taken for i in b))


def test_the_train_stage_counts_each_adapters_budget_from_its_datasets(tmp_path):
    """plan_budget on the grid's adapters, from dataset cells on disk (no training): the mix as
    published (batch 20, one epoch) against aligned to the reference's updates (batch 2)."""
    from harness.stages.train import plan_budget
    from harness.store import Store

    exp = mix_experiment(
        tmp_path,
        align=("none", "updates", "examples", "tokens"),
        epochs=1,
        max_steps=None,
        per_device_batch_size=2,
    )
    grid, store = expand(exp), Store(exp.root)
    rng = random.Random(0)
    sizes = {"t-small": 40, "t-large": 25, "mix": 50}
    for d in {r.dataset.key: r.dataset for r in grid.distilled.values()}.values():
        rows = [{"id": str(i), "n_tokens": rng.randint(30, 90)} for i in range(sizes[d.teacher])]
        with store.open_cell("dataset", d.key, d.config, d.upstream) as out:
            out.write_text(
                "examples.jsonl",
                "".join(f'{{"id": "{r["id"]}", "n_tokens": {r["n_tokens"]}}}\n' for r in rows),
            )
            out.finish({"n_examples": len(rows)})
    plans = {
        (t, r): plan_budget(exp, store, row.adapter)
        for (_, _, t, r, _, _), row in grid.distilled.items()
    }
    assert plans["t-small", "per_teacher"]["updates"] == 20  # 40 examples / batch 2
    assert plans["mix", "mix"] == {**plans["mix", "mix"], "updates": 3, "effective_batch": 20}
    ref = plans["mix", "mix@updates"]["reference"]
    assert ref["updates"] == 20 and ref["examples"] == 40
    assert plans["mix", "mix@updates"]["updates"] == 20  # ~7x the mix as published
    assert 40 <= plans["mix", "mix@examples"]["examples"] < 40 + 20
    assert ref["tokens"] <= plans["mix", "mix@tokens"]["tokens"] < ref["tokens"] + 20 * 90
    for align in ("updates", "examples", "tokens"):  # the reference set's own adapter: itself
        assert plans["t-small", f"per_teacher@{align}"] == plans["t-small", "per_teacher"]
    assert plans["t-large", "per_teacher@updates"]["updates"] == 20


def test_budget_alignment_is_the_same_for_every_distillation_method(tmp_path):
    """kd and on_policy adapters train on the same sets as sft: aligned to updates, examples or
    tokens of the reference, each plans exactly the budget of its sft counterpart (and a method
    adds nothing to the reference, the sft per_teacher set of `reference`)."""
    from harness.stages.train import plan_budget
    from harness.store import Store

    exp = experiment(
        tmp_path,
        methods=["sft", "kd", "on_policy"],
        budget={"align": ["none", "updates", "examples", "tokens"], "reference": "t-small"},
        per_device_batch_size=2,
    )
    grid, store = expand(exp), Store(exp.root)
    rng = random.Random(1)
    for d in {r.dataset.key: r.dataset for r in grid.distilled.values()}.values():
        n = {"t-small": 40, "t-large": 25}[d.teacher]
        with store.open_cell("dataset", d.key, d.config, d.upstream) as out:
            out.write_text(
                "examples.jsonl",
                "".join(f'{{"id": "{i}", "n_tokens": {rng.randint(30, 90)}}}\n' for i in range(n)),
            )
            out.finish({"n_examples": n})
    plans = {
        (t, r): plan_budget(exp, store, d.adapter)
        for (_, _, t, r, _, _), d in grid.distilled.items()
    }
    methods = {regimes.method_of(r) for _, r in plans}
    assert methods == {"sft", "kd", "on_policy"} and len(plans) == 2 * 4 * 3
    for (t, r), plan in plans.items():
        sft = r.split("+")[0]
        assert plan == plans[t, sft], (t, r)
    assert plans["t-large", "per_teacher@tokens+on_policy"]["align"] == "tokens"
