"""The precision choice: read from the CPU's flags, forced by COTGAP_PRECISION, recorded.

.venv/bin/python -m pytest tests/unit/test_precision.py -q
"""

from __future__ import annotations

import pytest

from harness import precision
from harness.errors import UserError


@pytest.fixture
def cpu(monkeypatch):
    """Pretend to be a CPU with the given flags and architecture (the real ones are this
    machine's; the test must hold on a machine of either kind)."""

    def fake(flags: str, machine: str = "x86_64") -> None:
        monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset(flags.split()))
        monkeypatch.setattr(precision.platform, "machine", lambda: machine)

    monkeypatch.delenv(precision.ENV, raising=False)
    return fake


@pytest.mark.parametrize(
    ("flags", "machine", "expected"),
    [
        ("fpu sse avx2 fma avx512f avx512_bf16", "x86_64", "bf16"),
        ("fpu sse avx2 amx_bf16 amx_tile", "x86_64", "bf16"),
        ("fpu sse avx2 fma", "x86_64", "fp32"),  # AVX2 only: bf16 would be emulated
        ("fpu sse avx2 avx512f avx512bw", "x86_64", "fp32"),  # AVX-512 without its bf16 part
        ("fp asimd bf16 i8mm", "aarch64", "bf16"),
        ("fp asimd", "aarch64", "fp32"),
        ("", "x86_64", "fp32"),  # flags unreadable: the safe choice
    ],
)
def test_auto_follows_the_cpu_flags(cpu, flags, machine, expected):
    cpu(flags, machine)
    assert precision.choose() == expected
    assert precision.describe()["cpu_bf16_native"] is (expected == "bf16")


def test_the_environment_and_the_argument_force_a_choice(cpu, monkeypatch):
    cpu("avx2")
    monkeypatch.setenv(precision.ENV, "bf16")
    assert precision.choose() == "bf16"
    assert precision.choose("fp32") == "fp32"  # an explicit config value wins
    monkeypatch.setenv(precision.ENV, "FP32")
    cpu("avx512_bf16")
    assert precision.choose() == "fp32" and precision.describe()["requested"] == "fp32"
    monkeypatch.setenv(precision.ENV, "half")
    with pytest.raises(UserError, match="COTGAP_PRECISION='half'.*auto, bf16, fp32"):
        precision.choose()


def test_this_machines_flags_are_read():
    # /proc/cpuinfo exists on every Linux machine this suite runs on
    assert "fpu" in precision.cpu_flags() or "fp" in precision.cpu_flags()
