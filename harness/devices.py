"""The GPUs of this node and who holds them: the local executor gives each engine group or
training worker the GPUs its model's `resources.gpus` asks for, so independent groups run at once
on one node without two sharing a GPU. A group's children see only their GPUs
(CUDA_VISIBLE_DEVICES), set from the thread that runs the group.

    COTGAP_GPUS=0,1,2,3 cotgap run configs/paper-study.yaml     # which GPUs cotgap may use

On a machine without GPUs the same holds for CPU cores, in slots: where every model is small
(one engine step is mostly per-step Python overhead, which one core runs as fast as several:
measured in `core_slots`), the engine groups of a phase run at once, one core each, each in
its own warm child bound to its core (COTGAP_CPU_CORES in its environment).

    COTGAP_CPU_SLOTS=1 cotgap run configs/sandbox.yaml           # one engine group at a time
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator

_HELD: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar(
    "cotgap_gpus", default=None
)
_CORES: contextvars.ContextVar[tuple[int, ...] | None] = contextvars.ContextVar(
    "cotgap_cores", default=None
)
CORES_ENV = "COTGAP_CPU_CORES"  # a child's cores: it binds itself to them first thing


def node_gpus() -> list[str]:
    """The GPUs cotgap may use here: $COTGAP_GPUS, else $CUDA_VISIBLE_DEVICES, else every GPU
    `nvidia-smi -L` lists; none on a machine without NVIDIA GPUs (torch is not imported)."""
    for name in ("COTGAP_GPUS", "CUDA_VISIBLE_DEVICES"):
        value = os.environ.get(name)
        if value is not None:
            return [g.strip() for g in value.split(",") if g.strip() and g.strip() != "-1"]
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's environment) for a child of the group this thread runs:
    CUDA_VISIBLE_DEVICES names the GPUs the group holds, when it holds some."""
    out = dict(os.environ if env is None else env)
    held = _HELD.get()
    if held is not None:
        out["CUDA_VISIBLE_DEVICES"] = ",".join(held)
    cores = _CORES.get()
    if cores is not None:  # the slot's cores: threads of torch, OpenMP and vLLM's CPU backend
        names = ",".join(str(c) for c in cores)
        out[CORES_ENV] = names
        out["OMP_NUM_THREADS"] = str(len(cores))
        out["VLLM_CPU_OMP_THREADS_BIND"] = names
    return out


def bind_to_held_cores() -> None:
    """In a child: run on the cores its parent's slot holds ($COTGAP_CPU_CORES), if any."""
    names = os.environ.get(CORES_ENV)
    if names and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(c) for c in names.split(",")})


def holding() -> bool:
    """Whether this thread runs a group that holds GPUs of the allocator."""
    return _HELD.get() is not None


def usable() -> list[str]:
    """The GPUs this thread's group may use: those it holds, else the node's."""
    held = _HELD.get()
    return list(held) if held is not None else node_gpus()


def one_each(n: int, gpus: list[str]) -> list[dict[str, str]]:
    """Environment additions for n workers that share `gpus`: one GPU each, round robin (none
    when there are no GPUs)."""
    return [{"CUDA_VISIBLE_DEVICES": gpus[i % len(gpus)]} if gpus else {} for i in range(n)]


def replicas(n: int, per: int) -> list[tuple[str, ...]]:
    """The GPUs of each of up to n engine replicas of `per` GPUs (tensor x pipeline parallel),
    cut from those this thread's group may use: as many replicas as fit, at least one; n replicas
    with none on a machine without GPUs (they share its CPU)."""
    gpus = usable()
    if not gpus:
        return [()] * n
    fit = max(1, min(n, len(gpus) // per))
    return [tuple(gpus[i * per : (i + 1) * per]) for i in range(fit)]


@contextlib.contextmanager
def visible(gpus: tuple[str, ...]) -> Iterator[None]:
    """Children started from this thread meanwhile see only `gpus` (a replica's share of what
    the group holds; none: no GPU) and get a child process of their own."""
    token = _HELD.set(tuple(gpus))
    try:
        yield
    finally:
        _HELD.reset(token)


def inprocess() -> bool:
    """COTGAP_INPROCESS=1: engine work runs in the calling process (debuggers, tests), so one
    group at a time (harness/engines: inprocess_default)."""
    return os.environ.get("COTGAP_INPROCESS", "0").lower() in ("1", "true", "yes")


def held_cores() -> tuple[int, ...] | None:
    """The CPU cores this thread's group holds (a slot), or None."""
    return _CORES.get()


def node_cores() -> list[int]:
    """The CPU cores this process may run on (its affinity, where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


SLOT_MEMORY_GB = 3.0  # an engine child with a small model: vLLM's 1 GiB CPU KV cache and runtime


def core_slots(all_small: bool) -> list[tuple[int, ...]]:
    """How a machine without GPUs runs its engine groups: as slots of cores, one group a slot.

    Where every model is small (`all_small`: models.sources.SMALL_MODEL), one slot per core, as
    many as memory holds (SLOT_MEMORY_GB each): vLLM's CPU engine on such a model runs as fast on
    one core as on two (the sandbox demo's 72 distilled evals: 97.7 s on one core, 100.2 s on two
    cores, one engine at a time; benchmarks/README.md), so two slots do twice the work. Else one
    slot of every core. COTGAP_CPU_SLOTS=N sets N slots (1: every engine group on every core).
    The choice depends on the machine and the grid's models only, never on what is left to run,
    so that a resumed cell runs on as many cores as an uninterrupted one would."""
    cores = node_cores()
    env = os.environ.get("COTGAP_CPU_SLOTS", "")
    if env.isdigit() and int(env) > 0:
        n = int(env)
    elif not all_small:
        n = 1
    else:
        n = max(1, min(len(cores), int(_memory_gb() // SLOT_MEMORY_GB)))
    n = min(n, len(cores))
    cut = [round(i * len(cores) / n) for i in range(n + 1)]  # contiguous, as even as they divide
    return [tuple(cores[cut[i] : cut[i + 1]]) for i in range(n)]


def _memory_gb() -> float:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    except (ValueError, OSError, AttributeError):
        return SLOT_MEMORY_GB  # unknown: one slot


class _Pool:
    """Things handed out to the threads that run groups: `_hold(n)` waits until n are free,
    takes the first n and sets `var` (if any) to them in the holding thread meanwhile."""

    def __init__(self, things: list, var: contextvars.ContextVar | None = None) -> None:
        self.free, self.var = list(things), var
        self.cond = threading.Condition()

    @contextlib.contextmanager
    def _hold(self, n: int) -> Iterator[tuple]:
        with self.cond:
            self.cond.wait_for(lambda: len(self.free) >= n)
            taken, self.free = tuple(self.free[:n]), self.free[n:]
        token = self.var.set(taken) if self.var is not None else None
        try:
            yield taken
        finally:
            if self.var is not None and token is not None:
                self.var.reset(token)
            with self.cond:
                self.free.extend(taken)
                self.cond.notify_all()


class CoreSlots(_Pool):
    """Hands out slots of cores: `hold()` waits until one is free and takes it; children started
    from the holding thread run on its cores (`child_env`)."""

    def __init__(self, slots: list[tuple[int, ...]]) -> None:
        super().__init__(slots)

    @contextlib.contextmanager
    def hold(self) -> Iterator[tuple[int, ...]]:
        with self._hold(1) as (slot,):
            token = _CORES.set(slot)
            try:
                yield slot
            finally:
                _CORES.reset(token)


class Allocator(_Pool):
    """Hands out the node's GPUs: `hold(n)` waits until n are free and takes them."""

    def __init__(self, gpus: list[str]) -> None:
        super().__init__(gpus, _HELD)
        self.size = len(gpus)

    def want(self, gpus: float) -> int:
        """Whole GPUs a group asking for `gpus` takes: at least one when it asks for any, at most
        the node's (a larger ask runs on all of them rather than never)."""
        return min(self.size, math.ceil(gpus)) if gpus > 0 else 0

    def hold(self, gpus: float) -> contextlib.AbstractContextManager[tuple[str, ...]]:
        return self._hold(self.want(gpus))
