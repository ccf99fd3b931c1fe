"""Watching the server's processes during a run: CPU shares and memory over time.

Memory is summarized as "anon + rings" (:func:`total_kib`): the anonymous memory of
every watched process plus the largest shared-memory footprint among them, i.e. the
gateway/engine audio rings counted once (see :mod:`tests.bench.procstat`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tests.bench import procstat

Memory = dict[str, dict[str, int]]  # role -> rss/anon/shmem/pss in KiB


def total_kib(memory: Memory) -> int:
    """Anonymous memory of every role plus the shared rings once."""
    anon = sum(m.get("anon", 0) for m in memory.values())
    return anon + max((m.get("shmem", 0) for m in memory.values()), default=0)


@dataclass(frozen=True)
class Snapshot:
    """CPU seconds and memory of every watched role, and the machine's CPU ticks."""

    t: float
    cpu_s: dict[str, float]
    memory: Memory
    machine: procstat.MachineTimes
    self_cpu_s: float

    def total_kib(self) -> int:
        return total_kib(self.memory)


@dataclass
class ProcessWatch:
    """Samples ``pids`` (role -> pid: CPU and memory) and ``cpu_pids`` (CPU only, e.g.
    the load generator's workers); processes that are gone simply drop out."""

    pids: dict[str, int]
    cpu_pids: dict[str, int] = field(default_factory=dict)
    timeline: list[dict[str, Any]] = field(default_factory=list)
    _last: Snapshot | None = None

    def snapshot(self) -> Snapshot:
        cpu: dict[str, float] = {}
        memory: Memory = {}
        for role, pid in self.pids.items():
            c = procstat.cpu_seconds(pid)
            m = procstat.memory_kib(pid)
            if c is not None:
                cpu[role] = c
            if m is not None:
                memory[role] = m
        for role, pid in self.cpu_pids.items():
            c = procstat.cpu_seconds(pid)
            if c is not None:
                cpu[role] = c
        return Snapshot(
            time.monotonic(), cpu, memory, procstat.MachineTimes.read(), time.process_time()
        )

    def sample(self, t0: float) -> dict[str, Any]:
        """Append one timeline point (CPU shares since the previous sample)."""
        now = self.snapshot()
        point: dict[str, Any] = {
            "t_s": round(now.t - t0, 2),
            "memory_kib": now.memory,
            "total_kib": now.total_kib(),
        }
        if self._last is not None:
            point["cpu_pct"] = cpu_pct(self._last, now)
            point["machine_cpu_pct"] = _round(now.machine.busy_pct_since(self._last.machine))
        self._last = now
        self.timeline.append(point)
        return point


def cpu_pct(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """CPU use of each role between two snapshots, in percent of one core."""
    wall = after.t - before.t
    if wall <= 0:
        return {}
    return {
        role: round(100.0 * (after.cpu_s[role] - before.cpu_s[role]) / wall, 1)
        for role in after.cpu_s
        if role in before.cpu_s
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
