"""Screen cells (harness/stages/screen.py) and their analysis (harness/analysis/screening.py): the signals against
an independent computation, the mask against training's, the cells in the grid and the store, and
the validation statistics on hand-made numbers."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from harness.analysis import screening
from harness.config.loading import load_experiment
from harness.config.schema import AnalysisConfig, ScreenConfig, TrainConfig
from harness.execution import plan, schedule
from harness.models import sources as models
from harness.sandbox.random_model import random_llama
from harness.stages import screen
from harness.stages.dataset import encode, load_tokenizer
from harness.stages.encoding import collate
from harness.store import Store, read_jsonl
from harness.tasks import answers
from harness.workflow import grid, regimes
from harness.workflow.cells import KINDS

CONFIG = Path(__file__).resolve().parent / "fixtures" / "grid" / "test-grid.yaml"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    d = random_llama(tmp_path_factory.mktemp("tiny") / "m", hidden=64, layers=2, seed=3)
    model, _ = screen.load_model(str(d), False)
    return model, load_tokenizer(str(d), chat_template=True)


def _examples(tok) -> list[tuple[list[int], int]]:
    pairs = [
        ("What is 12+7?", "2+7=9, 1+0=1. The answer is 19."),
        ("Flip a coin twice.", "Heads, then tails: the answer is no."),
        ("Last letters of cat dog?", "t, g. The answer is tg."),
        ("x", "y"),
    ]
    return [encode(tok, p, c, True) for p, c in pairs]


def reference(model, ids: list[int], n_prompt: int) -> dict:
    """Each example alone (no padding, no batch): log-softmax and a sort, by hand."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].double()
    nlls, ranks = [], []
    for t in range(n_prompt, len(ids)):
        row = logits[t - 1]
        nlls.append(-float(torch.log_softmax(row, -1)[ids[t]]))
        order = torch.argsort(row, descending=True).tolist()
        ranks.append(order.index(ids[t]) + 1)
    mean_rank = sum(ranks) / len(ranks)
    nll = sum(nlls) / len(nlls)
    return {
        "n_tokens": len(ranks),
        "nll": nll,
        "mean_rank": mean_rank,
        "median_rank": float(statistics.median(ranks)),
        "rsr": mean_rank / nll,
        "top1": sum(r == 1 for r in ranks) / len(ranks),
        "top5": sum(r <= 5 for r in ranks) / len(ranks),
    }


@pytest.mark.parametrize("batch_size", [1, 3, 16])
def test_signals_equal_an_independent_computation(tiny: tuple, batch_size: int) -> None:
    model, tok = tiny
    data = _examples(tok)
    got = screen.signals(model, data, batch_size, "cpu", tok.pad_token_id or tok.eos_token_id)
    for (ids, n_prompt), row in zip(data, got, strict=True):
        ref = reference(model, ids, n_prompt)
        assert row["n_tokens"] == ref["n_tokens"]
        for k in screen.SIGNALS:
            assert row[k] == pytest.approx(ref[k], abs=1e-5, rel=1e-5), k
    assert len({round(r["mean_rank"], 3) for r in got}) == len(got)  # nothing degenerate


def test_the_screened_tokens_are_the_ones_training_puts_its_loss_on(tiny: tuple) -> None:
    """Training's loss (encoding.collate's labels, train_worker._step's cross-entropy) on one example is the
    screen's NLL; the screen scores completion + EOS, not the prompt."""
    model, tok = tiny
    data = _examples(tok)
    got = screen.signals(model, data, 4, "cpu", tok.eos_token_id)
    for i, (ids, n_prompt) in enumerate(data):
        b = collate(data, [i], tok.eos_token_id)
        with torch.no_grad():
            logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
        targets = F.pad(b["labels"][:, 1:], (0, 1), value=-100).flatten()
        loss = F.cross_entropy(logits.flatten(0, 1).double(), targets)
        assert got[i]["nll"] == pytest.approx(float(loss), abs=1e-5)
        assert got[i]["n_tokens"] == int((targets != -100).sum()) == len(ids) - n_prompt
        assert ids[-1] == tok.eos_token_id


# --- the cells in the grid and in the store -------------------------------------------------------


def test_a_screen_section_adds_one_screen_cell_per_dataset_and_changes_no_other_key() -> None:
    exp = load_experiment(CONFIG)
    plain = grid.expand(exp)
    g = grid.expand(exp.model_copy(update={"screen": ScreenConfig()}))
    assert [(c.kind, c.key) for c in g if c.kind != "screen"] == [(c.kind, c.key) for c in plain]
    datasets = g.select(kind="dataset")
    assert [s.upstream for s in g.screens.values()] == [(d.key,) for d in datasets]
    assert all(s.phase == 4 and s.stage == "screen" for s in g.screens.values())
    position = {c.key: i for i, c in enumerate(g.cells)}
    for row, d in g.distilled.items():  # after its dataset, before its adapter
        s = g.screens[row[:5]]
        assert position[d.dataset.key] < position[s.key] < position[d.adapter.key]
    # batch_size is a runtime choice; max_examples changes the output and is in the key, when set
    other = grid.expand(exp.model_copy(update={"screen": ScreenConfig(batch_size=3)}))
    assert [s.key for s in other.screens.values()] == [s.key for s in g.screens.values()]
    sampled = grid.expand(exp.model_copy(update={"screen": ScreenConfig(max_examples=5)}))
    s = next(iter(sampled.screens.values()))
    assert s.config["max_examples"] == 5
    assert "max_examples" not in next(iter(g.screens.values())).config
    assert s.key not in {c.key for c in g}


def _fake_traces(store: Store, cell, n: int) -> None:
    """A traces cell written by hand: `n` questions, two correct samples each (coin flip)."""
    extractor = cell.config["task"]["extractor"]
    records = [
        {
            "id": f"q{i}",
            "sample": s,
            "prompt": f"A coin is heads up. Flip it {i} times. Is it heads up?",
            "completion": f"{i} flips. The answer is {'yes' if i % 2 == 0 else 'no'}.",
            "correct": True,
            "finish_reason": "stop",
        }
        for i in range(n)
        for s in range(2)
    ]
    with store.open_cell("traces", cell.key, cell.config) as out:
        out.write_text("traces.jsonl", "".join(json.dumps(r) + "\n" for r in records))
        version = answers.EXTRACTORS[extractor].version
        out.finish({"yield": 1.0, "extractor": extractor, "extractor_version": version})


def test_screen_cells_are_computed_from_the_dataset_cells_cached_and_resumed(
    tmp_path: Path,
) -> None:
    exp = load_experiment(CONFIG).model_copy(
        update={"results_dir": str(tmp_path), "screen": ScreenConfig(batch_size=4)}
    )
    g, store = grid.expand(exp), Store(exp.root)
    for i, t in enumerate(g.traces.values()):
        _fake_traces(store, t, 6 + 3 * i)
    screens = list(g.screens.values())
    counts = plan.run(exp, store, screens, log=lambda _: None)
    assert counts["screen"] == len(screens) == 6 and counts["adapter"] == 0
    for s in screens:
        d = store.cell_dir("dataset", s.upstream[0])
        examples = read_jsonl(d / "examples.jsonl")
        rows = read_jsonl(store.cell_dir("screen", s.key) / "signals.jsonl")
        assert [(r["id"], r["sample"]) for r in rows] == [(e["id"], e["sample"]) for e in examples]
        assert [r["n_tokens"] for r in rows] == [e["n_completion_tokens"] for e in examples]
        m = store.manifest("screen", s.key)
        assert m["summary"]["n_examples"] == m["summary"]["n_screened"] == len(examples)
        assert m["wall_s"] > 0
        assert m["summary"]["nll"] == pytest.approx(np.mean([r["nll"] for r in rows]))
        assert m["summary"]["teacher_train_acc"] == 1.0 and m["summary"]["n_tokens"] > 0
    # Every training set here is a subset of t-large's per_teacher set (the same texts): that
    # cell, the largest, is computed; the others copy its rows and compute nothing.
    summaries = [store.manifest("screen", s.key)["summary"] for s in screens]
    largest = max(range(len(screens)), key=lambda i: summaries[i]["n_examples"])
    assert summaries[largest]["n_copied"] == 0
    assert all(m["n_copied"] == m["n_screened"] for i, m in enumerate(summaries) if i != largest)
    by_text: dict[tuple, dict] = {}
    for s in screens:
        d = store.cell_dir("dataset", s.upstream[0])
        rows = read_jsonl(store.cell_dir("screen", s.key) / "signals.jsonl")
        for ex, row in zip(read_jsonl(d / "examples.jsonl"), rows, strict=True):
            row = {k: v for k, v in row.items() if k not in ("id", "sample")}
            assert by_text.setdefault((ex["prompt"], ex["completion"]), row) == row
    # ... and the copies equal the subset computed on its own
    spec = exp.model("stu")
    tok = load_tokenizer(models.resolve(spec), chat_template=True)
    model, _ = screen.load_model(models.resolve(spec), False)
    subset = screens[(largest + 1) % len(screens)]
    examples = read_jsonl(store.cell_dir("dataset", subset.upstream[0]) / "examples.jsonl")
    alone = screen.signals(
        model, [encode(tok, e["prompt"], e["completion"], True) for e in examples], 3, "cpu", 0
    )
    copied = read_jsonl(store.cell_dir("screen", subset.key) / "signals.jsonl")
    for a, c in zip(alone, copied, strict=True):
        assert all(c[k] == pytest.approx(a[k], rel=1e-6, abs=1e-6) for k in screen.SIGNALS)
    assert sum(plan.run(exp, store, screens, log=lambda _: None).values()) == 0
    killed = store.cell_dir("screen", screens[2].key)
    before = (killed / "signals.jsonl").read_bytes()
    (killed / "manifest.json").unlink()  # as a kill before the manifest leaves it
    counts = plan.run(exp, store, screens, log=lambda _: None)
    assert counts["screen"] == 1 and (killed / "signals.jsonl").read_bytes() == before
    tbl = screening.table(exp, store)
    assert len(tbl) == 6 and tbl["screen_rank"].notna().all() and tbl["gain"].isna().all()


def test_screen_max_examples_screens_a_seeded_sample() -> None:
    records = [{"id": i} for i in range(10)]
    assert screen.subsample(records, None) == records and screen.subsample(records, 20) == records
    picked = screen.subsample(records, 4)
    assert len(picked) == 4 and picked == screen.subsample(records, 4)
    assert [r["id"] for r in picked] == sorted(r["id"] for r in picked)


# --- the validation statistics --------------------------------------------------------------------


def _table(gains: dict, rsr: dict, train_s: float = 10.0) -> pd.DataFrame:
    rows = []
    for (student, teacher), gain in gains.items():
        rows.append(
            {
                "task": "t",
                "student": student,
                "teacher": teacher,
                "regime": "per_teacher",
                "trace_seed": 0,
                **{k: 1.0 for k in screening.SIGNALS},
                "rsr": rsr[student, teacher],
                "teacher_acc": 0.5,
                "teacher_train_acc": 0.5,
                "n_examples": 10,
                "gain": gain,
                "train_s": train_s,
            }
        )
    tbl = pd.DataFrame(rows)
    tbl["screen_rank"] = screening._rank(tbl, "rsr")
    return tbl


def test_validation_on_hand_made_numbers() -> None:
    # student a: rsr orders the teachers exactly as the gain (lower rsr, more gain);
    # student b: exactly backwards
    gains = {("a", "x"): 0.3, ("a", "y"): 0.2, ("a", "z"): 0.1}
    gains |= {("b", "x"): 0.3, ("b", "y"): 0.2, ("b", "z"): 0.1}
    rsr = {("a", "x"): 1.0, ("a", "y"): 2.0, ("a", "z"): 3.0}
    rsr |= {("b", "x"): 3.0, ("b", "y"): 2.0, ("b", "z"): 1.0}
    v = screening.validate(_table(gains, rsr), AnalysisConfig(bootstrap_samples=200), "rsr")
    corr = v["correlation"]["rsr"]
    assert corr["per_group"] == pytest.approx([1.0, -1.0]) and corr["mean"] == pytest.approx(0)
    assert corr["ci_low"] == pytest.approx(-1) and corr["ci_high"] == pytest.approx(1)
    assert v["correlation"]["nll"]["n"] == 0  # constant within each group: undefined
    assert v["top1"]["rsr"] == {"n": 2, "hit_rate": 0.5, "chance": pytest.approx(1 / 3)}
    assert v["top1"]["nll"]["hit_rate"] == pytest.approx(1 / 3)  # a three-way tie splits the hit
    k1, k2 = v["top_k"]
    assert k1["k"] == 1 and k1["time_saved"] == pytest.approx(2 / 3)
    assert k1["gain_lost_mean"] == pytest.approx(0.1) and k1["gain_lost_max"] == pytest.approx(0.2)
    assert k1["groups_with_loss"] == 1
    assert k2["gain_lost_max"] == pytest.approx(0.1) and k2["time_saved"] == pytest.approx(1 / 3)
    assert [g["screen_first"] for g in v["per_group"]] == ["x", "z"]


def test_validation_needs_measured_gains() -> None:
    gains = {("a", "x"): np.nan, ("a", "y"): np.nan}
    rsr = {("a", "x"): 1.0, ("a", "y"): 2.0}
    assert screening.validate(_table(gains, rsr), AnalysisConfig(), "rsr") is None
    assert screening.section(None) == ""


# --- train.teachers_per_student: top_k --------------------------------------------------------------


class ScreenedStages(dict):
    """A fake stage table (no engine, no training): screens record an rsr that makes t-large the
    better teacher except in the matched regime; the adapter stage can die after `die_after`."""

    def __init__(self, die_after: int | None = None) -> None:
        super().__init__({kind: self._stage for kind in KINDS})
        self.trained: list[str] = []
        self.die_after = die_after

    def _stage(self, exp, store: Store, cells: list) -> None:
        for c in cells:
            summary = {"n_examples": 5}
            if c.kind == "screen":
                better = (c.teacher == "t-large") != (c.regime == "matched")
                summary = {"n_examples": 5, "rsr": 1.0 if better else 2.0}
            if c.kind == "adapter":
                if self.die_after is not None and len(self.trained) == self.die_after:
                    raise KeyboardInterrupt  # killed mid-group
                self.trained.append(c.key)
            with store.open_cell(c.kind, c.key, c.config, c.upstream) as out:
                out.finish(summary)


def test_top_k_trains_exactly_k_teachers_per_group_and_resumes_after_a_kill(
    tmp_path: Path,
) -> None:
    exp = load_experiment(CONFIG)
    train = exp.train.model_copy(update={"teachers_per_student": "top_k", "top_k": 1})
    exp = exp.model_copy(update={"results_dir": str(tmp_path), "train": train})
    g, store = grid.expand(exp), Store(exp.root)
    assert len(g.screens) == 6 and len(g.gates) == 6  # screens without a screen: section
    plain = grid.expand(load_experiment(CONFIG))
    assert [c.key for c in g.select(kind="adapter")] == [
        c.key for c in plain.select(kind="adapter")
    ]
    want = {
        d.adapter.key
        for (_, _, teacher, regime, _, _), d in g.distilled.items()
        if (teacher == "t-large") != (regime == "matched")
    }
    first = ScreenedStages(die_after=1)
    with pytest.raises(KeyboardInterrupt):
        schedule.run_local(exp, store, schedule.Schedule(g, g, store, gates=g.gates), first)
    assert len(first.trained) == 1 and set(first.trained) <= want
    again = ScreenedStages()
    sched = schedule.Schedule(g, g, store, gates=g.gates)
    counts = schedule.run_local(exp, store, sched, again)
    assert set(first.trained) | set(again.trained) == want and len(again.trained) == 2
    assert counts["screen"] == 0 and counts["adapter"] == 2
    adapters = g.select(kind="adapter")
    assert {a.key for a in adapters if store.complete("adapter", a.key)} == want
    skips = [e for e in schedule.read_events(store) if e["event"] == "skip"]
    out = {e["cell"]: e["reason"] for e in skips if e["kind"] == "adapter"}
    assert set(out) == {a.key for a in adapters} - want
    assert all(r == "screened out: rsr rank 2 of 2, top 1 trained" for r in out.values())
    assert sum(e["kind"] == "eval" for e in skips) == 3  # their distilled evals
    assert screening.screened_out(g, store) == out  # what the leaderboard marks
    for (task, student, _, regime, _, _), _d in g.distilled.items():  # exactly k a group
        group = [a for a in adapters if (a.task, a.student, a.regime) == (task, student, regime)]
        assert sum(a.key in want for a in group) == 1


# --- per-item filtering ---------------------------------------------------------------------------


def test_filter_worst_drops_the_lowest_scores_in_order() -> None:
    examples = [{"i": i} for i in range(6)]
    kept = regimes.filter_worst(examples, [5, 1, 4, 1, 3, 6], 0.5)
    assert [e["i"] for e in kept] == [0, 2, 5]  # 1 and 3 (tied lowest), then 4
    assert regimes.filter_worst(examples, [0] * 6, 0.1) == examples  # int(0.6) = 0 dropped


def test_filtering_drops_the_examples_the_screen_finds_least_learnable(tmp_path: Path) -> None:
    base = load_experiment(CONFIG).model_copy(
        update={"results_dir": str(tmp_path), "screen": ScreenConfig()}
    )
    g, store = grid.expand(base), Store(base.root)
    for t in g.traces.values():
        _fake_traces(store, t, 10)
    row = ("sandbox_coin_flip", "stu", "t-large", "per_teacher", 0)
    plan.run(base, store, [g.screens[row]], log=lambda _: None)
    train = base.train.model_copy(update={"filter_by": "nll", "filter_drop": 0.25})
    filt = base.model_copy(update={"train": train})
    fg = grid.expand(filt)
    d, plain = fg.distilled[(*row, 0)].dataset, g.distilled[(*row, 0)].dataset
    assert d.config["filter"] == {"by": "nll", "drop": 0.25} and "filter" not in plain.config
    assert d.key != plain.key and "filter_by" not in str(fg.distilled[(*row, 0)].adapter.config)
    assert plain.resources(base)["gpus"] == 0 and d.resources(filt)["gpus"] == 1
    plan.run(filt, store, [d], log=lambda _: None)
    every = read_jsonl(store.cell_dir("dataset", plain.key) / "examples.jsonl")
    kept = read_jsonl(store.cell_dir("dataset", d.key) / "examples.jsonl")
    nll = [
        r["nll"] for r in read_jsonl(store.cell_dir("screen", g.screens[row].key) / "signals.jsonl")
    ]
    n_drop = int(len(every) * 0.25)
    worst = set(sorted(range(len(every)), key=lambda i: (-nll[i], -i))[:n_drop])
    assert kept == [e for i, e in enumerate(every) if i not in worst] and n_drop > 0
    assert store.manifest("dataset", d.key)["summary"]["n_filtered"] == n_drop


def test_filter_options_come_together() -> None:
    with pytest.raises(ValueError, match="filter_by and filter_drop"):
        TrainConfig(max_steps=1, filter_by="nll")
    with pytest.raises(ValueError, match="top_k is used only"):
        TrainConfig(max_steps=1, top_k=2)


def test_the_item_bootstrap_equals_a_loop_of_scipy_spearman() -> None:
    from scipy import stats

    gains = {("a", "x"): 0.3, ("a", "y"): 0.2, ("a", "z"): 0.1}
    rsr = {("a", "x"): 1.0, ("a", "y"): 2.0, ("a", "z"): 3.0}
    tbl = _table(gains, rsr)
    rng = np.random.default_rng(7)
    posts = {
        ("t", "a", t, "per_teacher", 0): {i: float(rng.random() < p) for i in range(40)}
        for t, p in (("x", 0.7), ("y", 0.6), ("z", 0.5))
    }
    a = AnalysisConfig(bootstrap_samples=300, seed=3)
    got = screening._item_bootstrap([tbl], "rsr", a, posts)
    acc = np.array([[posts["t", "a", t, "per_teacher", 0][i] for i in range(40)] for t in "xyz"])
    idx = np.random.default_rng(3).integers(0, 40, size=(300, 40))
    rhos = []
    for sample in idx:
        means = acc[:, sample].mean(1)
        if np.ptp(means) > 0:
            rhos.append(stats.spearmanr(-np.array([1.0, 2.0, 3.0]), means).statistic)
    want = [np.percentile(rhos, 2.5), np.percentile(rhos, 97.5)]
    assert got["per_group_item_ci"][0] == pytest.approx(want)
    assert got["item_ci"] == pytest.approx(want)  # one group: the mean is that group's rho


# --- local naturalness ------------------------------------------------------------------------------


def test_steps_are_sentences_and_lines_that_join_back() -> None:
    text = "9+1=10, 8+0+1=9. Carry 1.\nIt is 3.5 now! The answer is 90."
    parts = screen.steps(text)
    assert parts == ["9+1=10, 8+0+1=9. ", "Carry 1.\n", "It is 3.5 now! ", "The answer is 90."]
    assert "".join(parts) == text and screen.steps("no stop") == ["no stop"]


def test_local_nll_equals_each_step_scored_alone_after_its_window(tiny: tuple) -> None:
    model, tok = tiny
    records = [
        {"prompt": "What is 12+7?", "completion": "2+7=9. 1+0=1. Carry none.\nThe answer is 19."},
        {"prompt": "Flip?", "completion": "Heads. The answer is yes."},
    ]
    got = screen.local_nll(model, tok, records, True, 1, 3, "cpu", tok.eos_token_id)
    for r, value in zip(records, got, strict=True):
        prompt_ids, n_prompt = encode(tok, r["prompt"], "", True)
        parts = screen.steps(r["completion"])
        step_nlls = []
        for i, step in enumerate(parts):
            before = parts[i - 1] if i else ""
            head = prompt_ids[:n_prompt] + tok(before, add_special_tokens=False)["input_ids"]
            target = tok(step, add_special_tokens=False)["input_ids"]
            target += [tok.eos_token_id] if i == len(parts) - 1 else []
            ids = torch.tensor([head + target])
            with torch.no_grad():
                logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), -1)
            nll = [-float(logp[len(head) + j - 1, t]) for j, t in enumerate(target)]
            step_nlls.append(sum(nll) / len(nll))
        assert value == pytest.approx(sum(step_nlls) / len(step_nlls), abs=1e-5)


def test_local_window_is_in_the_screen_key_when_set() -> None:
    exp = load_experiment(CONFIG)
    off = grid.expand(exp.model_copy(update={"screen": ScreenConfig()}))
    on = grid.expand(exp.model_copy(update={"screen": ScreenConfig(local_window=2)}))
    a, b = next(iter(off.screens.values())), next(iter(on.screens.values()))
    assert "local_window" not in a.config and b.config["local_window"] == 2 and a.key != b.key
    with pytest.raises(ValueError, match="local_window"):
        ScreenConfig(signal="local_nll")


def test_a_screen_cell_with_a_local_window_records_local_nll(tmp_path: Path) -> None:
    exp = load_experiment(CONFIG).model_copy(
        update={"results_dir": str(tmp_path), "screen": ScreenConfig(local_window=1)}
    )
    g, store = grid.expand(exp), Store(exp.root)
    for t in g.traces.values():
        _fake_traces(store, t, 4)
    cell = g.screens["sandbox_coin_flip", "stu", "t-small", "per_teacher", 0]
    plan.run(exp, store, [cell], log=lambda _: None)
    rows = read_jsonl(store.cell_dir("screen", cell.key) / "signals.jsonl")
    summary = store.manifest("screen", cell.key)["summary"]
    assert summary["local_nll"] == pytest.approx(np.mean([r["local_nll"] for r in rows]))
    assert summary["n_tokens"] == sum(r["n_tokens"] for r in rows)
    assert screening.table(exp, store)["local_nll"].notna().sum() == 1


def test_screen_table_ranks_the_teachers_of_each_trace_draw(tmp_path: Path) -> None:
    """With two trace draws a screen cell reads one draw's set: one row per draw, ranked among
    the teachers of the same draw (t-large first on draw 0, last on draw 1)."""
    base = load_experiment(CONFIG)
    exp = base.model_copy(
        update={
            "results_dir": str(tmp_path),
            "screen": ScreenConfig(),
            "generate": base.generate.model_copy(update={"seeds": (0, 1)}),
        }
    )
    g, store = grid.expand(exp), Store(exp.root)
    for (*_, teacher, _, draw), c in g.screens.items():
        first = (teacher == "t-large") == (draw == 0)
        summary = {k: 1.0 for k in screening.SIGNALS} | {"rsr": 1.0 if first else 2.0}
        summary |= {"n_examples": 5, "n_screened": 5, "n_tokens": 50, "teacher_train_acc": 0.5}
        with store.open_cell(c.kind, c.key, c.config, c.upstream) as out:
            out.finish(summary)
    tbl = screening.table(exp, store)
    assert len(tbl) == len(g.screens) == 2 * 3 * 2  # teachers x regimes x draws
    assert list(tbl.columns[:5]) == ["task", "student", "teacher", "regime", "trace_seed"]
    for r in tbl.itertuples():
        assert r.screen_rank == (1 if (r.teacher == "t-large") == (r.trace_seed == 0) else 2)
