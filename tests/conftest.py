"""Shared test set-up: offline, CPU vLLM settings, the real benchmark files in ../shared/data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Set before anything imports transformers / vllm: offline hub, in-process vLLM on both cores.
for _k, _v in {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_OMP_THREADS_BIND": "0-1",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # Read once, when torch is first imported: without it, OpenMP threads spin and 2-thread CPU
    # training runs 10-100x slower whenever another process is busy on this 2-core machine.
    "OMP_WAIT_POLICY": "PASSIVE",
    # one engine group at a time on every core, whatever this machine's cores: the tests that
    # run groups in slots of cores (tests/test_gpu_allocator.py) ask for them
    "COTGAP_CPU_SLOTS": "1",
}.items():
    os.environ.setdefault(_k, _v)

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("COTGAP_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"benchmark files not found at {SHARED_DATA}")
    return SHARED_DATA


def lost_groups(items: list[pytest.Item]) -> list[str]:
    """The xdist_group tests whose node id lacks the `@group` suffix pytest-xdist's loadgroup
    scheduler groups by (a parametrized id may hold an '@' of its own, before its ']')."""
    return [
        i.nodeid
        for i in items
        if i.get_closest_marker("xdist_group") and i.nodeid.rfind("@") <= i.nodeid.rfind("]")
    ]


_LOST = pytest.StashKey[str]()


@pytest.hookimpl(trylast=True)  # after pytest-xdist's own hook has added the suffixes
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `--dist loadgroup` (a worker's config.option.loadgroup), a grouped test whose group
    was lost fails before its fixtures are set up: each worker would build the shared grid."""
    lost = set(lost_groups(items)) if getattr(config.option, "loadgroup", False) else set()
    for item in items:
        if item.nodeid in lost:
            item.stash[_LOST] = (
                f"--dist loadgroup: {len(lost)} test(s) marked xdist_group lost their group, so "
                "every worker would build their shared fixture: this pytest-xdist cannot tag the "
                "node ids of this pytest (pytest-dev/pytest-xdist#1386). Install the versions "
                "pyproject.toml's dev extra allows (make install), or run with -n 0."
            )


@pytest.hookimpl(tryfirst=True)  # before pytest's own set-up builds the fixtures
def pytest_runtest_setup(item: pytest.Item) -> None:
    if _LOST in item.stash:
        pytest.fail(item.stash[_LOST], pytrace=False)
