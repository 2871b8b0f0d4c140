"""The engine interface: requests in, n samples per request out; shared prompt rendering and seeds.

    from harness.engines import Request, Sampling, load
    engine = load("vllm", model_spec)
    [[sample]] = engine.generate([Request("q1", prompt="What is 2+3?")], Sampling(max_tokens=64))

Both engines receive the same token ids: `render` applies the tokenizer's chat template once here
(or tokenizes the raw prompt when the model entry says `chat_template: false`), so neither engine
adds a second BOS or renders a template its own way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from harness.config.schema import ModelSpec
from harness.errors import UserError

FinishReason = Literal["stop", "length"]
# vLLM builds its LoRA kernels for these maximum ranks only.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclasses.dataclass(frozen=True)
class Request:
    """One prompt: a user-message string, or a list of chat messages ({"role", "content"}).
    `continuation`: text the model's turn already begins with, which it goes on from (the
    second answer pass: its completion + "Therefore, the answer is")."""

    id: str
    prompt: str | None = None
    messages: Sequence[Mapping[str, str]] | None = None
    continuation: str = ""

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError(f"request {self.id!r}: give exactly one of prompt or messages")


@dataclasses.dataclass(frozen=True)
class Sampling:
    """Decoding settings shared by both engines. temperature 0 is greedy; top_k <= 0 is off."""

    n: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 512
    seed: int = 0
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0  # > 0: each sample keeps the k most likely tokens of every position

    @classmethod
    def from_config(cls, cfg: Any) -> Sampling:
        """From a GenerateConfig or an EvalConfig (which has no top_k: off)."""
        fields = {"n", "temperature", "top_p", "top_k", "max_tokens", "seed"}
        return cls(**cfg.model_dump(include=fields), stop=tuple(cfg.stop))

    def as_dict(self) -> dict[str, Any]:
        """JSON form, for manifests."""
        return {**dataclasses.asdict(self), "stop": list(self.stop)}


@dataclasses.dataclass(frozen=True)
class Sample:
    """One completion. `token_ids` include the EOS token when the model stopped on it."""

    text: str
    token_ids: tuple[int, ...]
    prompt_tokens: int
    finish_reason: FinishReason
    logprob: float | None = None  # cumulative log-probability of token_ids, when asked for
    # with Sampling.top_logprobs k: per generated token, the model's k most likely token ids and
    # their log-probabilities (of the raw distribution, before temperature), most likely first
    top: tuple[tuple[tuple[int, ...], tuple[float, ...]], ...] | None = None
    # the completion's length when token_ids are not known (a server that reports usage only)
    n_tokens: int | None = None

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids) if self.n_tokens is None else self.n_tokens


def request_seed(seed: int, request_id: str) -> int:
    """The seed of one request: a function of (base seed, request id) only, never of its batch.

    Sample k of a request uses seed + k (vLLM's rule for n > 1), so 31 bits leave room for k.
    """
    digest = hashlib.sha256(f"{seed}\0{request_id}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x3FFFFFFF


def vllm_lora_rank(rank: int) -> int:
    """The smallest maximum LoRA rank vLLM accepts that serves adapters of `rank`."""
    for r in VLLM_LORA_RANKS:
        if r >= rank:
            return r
    raise UserError(
        f"LoRA rank {rank} is above vLLM's largest max_lora_rank {VLLM_LORA_RANKS[-1]}."
    )


Adapters = str | None | Sequence[str | None]  # one adapter for every request, or one each


def per_request(adapter: Adapters, n: int) -> list[str | None]:
    """The adapter of each of `n` requests: `adapter` for all of them, or its items one by one."""
    if adapter is None or isinstance(adapter, str | Path):
        return [None if adapter is None else str(adapter)] * n
    adapters = list(adapter)
    if len(adapters) != n:
        raise ValueError(f"{len(adapters)} adapters for {n} requests")
    return adapters


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def cpu_env_defaults(tensor_parallel_size: int = 1) -> None:
    """Environment vLLM's CPU backend needs on a small machine; unset keys only, no-op with CUDA.

    In-process engine core (the stage already runs in its own child process: 3 s to start
    instead of 16-20 s), OpenMP threads on every core this process may use instead of vLLM's
    automatic choice (on a 2-core machine: one core bound, one reserved).
    """
    if has_cuda():
        return
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    if tensor_parallel_size == 1:
        usable = (
            os.sched_getaffinity(0)
            if hasattr(os, "sched_getaffinity")
            else range(os.cpu_count() or 1)
        )
        cores = ",".join(str(c) for c in sorted(usable))
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", cores)


def adapter_rank(adapter_dir: str | Path) -> int:
    """The LoRA rank of a PEFT adapter directory (its adapter_config.json `r`)."""
    cfg = Path(adapter_dir) / "adapter_config.json"
    if not cfg.is_file():
        raise UserError(f"{adapter_dir}: not a PEFT adapter directory (no adapter_config.json).")
    return int(json.loads(cfg.read_text())["r"])


class Engine:
    """What both engines share: the tokenizer, prompt rendering, adapter ids.

    Subclasses implement `stream` (yields `(request index, samples)` as requests finish, in any
    order), `version()` and `close()`; `generate` collects a stream in request order.
    """

    name = ""
    packages: tuple[str, ...] = ()

    def __init__(self, spec: ModelSpec, model_dir: str | None = None):
        from transformers import AutoTokenizer

        from harness.models import sources as models

        self.spec = spec
        # The resolved directory is already the snapshot of spec.revision, so revision ends here.
        self.model_dir = model_dir or models.resolve(spec)
        self.tokenizer = AutoTokenizer.from_pretrained(
            self.model_dir, trust_remote_code=spec.trust_remote_code
        )
        if spec.chat_template and not self.tokenizer.chat_template:
            raise UserError(
                f"model {spec.name!r}: its tokenizer has no chat template; set `chat_template: false` "
                "on the model entry to send raw prompts."
            )
        self._adapter_ids: dict[str, int] = {}

    def render(self, request: Request) -> list[int]:
        """The prompt token ids both engines see."""
        return self.render_many([request])[0]

    def render_many(self, requests: Sequence[Request]) -> list[list[int]]:
        """`render` of every request, in one call to the tokenizer: the chat templates are filled
        in one by one, but the texts are tokenised as one batch (4,096 sandbox prompts: 0.10 s
        against 0.18 s one call each, the same ids)."""
        if not requests:
            return []
        if not self.spec.chat_template:
            chats = [r.id for r in requests if r.messages is not None]
            if chats:
                raise UserError(
                    f"model {self.spec.name!r} has `chat_template: false`, but request "
                    f"{chats[0]!r} is a chat; send a prompt string."
                )
            texts = [(r.prompt or "") + r.continuation for r in requests]
            return [list(ids) for ids in self.tokenizer(texts)["input_ids"]]
        conversations = [
            [dict(m) for m in r.messages or [{"role": "user", "content": r.prompt or ""}]]
            for r in requests
        ]
        if any(r.continuation for r in requests):  # the turn's text goes on after the template's
            texts = self.tokenizer.apply_chat_template(
                conversations, add_generation_prompt=True, tokenize=False
            )
            texts = [t + r.continuation for t, r in zip(texts, requests, strict=True)]
            ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
            return [list(x) for x in ids]
        ids = self.tokenizer.apply_chat_template(
            conversations, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        return [list(x) for x in ids]

    def adapter_id(self, adapter: str | Path) -> tuple[str, int]:
        """A stable (name, positive int id) per adapter directory for this engine session."""
        path = str(Path(adapter).resolve())
        if not Path(path).is_dir():
            raise UserError(f"{adapter}: adapter directory does not exist.")
        return path, self._adapter_ids.setdefault(path, len(self._adapter_ids) + 1)

    def stream(
        self, requests: Sequence[Request], sampling: Sampling, adapter: Adapters = None
    ) -> Iterator[tuple[int, list[Sample]]]:
        """`(index into requests, its sampling.n samples)` for each request, as each finishes.
        `adapter`: a PEFT directory for every request, or one per request (None: the base model)."""
        raise NotImplementedError

    def generate(
        self, requests: Sequence[Request], sampling: Sampling, adapter: Adapters = None
    ) -> list[list[Sample]]:
        """One list of `sampling.n` samples per request, in request order (`adapter`: as `stream`)."""
        results: list[list[Sample]] = [[] for _ in requests]
        for i, samples in self.stream(requests, sampling, adapter):
            results[i] = samples
        return results

    def version(self) -> str:
        raise NotImplementedError

    def journal_to(self, path: str | Path) -> None:
        """Where this engine keeps each finished request, to be read back instead of asked again
        after a kill (an engine whose requests cost money does; the in-process ones need not)."""

    def usage(self) -> dict[str, Any]:
        """What the requests of the journal in use cost (requests, retries, tokens), for a cell's
        summary; empty for an engine that runs in-process (its cost is its device time)."""
        return {}

    def close(self) -> None:
        """Free the model; the process that made the engine should end soon after."""


def cut_at_stop(text: str, stop: Sequence[str]) -> int | None:
    """Index where the earliest stop string starts in `text`, or None."""
    hits = [i for i in (text.find(s) for s in stop) if i >= 0]
    return min(hits) if hits else None
