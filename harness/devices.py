"""The GPUs of this node and who holds them: the local executor gives each engine group or
training worker the GPUs its model's `resources.gpus` asks for, so independent groups run at once
on one node without two sharing a GPU. A group's children see only their GPUs
(CUDA_VISIBLE_DEVICES), set from the thread that runs the group.

    COTGAP_GPUS=0,1,2,3 cotgap run configs/paper-study.yaml     # which GPUs cotgap may use
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
    return out


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


class Allocator:
    """Hands out the node's GPUs: `acquire(n)` waits until n are free and takes them."""

    def __init__(self, gpus: list[str]) -> None:
        self.free = list(gpus)
        self.size = len(gpus)
        self.cond = threading.Condition()

    def want(self, gpus: float) -> int:
        """Whole GPUs a group asking for `gpus` takes: at least one when it asks for any, at most
        the node's (a larger ask runs on all of them rather than never)."""
        return min(self.size, math.ceil(gpus)) if gpus > 0 else 0

    @contextlib.contextmanager
    def hold(self, gpus: float) -> Iterator[tuple[str, ...]]:
        n = self.want(gpus)
        with self.cond:
            self.cond.wait_for(lambda: len(self.free) >= n)
            taken, self.free = tuple(self.free[:n]), self.free[n:]
        token = _HELD.set(taken)
        try:
            yield taken
        finally:
            _HELD.reset(token)
            with self.cond:
                self.free.extend(taken)
                self.cond.notify_all()
