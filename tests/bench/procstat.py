"""CPU time and memory of processes, and the machine's description, from ``/proc``.

- CPU time: ``utime + stime`` of ``/proc/<pid>/stat`` (fields 14 and 15, every thread
  of the process, in clock ticks; proc(5)).
- Memory: ``VmRSS``, ``RssAnon`` and ``RssShmem`` from ``/proc/<pid>/status``, ``Pss``
  from ``/proc/<pid>/smaps_rollup``. What the benchmark reports is anonymous memory
  (heaps, buffers: where sessions and leaks live) plus the shared-memory audio rings
  counted once. Not RSS: the gateway and the engine both map the rings, RSS counts them
  twice. Not PSS: it splits shared library pages with every other process that maps the
  same files, so on a shared machine another job starting or ending moves it by tens of
  MiB (observed: 33 MiB steps of the engine's PSS while its RSS stood still).
- Machine load: the aggregate ``cpu`` line of ``/proc/stat``.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of ``pid`` (all threads) in seconds; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rindex(b")") + 2 :].split()  # the name may contain spaces
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _kib_field(path: str, name: str) -> int | None:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(name):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


_STATUS_FIELDS = {"VmRSS": "rss", "RssAnon": "anon", "RssShmem": "shmem"}


def memory_kib(pid: int) -> dict[str, int] | None:
    """``rss``, ``anon``, ``shmem`` and ``pss`` of ``pid`` in KiB; None if it is gone."""
    found: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key = _STATUS_FIELDS.get(line.partition(":")[0])
                if key is not None:
                    found[key] = int(line.split()[1])
    except OSError:
        return None
    found["pss"] = _kib_field(f"/proc/{pid}/smaps_rollup", "Pss:") or 0
    return found if "rss" in found else None


@dataclass(frozen=True)
class MachineTimes:
    """Aggregate CPU ticks of the machine: busy and total."""

    busy: int  # user + nice + system + irq + softirq
    total: int  # busy + idle + iowait + steal
    irq: int = 0  # irq + softirq: e.g. loopback TCP work, charged to no process
    steal: int = 0  # time the hypervisor gave to other machines (a noisy neighbour)

    @classmethod
    def read(cls) -> MachineTimes:
        with open("/proc/stat") as f:
            parts = [int(x) for x in f.readline().split()[1:]] + [0] * 8
        user, nice, system, idle, iowait, irq, softirq, steal = parts[:8]
        busy = user + nice + system + irq + softirq  # guest time is already in user/nice
        return cls(busy=busy, total=busy + idle + iowait + steal, irq=irq + softirq, steal=steal)

    def busy_pct_since(self, earlier: MachineTimes) -> float | None:
        """Machine-wide busy share since ``earlier``, in percent of one core."""
        return self._pct(self.busy - earlier.busy, earlier)

    def irq_pct_since(self, earlier: MachineTimes) -> float | None:
        """Interrupt and softirq share since ``earlier``, in percent of one core."""
        return self._pct(self.irq - earlier.irq, earlier)

    def steal_pct_since(self, earlier: MachineTimes) -> float | None:
        """Hypervisor steal since ``earlier``, in percent of one core."""
        return self._pct(self.steal - earlier.steal, earlier)

    def _pct(self, ticks: int, earlier: MachineTimes) -> float | None:
        dt = self.total - earlier.total
        return None if dt <= 0 else 100.0 * (os.cpu_count() or 1) * ticks / dt


def wait_for_quiet(max_wait_s: float, threshold_pct: float = 25.0, step_s: float = 2.0) -> float:
    """Wait (at most ``max_wait_s``) until the machine's CPU use over ``step_s`` falls
    below ``threshold_pct`` of one core; returns the last measured use. On a shared
    machine this keeps other people's jobs out of a measurement where possible."""
    deadline = time.monotonic() + max_wait_s
    while True:
        before = MachineTimes.read()
        time.sleep(step_s)
        busy = MachineTimes.read().busy_pct_since(before) or 0.0
        if busy < threshold_pct or time.monotonic() >= deadline:
            return busy


def source_revision(root: str) -> str | None:
    """The measured source: ``git describe`` of ``root`` ("-dirty" with uncommitted
    changes), or ``$BENCH_REVISION`` when ``root`` is not a git checkout (a snapshot)."""
    try:
        out = subprocess.run(
            ["git", "-C", root, "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("BENCH_REVISION")
    return out.stdout.strip() or os.environ.get("BENCH_REVISION")


def machine_info() -> dict[str, object]:
    """CPU model, cores, memory, kernel and Python: the header of every report."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_kib = _kib_field("/proc/meminfo", "MemTotal:")
    return {
        "cpu_model": model,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / 1024**2, 1) if mem_kib else None,
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "hostname": platform.node(),
    }
