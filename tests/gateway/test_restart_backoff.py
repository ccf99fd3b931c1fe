"""Tests for gateway.restart_backoff: the wait before restarting a process."""

from __future__ import annotations

from gateway.restart_backoff import RestartBackoff


def test_the_wait_doubles_while_runs_keep_failing_up_to_the_cap():
    backoff = RestartBackoff(initial_s=0.2, max_s=1.0, stable_after_s=30.0)
    assert [backoff.after_exit(0.5) for _ in range(5)] == [0.2, 0.4, 0.8, 1.0, 1.0]


def test_a_long_healthy_run_starts_the_wait_over():
    backoff = RestartBackoff(initial_s=0.2, max_s=5.0, stable_after_s=30.0)
    for _ in range(4):
        backoff.after_exit(1.0)
    assert backoff.after_exit(31.0) == 0.2
    assert backoff.after_exit(1.0) == 0.4
    assert backoff.after_exit(30.0) == 0.8  # not longer than stable_after_s: no reset
