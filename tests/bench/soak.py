"""Soak analysis: does memory stay flat while calls keep talking for minutes?

The level's timeline samples the memory of the gateway and the engine every few
seconds: anonymous memory of both plus the shared audio rings once
(:mod:`tests.bench.watch`; PSS would move whenever another process maps the same
libraries).
The first ``warmup`` (a tenth of the run, at least 60 s, at most half) is left out:
allocators, caches and the rings' pages settle while every call speaks its first
prompts. Over the rest a least-squares line gives the growth rate; memory is called
flat when that line grows less than ``max(2 MiB, 1 %)`` per 10 minutes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tests.bench.stats import linear_slope

FLAT_MIB_PER_10MIN = 2.0
FLAT_FRACTION = 0.01


def parts(points: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per timeline point: each process's anonymous memory, and the shared rings (KiB)."""
    roles = sorted({role for p in points for role in p["memory_kib"]})
    out = {
        f"{role} anon": [p["memory_kib"].get(role, {}).get("anon", 0) for p in points]
        for role in roles
    }
    out["rings (shared)"] = [
        max((m.get("shmem", 0) for m in p["memory_kib"].values()), default=0) for p in points
    ]
    return out


def analyze(level: dict[str, Any]) -> dict[str, Any]:
    points = [p for p in level["timeline"] if p["memory_kib"]]
    t = np.array([p["t_s"] for p in points], dtype=float)
    mib = np.array([p["total_kib"] / 1024 for p in points], dtype=float)
    if t.size < 4:
        raise ValueError("a soak needs a longer run: fewer than 4 memory samples")
    warmup = min(max(60.0, 0.1 * float(t[-1])), 0.5 * float(t[-1]))
    keep = t >= warmup
    t_k, mib_k = t[keep], mib[keep]
    slope = linear_slope(t_k, mib_k)
    growth = None if slope is None else slope * 600.0
    edge = max(1, min(3, t_k.size // 4))
    start, end = float(mib_k[:edge].mean()), float(mib_k[-edge:].mean())
    limit = max(FLAT_MIB_PER_10MIN, FLAT_FRACTION * start)
    by_role: dict[str, float | None] = {}
    for part, series in parts(points).items():
        part_slope = linear_slope(t_k, np.asarray(series, dtype=float)[keep] / 1024)
        by_role[part] = None if part_slope is None else round(part_slope * 600.0, 3)
    return {
        "warmup_s": round(warmup, 1),
        "samples": int(t_k.size),
        "start_mib": round(start, 2),
        "end_mib": round(end, 2),
        "max_mib": round(float(mib_k.max()), 2),
        "growth_mib_per_10min": None if growth is None else round(growth, 3),
        "flat_limit_mib_per_10min": round(limit, 2),
        "flat": growth is not None and growth < limit,
        "growth_mib_per_10min_by_role": by_role,
    }
