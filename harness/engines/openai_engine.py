"""A model behind an OpenAI-compatible endpoint: the same requests and decoding settings as the
in-process engines, sent over HTTP with bounded concurrency, rate limits, retries and a journal.

    teachers:
      - name: big-teacher
        engine: {kind: openai, base_url: "http://gpu-box:8000/v1", model: Qwen/Qwen2.5-72B-Instruct}

Each finished request is appended to a JSONL journal in the cell's directory and fsync'ed before
its samples go on, so a killed run reads it back instead of paying for it again. A request that
fails (429 / 5xx / timeout / dropped connection / malformed body) is retried with exponential
backoff and jitter, at least as long as the server's Retry-After says (a wait of RETRY_NOTE_S or
more is said where the run's progress shows); one that still fails after `max_attempts` is
journaled as failed with its reason, the others complete, and the stage then stops with a user
error naming it and what to check (a re-run asks only for what is missing). The API key is read from
the environment variable the entry names and is never written anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import hashlib
import json
import os
import queue
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from harness.config.schema import ModelSpec, OpenAIEndpoint
from harness.engines.base import (
    Adapters,
    Engine,
    Request,
    Sample,
    Sampling,
    per_request,
    request_seed,
)
from harness.errors import UserError

RETRY_STATUS = frozenset({408, 409, 425, 429})  # and every 5xx
BACKOFF_FIRST_S = 0.5  # the first retry waits about this long, doubling up to BACKOFF_MAX_S
BACKOFF_MAX_S = 60.0
RETRY_AFTER_MAX_S = 600.0  # a Retry-After beyond this is taken as this
RETRY_NOTE_S = 10.0  # a Retry-After this long or longer is said where the run's progress shows


class RequestsFailed(UserError):
    """Some requests failed after every attempt; the others are in the journal. A user error (exit
    2, one paragraph): what fixes it is the server or the entry's settings, which the message
    names."""


class Journal:
    """Finished requests by key: read from the file it was pointed at, then appended to it."""

    def __init__(self) -> None:
        self._fd = -1
        self.path: Path | None = None
        self._reset()

    def _reset(self) -> None:
        self.done: dict[str, dict[str, Any]] = {}
        self.resumed = 0  # finished requests read back from the file
        self.lost_attempts = 0  # attempts of requests that failed every one (retried later)
        self.failed = 0  # requests that failed every attempt

    def open(self, path: Path) -> None:
        """Read `path`'s finished requests (a line cut by a kill is dropped) and append to it.
        The journal open already: nothing to do (what this run added to it is not resumed)."""
        if self._fd >= 0 and self.path == path.resolve():
            return
        self.close()
        self._reset()
        self.path = path.resolve()
        if path.exists():
            data = path.read_bytes()
            whole = data[: data.rfind(b"\n") + 1]
            if whole != data:  # the tail a kill cut: the next line must start on a line of its own
                with open(path, "r+b") as f:
                    f.truncate(len(whole))
            for line in whole.splitlines():
                self._count(json.loads(line))
            self.resumed, self.failed = len(self.done), 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, record: dict[str, Any]) -> None:
        """Append one record in one write and fsync it: on disk before anything depends on it."""
        if self._fd >= 0:
            os.write(self._fd, (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
            os.fsync(self._fd)
        self._count(record)

    def _count(self, record: dict[str, Any]) -> None:
        if "choices" in record:
            self.done[record["key"]] = record
        else:
            self.lost_attempts += record["attempts"]
            self.failed += 1

    def usage(self) -> dict[str, Any]:
        """Totals over every request journaled: what a cell's answers cost, kills included."""
        done = self.done.values()
        return {
            "requests": len(self.done),
            "resumed_requests": self.resumed,
            "retries": self.lost_attempts + sum(r["attempts"] - 1 for r in done),
            "failed_requests": self.failed,
            "prompt_tokens": sum(r["usage"]["prompt_tokens"] for r in done),
            "completion_tokens": sum(r["usage"]["completion_tokens"] for r in done),
        }

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.path = None


class RateLimit:
    """At most `per_minute` units a minute: a bucket that holds one minute's worth and refills
    continuously. One event loop uses it, so taking is atomic between awaits."""

    def __init__(self, per_minute: float):
        self.capacity, self.rate = per_minute, per_minute / 60.0
        self.level, self.at = per_minute, time.monotonic()

    async def take(self, units: float) -> None:
        units = min(units, self.capacity)  # a request larger than a minute's budget waits for all
        while True:
            now = time.monotonic()
            self.level = min(self.capacity, self.level + (now - self.at) * self.rate)
            self.at = now
            if self.level >= units:
                self.level -= units
                return
            await asyncio.sleep((units - self.level) / self.rate)


def retry_after(headers: Any) -> float | None:
    """Seconds the server asks us to wait: `retry-after-ms`, or `Retry-After` in seconds or as
    an HTTP date."""
    if headers is None:
        return None
    with contextlib.suppress(TypeError, ValueError):
        if (ms := headers.get("retry-after-ms")) is not None:
            return min(RETRY_AFTER_MAX_S, float(ms) / 1000)
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return min(RETRY_AFTER_MAX_S, max(0.0, float(value)))
    except ValueError:
        with contextlib.suppress(TypeError, ValueError):
            when = email.utils.parsedate_to_datetime(value).timestamp()
            return min(RETRY_AFTER_MAX_S, max(0.0, when - time.time()))
    return None


def backoff(attempt: int, rng: random.Random, server_says: float | None = None) -> float:
    """Seconds before attempt `attempt + 1`: exponential with "equal jitter" (half fixed, half
    random: retries of many requests spread out), and never sooner than the server asked."""
    base = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** (attempt - 1))
    delay = base / 2 + rng.uniform(0, base / 2)
    return max(delay, server_says or 0.0)


def classify(error: BaseException) -> tuple[bool, str, float | None]:
    """(retry?, reason, the server's Retry-After) of a failed attempt."""
    import openai

    if isinstance(error, openai.APIStatusError):
        status = error.status_code
        retry = status in RETRY_STATUS or status >= 500
        return (
            retry,
            f"HTTP {status}: {str(error.message)[:200]}",
            retry_after(error.response.headers),
        )
    if isinstance(error, openai.APITimeoutError):
        return True, "timed out", None
    if isinstance(error, openai.APIConnectionError):
        cause = error.__cause__ or error
        return True, f"connection failed: {type(cause).__name__}: {str(cause)[:200]}", None
    if isinstance(error, (openai.APIResponseValidationError, ValueError, KeyError, TypeError)):
        return True, f"malformed response: {type(error).__name__}: {str(error)[:200]}", None
    raise error


class OpenAIEngine(Engine):
    """Requests to one served model. Greedy decoding asks for one completion and copies it n
    times, as the in-process engines do; sampled requests carry the request's own seed."""

    name = "openai"
    packages = ("openai",)

    def __init__(self, spec: ModelSpec, lora_rank: int | None = None, max_loras: int = 2):
        if lora_rank is not None:
            raise UserError(
                f"model {spec.name!r} is served (engine.kind: openai): cotgap cannot load LoRA "
                "adapters into it; a student must run in-process."
            )
        self.settings: OpenAIEndpoint = spec.engine
        self._api_key = _api_key(spec)
        if spec.path and self.settings.endpoint == "completions":
            super().__init__(spec)  # the local tokenizer renders the prompt as in-process
        else:
            # served without a local tokenizer: the server renders and counts
            self.spec, self.tokenizer, self.model_dir = spec, None, None  # type: ignore[assignment]
            self._adapter_ids = {}
        self.served_model: str | None = None  # the name the server reports in its responses
        self.journal = Journal()
        self.rng = random.Random()
        self._running: tuple | None = None  # (event loop, its main task) while requests run
        # sends an event to the stage's progress; whether one listens (engines.emit)
        self.emit: Callable[[dict[str, Any]], bool] | None = None

    def _redact(self, text: str) -> str:
        """`text` without the API key (a server may echo it in an error message)."""
        if self.settings.api_key_env is None:
            return text
        return text.replace(self._api_key, "<api key>")

    def version(self) -> str:
        import openai

        return openai.__version__

    def provenance(self) -> dict[str, Any]:
        """Where the samples came from: the endpoint and the model name the server reported."""
        s = self.settings
        return {"base_url": s.base_url, "endpoint": s.endpoint, "served_model": self.served_model}

    def journal_to(self, path: str | Path) -> None:
        self.journal.open(Path(path))

    def usage(self) -> dict[str, Any]:
        return {**self.journal.usage(), "served_model": self.served_model}

    def close(self) -> None:
        self.journal.close()

    # --- one call -------------------------------------------------------------------------------

    def stream(
        self, requests: Sequence[Request], sampling: Sampling, adapter: Adapters = None
    ) -> Iterator[tuple[int, list[Sample]]]:
        """Journaled requests first, then the rest as the server answers them."""
        if any(per_request(adapter, len(requests))):
            raise UserError(f"model {self.spec.name!r} is served: it cannot run LoRA adapters.")
        bodies = [self._body(r, sampling) for r in requests]
        keys = [_key(b) for b in bodies]
        todo = []
        for i, key in enumerate(keys):
            if key in self.journal.done:
                self.served_model = self.served_model or self.journal.done[key]["model"]
                yield i, _samples(self.journal.done[key], sampling)
            else:
                todo.append(i)
        if todo:
            yield from self._ask([(i, requests[i].id, keys[i], bodies[i]) for i in todo], sampling)

    def _ask(self, jobs: list[tuple], sampling: Sampling) -> Iterator[tuple[int, list[Sample]]]:
        """Run the jobs on an event loop in a thread; yield each as it is journaled."""
        out: queue.Queue = queue.Queue()
        stop = threading.Event()
        thread = threading.Thread(
            target=lambda: out.put(_outcome(lambda: asyncio.run(self._all(jobs, out, stop)))),
            name="openai-requests",
            daemon=True,
        )
        thread.start()
        failures = []
        try:
            while True:
                item = out.get()
                if isinstance(item, tuple) and item[0] == "done":
                    if item[1] is not None:
                        raise item[1]
                    break
                if isinstance(item, tuple) and item[0] == "note":
                    self._say(item[1])
                    continue
                i, record = item
                if "choices" in record:
                    yield i, _samples(record, sampling)
                else:
                    failures.append(record)
        finally:
            stop.set()
            if self._running is not None and thread.is_alive():  # stopped early: cancel in-flight
                loop, main = self._running
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(main.cancel)
            thread.join()
        if failures:
            first = failures[0]
            reason = " ".join(first["failed"].split())  # one paragraph, whatever the server said
            raise RequestsFailed(
                f"{len(failures)} of {len(jobs)} requests to model {self.settings.model!r} at "
                f"{self.settings.base_url} failed after {first['attempts']} attempt(s); first: "
                f"request {first['id']!r}: {reason}. {self._hint(reason)} The "
                f"{len(jobs) - len(failures)} that finished are journaled: re-run to ask only "
                "for the rest."
            )

    def _say(self, note: str) -> None:
        """A line for the user where the run's progress shows (`emit`), else on stderr."""
        if not (self.emit and self.emit({"note": note})):
            print(note, file=sys.stderr, flush=True)

    def _hint(self, reason: str) -> str:
        """What to check, from the reason the last attempt failed."""
        s = self.settings
        status = reason.split(":")[0].removeprefix("HTTP ")
        if reason.startswith("connection failed"):
            return (
                f"Nothing answered at {s.base_url}: is the server running there (engine.base_url)?"
            )
        if status in ("401", "403"):
            where = (
                f"the key in ${s.api_key_env} (engine.api_key_env)"
                if s.api_key_env
                else "engine.api_key_env: it names no key"
            )
            return f"The server refused the credentials: check {where}."
        if status == "404":
            return (
                f"Check engine.model (the name the server serves; {s.base_url}/models lists "
                "them) and engine.base_url (the API root, ending in /v1 for most servers)."
            )
        if status == "429":
            return (
                "The server kept rate-limiting: lower engine.requests_per_minute, "
                "tokens_per_minute or max_concurrency, or raise engine.max_attempts."
            )
        if reason.startswith("malformed response"):
            return (
                f"What {s.base_url} answers is not an OpenAI-compatible response: check "
                "engine.base_url and engine.endpoint (chat or completions)."
            )
        if reason.startswith("timed out"):
            return "Raise engine.timeout_s or lower max_tokens, or see the server's load."
        return "See the server's log for the cause."

    async def _all(self, jobs: list[tuple], out: queue.Queue, stop: threading.Event) -> None:
        import openai

        s = self.settings
        client = openai.AsyncOpenAI(
            base_url=s.base_url,
            api_key=self._api_key,
            timeout=s.timeout_s,
            # retries are ours: each request's attempts are counted and journaled, Retry-After is
            # honoured beyond the client's cap, and a request is given up after max_attempts
            max_retries=0,
        )
        limits = _Limits(s)
        self._out = out
        self._running = (asyncio.get_running_loop(), asyncio.current_task())
        async with client:
            tasks = [asyncio.create_task(self._one(client, limits, job, stop)) for job in jobs]
            try:
                for task in asyncio.as_completed(tasks):
                    i, record = await task
                    if record is None:  # the consumer has stopped: nothing more is wanted
                        break
                    self._finished(i, record, out)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                self._running = None

    def _finished(self, i: int, record: dict[str, Any], out: queue.Queue) -> None:
        """Journal a finished request, count it, and hand it to the consumer."""
        self.journal.write(record)
        out.put((i, record))

    async def _one(self, client: Any, limits: _Limits, job: tuple, stop: threading.Event) -> tuple:
        i, rid, key, body = job
        reasons: list[str] = []
        for attempt in range(1, self.settings.max_attempts + 1):
            if stop.is_set():
                return i, None
            error_wait = None
            async with limits.slot(body):
                try:
                    choices, usage, model = await self._call(client, body)
                except Exception as e:  # noqa: BLE001 (classify re-raises what it does not know)
                    retry, reason, wait = classify(e)
                    reasons.append(self._redact(reason))
                    if not retry:
                        break
                    error_wait = wait
                    if limits.pause(wait) and wait is not None and wait >= RETRY_NOTE_S:
                        self._out.put(("note", self._waiting(wait, reason)))
                else:
                    self.served_model = self.served_model or model
                    record = {"key": key, "id": rid, "attempts": attempt, "model": model}
                    return i, {**record, "choices": choices, "usage": usage, "retried": reasons}
            if attempt < self.settings.max_attempts:
                await asyncio.sleep(backoff(attempt, self.rng, error_wait))
        return i, {"key": key, "id": rid, "attempts": len(reasons), "failed": reasons[-1],
                   "retried": reasons}  # fmt: skip

    def _waiting(self, seconds: float, reason: str) -> str:
        capped = " (its Retry-After, capped)" if seconds >= RETRY_AFTER_MAX_S else ""
        return (
            f"model {self.settings.model!r} at {self.settings.base_url}: {reason[:80]}; every "
            f"request waits {seconds:.0f} s as the server asks{capped}, then tries again "
            f"(up to engine.max_attempts {self.settings.max_attempts} attempts each)"
        )

    async def _call(self, client: Any, body: dict[str, Any]) -> tuple[list, dict, str]:
        """One attempt: (choices, usage, the reported model) or an exception."""
        if self.settings.endpoint == "chat":
            resp = await client.chat.completions.create(**body)
            texts = [c.message.content or "" for c in resp.choices]
        else:
            resp = await client.completions.create(**body)
            texts = [c.text for c in resp.choices]
        want = body.get("n", 1)
        if len(resp.choices) != want or resp.usage is None:
            raise ValueError(f"{len(resp.choices)} choices for n={want}, usage {resp.usage!r}")
        ordered = sorted(zip(resp.choices, texts, strict=True), key=lambda ct: ct[0].index)
        total = resp.usage.completion_tokens
        choices = []
        for k, (c, text) in enumerate(ordered):
            if c.finish_reason not in ("stop", "length"):
                raise UserError(
                    f"model {self.settings.model!r} ended a completion with finish_reason "
                    f"{c.finish_reason!r}; cotgap scores stop and length only."
                )
            ids = getattr(c, "token_ids", None)
            tokens = len(ids) if ids is not None else total // want + (k < total % want)
            choices.append({"text": text, "finish_reason": c.finish_reason, "tokens": tokens,
                            "token_ids": ids})  # fmt: skip
        usage = {"prompt_tokens": resp.usage.prompt_tokens, "completion_tokens": total}
        return choices, usage, resp.model

    def _body(self, request: Request, sampling: Sampling) -> dict[str, Any]:
        """The request body: the prompt as the endpoint takes it, and the decoding settings."""
        s, greedy = self.settings, sampling.temperature == 0
        body: dict[str, Any] = {"model": s.model, "max_tokens": sampling.max_tokens}
        body["temperature"] = sampling.temperature
        if not greedy:
            body.update(n=sampling.n, top_p=sampling.top_p)
            body["seed"] = request_seed(sampling.seed, request.id)
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        extra: dict[str, Any] = {}
        if s.vllm_extensions:
            extra["return_token_ids"] = True
            if sampling.top_k > 0 and not greedy:
                extra["top_k"] = sampling.top_k
        elif sampling.top_k > 0 and not greedy:
            raise UserError(
                f"model {self.spec.name!r}: top_k {sampling.top_k} is not an OpenAI API setting; "
                "set engine.vllm_extensions: true for a vLLM server, or leave top_k out."
            )
        if s.endpoint == "chat":
            body["messages"] = [dict(m) for m in request.messages or ()] or [
                {"role": "user", "content": request.prompt}
            ]
            if request.continuation:
                if not s.vllm_extensions:
                    raise UserError(
                        f"model {self.spec.name!r}: a chat endpoint cannot go on from a started "
                        "answer (evaluate.answer_pass); use endpoint: completions, or "
                        "vllm_extensions: true on a vLLM server."
                    )
                body["messages"].append({"role": "assistant", "content": request.continuation})
                extra.update(continue_final_message=True, add_generation_prompt=False)
        elif self.tokenizer is not None:
            body["prompt"] = self.render(request)  # token ids: exactly what in-process sees
        elif request.messages is not None:
            raise UserError(
                f"model {self.spec.name!r}: endpoint completions without a local tokenizer takes "
                "prompt strings; use endpoint: chat for chat requests."
            )
        else:
            body["prompt"] = (request.prompt or "") + request.continuation
        if extra:
            body["extra_body"] = extra
        return body


class _Limits:
    """Concurrency, the per-minute limits, and the server's Retry-After, of one engine call."""

    def __init__(self, s: OpenAIEndpoint):
        self.sem = asyncio.Semaphore(s.max_concurrency)
        self.rpm = RateLimit(s.requests_per_minute) if s.requests_per_minute else None
        self.tpm = RateLimit(s.tokens_per_minute) if s.tokens_per_minute else None
        self.not_before = 0.0  # monotonic time before which no request is sent

    def pause(self, seconds: float | None) -> bool:
        """A 429's Retry-After holds back every request, not only the one that got it. Whether
        it holds them longer than they were held already (by a second or more)."""
        if not seconds:
            return False
        until = time.monotonic() + seconds
        longer = until > self.not_before + 1.0
        self.not_before = max(self.not_before, until)
        return longer

    @contextlib.asynccontextmanager
    async def slot(self, body: dict[str, Any]) -> Any:
        async with self.sem:
            while (wait := self.not_before - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            if self.rpm:
                await self.rpm.take(1)
            if self.tpm:
                await self.tpm.take(_token_estimate(body))
            yield


def _token_estimate(body: dict[str, Any]) -> float:
    """Tokens a request may use, before it is sent: its prompt (ids, or ~4 characters a token)
    and max_tokens for each of its n completions."""
    prompt = body.get("prompt")
    size: float
    if isinstance(prompt, list):
        size = len(prompt)
    else:
        text = prompt if isinstance(prompt, str) else json.dumps(body.get("messages"))
        size = len(text) / 4
    return size + body["max_tokens"] * body.get("n", 1)


def _key(body: dict[str, Any]) -> str:
    """A request's journal key: everything that decides its answer."""
    blob = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _samples(record: dict[str, Any], sampling: Sampling) -> list[Sample]:
    prompt = record["usage"]["prompt_tokens"]
    samples = [
        Sample(c["text"], tuple(c["token_ids"] or ()), prompt, c["finish_reason"],
               n_tokens=None if c["token_ids"] is not None else c["tokens"])
        for c in record["choices"]
    ]  # fmt: skip
    return samples * sampling.n if len(samples) < sampling.n else samples


def _outcome(fn: Any) -> tuple[str, BaseException | None]:
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 (handed to the consuming thread, which raises it)
        return "done", e
    return "done", None


def _api_key(spec: ModelSpec) -> str:
    """The key from the environment; a server without keys gets a placeholder the client needs."""
    var = spec.engine.api_key_env
    if var is None:
        return "none"
    key = os.environ.get(var)
    if not key:
        raise UserError(
            f"model {spec.name!r}: engine.api_key_env names {var}, which is not set; export "
            f"{var}=<your key> (it is read from the environment only, never from a file)."
        )
    return key
