"""Generation engines behind one interface, and the child process a stage runs them in.

    from harness.engines import Request, Sampling, load, run_in_child
    engine = load("vllm", model_spec, lora_rank=8)     # or "hf"
    outs = engine.generate([Request("q1", prompt="2+3=?")], Sampling(n=2, temperature=0.7))

A stage runs its engine work in a child process (`run_in_child`), so the memory the engine took
(GPU memory included) is returned to the system when that child exits. Set COTGAP_INPROCESS=1 to
run it in the calling process instead (debuggers, tests).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, ClassVar

from harness import devices
from harness.config.schema import ModelSpec
from harness.engines.base import Engine, Request, Sample, Sampling, request_seed
from harness.engines.hf_engine import HFEngine
from harness.engines.openai_engine import OpenAIEngine
from harness.engines.vllm_engine import VllmEngine
from harness.errors import UserError
from harness.models import sources as models

__all__ = [
    "ENGINES",
    "ChildFailed",
    "Engine",
    "Request",
    "Sample",
    "Sampling",
    "emit",
    "in_request_order",
    "inprocess_default",
    "load",
    "pending",
    "request_seed",
    "run_in_child",
    "run_stage",
]

ENGINES: dict[str, type[Engine]] = {"vllm": VllmEngine, "hf": HFEngine}
EMIT_EVERY_S = 0.25  # progress messages from the child, at most this often


def load(
    name: str,
    spec: ModelSpec,
    lora_rank: int | None = None,
    max_loras: int = 2,
    max_logprobs: int = 0,
) -> Engine:
    """Start engine `name` on a model. `lora_rank`: the largest rank of the adapters it will serve;
    `max_loras`: how many of them one batch may mix (vLLM; peft serves any); `max_logprobs`: the
    most top log-probabilities a request asks for (Sampling.top_logprobs). A served model
    (engine.kind: openai) gets the OpenAI-compatible client whatever `name` says."""
    engine: Engine
    if spec.served:
        engine = OpenAIEngine(spec, lora_rank=lora_rank, max_loras=max_loras)
        engine.emit = emit  # its notes (a long Retry-After) reach the stage's progress
        return engine
    if name not in ENGINES:
        raise UserError(f"unknown engine {name!r}; valid: {', '.join(sorted(ENGINES))}")
    _convert_first(spec)
    emit({"status": f"starting the {name} engine"})
    began = time.perf_counter()
    start: Callable[..., Engine] = ENGINES[name]  # each engine's own keywords
    engine = start(spec, lora_rank=lora_rank, max_loras=max_loras, max_logprobs=max_logprobs)
    emit({"status": f"{name} engine up in {time.perf_counter() - began:.0f} s"})
    return engine


def _convert_first(spec: ModelSpec) -> None:
    """A GGUF model not converted yet is converted here, said before and after: the one-time
    de-quantisation takes tens of seconds with nothing else to show."""
    from harness.models import gguf

    if not (spec.path or "").startswith(gguf.PREFIX) or models.directory_here(spec) is not None:
        return
    emit(
        {
            "status": f"converting {spec.path} to float32 safetensors (once; kept in {gguf.gguf_dir()})"
        }
    )
    began = time.perf_counter()
    models.resolve(spec)
    emit({"status": f"converted {spec.path} in {time.perf_counter() - began:.0f} s"})


# --- the child process ----------------------------------------------------------------------------


class ChildFailed(RuntimeError):
    """The child process of a stage failed; the message names what it was doing and its log."""


_emit: Callable[[Any], None] | None = None
_HARNESS_ROOT = str(Path(__file__).resolve().parents[2])  # the directory that holds `harness/`


def emit(event: Any) -> bool:
    """Send `event` (picklable) to the `on_event` callback of the `run_in_child` that runs us;
    whether there was one."""
    if _emit is not None:
        _emit(event)
    return _emit is not None


def in_request_order(
    stream: Iterable[tuple[int, list[Sample]]],
) -> Iterator[tuple[int, list[Sample]]]:
    """An engine's stream (request index, samples) in request order: each request as soon as it
    and every earlier one are done, so a file written from it always holds the first requests;
    progress goes out (`emit`) as requests finish."""
    finished: dict[int, list[Sample]] = {}
    next_i, done, tokens, last_emit = 0, 0, 0, 0.0
    for i, samples in stream:
        finished[i] = samples
        done, tokens = done + len(samples), tokens + sum(s.completion_tokens for s in samples)
        if time.perf_counter() - last_emit > EMIT_EVERY_S:
            emit({"samples": done, "tokens": tokens})
            done, tokens, last_emit = 0, 0, time.perf_counter()
        while next_i in finished:
            yield next_i, finished.pop(next_i)
            next_i += 1
    emit({"samples": done, "tokens": tokens})


def _reuse_default() -> bool:
    """Whether engine work reuses one warm child process per run. On a CPU machine it does: a
    fresh child pays `import vllm` and the first engine's set-up (seconds) for every
    model of every stage, most of a small grid's time; memory goes back to the allocator when a
    job's engine is dropped. With a GPU each group gets a fresh child, which is the only sure way
    to hand every byte of GPU memory back. COTGAP_ENGINE_WORKER=fresh|reuse overrides."""
    env = os.environ.get("COTGAP_ENGINE_WORKER", "").lower()
    if env in ("fresh", "reuse"):
        return env == "reuse"
    return not (Path("/dev/nvidiactl").exists() or Path("/dev/nvidia0").exists())


def inprocess_default() -> bool:
    """COTGAP_INPROCESS=1: engine work runs in the calling process (debuggers, tests)."""
    return devices.inprocess()


def run_in_child(
    fn: Callable[..., Any],
    *args: Any,
    label: str,
    log_path: str | Path,
    on_event: Callable[[Any], None] | None = None,
    inprocess: bool | None = None,
    reuse: bool | None = None,
    **kwargs: Any,
) -> Any:
    """Call `fn(*args, **kwargs)` in a child Python process and return its (picklable) result.

    `fn` must be importable by reference (a module-level function outside `__main__`). Its stdout
    and stderr, the engine's logs included, go to `log_path`; calls to `emit(event)` in it reach
    `on_event` here. A failure raises `ChildFailed` naming `label` and the log (a `UserError` in
    the child stays one). The child exits by itself when this process dies, even by SIGKILL.
    Unlike multiprocessing's "spawn", the caller's main script is not imported again. With
    `reuse` (default: `_reuse_default()`), one warm child serves call after call; a child whose
    call failed is not reused.
    """
    global _emit
    if inprocess is None:
        inprocess = inprocess_default()
    if inprocess:
        previous, _emit = _emit, on_event
        try:
            return fn(*args, **kwargs)
        finally:
            _emit = previous
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    reuse = _reuse_default() if reuse is None else reuse
    # a group holding GPUs of a shared node gets a child of its own that sees only those GPUs;
    # a group holding a slot of CPU cores, the slot's warm child (bound to those cores)
    slot = devices.held_cores()
    worker = _Worker.get(slot) if reuse and not devices.holding() else _Worker()
    try:
        outcome = worker.call((fn, args, kwargs, str(log_path)), on_event)
    except BaseException:
        worker.stop(kill=True)
        raise
    ok = outcome is not None and outcome[0] == "result"
    if not ok or worker is not _Worker.warm.get(slot):
        worker.stop()  # after a failed call the child exits by itself: it is never reused
    if ok and outcome is not None:
        return outcome[1]
    raise _failure(label, log_path, worker.child.returncode, outcome)


class _Worker:
    """A child Python process that runs calls sent through its stdin, one after another."""

    # the reusable ones, by the CPU cores of their slot (None: no slot), each started by the first
    # call that reuses it; the slots' threads share it, each taking its own slot's child
    warm: ClassVar[dict[tuple[int, ...] | None, _Worker]] = {}
    lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def get(cls, slot: tuple[int, ...] | None = None) -> _Worker:
        with cls.lock:
            worker = cls.warm.get(slot)
            if worker is None or worker.child.poll() is not None:
                worker = cls.warm[slot] = cls()
                worker.slot = slot
            return worker

    def __init__(self) -> None:
        self.slot: tuple[int, ...] | None = None
        messages_r, messages_w = os.pipe()  # child -> parent: events and outcomes
        alive_r, self.alive_w = os.pipe()  # held open here only: EOF in the child = we died
        code = (
            f"import sys; sys.path.insert(0, {_HARNESS_ROOT!r}); "
            f"from harness.engines import _child_main; _child_main({messages_w}, {alive_r})"
        )
        self.child = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,  # each call sends the child's output to its own log
            stderr=subprocess.DEVNULL,
            pass_fds=(messages_w, alive_r),
            env=devices.child_env(),
        )
        os.close(messages_w)
        os.close(alive_r)
        self.conn = Connection(messages_r, writable=False)
        assert self.child.stdin is not None  # stdin=PIPE
        self.stdin = self.child.stdin
        with contextlib.suppress(BrokenPipeError):  # a child that died at start-up
            pickle.dump(sys.path, self.stdin)
            self.stdin.flush()

    def call(self, job: tuple, on_event: Callable[[Any], None] | None) -> tuple[str, Any] | None:
        """Send one call; relay its events; return its outcome (None: the child died)."""
        try:
            pickle.dump(job, self.stdin)
            self.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        while True:
            try:
                kind, payload = self.conn.recv()
            except EOFError:
                self.child.wait()
                return None
            if kind != "event":
                return kind, payload
            if on_event is not None:
                on_event(payload)

    def stop(self, kill: bool = False) -> None:
        with _Worker.lock:
            if _Worker.warm.get(self.slot) is self:
                del _Worker.warm[self.slot]
        if self.conn.closed:
            return
        if kill:
            self.child.kill()
        with contextlib.suppress(OSError):
            self.stdin.close()  # EOF: the child's loop ends
        self.child.wait()
        self.conn.close()
        with contextlib.suppress(OSError):
            os.close(self.alive_w)


def pending(store: Any, cells: list, kind: str) -> list:
    """The cells not complete yet in `store`: `kind` cells of one model, as a stage takes them."""
    cells = [c for c in cells if not store.complete(c.kind, c.key)]
    models = {c.model for c in cells}
    if len(models) > 1 or any(c.kind != kind for c in cells):
        raise ValueError(f"a stage takes {kind} cells of one model, got {sorted(models)}")
    return cells


def run_stage(
    stage: str,
    fn: Callable[..., Any],
    *args: Any,
    cells: list,
    store: Any,
    progress: bool = True,
    inprocess: bool | None = None,
) -> Any:
    """`run_in_child(fn, *args)` for one engine stage over `cells` of one model, with a progress
    bar fed by the child's events and its log in `<store>/logs/<stage>-<model>.log`. A failure
    names the cell the child was working on (the last `cell` event), or says it died starting."""
    from harness.progress import StageProgress
    from harness.store import safe_name

    model = cells[0].model
    label = f"{stage} ({model}: {', '.join(c.label for c in cells)})"
    log_path = store.root / "logs" / f"{stage}-{safe_name(model)}.log"
    with StageProgress(f"{stage} {model}", enabled=progress) as bar:
        try:
            return run_in_child(
                fn, *args, label=label, log_path=log_path, on_event=bar.update, inprocess=inprocess
            )
        except ChildFailed as e:
            where = f"cell {bar.cell}" if bar.cell else "starting the engine"
            raise ChildFailed(f"{stage} stage failed at {where}: {e}") from None


def _failure(
    label: str, log_path: Path, exitcode: int | None, outcome: tuple[str, Any] | None
) -> Exception:
    if outcome and outcome[0] == "user_error":
        return UserError(f"{label}: {outcome[1]} (log: {log_path})")
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        why = f"was killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
    else:
        why = f"failed (exit code {exitcode})"
    detail = f": {outcome[1]}" if outcome else ""
    return ChildFailed(f"{label} {why}{detail}\nlog: {log_path}\n{_tail(log_path)}")


def _tail(path: Path, lines: int = 20) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


def _child_main(messages_fd: int, alive_fd: int) -> None:
    """Entry point of the child: run the calls read from stdin, report through `messages_fd`."""
    global _emit
    import gc

    def exit_when_parent_dies() -> None:
        while os.read(alive_fd, 1):
            pass
        os._exit(70)

    threading.Thread(target=exit_when_parent_dies, daemon=True, name="watch-parent").start()
    devices.bind_to_held_cores()
    conn = Connection(messages_fd, readable=False)
    sys.path[:] = pickle.load(sys.stdin.buffer)  # so that fn's module imports as in the parent
    _emit = lambda event: conn.send(("event", event))  # noqa: E731
    while True:
        try:
            fn, args, kwargs, log_path = pickle.load(sys.stdin.buffer)
        except EOFError:
            sys.exit(0)
        with open(log_path, "ab") as log:  # this call's output, the engine's logs included
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
        try:
            outcome: tuple[str, Any] = ("result", fn(*args, **kwargs))
        except UserError as e:
            traceback.print_exc()
            outcome = ("user_error", str(e))
        except BaseException as e:
            traceback.print_exc()
            outcome = ("error", f"{type(e).__name__}: {e}")
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        gc.collect()  # the call's engine, so that the next one finds its memory free
        conn.send(outcome)
        if outcome[0] != "result":
            sys.exit(2 if outcome[0] == "user_error" else 1)
