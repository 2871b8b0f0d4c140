"""Slots of CPU cores (harness/devices.py: core_slots) and the cut of a phase's engine groups
into runs the slots share (harness/execution/schedule.py: split_for_slots). The machine's cores
and memory are mocked (`node_cores`, `_memory_gb`): the rule is what is tested, on any machine."""

from __future__ import annotations

import pytest

from harness import devices
from harness.execution.schedule import Group, split_for_slots
from harness.workflow.cells import Cell


@pytest.fixture
def machine(monkeypatch):
    monkeypatch.delenv("COTGAP_CPU_SLOTS", raising=False)

    def set_(cores: list[int], memory_gb: float = 64.0) -> None:
        monkeypatch.setattr(devices, "node_cores", lambda: cores)  # the mock
        monkeypatch.setattr(devices, "_memory_gb", lambda: memory_gb)  # the mock

    return set_


def test_small_models_get_a_slot_a_core_and_large_ones_every_core(machine):
    machine([0, 1])
    assert devices.core_slots(all_small=True) == [(0,), (1,)]
    assert devices.core_slots(all_small=False) == [(0, 1)]
    machine([2, 3, 4, 5, 6, 7])
    assert devices.core_slots(all_small=True) == [(c,) for c in range(2, 8)]
    assert devices.core_slots(all_small=False) == [(2, 3, 4, 5, 6, 7)]
    machine([0])
    assert devices.core_slots(all_small=True) == [(0,)]


def test_memory_caps_the_slots_and_the_environment_sets_them(machine, monkeypatch):
    machine(list(range(8)), memory_gb=10.0)  # 3 GB a slot: three fit
    three = devices.core_slots(all_small=True)
    assert sum(three, ()) == tuple(range(8)) and sorted(map(len, three)) == [2, 3, 3]
    monkeypatch.setenv("COTGAP_CPU_SLOTS", "2")
    assert devices.core_slots(all_small=False) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    monkeypatch.setenv("COTGAP_CPU_SLOTS", "1")
    assert devices.core_slots(all_small=True) == [tuple(range(8))]
    monkeypatch.setenv("COTGAP_CPU_SLOTS", "32")  # never more slots than cores
    assert len(devices.core_slots(all_small=True)) == 8


def test_a_held_slot_names_its_cores_to_children_and_is_waited_for():
    slots = devices.CoreSlots([(0,), (1,)])
    assert devices.held_cores() is None and "COTGAP_CPU_CORES" not in devices.child_env({})
    with slots.hold() as a, slots.hold() as b:
        assert {a, b} == {(0,), (1,)} and slots.free == []
        env = devices.child_env({})
        assert env["COTGAP_CPU_CORES"] == env["VLLM_CPU_OMP_THREADS_BIND"] == str(b[0])
        assert env["OMP_NUM_THREADS"] == "1" and devices.held_cores() == b
    assert sorted(slots.free) == [(0,), (1,)] and devices.held_cores() is None


def _cells(model: str, n: int) -> tuple[Cell, ...]:
    return tuple(Cell(f"{model}{i}", {}, (), model, "task") for i in range(n))


def test_groups_of_two_cells_a_slot_are_cut_evenly_and_the_largest_runs_first():
    big, small, odd = _cells("s", 36), _cells("t", 2), _cells("u", 5)
    out = split_for_slots([Group("eval", small), Group("eval", big), Group("eval", odd)], 2)
    assert [len(g.cells) for g in out] == [18, 18, 3, 2, 2]  # 5 cells: 3 + 2; 2 cells: whole
    # every cell once, each run of one group, taking every other cell of it
    assert sorted(c.key for g in out for c in g.cells) == sorted(
        c.key for c in (*big, *small, *odd)
    )
    assert [c.key for c in out[0].cells] == [f"s{i}" for i in range(0, 36, 2)]
    assert [c.key for c in out[1].cells] == [f"s{i}" for i in range(1, 36, 2)]
    assert all(len({c.model for c in g.cells}) == 1 for g in out)
    assert [len(g.cells) for g in split_for_slots([Group("traces", _cells("v", 6))], 3)] == [2] * 3
    assert [len(g.cells) for g in split_for_slots([Group("traces", _cells("v", 5))], 3)] == [5]
