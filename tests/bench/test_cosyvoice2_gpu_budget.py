"""The GPU run's time budget (tests/bench/cosyvoice2_gpu.py): a capacity phase runs its
levels while the one before, scaled by the stream count, says the next ends in the
phase's share; a phase with no time left runs nothing. On a virtual clock."""

from __future__ import annotations

from typing import Any

import pytest

from tests.bench import cosyvoice2_capacity, cosyvoice2_gpu


class VirtualTime:
    """Stands for the ``time`` module: a run of n streams takes n seconds."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> VirtualTime:
    virtual = VirtualTime()
    monkeypatch.setattr(cosyvoice2_gpu, "time", virtual)

    def run(_backend: Any, n: int) -> list[Any]:
        virtual.now += n
        return []

    def summarize(path: str, n: int, _records: Any, wall_s: float) -> dict[str, Any]:
        return {"path": path, "streams": n, "wall_s": wall_s}

    monkeypatch.setattr(cosyvoice2_capacity, "run_engine", run)
    monkeypatch.setattr(cosyvoice2_capacity, "summarize", summarize)
    return virtual


def measured(budget_s: float, share: float, levels: list[int]) -> list[int]:
    rows: list[dict[str, Any]] = []
    run = cosyvoice2_gpu.Clock(budget_s)
    cosyvoice2_gpu.capacity(None, levels, "engine", "float32", run, share, "cpu", rows.append)
    return [r["streams"] for r in rows]


def test_a_phase_runs_the_levels_that_fit_its_share(clock: VirtualTime) -> None:
    # 100 s left, a share of 0.5: 50 s. Warm-up 1 s; 2 (2 s), 4 (4), 8 (8), 16 (16): 31 s;
    # 32 would take about 32 s more: not run.
    assert measured(100, 0.5, [2, 4, 8, 16, 32]) == [2, 4, 8, 16]
    assert clock.now == 1000 + 31


def test_the_whole_budget_runs_every_level(clock: VirtualTime) -> None:
    assert measured(1000, 1.0, [2, 4, 8, 16, 32]) == [2, 4, 8, 16, 32]


def test_a_phase_with_no_time_left_runs_nothing(clock: VirtualTime) -> None:
    run = cosyvoice2_gpu.Clock(10)
    clock.now += 11
    rows: list[dict[str, Any]] = []
    cosyvoice2_gpu.capacity(None, [1, 2], "engine", "float32", run, 1.0, "cpu", rows.append)
    assert rows == [] and clock.now == 1011  # not even the warm-up
