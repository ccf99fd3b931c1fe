"""A lane's pace as a fitted line (engine/scheduler/pace.py), kept per kind of call
(alone, or beside others: engine/scheduler/policy.py's observe_pace), and a batch that
began alone estimated again once another begins beside it (Lane.begin)."""

from __future__ import annotations

import pytest

from engine.backends.synthetic import SyntheticBackend
from engine.scheduler import policy
from engine.scheduler.pace import PaceFit
from engine.scheduler.state import Lane
from tests.engine.scheduler.test_policy import make_lane, make_stream


def test_a_fixed_cost_per_call_is_found_once_the_lengths_spread() -> None:
    fit = PaceFit()
    assert fit.line() == (0.0, 0.0)  # nothing seen
    fit.observe(10, 1.4)
    fit.observe(10, 1.4)
    # One length only: no fixed cost can be told from it; seconds per character.
    assert fit.line() == pytest.approx((0.0, 0.14))
    for chars in (4, 20, 8, 12, 22, 4, 16):  # 0.4 s a call plus 0.1 s a character
        fit.observe(chars, 0.4 + 0.1 * chars)
    per_call, per_char = fit.line()
    assert per_call == pytest.approx(0.4, abs=0.02)
    assert per_char == pytest.approx(0.1, abs=0.002)
    # What pricing by seconds per character alone gets wrong: a 4-character call.
    assert 0.4 + 0.1 * 4 > 1.5 * (4 * (0.4 + 0.1 * 13) / 13)


def test_a_line_that_would_cost_less_than_nothing_falls_back_to_seconds_per_char() -> None:
    fit = PaceFit()
    for chars, seconds in ((4, 0.1), (20, 2.5), (8, 0.5), (16, 2.0)):  # negative intercept
        fit.observe(chars, seconds)
    per_call, per_char = fit.line()
    assert per_call == 0.0
    assert per_char == pytest.approx(fit.mean_y / fit.mean_x)
    shrinking = PaceFit()
    for chars, seconds in ((4, 2.0), (20, 1.0), (8, 1.8), (16, 1.2)):  # longer is cheaper
        shrinking.observe(chars, seconds)
    assert shrinking.line()[0] == 0.0


def test_the_newest_calls_weigh_most() -> None:
    fit = PaceFit()
    for _ in range(5):
        fit.observe(10, 1.0)
    for _ in range(40):  # the machine got twice as slow
        fit.observe(10, 2.0)
    assert fit.line()[1] == pytest.approx(0.2, rel=0.01)
    fit.observe(0, 5.0)  # an empty call says nothing
    fit.observe(10, -1.0)
    assert fit.line()[1] == pytest.approx(0.2, rel=0.01)


def test_lone_calls_price_lone_calls_and_never_the_shared_pace_once_known() -> None:
    lane = make_lane(gated=True, threads=2, max_batch=1)
    # Only lone calls so far (an idle machine): they are the lane's pace.
    policy.observe_pace(lane, 0.5, 10, alone=True)
    assert lane.seconds_per_char == pytest.approx(0.05)
    assert lane.call_seconds(10) == lane.call_seconds(10, alone=True) == pytest.approx(0.5)
    # A call beside another: the shared pace is the lane's from now on; lone calls keep
    # their own, for calls that begin alone.
    policy.observe_pace(lane, 1.2, 10)
    assert lane.seconds_per_char == pytest.approx(0.12)
    policy.observe_pace(lane, 0.4, 10, alone=True)
    assert lane.seconds_per_char == pytest.approx(0.12)
    assert lane.call_seconds(10, alone=True) == pytest.approx(0.49)  # 0.5 + 0.1 (0.4 - 0.5)


def test_a_batch_that_began_alone_is_expected_later_once_another_begins_beside_it() -> None:
    lane = make_lane(gated=True, threads=2, max_batch=1)
    policy.observe_pace(lane, 0.5, 10, alone=True)  # alone: 0.05 s a character
    policy.observe_pace(lane, 1.0, 10)  # beside another: 0.1
    first = make_stream(lane, 0, ["x" * 10])
    rules = policy.Policy(cost_factor=1.25)
    rules.mark_busy(lane, first, now=0.0, alone=True)
    assert first.busy_until == pytest.approx(0.625)  # at the lone pace
    lane.begin(1, first.busy_until, 10, 0.0, 1.25, streams=[first])
    assert lane.in_flight == 1
    second = make_stream(lane, 1, ["y" * 10])
    rules.mark_busy(lane, second, now=0.2)
    assert second.busy_until == pytest.approx(0.2 + 1.25)
    lane.begin(2, second.busy_until, 10, 0.2, 1.25, streams=[second])
    # The first shares the cores from 0.2 s on: expected when the shared pace says.
    assert lane.running[1].overlapped and lane.running[1].end == pytest.approx(1.25)
    assert first.busy_until == pytest.approx(1.25)
    assert not lane.running[2].overlapped and lane.in_flight == 2
    done = lane.finish(1)
    assert done is not None and done.alone and done.overlapped and lane.in_flight == 1
    assert lane.finish(99) is None  # (a batch the lane never listed: nothing to return)


def test_the_lane_s_own_constructor_knows_no_pace() -> None:
    backend = SyntheticBackend()
    lane = Lane(backend, None)
    assert lane.call_seconds(10) == 0.0 and lane.call_seconds(10, alone=True) == 0.0


def test_a_lone_call_gets_every_worker_only_when_nothing_else_of_the_lane_waits() -> None:
    lane = make_lane(gated=True, threads=2, max_batch=1)
    first = make_stream(lane, 0, ["x" * 10])
    assert not lane.runs_alone([first])  # the backend gives lone calls no more cores
    lane.lone_calls = True
    assert lane.runs_alone([first])
    second = make_stream(lane, 1, ["y" * 10])
    assert not lane.runs_alone([first])  # another stream has a segment to do
    second.utterances[0].segments.clear()
    second.busy = True
    assert not lane.runs_alone([first])  # ... or one in flight
    second.busy = False
    assert lane.runs_alone([first])
    lane.begin(1, 0.8, 10, 0.0, 1.25, streams=[first], lone=True)
    # It holds both workers: nothing else starts beside it, and the replay sees both busy.
    assert lane.in_flight == lane.threads == 2 and lane.running[1].workers == 2
    assert not lane.runs_alone([second])
    assert policy.Policy._workers(lane, (), now=0.3) == pytest.approx([0.5, 0.5])
    assert lane.finish(1) is not None and lane.in_flight == 0
    one_thread = make_lane(gated=True, threads=1, max_batch=1)
    one_thread.lone_calls = True
    assert not one_thread.runs_alone([make_stream(one_thread, 0, ["z"])])


def test_a_lone_call_that_narrows_frees_a_worker_and_is_expected_at_the_shared_pace() -> None:
    """A lone batch whose backend goes on with one core once its first audio is out
    (SynthesisJob.narrowed): the lane's other worker is free for a newcomer, and the
    batch and its stream are expected done at the shared pace from when it began."""
    lane = make_lane(gated=True, threads=2, max_batch=1)
    lane.lone_calls = True
    policy.observe_pace(lane, 0.5, 10, alone=True)  # alone: 0.05 s a character
    policy.observe_pace(lane, 1.0, 10)  # beside another: 0.1
    first = make_stream(lane, 0, ["x" * 10])
    rules = policy.Policy(cost_factor=1.25)
    rules.mark_busy(lane, first, now=0.0, alone=True)
    lane.begin(1, first.busy_until, 10, 0.0, 1.25, streams=[first], lone=True)
    assert lane.in_flight == 2
    assert policy.Policy._workers(lane, (), 0.3) == pytest.approx([0.325, 0.325])
    lane.narrow(1, 1.25)
    assert lane.in_flight == 1 and lane.running[1].workers == 1 and lane.running[1].narrowed
    assert lane.running[1].end == pytest.approx(1.25) and first.busy_until == pytest.approx(1.25)
    assert policy.Policy._workers(lane, (), now=0.3) == pytest.approx([0.95, 0.0])
    lane.narrow(1, 1.25)  # (said twice, or of a batch the lane no longer runs: nothing)
    lane.narrow(99, 1.25)
    assert lane.in_flight == 1
    second = make_stream(lane, 1, ["y" * 10])
    assert not lane.runs_alone([second])  # the newcomer shares the cores
    lane.begin(2, 1.55, 10, 0.3, 1.25, streams=[second])
    assert lane.in_flight == 2 and lane.running[1].end == pytest.approx(1.25)
    # Its time says nothing of either pace (both cores, then one); the newcomer's does.
    fits = (lane.fit.calls, lane.alone_fit.calls)
    policy.observe_batch(lane, lane.finish(1), 0.9, 10)
    assert (lane.fit.calls, lane.alone_fit.calls) == fits
    policy.observe_batch(lane, lane.finish(2), 1.1, 10)
    assert (lane.fit.calls, lane.alone_fit.calls) == (fits[0] + 1, fits[1])
    assert lane.in_flight == 0


def test_no_call_is_priced_below_the_fastest_one_seen() -> None:
    """Through the origin (the fit's fallback) a short segment is priced at a fraction of
    what it takes: the fastest call seen is a floor (a Kokoro segment of three Mandarin
    characters took 0.98 s on a slow CPU, priced at 0.53 s, and came late)."""
    fit = PaceFit()
    assert fit.fastest == 0.0
    for chars, seconds in ((12, 2.0), (14, 2.3), (12, 2.1)):  # one length: the fallback
        fit.observe(chars, seconds)
    assert fit.line()[0] == 0.0 and fit.fastest == 2.0
    fit.observe(3, 0.98)
    assert fit.fastest == 0.98
    lane = make_lane(gated=True, threads=2, max_batch=1)
    for chars, seconds in ((12, 2.0), (14, 2.3), (12, 2.1)):
        policy.observe_pace(lane, seconds, chars)
    assert lane.fastest_call == 2.0
    assert lane.call_seconds(3) == pytest.approx(2.0)  # not 3 x 0.17 s
    assert lane.call_seconds(20) == pytest.approx(20 * lane.seconds_per_char)
    policy.observe_pace(lane, 0.9, 3, alone=True)  # a lone call: its own floor
    assert lane.call_seconds(1, alone=True) == pytest.approx(0.9)
    assert lane.fastest_call == 2.0
