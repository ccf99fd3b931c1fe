"""The admission gate counts synthesis only: first audio from the speech cache is not a
measure of the engine's synthesis latency or pace (issue 27, item 5)."""

from __future__ import annotations

import pytest

from gateway.admission import AdmissionSettings
from gateway.admission_gate import AdmissionGate, Ticket, UtteranceAdmission
from gateway.likely_hits import SHARED, LikelyHits, likely_hit_key
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


def _degraded_with_a_queue(clock: Clock) -> tuple[AdmissionGate, UtteranceAdmission]:
    """A gate whose synthesis is slow (2 s median) with one utterance in flight and one
    waiting: the concurrency limit is reached."""
    gate = AdmissionGate(AdmissionSettings(min_samples=5), GatewayMetrics(), clock=clock)
    admission = _session(gate)
    for seq in range(5):
        _speak(admission, clock, seq, 2.0, "miss")
    assert gate.controller.degraded
    admission.admit(100, "busy")
    admission.admit(101, "waiting")
    assert admission.holding(101)
    return gate, admission


def test_a_likely_hit_skips_the_queue_and_a_miss_forgets_it() -> None:
    clock = Clock()
    gate, admission = _degraded_with_a_queue(clock)
    greeting = (likely_hit_key("acme", "en-us-joe", 1.0, None, "Thank you for calling Acme Bank."),)
    admission.admit(200, "greeting-1", greeting)
    assert admission.holding(200)  # nothing known yet: it waits like the others
    gate.first_audio(gate_ticket(admission, 200), "hit")  # (released later, served: a hit)
    admission.admit(201, "greeting-2", greeting)
    assert not admission.holding(201)  # the engine served it from its cache last time
    assert admission.holding(101)  # what waited still waits (it is synthesis)
    admission.first_audio(201, "miss")  # evicted since: synthesized
    admission.admit(202, "greeting-3", greeting)
    assert admission.holding(202)
    other = (likely_hit_key("acme", "en-us-joe", 1.25, None, "Thank you for calling Acme Bank."),)
    admission.admit(203, "faster", other)
    assert admission.holding(203)  # another speed is another recording


def test_another_tenants_hit_is_no_likely_hit_but_a_shared_prompt_is() -> None:
    """The engine's cache is scoped by tenant: a hit of tenant A says nothing of tenant
    B's utterance of the same text (it waits like any synthesis); a prompt the operator
    declared (warmed as shared) is a likely hit for every tenant."""
    clock = Clock()
    gate, admission = _degraded_with_a_queue(clock)
    text = "Thank you for calling Acme Bank."

    def keys(tenant: str) -> tuple[str, ...]:
        return tuple(likely_hit_key(t, "en-us-joe", 1.0, None, text) for t in (tenant, SHARED))

    admission.admit(300, "a-1", keys("a"))
    gate.first_audio(gate_ticket(admission, 300), "hit")
    admission.admit(301, "a-2", keys("a"))
    assert not admission.holding(301)
    admission.admit(302, "b-1", keys("b"))
    assert admission.holding(302)  # another tenant's hit: no guess for this one
    gate.likely_hits.remember(likely_hit_key(SHARED, "en-us-joe", 1.0, None, "Welcome."))
    shared = tuple(likely_hit_key(t, "en-us-joe", 1.0, None, "Welcome.") for t in ("b", SHARED))
    admission.admit(303, "b-2", shared)
    assert not admission.holding(303)


def test_likely_hits_are_bounded_and_age() -> None:
    clock = Clock()
    hits = LikelyHits(capacity=2, ttl_s=60.0, clock=clock)
    for key in ("a", "b", "c"):
        hits.observe((key,), "hit")
    assert len(hits) == 2 and not hits.likely("a") and hits.likely("b") and hits.likely("c")
    clock.now += 61
    assert not hits.likely("b")
    hits.observe(("c",), "")  # an engine without a cache says nothing: forgotten
    assert not hits.likely("c") and len(hits) == 0
    with pytest.raises(ValueError):
        LikelyHits(capacity=0)


def gate_ticket(admission: UtteranceAdmission, seq: int) -> Ticket:
    return admission._tickets[seq]
