"""Which floating-point precision this machine runs well: bf16 where it is native, fp32 elsewhere.

    python -c "from harness.precision import choose; print(choose())"
    COTGAP_PRECISION=fp32 cotgap sandbox build      # force the fp32 path (auto | bf16 | fp32)

On a CPU, bf16 autocast is faster than fp32 where the cores have bf16 instructions
(x86 `avx512_bf16` or `amx_bf16`, Arm `bf16`) and several times slower where it is emulated (AVX2
only). So "auto" reads the CPU's feature flags rather than assuming, and
every caller records the choice it made. On CUDA, "auto" is bf16 where the device supports it.
A pure leaf: the flags come from /proc/cpuinfo (or sysctl on macOS); torch is imported only for
the CUDA question, and only when it is already imported.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import subprocess
import sys
from typing import Literal

from harness.errors import UserError

Precision = Literal["bf16", "fp32"]
CHOICES = ("auto", "bf16", "fp32")
ENV = "COTGAP_PRECISION"
_X86_BF16 = {"avx512_bf16", "amx_bf16"}


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags, lower case (empty where they cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):  # x86 | Arm
                    return frozenset(value.lower().split())
    except OSError:
        pass
    if sys.platform == "darwin":
        cmd = ["sysctl", "-n", "hw.optional.arm.FEAT_BF16"]
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=5).stdout.strip()
            return frozenset({"bf16"}) if out == "1" else frozenset()
    return frozenset()


def cpu_bf16_native() -> bool:
    flags = cpu_flags()
    if platform.machine().lower() in ("aarch64", "arm64"):
        return "bf16" in flags
    return bool(flags & _X86_BF16)


def requested(value: str | None = None) -> str:
    """The asked-for precision: `value` if given, else $COTGAP_PRECISION, else "auto"."""
    asked = (value or os.environ.get(ENV) or "auto").lower()
    if asked not in CHOICES:
        raise UserError(f"{ENV}={asked!r} is not a precision; valid: {', '.join(CHOICES)}.")
    return asked


def choose(value: str | None = None, device: str = "cpu") -> Precision:
    """The precision to compute in on `device` ("cpu" or "cuda"): `value` or $COTGAP_PRECISION
    when it names one, else what the hardware runs natively."""
    asked = requested(value)
    if asked != "auto":
        return asked  # type: ignore[return-value]
    if device == "cuda":
        torch = sys.modules.get("torch")
        return "bf16" if torch is not None and torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if cpu_bf16_native() else "fp32"


def describe() -> dict[str, object]:
    """What a manifest records about the choice: the CPU's bf16 support and the request."""
    native = cpu_bf16_native()
    return {"cpu_bf16_native": native, "machine": platform.machine(), "requested": requested()}
