"""The GPU check: cotgap on one CUDA GPU, offline and without vLLM (the transformers engine), in
under 8 minutes on an H100. Prints tokens/s, model FLOPs utilisation (MFU) and peak memory.

    make gpu-check                                   # = python -m benchmarks.gpu_check
    python -m benchmarks.gpu_check --device cpu      # the dry run (tiny sizes; in the test suite)

1. the sandbox grid (configs/sandbox.yaml; on the CPU a 1-teacher test-zoo grid) through
   `cotgap run`, into a temporary results directory;
2. LoRA and full fine-tuning steps of a randomly initialised model of Qwen2.5-1.5B's
   architecture, built from its config (nothing is downloaded), through cotgap's loss
   (harness.stages.train_worker.completion_ce) under accelerate's bf16 mixed precision, with gradient
   checkpointing as `train.gradient_checkpointing: auto` decides;
3. generation with the same model (transformers' `generate`, what the transformers engine runs);
4. cotgap's sharded training path: a full fine-tuning of the test-zoo student through
   `accelerate launch` with an FSDP2 config (one process on the GPU), checkpointed and saved,
   its merged weights checked whole. accelerate shards only on accelerators, so the CPU dry run
   lifts that one gate as the test suite does (tests/fsdp_cpu/sitecustomize.py).

MFU counts 6N FLOPs a trained token for full fine-tuning, 4N for LoRA (no weight gradients),
+2N when activations are recomputed, and 2N a generated token (Kaplan et al. 2020), against the
GPU's bf16 dense peak (PEAK_TFLOPS; an unknown GPU gets no MFU). A JSON line with every figure
ends the output (`--out` writes it to a file too).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
# bf16 dense TFLOP/s from NVIDIA's datasheets (SXM parts)
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0}
QWEN25_15B = {  # Qwen/Qwen2.5-1.5B-Instruct config.json
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
TINY = {**QWEN25_15B, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
TINY.update(num_attention_heads=2, num_key_value_heads=1)
SIZES = {  # device: (train batch, train length, steps, gen prompts, gen prompt len, new tokens)
    "cuda": (4, 1024, 8, 32, 128, 256),
    "cpu": (2, 64, 2, 2, 16, 8),
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--skip-grid", action="store_true", help="skip step 1 (the sandbox grid)")
    p.add_argument("--out", type=Path, help="also write the JSON figures here")
    args = p.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA device here; run with --device cpu for the dry run.")
    report: dict[str, Any] = {"device": device_name(args.device), "torch": torch.__version__}
    print(f"gpu_check on {report['device']} (torch {torch.__version__})", flush=True)
    if not args.skip_grid:
        report["grid"] = sandbox_grid(args.device)
    report["lora"] = train_steps(args.device, "lora")
    report["full"] = train_steps(args.device, "full")
    report["generate"] = generate(args.device)
    report["fsdp"] = fsdp(args.device)
    text = json.dumps(report)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


def device_name(device: str) -> str:
    import torch

    if device == "cuda":
        return torch.cuda.get_device_name(0)
    return f"CPU ({os.cpu_count()} cores)"


def peak_tflops(device: str) -> float | None:
    name = device_name(device)
    return next((v for k, v in PEAK_TFLOPS.items() if k in name), None)


def _reset_peak(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def _peak_gb(device: str) -> float:
    import torch

    if device == "cuda":
        return round(torch.cuda.max_memory_allocated() / 1e9, 2)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9, 2)  # RSS


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def sandbox_grid(device: str) -> dict[str, Any]:
    """`cotgap run` on the sandbox grid (the CPU dry run: one test-zoo teacher, a few items)."""
    config = yaml.safe_load((REPO / "configs" / "sandbox.yaml").read_text())
    with tempfile.TemporaryDirectory(prefix="cotgap-gpu-check-") as tmp:
        config["results_dir"] = str(Path(tmp) / "results")
        if device == "cpu":
            config["teachers"] = [{"name": "t", "path": "sandbox:test-teacher-s"}]
            config["students"] = [{"name": "s", "path": "sandbox:test-student"}]
            config["tasks"] = [{"name": "sandbox_coin_flip", "train_limit": 8, "test_limit": 8}]
            config["train"].update(max_steps=2, per_device_batch_size=4, regimes=["per_teacher"])
            config["generate"]["max_tokens"] = 32
            config["evaluate"]["max_tokens"] = 32
            # one teacher races nothing: the fixed design at the race's minimum, no screens
            race = config["train"].pop("race", None) or {"min_replicates": 3}
            config.pop("screen", None)
            for section in ("generate", "train"):
                config[section]["seeds"] = config[section]["seeds"][: race["min_replicates"]]
        path = Path(tmp) / "grid.yaml"
        path.write_text(yaml.safe_dump(config))
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        if device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-m", "harness", "run", str(path)],
            capture_output=True,
            text=True,
            env=env,
        )
        seconds = time.perf_counter() - t0
        if out.returncode:
            raise SystemExit(f"gpu_check: the sandbox grid failed:\n{out.stderr[-3000:]}")
        board = Path(config["results_dir"]) / "sandbox" / "analysis" / "leaderboard.csv"
        rows = board.read_text().count("\n") - 1 if board.is_file() else 0
    print(f"1. sandbox grid: {seconds:.1f} s, {rows} leaderboard rows", flush=True)
    return {"seconds": round(seconds, 1), "leaderboard_rows": rows}


def build_model(device: str) -> Any:
    """A random-init Qwen2 of Qwen2.5-1.5B's shape (tiny on the CPU), fp32 weights."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(**(QWEN25_15B if device == "cuda" else TINY))
    with torch.device(device):
        return Qwen2ForCausalLM(cfg)


def train_steps(device: str, method: str) -> dict[str, Any]:
    """Optimizer steps of `method` (lora, full) through cotgap's loss; tokens/s, MFU, peak."""
    import peft
    import torch
    from accelerate import Accelerator

    from harness.config.schema import TrainConfig
    from harness.stages import train_worker
    from harness.workflow import estimate

    batch, length, steps = SIZES[device][:3]
    model = build_model(device)
    n = model.num_parameters()
    recompute = estimate.checkpointing(TrainConfig(max_steps=1), n)
    if recompute:
        model.gradient_checkpointing_enable({"use_reentrant": False})
        model.config.use_cache = False
    if method == "lora":
        model = model.to(torch.bfloat16) if device == "cuda" else model
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        model = peft.get_peft_model(
            model, peft.LoraConfig(r=16, lora_alpha=32, target_modules=targets)
        )
    acc = Accelerator(cpu=device == "cpu", mixed_precision="bf16" if device == "cuda" else "no")
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    model, optimizer = acc.prepare(model, optimizer)
    model.train()
    ids = torch.randint(0, model.config.vocab_size, (batch, length), device=acc.device)
    b = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}

    for i in range(steps + 1):  # the first: warm-up (kernels, allocator, optimizer state)
        if i == 1:
            _sync(device)
            _reset_peak(device)
            t0 = time.perf_counter()
        acc.backward(train_worker.completion_ce(acc, model, b) / ids.numel())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    _sync(device)
    seconds = time.perf_counter() - t0
    tokens_s = steps * ids.numel() / seconds
    flops = ((6 if method == "full" else 4) + (2 if recompute else 0)) * n
    result = _figures(device, tokens_s, flops, n)
    result.update(checkpointing=recompute, batch=batch, length=length, steps=steps)
    print(
        f"2. {method} fine-tuning: {tokens_s:,.0f} tokens/s, MFU {result['mfu']}, "
        f"peak {result['peak_gb']} GB (checkpointing {'on' if recompute else 'off'})",
        flush=True,
    )
    acc.free_memory(model, optimizer)
    return result


def _figures(device: str, tokens_s: float, flops_per_token: float, n: int) -> dict[str, Any]:
    peak = peak_tflops(device)
    mfu = round(tokens_s * flops_per_token / (peak * 1e12), 3) if peak else None
    return {
        "params": n,
        "tokens_per_s": round(tokens_s, 1),
        "mfu": mfu,
        "peak_gb": _peak_gb(device),
    }


def generate(device: str) -> dict[str, Any]:
    """Greedy decoding of a batch of random prompts to a fixed length (EOS disabled)."""
    import torch

    prompts, prompt_len, new = SIZES[device][3:]
    model = build_model(device)
    model = model.to(torch.bfloat16) if device == "cuda" else model
    model.eval()
    n = model.num_parameters()
    ids = torch.randint(0, model.config.vocab_size, (prompts, prompt_len), device=device)
    kw = {"max_new_tokens": new, "min_new_tokens": new, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        model.generate(ids, **{**kw, "max_new_tokens": 2, "min_new_tokens": 2})  # warm-up
        _sync(device)
        _reset_peak(device)
        t0 = time.perf_counter()
        out = model.generate(ids, **kw)
        _sync(device)
    seconds = time.perf_counter() - t0
    made = (out.shape[1] - prompt_len) * prompts
    result = _figures(device, made / seconds, 2 * n, n)
    result.update(prompts=prompts, new_tokens=new)
    print(
        f"3. generation: {result['tokens_per_s']:,.0f} tokens/s ({prompts} prompts x {new} "
        f"tokens), MFU {result['mfu']}, peak {result['peak_gb']} GB",
        flush=True,
    )
    return result


FSDP_CONFIG = """\
distributed_type: FSDP
num_machines: 1
num_processes: 1
mixed_precision: 'no'
fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_state_dict_type: SHARDED_STATE_DICT
"""


def fsdp(device: str) -> dict[str, Any]:
    """harness.stages.train_worker under accelerate FSDP2: 4 steps of full fine-tuning with a sharded
    checkpoint at step 2, then the whole weights gathered into merged/ (every tensor of the
    base, at its shape)."""
    from safetensors.torch import load_file

    from harness.config.schema import TrainConfig
    from harness.stages import train

    student = REPO / "harness" / "sandbox" / "models" / "test-student"
    cfg = TrainConfig(method="full", max_steps=4, checkpoint_every=2, per_device_batch_size=4)
    with tempfile.TemporaryDirectory(prefix="cotgap-gpu-check-fsdp-") as tmp:
        cell = Path(tmp)
        (cell / "fsdp.yaml").write_text(FSDP_CONFIG)
        cfg = cfg.model_copy(update={"accelerate_config": str(cell / "fsdp.yaml")})
        rows = [{"prompt": f"{a}+{a}", "completion": f"{2 * a}"} for a in range(32)]
        (cell / "examples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        job = {"model_dir": str(student), "chat_template": True, "trust_remote_code": False,
               "examples": str(cell / "examples.jsonl"), "train": cfg.model_dump(mode="json"),
               "seed": 0, "merge": False, "checkpoint_seconds": 0}  # fmt: skip
        (cell / "job.json").write_text(json.dumps(job))
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        if device == "cpu":  # the dry run: accelerate's CPU gate lifted (see the docstring)
            shim = [str(REPO / "tests" / "fsdp_cpu"), str(REPO)]
            env["PYTHONPATH"] = os.pathsep.join([*shim, env.get("PYTHONPATH", "")])
        t0 = time.perf_counter()
        out = subprocess.run(
            train.worker_command(cell, cfg), capture_output=True, text=True, env=env
        )
        seconds = time.perf_counter() - t0
        if out.returncode:
            raise SystemExit(f"gpu_check: FSDP training failed:\n{out.stderr[-3000:]}")
        base = load_file(student / "model.safetensors")
        tuned = load_file(cell / "merged" / "model.safetensors")
        whole = {n: tuple(w.shape) for n, w in tuned.items()} == {
            n: tuple(w.shape) for n, w in base.items()
        }
        summary = json.loads((cell / "summary.json").read_text())
        sharded = (cell / "checkpoints" / "step-2" / "pytorch_model_fsdp_0").is_dir()
    print(
        f"4. FSDP full fine-tuning: {seconds:.1f} s, sharded checkpoint: {sharded}, "
        f"merged weights whole: {whole}",
        flush=True,
    )
    if not (whole and sharded):
        raise SystemExit("gpu_check: the FSDP run did not shard, or saved partial weights")
    return {"seconds": round(seconds, 1), "steps": summary["steps"], "whole": whole,
            "sharded_checkpoint": sharded, "dtypes": summary["dtypes"]}  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
