"""The ideal first-come-first-served model (tests/bench/queueing.py) on cases whose answer
is known exactly."""

from __future__ import annotations

import pytest

from tests.bench.queueing import CallModel, first_audio_ms, percentiles


def test_a_lone_caller_never_waits() -> None:
    latencies = first_audio_ms(CallModel(1, 1, service_s=0.05, audio_s=1.0), duration_s=60)
    assert len(latencies) > 10
    assert all(latency == pytest.approx(50.0) for latency in latencies)


def test_a_burst_goes_in_rounds_of_the_workers() -> None:
    """Six prompts at once on two workers: two each at 1, 2 and 3 service times."""
    burst = CallModel(6, 2, service_s=0.1, audio_s=1.0, burst=True)
    latencies = first_audio_ms(burst, duration_s=30)
    assert sorted(latencies) == pytest.approx([100, 100, 200, 200, 300, 300])
    assert percentiles(burst, window_s=30)["busy"] == pytest.approx(1.0)


def test_a_worker_for_every_caller_means_no_wait() -> None:
    model = CallModel(3, 3, service_s=0.05, audio_s=1.0)
    assert max(first_audio_ms(model, duration_s=30)) == pytest.approx(50.0)


def test_more_callers_wait_longer_and_keep_the_workers_busier() -> None:
    light, heavy = (
        percentiles(CallModel(n, 2, service_s=0.067, audio_s=1.0), window_s=30) for n in (10, 45)
    )
    assert light["p50_ms"] == pytest.approx(67.0, abs=1.0)
    assert heavy["p95_ms"] > light["p95_ms"] and heavy["busy"] > light["busy"]
    assert 0 < light["busy"] < heavy["busy"] < 1


def test_nonsense_is_refused() -> None:
    with pytest.raises(ValueError):
        first_audio_ms(CallModel(0, 1, service_s=0.1, audio_s=1.0), duration_s=30)


def test_the_start_up_surge_counts_as_in_the_benchmark_s_window() -> None:
    """Every call's first prompt falls in the window's first seconds: a short window's
    tail is longer than a long window's."""
    model = CallModel(45, 2, service_s=0.067, audio_s=1.0)
    short, long = (percentiles(model, window_s=w, seeds=5)["p99_ms"] for w in (10, 300))
    assert short > long
