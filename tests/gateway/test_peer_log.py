"""Per-peer log rate limiting (gateway/peer_log.py)."""

from __future__ import annotations

import logging

import pytest

from gateway.peer_log import PeerLog


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_passes_then_lines_are_suppressed_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    log = PeerLog(logging.getLogger("peer-test"), "native s1", burst=3, interval_s=3.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="peer-test"):
        for i in range(1000):
            log.info("bad message %d", i)
        assert [r.getMessage() for r in caplog.records] == [
            "native s1: bad message 0",
            "native s1: bad message 1",
            "native s1: bad message 2",
        ]
        assert log.suppressed == 997
        clock.now = 1.0  # one token back (3 per 3 s)
        log.info("later")
    assert caplog.records[-1].getMessage() == (
        "native s1: later (997 earlier line(s) about this peer suppressed)"
    )
    assert log.suppressed == 0


def test_disabled_levels_cost_no_tokens(caplog: pytest.LogCaptureFixture) -> None:
    log = PeerLog(logging.getLogger("peer-test-2"), "p", burst=1, clock=Clock())
    with caplog.at_level(logging.WARNING, logger="peer-test-2"):
        for _ in range(5):
            log.info("ignored")
        log.warning("kept")
    assert [r.getMessage() for r in caplog.records] == ["p: kept"]
