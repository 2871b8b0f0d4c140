"""transformers engine: `model.generate` over length-sorted, left-padded batches with a KV cache.

    engine = HFEngine(spec)
    engine.generate(requests, Sampling(max_tokens=64), adapter="results/.../adapter")

The fallback where vLLM is not installed, and the reference the contract tests hold vLLM to.
Sampling draws each row from its own seeded generator (`SeededSampler`), so like vLLM a request's
samples depend on (seed, request id) and not on which requests share its batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from harness.config.schema import ModelSpec
from harness.engines.base import (
    Adapters,
    Engine,
    FinishReason,
    Request,
    Sample,
    Sampling,
    cut_at_stop,
    has_cuda,
    per_request,
    request_seed,
)

DEFAULT_BATCH_ROWS = 64  # sequences per generate call when the model sets no max_num_seqs


class SeededSampler:
    """A logits processor that samples row i with generator i and leaves only that token finite.

    Run under greedy search, the argmax is then the sampled token. Temperature, top-k and top-p
    are transformers' own warpers.
    """

    def __init__(self, seeds: Sequence[int], sampling: Sampling, device: Any):
        import torch
        from transformers import (
            LogitsProcessorList,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        self.generators = [torch.Generator(device).manual_seed(s) for s in seeds]
        warpers = [TemperatureLogitsWarper(sampling.temperature)]
        if sampling.top_k > 0:
            warpers.append(TopKLogitsWarper(sampling.top_k))
        if sampling.top_p < 1.0:
            warpers.append(TopPLogitsWarper(sampling.top_p))
        self.warpers = LogitsProcessorList(warpers)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        probs = torch.softmax(self.warpers(input_ids, scores.float()), dim=-1)
        rows = zip(probs, self.generators, strict=True)
        picks = torch.cat([torch.multinomial(p, 1, generator=g) for p, g in rows])
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, picks[:, None], 0.0)


class StopOnStrings:
    """A stopping criterion: a row is done once its generated text (not the prompt) holds a stop string."""

    def __init__(self, tokenizer: Any, stop: Sequence[str], prompt_len: int):
        self.tokenizer, self.stop, self.prompt_len = tokenizer, tuple(stop), prompt_len
        # enough trailing tokens to spell the longest stop string, even one byte per token
        self.window = max(len(s.encode()) for s in stop) + 8

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        tails = self.tokenizer.batch_decode(
            input_ids[:, self.prompt_len :][:, -self.window :], skip_special_tokens=True
        )
        done = [any(s in t for s in self.stop) for t in tails]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


class HFEngine(Engine):
    """transformers + peft; adapters are loaded once each and switched with `set_adapter`."""

    name = "hf"
    packages = ("torch", "transformers", "peft")

    def __init__(
        self,
        spec: ModelSpec,
        lora_rank: int | None = None,
        max_loras: int = 2,
        max_logprobs: int = 0,
    ):
        """`lora_rank`, `max_loras` and `max_logprobs` are vLLM's; peft serves any adapter and
        any number of log-probabilities without them."""
        super().__init__(spec)
        import torch
        from transformers import AutoModelForCausalLM, GenerationConfig

        self.device = torch.device("cuda" if has_cuda() else "cpu")
        dtype: Any = spec.engine.dtype
        if dtype == "auto" and self.device.type == "cpu":
            dtype = torch.float32
        self.model = AutoModelForCausalLM.from_pretrained(
            self.model_dir, dtype=dtype, trust_remote_code=spec.trust_remote_code
        ).to(self.device)
        self.model.eval()
        eos = self.model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        self.eos_ids = sorted({*eos, self.tokenizer.eos_token_id} - {None})
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.eos_ids[0]
        # Only what we pass decides decoding: no repetition penalty etc. from the hub's defaults,
        # as vLLM ignores them when given explicit sampling parameters.
        self.model.generation_config = GenerationConfig(
            eos_token_id=self.eos_ids, pad_token_id=self.pad_id
        )
        self.batch_rows = spec.engine.max_num_seqs or DEFAULT_BATCH_ROWS
        self._adapters: dict[str, str] = {}  # path -> peft adapter name

    def version(self) -> str:
        import transformers

        return f"transformers=={transformers.__version__}"

    @contextlib.contextmanager
    def _adapter(self, adapter: str | None) -> Iterator[None]:
        from peft import PeftModel

        if adapter is None:
            peft = isinstance(self.model, PeftModel)
            with self.model.disable_adapter() if peft else contextlib.nullcontext():
                yield
            return
        path, int_id = self.adapter_id(adapter)
        if path not in self._adapters:
            name = f"adapter{int_id}"
            if isinstance(self.model, PeftModel):
                self.model.load_adapter(path, adapter_name=name)
            else:
                self.model = PeftModel.from_pretrained(self.model, path, adapter_name=name)
            self.model.eval()
            self._adapters[path] = name
        self.model.set_adapter(self._adapters[path])
        yield

    def stream(
        self, requests: Sequence[Request], sampling: Sampling, adapter: Adapters = None
    ) -> Iterator[tuple[int, list[Sample]]]:
        """Generate adapter by adapter (in order of first use), batch by batch, longest prompts
        first; yield each batch's requests."""
        prompts = self.render_many(requests)
        seeds = [request_seed(sampling.seed, r.id) for r in requests]
        rows_per_request = sampling.n if sampling.temperature > 0 else 1  # greedy: copies
        per_batch = max(1, self.batch_rows // rows_per_request)
        by_adapter: dict[str | None, list[int]] = {}
        for i, a in enumerate(per_request(adapter, len(requests))):
            by_adapter.setdefault(a, []).append(i)
        for name, indices in by_adapter.items():
            # longest first: an out-of-memory batch shows up at once, and padding stays small
            order = sorted(indices, key=lambda i: -len(prompts[i]))
            with self._adapter(name):
                for start in range(0, len(order), per_batch):
                    batch = order[start : start + per_batch]
                    rows = [(i, k) for i in batch for k in range(rows_per_request)]
                    samples = self._generate_rows(
                        [prompts[i] for i, _ in rows], [seeds[i] + k for i, k in rows], sampling
                    )
                    for j, i in enumerate(batch):
                        mine = samples[j * rows_per_request : (j + 1) * rows_per_request]
                        yield i, mine * (sampling.n // rows_per_request)

    def _generate_rows(
        self, prompts: list[list[int]], seeds: list[int], sampling: Sampling
    ) -> list[Sample]:
        import torch
        from transformers import LogitsProcessorList, StoppingCriteriaList

        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(input_ids)
        for row, p in enumerate(prompts):
            input_ids[row, width - len(p) :] = torch.tensor(p)
            mask[row, width - len(p) :] = 1
        processors = LogitsProcessorList()
        if sampling.temperature > 0:
            processors.append(SeededSampler(seeds, sampling, self.device))
        criteria = StoppingCriteriaList()
        if sampling.stop:
            criteria.append(StopOnStrings(self.tokenizer, sampling.stop, width))
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=mask.to(self.device),
                max_new_tokens=sampling.max_tokens,
                do_sample=False,
                logits_processor=processors,
                stopping_criteria=criteria,
                return_dict_in_generate=True,
                output_logits=sampling.logprobs or sampling.top_logprobs > 0,
            )
        generated = out.sequences[:, width:].tolist()
        logprobs = None
        if sampling.logprobs or sampling.top_logprobs:
            logprobs = torch.stack(out.logits, dim=1).float().log_softmax(-1)
        return [
            self._sample(row, ids, len(prompts[row]), sampling, logprobs)
            for row, ids in enumerate(generated)
        ]

    def _sample(
        self, row: int, ids: list[int], prompt_tokens: int, sampling: Sampling, logprobs: Any
    ) -> Sample:
        """Cut a padded row where vLLM would have stopped: a stop string, else EOS, else max_tokens."""
        eos_at = next((j for j, t in enumerate(ids) if t in self.eos_ids), None)
        body = ids if eos_at is None else ids[:eos_at]
        text = self.tokenizer.decode(body, skip_special_tokens=True)
        finish: FinishReason = "length"
        cut = cut_at_stop(text, sampling.stop)
        if cut is not None:
            body = body[: self._tokens_until_stop(body, sampling.stop)]
            ids, text, finish = body, text[:cut], "stop"
        elif eos_at is not None:
            ids, finish = ids[: eos_at + 1], "stop"
        logprob, top = None, None
        if logprobs is not None and sampling.logprobs:
            logprob = float(sum(logprobs[row, j, t] for j, t in enumerate(ids)))
        if sampling.top_logprobs:
            values, indices = logprobs[row, : len(ids)].topk(sampling.top_logprobs, dim=-1)
            top = tuple(
                (tuple(i), tuple(v)) for i, v in zip(indices.tolist(), values.tolist(), strict=True)
            )
        return Sample(text, tuple(ids), prompt_tokens, finish, logprob, top)

    def _tokens_until_stop(self, ids: list[int], stop: Sequence[str]) -> int:
        """The fewest leading tokens whose text holds a stop string (the token that completed it)."""
        lo, hi = 1, len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            text = self.tokenizer.decode(ids[:mid], skip_special_tokens=True)
            lo, hi = (mid + 1, hi) if cut_at_stop(text, stop) is None else (lo, mid)
        return lo

    def close(self) -> None:
        self.model = None
