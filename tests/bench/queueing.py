"""What first-come-first-served model workers allow: the first-audio latency an ideal
engine would give the load generator's calls, to hold a measured figure against.

The calls behave as the load generator's (:mod:`tests.bench.script`): each of
``callers`` waits ``uniform(0, think_max)``, then speaks a prompt, hears it (its audio
lasts ``audio_s`` once it starts), thinks ``uniform(think_min, think_max)`` and speaks the
next; with ``burst`` every call speaks one prompt at time 0. A prompt is one job of
``service_s`` on the first of ``workers`` free workers, in order of arrival, each job run
to its end. First audio is the wait plus the service. Ideal: nothing else (gateway,
transport, load generator) takes time or cores. If the engine measures close to this,
the rest of the gap to a latency goal is the machine's speed, not the scheduling.

The window is the benchmark's (its first seconds hold every call's first prompt, a
start-up surge that a longer window would dilute); percentiles pool :data:`SEEDS` runs.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass
from typing import Final

import numpy as np

SEEDS: Final = 20  # simulated windows pooled, for the percentiles to settle


@dataclass(frozen=True)
class CallModel:
    callers: int
    workers: int
    service_s: float  # a worker's time for one prompt
    audio_s: float  # one prompt's audio
    think_min_s: float = 0.5
    think_max_s: float = 2.0
    burst: bool = False


def first_audio_ms(model: CallModel, *, duration_s: float, seed: int = 1) -> list[float]:
    """Every prompt's first-audio latency (ms) of the prompts spoken in ``duration_s`` of
    simulated calls (a prompt spoken before the end is waited for, as in the load
    generator)."""
    if model.callers < 1 or model.workers < 1 or model.service_s <= 0:
        raise ValueError("callers, workers and service time must be positive")
    rng = random.Random(seed)
    speaks = [
        (0.0 if model.burst else rng.uniform(0.0, model.think_max_s), caller)
        for caller in range(model.callers)
    ]
    heapq.heapify(speaks)
    free_at = [0.0] * model.workers  # a heap: when each worker is next free
    latencies: list[float] = []
    while speaks:
        spoke_at, caller = heapq.heappop(speaks)
        start = max(spoke_at, heapq.heappop(free_at))
        done = start + model.service_s
        heapq.heappush(free_at, done)
        latencies.append((done - spoke_at) * 1000)
        if model.burst:
            continue
        nxt = done + model.audio_s + rng.uniform(model.think_min_s, model.think_max_s)
        if nxt < duration_s:
            heapq.heappush(speaks, (nxt, caller))
    return latencies


def percentiles(model: CallModel, *, window_s: float, seeds: int = SEEDS) -> dict[str, float]:
    """First audio p50, p95 and p99 (ms) over ``seeds`` windows of ``window_s``, and the
    workers' busy fraction in them."""
    runs = [first_audio_ms(model, duration_s=window_s, seed=seed) for seed in range(seeds)]
    latencies = np.array([latency for run in runs for latency in run])
    span = window_s if not model.burst else float(latencies.max()) / 1000
    busy = len(latencies) * model.service_s / (model.workers * span * seeds)
    p50, p95, p99 = np.percentile(latencies, [50, 95, 99])
    return {
        "p50_ms": round(float(p50), 1),
        "p95_ms": round(float(p95), 1),
        "p99_ms": round(float(p99), 1),
        "busy": round(busy, 3),
    }
