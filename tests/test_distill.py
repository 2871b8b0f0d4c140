"""Distillation methods: the kd loss from stored top-k log-probabilities against the full teacher
distribution, the generalized JSD against TRL's GKD loss, top-k capture at generation, the
method axis of the grid, the tokenizer check, and kd / on_policy training runs.

    .venv/bin/pytest tests/test_distill.py -q

Models are the shipped sandbox zoo (one character tokenizer) on the real sandbox_addition task.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from harness import engines
from harness.config.schema import Experiment
from harness.models import sources as models
from harness.stages import dataset as datasets
from harness.stages import distill_methods, generate, train
from harness.store import Store, read_jsonl
from harness.workflow import grid as grids

TASK = "sandbox_addition"


def experiment(root: Path, methods: list[str], **train_cfg: Any) -> Experiment:
    return Experiment.model_validate(
        {
            "name": "methods-test",
            "results_dir": str(root),
            "teachers": [{"name": "teacher-s", "path": "sandbox:teacher-s"}],
            "students": [{"name": "student-xs", "path": "sandbox:student-xs"}],
            "tasks": [{"name": TASK, "train_limit": 8, "test_limit": 4}],
            "generate": {"engine": "hf", "n": 1, "temperature": 0.7, "max_tokens": 48},
            "train": {
                "methods": methods,
                "max_steps": 4,
                "per_device_batch_size": 4,
                "max_length": 128,
                "precision": "fp32",
                "checkpoint_seconds": 0,
                **train_cfg,
            },
        }
    )


# --- the losses --------------------------------------------------------------------------------


def full_kl(teacher_logits: torch.Tensor, student_logits: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) per row, from the full distributions."""
    lt, ls = teacher_logits.log_softmax(-1), student_logits.log_softmax(-1)
    return (lt.exp() * (lt - ls)).sum(-1)


def test_topk_kl_is_the_full_kl_at_the_whole_vocabulary_and_rises_to_it_with_k() -> None:
    """Merging the teacher's tail into one bucket can only lose divergence (the data-processing
    inequality), and each larger k refines the buckets: per position the top-k KL grows with k
    and reaches the full KL when k covers the vocabulary."""
    gen = torch.Generator().manual_seed(0)
    teacher = 3 * torch.randn(64, 102, generator=gen)
    student = 3 * torch.randn(64, 102, generator=gen)
    exact = full_kl(teacher, student)
    last = torch.zeros(64)
    for k in (1, 2, 5, 10, 20, 50, 101, 102):
        lps, ids = teacher.log_softmax(-1).topk(k, dim=-1)
        kl = distill_methods.topk_forward_kl(student, ids, lps, full=k == 102)
        assert torch.all(kl >= last - 1e-5) and torch.all(kl <= exact + 1e-5)
        last = kl
    torch.testing.assert_close(last, exact, rtol=1e-5, atol=1e-5)
    lps, ids = teacher.log_softmax(-1).topk(101, dim=-1)  # one token left: the tail is exact too
    torch.testing.assert_close(distill_methods.topk_forward_kl(student, ids, lps, False), exact)


def test_topk_kl_tail_bucket_is_explicit() -> None:
    """k = 1 on a 3-token vocabulary, by hand: the teacher's top token and one tail bucket."""
    t = torch.tensor([[0.7, 0.2, 0.1]]).log()
    s = torch.tensor([[0.5, 0.25, 0.25]]).log()
    lps, ids = t.topk(1, dim=-1)
    want = 0.7 * math.log(0.7 / 0.5) + 0.3 * math.log(0.3 / 0.5)
    assert distill_methods.topk_forward_kl(s, ids, lps, False).item() == pytest.approx(
        want, rel=1e-5
    )


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_generalized_jsd_equals_trl_gkd_loss(beta: float) -> None:
    """The same tensors through TRL's GKDTrainer.generalized_jsd_loss (the reference
    implementation of GKD): equal values and equal gradients for the student."""
    pytest.importorskip("trl")
    from trl.experimental.gkd.gkd_trainer import GKDTrainer

    gen = torch.Generator().manual_seed(1)
    teacher = 2 * torch.randn(3, 7, 102, generator=gen)
    student = (2 * torch.randn(3, 7, 102, generator=gen)).requires_grad_(True)
    ours = distill_methods.generalized_jsd(student.flatten(0, 1), teacher.flatten(0, 1), beta).sum()
    (g_ours,) = torch.autograd.grad(ours, student)
    theirs = GKDTrainer.generalized_jsd_loss(student, teacher, beta=beta, reduction="sum")
    (g_theirs,) = torch.autograd.grad(theirs, student)
    torch.testing.assert_close(ours, theirs.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-4, atol=1e-6)


def test_reverse_kl_is_beta_one() -> None:
    gen = torch.Generator().manual_seed(2)
    t, s = torch.randn(5, 11, generator=gen), torch.randn(5, 11, generator=gen)
    torch.testing.assert_close(distill_methods.generalized_jsd(s, t, 1.0), full_kl(s, t))
    assert distill_methods.on_policy_beta({"divergence": "reverse_kl", "beta": 0.5}) == 1.0


# --- the grid ----------------------------------------------------------------------------------


def test_methods_axis_keys(tmp_path: Path) -> None:
    """sft adds nothing to any key; kd adds the top-k to the traces; each method its own adapter
    and eval, its row regime named by the method; on_policy leaves the traces alone."""
    sft = grids.expand(experiment(tmp_path, ["sft"]))
    both = grids.expand(experiment(tmp_path, ["sft", "on_policy"]))
    assert {c.key for c in sft}.issubset({c.key for c in both})
    (extra,) = [c for c in both.select(kind="adapter") if c.method == "on_policy"]
    assert extra.regime == "per_teacher+on_policy" and extra.config["method"]["name"] == "on_policy"
    assert "method" not in next(c for c in both.select(kind="adapter") if c.method == "sft").config
    kd = grids.expand(experiment(tmp_path, ["sft", "kd"], kd={"top_k": 7}))
    (traces,) = kd.select(kind="traces")
    assert traces.config["generate"]["top_logprobs"] == 7
    assert "top_logprobs" not in sft.select(kind="traces")[0].config["generate"]
    rows = sorted(r[3] for r in kd.distilled)
    assert rows == ["per_teacher", "per_teacher+kd"]
    weight = grids.expand(experiment(tmp_path, ["kd"], kd={"top_k": 7, "weight": 0.9}))
    assert weight.select(kind="adapter")[0].key != kd.select(kind="adapter")[1].key


def test_on_policy_refuses_the_mix_regime(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="on_policy needs one teacher"):
        Experiment.model_validate(
            {
                **experiment(tmp_path, ["sft"]).model_dump(),
                "teachers": [
                    {"name": "a", "path": "sandbox:teacher-s"},
                    {"name": "b", "path": "sandbox:teacher-m"},
                ],
                "train": {
                    "methods": ["on_policy"],
                    "max_steps": 1,
                    "regimes": ["mix"],
                    "mix": [{"teacher": "a", "weight": 1}, {"teacher": "b", "weight": 1}],
                },
            }
        )


def test_validate_refuses_teachers_of_another_tokenizer(tmp_path: Path) -> None:
    """A teacher whose tokenizer gives one character another id: kd and on_policy cannot compare
    its distributions with the student's; `grid.expand_problems` (cotgap validate) says so, sft does not."""
    import json

    other = tmp_path / "other-teacher"
    shutil.copytree(models.resolve(experiment(tmp_path, ["sft"]).teachers[0]), other)
    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = [k for k in vocab if len(k) == 1 and k.isdigit()][:2]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer.json").write_text(json.dumps(tok))
    for methods, bad in ((["sft"], False), (["sft", "kd"], True)):
        exp = experiment(tmp_path, methods)
        teachers = [exp.teachers[0].model_copy(update={"path": str(other)})]
        exp = exp.model_copy(update={"teachers": teachers})
        problems = grids.tokenizer_problems(exp)
        assert bool(problems) == bad
    assert "share one tokenizer" in problems[0] and "teacher-s" in problems[0]
    big = experiment(tmp_path, ["kd"], kd={"top_k": 500})
    assert "more than the 102 tokens" in grids.tokenizer_problems(big)[0]


# --- capture at generation, and training ---------------------------------------------------------


@pytest.fixture(scope="module")
def kd_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Experiment, Store, Any]:
    """teacher-s's traces with its whole distribution kept (top_k = the vocabulary, 102), through
    the transformers engine in this process; their dataset for student-xs."""
    exp = experiment(tmp_path_factory.mktemp("kd"), ["sft", "kd"], kd={"top_k": 102})
    grid, store = grids.expand(exp), Store(exp.root)
    (traces,) = grid.select(kind="traces")
    engine = engines.load("hf", exp.teachers[0], max_logprobs=102)
    try:
        generate.work(exp, str(exp.root), [traces], engine=engine)
    finally:
        engine.close()
    (dataset,) = grid.select(kind="dataset")
    datasets.build(exp, store, dataset)
    return exp, store, grid


def teacher_logits(exp: Experiment, prompt_ids: list[int], completion: list[int]) -> torch.Tensor:
    """The teacher's logits predicting each completion token (a forward pass of the model)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(models.resolve(exp.teachers[0]))
    with torch.no_grad():
        logits = model(torch.tensor([[*prompt_ids, *completion]])).logits[0]
    return logits[len(prompt_ids) - 1 : len(prompt_ids) + len(completion) - 1]


def test_captured_topk_is_the_teachers_distribution(kd_run: tuple) -> None:
    """topk.npz holds, per generated token, the teacher's log-probabilities: with k = vocabulary,
    the kd loss from the file equals the KL computed from the teacher's own full logits."""
    exp, store, grid = kd_run
    (traces,) = grid.select(kind="traces")
    cell_dir = store.cell_dir("traces", traces.key)
    summary = store.manifest("traces", traces.key)["summary"]
    assert summary["topk_bytes"] == (cell_dir / distill_methods.TOPK).stat().st_size > 0
    assert summary["top_logprobs"] == 102 and not (cell_dir / distill_methods.TOPK_LINES).exists()
    records, topk = (
        read_jsonl(cell_dir / generate.TRACES),
        distill_methods.TopK(cell_dir / distill_methods.TOPK),
    )
    assert len(topk.index) == len(records) == 8
    engine = engines.load("hf", exp.teachers[0])
    r = records[0]
    prompt_ids = engine.render(engines.Request(r["id"], prompt=r["prompt"]))
    tokens, ids, lps = topk.get(r["id"], r["sample"])
    assert len(tokens) == r["completion_tokens"] and ids.shape == (len(tokens), 102)
    logits = teacher_logits(exp, prompt_ids, tokens.tolist())
    student = torch.randn(len(tokens), 102, generator=torch.Generator().manual_seed(3))
    stored = distill_methods.topk_forward_kl(
        student, torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(lps), full=True
    )
    torch.testing.assert_close(stored, full_kl(logits, student), rtol=1e-4, atol=1e-4)


def test_kd_adapter_trains_on_aligned_teacher_distributions(kd_run: tuple) -> None:
    """A kd adapter trains from the stored top-k alone (no teacher in the worker): every
    completion token the teacher generated is aligned (one tokenizer), and the summary says so."""
    exp, store, grid = kd_run
    (cell,) = [c for c in grid.select(kind="adapter") if c.method == "kd"]
    summary = train.run(exp, store, [cell])[cell.key]
    examples = read_jsonl(store.cell_dir("dataset", cell.upstream[0]) / "examples.jsonl")
    traces = read_jsonl(
        store.cell_dir("traces", grid.select(kind="traces")[0].key) / "traces.jsonl"
    )
    generated = {(t["id"], t["sample"]): t["completion_tokens"] for t in traces}
    assert summary["distillation"]["method"] == "kd"
    assert summary["distillation"]["kd_positions"] == sum(
        generated[e["id"], e["sample"]] for e in examples
    )
    assert math.isfinite(summary["final_loss"]) and summary["steps"] == 4


def test_topk_resumes_with_the_traces(kd_run: tuple, tmp_path: Path) -> None:
    """A killed run left 3 trace records, a topk line for a 4th record it never wrote and half a
    line: the rerun keeps the 3, regenerates the rest, and ends with the reference's traces and
    arrays."""
    exp, store, grid = kd_run
    (traces,) = grid.select(kind="traces")
    ref_dir = store.cell_dir("traces", traces.key)
    again = exp.model_copy(update={"results_dir": str(tmp_path)})
    cell_dir = Store(again.root).cell_dir("traces", traces.key)
    cell_dir.mkdir(parents=True)
    lines = (ref_dir / generate.TRACES).read_bytes().splitlines(keepends=True)
    (cell_dir / generate.TRACES).write_bytes(b"".join(lines[:3]))
    ref = distill_methods.TopK(ref_dir / distill_methods.TOPK)
    records = read_jsonl(ref_dir / generate.TRACES)

    def line(r: dict) -> str:
        tokens, ids, lps = ref.get(r["id"], r["sample"])
        top = tuple(zip(map(tuple, ids.tolist()), map(tuple, lps.tolist()), strict=True))
        sample = engines.Sample("", tuple(tokens.tolist()), 0, "stop", None, top)
        return json.dumps(
            {"id": r["id"], "sample": r["sample"], **distill_methods.encode_topk(sample)}
        )

    text = "\n".join(line(r) for r in records[:4]) + "\n" + line(records[4])[:40]
    (cell_dir / distill_methods.TOPK_LINES).write_text(text)
    engine = engines.load("hf", exp.teachers[0], max_logprobs=102)
    try:
        summary = generate.work(again, str(again.root), [traces], engine=engine)[traces.key]
    finally:
        engine.close()
    assert summary["resumed_items"] == 3
    assert (cell_dir / generate.TRACES).read_bytes() == (ref_dir / generate.TRACES).read_bytes()
    got = distill_methods.TopK(cell_dir / distill_methods.TOPK)
    assert got.index == ref.index
    assert np.array_equal(got.tokens, ref.tokens) and np.array_equal(got.ids, ref.ids)
    # the resumed items ran in a batch of other widths: float rounding, not other values
    np.testing.assert_allclose(got.logprobs, ref.logprobs, rtol=0, atol=1e-4)


def test_vllm_captures_the_top_k_of_the_transformers_engine(tmp_path: Path) -> None:
    """vLLM's `logprobs=k` and the transformers engine's log-softmax of its logits: the same
    top-k ids and log-probabilities for the same greedy completion."""
    spec = experiment(tmp_path, ["kd"]).teachers[0]
    request = [engines.Request("q", prompt="What is 37+45? Think step by step.")]
    sampling = engines.Sampling(max_tokens=24, top_logprobs=30)
    got = {}
    for name in ("vllm", "hf"):
        engine = engines.load(name, spec, max_logprobs=30)
        try:
            [[got[name]]] = engine.generate(request, sampling)
        finally:
            engine.close()
    v = got["vllm"]
    assert v.token_ids == got["hf"].token_ids and len(v.top) == len(v.token_ids) > 1
    for (ids_v, lps_v), (ids_h, lps_h) in zip(got["vllm"].top, got["hf"].top, strict=True):
        assert len(ids_v) == 30
        np.testing.assert_allclose(lps_v, lps_h, atol=1e-3)
        assert ids_v[:5] == ids_h[:5]  # beyond, near-ties may order differently


def test_method_settings_need_their_method(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="train.kd is used only with kd in train.methods"):
        experiment(tmp_path, ["sft"], kd={"top_k": 5})
    with pytest.raises(ValueError, match="train.on_policy is used only with on_policy"):
        experiment(tmp_path, ["sft", "kd"], on_policy={"beta": 0.2})


def test_plan_counts_on_policy_sampling_and_teacher_forwards(tmp_path: Path) -> None:
    """`cotgap plan` prices an on_policy adapter's samples (generation by the student) and the
    teacher's forward passes (training-stage work of the teacher), beside its training."""
    from harness.execution import plan

    def work(methods: list[str], **cfg: Any) -> dict:
        exp = experiment(tmp_path, methods, **cfg)
        return plan.work_by_model(exp, grids.expand(exp).unique())

    sft, opd = work(["sft"]), work(["sft", "on_policy"], on_policy={"max_new_tokens": 50})
    assert ("generate", "student-xs") not in sft and ("train", "teacher-s") not in sft
    examples = 4 * 4  # max_steps x batch
    assert opd["generate", "student-xs"]["tokens"] == examples * 50
    assert opd["train", "teacher-s"]["tokens"] == examples * 128 // 3
    assert opd["train", "student-xs"]["tokens"] == 2 * sft["train", "student-xs"]["tokens"]


def test_methods_multiply_every_other_axis(tmp_path: Path) -> None:
    """With screening, top-k teachers, per-item filtering, budget alignment and two seeds, each
    method adds one adapter and one eval per sft adapter, each with its own gate; datasets and
    screens are shared by the methods."""
    from helpers import sandbox_grid

    def grid(methods: list[str]) -> grids.Grid:
        train = {"methods": methods, "teachers_per_student": "top_k", "top_k": 1,
                 "filter_by": "nll", "filter_drop": 0.25, "seeds": [0, 1],
                 "budget": {"align": ["none", "tokens"]}}  # fmt: skip
        data = sandbox_grid("m", tmp_path, **train)
        data["screen"] = {"max_examples": 8}
        return grids.expand(Experiment.model_validate(data))

    one, three = grid(["sft"]), grid(["sft", "kd", "on_policy"])
    count = lambda g, kind: len({c.key for c in g.select(kind=kind)})  # noqa: E731
    assert count(three, "adapter") == 3 * count(one, "adapter") > 0
    assert count(three, "dataset") == count(one, "dataset")
    assert count(three, "screen") == count(one, "screen")
    assert len(three.distilled) == 3 * len(one.distilled)
    assert set(three.gates) == {d.adapter.key for d in three.distilled.values()}


def test_kd_with_its_top_k_file_gone_says_to_delete_the_traces_cell(tmp_path: Path) -> None:
    """A complete traces cell that lost topk.npz (deleted or moved by hand) cannot be resumed
    into shape: a re-run keeps complete cells. The kd job says to delete that cell before any
    worker starts; so does every stage that reads a complete cell's output (`Store.output`)."""
    from harness.errors import UserError

    exp = experiment(tmp_path, ["kd"])
    g, store = grids.expand(exp), Store(exp.root)
    (traces,) = g.select(kind="traces")
    (dataset,) = g.select(kind="dataset")
    (adapter,) = g.select(kind="adapter")
    for cell, name in ((traces, "traces.jsonl"), (dataset, "examples.jsonl")):
        with store.open_cell(cell.kind, cell.key, cell.config, cell.upstream) as out:
            out.jsonl(name).write({"id": "x", "n_tokens": 3})
            out.finish({"n_examples": 1})
    with pytest.raises(UserError) as e:
        train._method_job(exp, store, adapter)
    where = store.cell_dir("traces", traces.key)
    assert f"{where / distill_methods.TOPK} is missing" in str(e.value)
    assert f"delete {where} and re-run" in str(e.value)
    (store.cell_dir("dataset", dataset.key) / "examples.jsonl").unlink()
    with pytest.raises(UserError, match=f"delete {store.cell_dir('dataset', dataset.key)}"):
        train._job(exp, store, adapter)
