"""Tests for engine.capacity: whether a lane can start one more utterance."""

from __future__ import annotations

from typing import TypedDict

import pytest

from engine.capacity import Pace, Replay, StreamWork, can_start, run_dry

# A worker spends 10 ms per character; a character is 60 ms of audio (rtf 1/6). No
# safety margins, so the arithmetic in each case is exact.
PACE = Pace(seconds_per_char=0.01, audio_per_char=0.06)


class Margins(TypedDict):
    cost_factor: float
    margin_s: float


EXACT: Margins = {"cost_factor": 1.0, "margin_s": 0.0}


def playing(unplayed_s: float, *segments: int, in_flight_s: float | None = None) -> StreamWork:
    return StreamWork(segments, unplayed_s=unplayed_s, heard=True, in_flight_s=in_flight_s)


@pytest.mark.parametrize(
    ("case", "committed", "workers", "new", "expected"),
    [
        ("nothing committed: always", [], [0.0], (500, 500), True),
        ("ample buffer", [playing(3.0, 50)], [0.0], (20, 50), True),
        # The newcomer's 20 characters (0.2 s) go first: the committed stream's 50
        # (0.5 s) would end at 0.7 s, after its 0.6 s of audio.
        ("pushes a speaking call past its audio", [playing(0.6, 50)], [0.0], (20,), False),
        ("two workers share it", [playing(0.6, 50)], [0.0, 0.0], (20,), True),
        ("a busy worker is not free", [playing(0.6, 50)], [0.3, 0.0], (20,), False),
        # Alone it is fine: 20 chars give 1.2 s of audio, the next 100 take 1.0 s. Behind
        # a committed stream's 50 (0.5 s, due first) the 100 end at 1.7 s > 0.2 + 1.2.
        ("its own next segment would come late", [playing(1.3, 50)], [0.0], (20, 100), False),
        ("alone it keeps up", [playing(9.0)], [0.0], (20, 100), True),
        ("several calls in time", [playing(4.0, 40), playing(5.0, 40)], [0.0], (20, 40), True),
        # Running dry whatever happens (text slower than speech): not the newcomer's doing.
        ("a call dry anyway does not block starts", [playing(0.1, 50)], [0.0], (10,), True),
    ],
)  # fmt: skip
def test_can_start(case, committed, workers, new, expected):
    verdict = can_start(StreamWork(new), committed, workers_free_in=workers, pace=PACE, **EXACT)
    assert verdict is expected, case


def test_a_segment_in_flight_adds_its_audio_when_it_is_done():
    # 0.2 s left to play, a segment in flight done in 0.1 s adding 1 s: the next 50
    # characters (0.5 s) are due at 1.2 s and done at 0.6 s.
    stream = StreamWork((50,), unplayed_s=0.2, heard=True, in_flight_s=0.1, in_flight_audio_s=1.0)
    assert run_dry([stream], [0.1], PACE, **EXACT) == set()
    late = StreamWork((50,), unplayed_s=0.2, heard=True, in_flight_s=0.3, in_flight_audio_s=1.0)
    assert run_dry([late], [0.3], PACE, **EXACT) == {0}  # in flight past its audio


def test_a_paced_segment_in_flight_plays_its_audio_without_a_gap():
    """A segment decoded in pieces that keep pace (``in_flight_paced``): once some of it
    has come, all of its audio is counted as playing from now, and the worker is free
    when it is done; the next segment is due when that audio runs out."""
    # 0.2 s in hand, 1 s more of the segment still to come, done in 0.5 s: the next 50
    # characters take 0.5 s, arriving at 1.0 s, before the 1.2 s of audio runs out
    paced = StreamWork(
        (50,), unplayed_s=0.2, heard=True, in_flight_s=0.5, in_flight_audio_s=1.0,
        in_flight_paced=True,
    )  # fmt: skip
    assert run_dry([paced], [0.5], PACE, **EXACT) == set()
    # the same segment not paced: its audio comes at its end, 0.3 s after the 0.2 s ran out
    whole = StreamWork((50,), unplayed_s=0.2, heard=True, in_flight_s=0.5, in_flight_audio_s=1.0)
    assert run_dry([whole], [0.5], PACE, **EXACT) == {0}
    # paced, but the next segment still comes late: 80 characters (0.8 s) arrive at 1.3 s
    late = StreamWork(
        (80,), unplayed_s=0.2, heard=True, in_flight_s=0.5, in_flight_audio_s=1.0,
        in_flight_paced=True,
    )  # fmt: skip
    assert run_dry([late], [0.5], PACE, **EXACT) == {0}
    # and with the margin: due 0.4 s before the audio runs out
    assert run_dry([paced], [0.5], PACE, cost_factor=1.0, margin_s=0.4) == {0}


def test_a_stream_not_yet_heard_cannot_run_dry_on_its_first_segment():
    assert run_dry([StreamWork((500,))], [0.0], PACE, **EXACT) == set()


def test_cutting_long_segments_is_replayed():
    # 0.5 s of audio left, next segment 100 characters (1 s): late whole; cut into a
    # piece that fits (the lane's split_to_fit) it keeps up: 40 chars in 0.4 s give 2.4 s.
    stream = playing(0.5, 100)
    assert run_dry([stream], [0.0], PACE, **EXACT) == {0}
    assert run_dry([stream], [0.0], PACE, **EXACT, min_piece_chars=10) == set()
    # Both pieces keep min_piece_chars, as split_to_fit's do: with 55, no cut leaves two
    # (100 < 110), so the whole segment goes, late.
    assert run_dry([stream], [0.0], PACE, **EXACT, min_piece_chars=55) == {0}
    short = playing(0.25, 30)  # 30 chars (0.3 s): too short to cut into two of 24
    assert run_dry([short], [0.0], PACE, **EXACT, min_piece_chars=24) == {0}
    with pytest.raises(ValueError):
        run_dry([stream], [0.0], PACE, min_piece_chars=0)


def test_the_stream_s_own_rate_counts():
    slow_speaker = StreamWork((50, 50), unplayed_s=0.0, heard=False, audio_per_char=0.2)
    assert run_dry([slow_speaker], [0.0], PACE, **EXACT) == set()
    fast_speaker = StreamWork((50, 100), unplayed_s=0.0, heard=False, audio_per_char=0.015)
    assert run_dry([fast_speaker], [0.0], PACE, **EXACT) == {0}


def test_safety_margins_make_it_stricter():
    committed = [playing(0.75, 50)]  # exact: 0.2 + 0.5 = 0.7 s <= 0.75 s
    assert can_start(StreamWork((20,)), committed, workers_free_in=[0.0], pace=PACE, **EXACT)
    assert not can_start(
        StreamWork((20,)), committed, workers_free_in=[0.0], pace=PACE, cost_factor=1.25,
        margin_s=0.0,
    )  # fmt: skip
    assert not can_start(
        StreamWork((20,)), committed, workers_free_in=[0.0], pace=PACE, cost_factor=1.0,
        margin_s=0.1,
    )  # fmt: skip


def test_keeping_pace_is_about_the_stream_and_joining_about_the_others_too() -> None:
    """``keeps_pace``: the stream's own later segments arrive in time beside the others;
    ``joins_without_harm``: that, and no other stream runs dry because of it (the rule
    of can_start, without its empty-lane shortcut)."""
    replay = Replay([0.0], PACE, **EXACT)
    assert replay.run_dry([playing(0.1, 50)]) == run_dry([playing(0.1, 50)], [0.0], PACE, **EXACT)
    mine = playing(1.2, 20)  # 1.2 s in hand, its next 20 characters take 0.2 s
    # ahead of a call with 0.6 s in hand and 50 characters (0.5 s) to go: both fine
    fine = [playing(0.6, 50)]
    assert replay.keeps_pace(mine, fine)
    assert replay.joins_without_harm(mine, fine)
    # a newcomer heard from nothing goes first: the other call's 50 end at 0.7 s > 0.6 s
    new = StreamWork((20,))
    assert replay.keeps_pace(new, fine)
    assert not replay.joins_without_harm(new, fine)
    # its own next segment too long for the audio it holds: it cannot keep pace anywhere
    short = playing(0.1, 50)
    assert not replay.keeps_pace(short, [])
    assert not replay.joins_without_harm(short, [])
    assert can_start(short, [], workers_free_in=[0.0], pace=PACE, **EXACT)  # empty lane


def test_a_fixed_cost_per_segment_is_paid_by_every_segment():
    # 0.3 s of audio left and a 10-character segment next: 0.1 s at 10 ms a character,
    # in time; with 0.25 s more per segment (a model's front), 0.35 s: late.
    stream = playing(0.3, 10)
    assert run_dry([stream], [0.0], PACE, **EXACT) == set()
    fixed = Pace(seconds_per_char=0.01, audio_per_char=0.06, seconds_per_call=0.25)
    assert run_dry([stream], [0.0], fixed, **EXACT) == {0}
    # A cut piece pays it too: 0.5 s left, 100 characters; whole (1.25 s) late. The
    # piece that fits is 25 characters (0.25 + 0.25 = 0.5 s), not the 50 that fit
    # without the fixed cost: a 50-character piece would end at 0.75 s, late.
    long = playing(0.5, 100)
    assert run_dry([long], [0.0], fixed, **EXACT, min_piece_chars=10) == set()
    assert run_dry([long], [0.0], fixed, **EXACT, min_piece_chars=30) == {0}


def test_no_segment_costs_less_than_the_fastest_call() -> None:
    """``min_call_seconds``: the replay prices no segment below it (a fixed cost the line
    may not know yet). 0.2 s in hand, the next 5 characters 0.05 s by the line: in time;
    at a floor of 0.3 s: late."""
    stream = StreamWork((5,), unplayed_s=0.2, heard=True)
    assert run_dry([stream], [0.0], PACE, **EXACT) == set()
    floored = Pace(seconds_per_char=0.01, audio_per_char=0.06, min_call_seconds=0.3)
    assert run_dry([stream], [0.0], floored, **EXACT) == {0}


def test_a_pace_prices_a_call_and_says_how_long_a_piece_fits_in_a_time() -> None:
    """One formula for what a segment costs (a fixed cost, a cost per character, never
    below the fastest call, with the safety factor) and its inverse, which the lane's cut
    and the replay's cut both use: the longest piece that costs at most that time."""
    pace = Pace(0.01, 0.07, seconds_per_call=0.1, min_call_seconds=0.3)
    assert pace.call_seconds(10, 1.0) == pytest.approx(0.3)  # the floor: 0.2 by the line
    assert pace.call_seconds(50, 2.0) == pytest.approx(1.2)
    assert pace.chars_within(1.2, 2.0) == 50
    assert pace.call_seconds(pace.chars_within(1.0, 1.25), 1.25) <= 1.0
    assert pace.chars_within(0.5, 2.0) == 0  # less than the fastest call costs
    assert Pace(0.0, 0.07).chars_within(5.0, 1.0) == 0  # no pace yet
