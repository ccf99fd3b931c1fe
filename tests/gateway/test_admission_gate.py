"""The admission gate counts synthesis only: first audio from the speech cache is not a
measure of the engine's synthesis latency or pace (issue 27, item 5)."""

from __future__ import annotations

import pytest

from gateway.admission import AdmissionSettings
from gateway.admission_gate import AdmissionGate, UtteranceAdmission
from gateway.metrics import GatewayMetrics


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _session(gate: AdmissionGate) -> UtteranceAdmission:
    return UtteranceAdmission(gate, send=lambda *_: None, expired=lambda *_: None)


def _speak(
    admission: UtteranceAdmission, clock: Clock, seq: int, latency_s: float, cache: str
) -> None:
    admission.admit(seq, f"u{seq}")
    clock.now += latency_s
    admission.first_audio(seq, cache)
    admission.close(seq)


def test_hits_feed_neither_the_median_nor_the_pace() -> None:
    clock = Clock()
    gate = AdmissionGate(AdmissionSettings(min_samples=5), GatewayMetrics(), clock=clock)
    admission = _session(gate)
    for seq in range(5):  # synthesis at 2 s: degraded
        _speak(admission, clock, seq, 2.0, "miss")
    assert gate.controller.degraded
    assert gate.controller.median_latency == 2.0
    for seq in range(5, 105):  # a hundred cached greetings in 5 ms each
        _speak(admission, clock, seq, 0.005, "hit")
    assert gate.controller.median_latency == 2.0  # synthesis is as slow as it was
    assert gate.controller.degraded


def test_misses_and_an_engine_without_a_cache_are_counted() -> None:
    clock = Clock()
    gate = AdmissionGate(AdmissionSettings(min_samples=5), GatewayMetrics(), clock=clock)
    admission = _session(gate)
    for seq in range(3):
        _speak(admission, clock, seq, 2.0, "miss")
    for seq in range(3, 6):
        _speak(admission, clock, seq, 2.0, "")  # the cache is off
    assert gate.controller.median_latency == 2.0
    assert gate.controller.degraded
    for seq in range(6, 20):
        _speak(admission, clock, seq, 0.1, "miss")
    assert gate.controller.median_latency == pytest.approx(0.1)
    assert not gate.controller.degraded


def test_a_hit_still_frees_its_place_in_flight() -> None:
    clock = Clock()
    gate = AdmissionGate(AdmissionSettings(min_samples=1), GatewayMetrics(), clock=clock)
    admission = _session(gate)
    admission.admit(1, "u1")
    assert gate.controller.in_flight == 1
    admission.first_audio(1, "hit")
    assert gate.controller.in_flight == 0
