"""Decoding a Kokoro segment in pieces: the schedule, the phase, the joins.

Sans-I/O: arrays and numbers in, arrays and numbers out; the decoder is a function given
by the caller (:class:`engine.backends.kokoro.model.KokoroModel` runs ONNX Runtime).

One segment: the front (text to frames, :mod:`engine.backends.kokoro.graph`) runs once;
the decoder then runs over frame ranges, each piece with :data:`LEFT_CONTEXT` frames
before it and :data:`RIGHT_CONTEXT` after it (clipped at the segment's ends), of which
only the piece's own frames are kept. One frame is ``hop`` samples (600: 25 ms at 24 kHz).

- The schedule (:func:`schedule`): the first piece as short as first audio needs, each
  later one as long as the audio already out covers decoding it (at ``pace`` audio
  seconds per second of one worker), the last one the rest. The leading pad's frames before
  ``begin`` (the lead cut) are never decoded but as context.
- The phase: the harmonic source's phase at each half frame, ``2 pi * 300 *
  cumsum(frac(f0 * h / 24000))`` for harmonics ``h`` 1..9, is computed by the front over
  the whole segment (the export's own nodes, so the same values), and each piece gets its
  slice (:func:`phase_slice`): a piece starts where the one before it left off (the
  decoder's own cumulative sum would restart at each piece).
- The instance normalizations' statistics (:class:`Stats`): see docs/kokoro.md for the
  measurement that chose them. ``first``: the first piece normalizes over its own frames
  and every later piece reuses those statistics, so that the decoder is one fixed
  function over the segment and pieces join as the whole decode does (no level step).
  ``own``: every piece over its own frames, the level of each later piece matched to the
  one before it where they overlap (a gain that returns to 1 over the piece).
- The release (:func:`release_after`): the first audio goes out once enough pieces are
  decoded that every later one arrives before the audio before it runs out, at the pace
  a :class:`PaceMeter` measures on this machine's decoding as the load changes.
- The joins: consecutive pieces overlap by their context; :data:`CROSSFADE` samples at
  each join are a linear crossfade of the two (both are the same audio to rounding with
  ``first`` statistics).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final, Literal

import numpy as np
import numpy.typing as npt

LEFT_CONTEXT: Final = 8  # frames decoded before a piece and dropped
RIGHT_CONTEXT: Final = 8  # frames decoded after a piece and dropped
CROSSFADE: Final = 120  # samples (5 ms) of crossfade at a join
LEVEL_MATCH_FRAMES: Final = 4  # frames each side of a join whose levels are matched
MIN_PIECE: Final = 8  # frames: no later piece shorter (its context would dominate)
SNAP_FRAMES: Final = 4  # how far a join may move to a quieter boundary
FIRST_PIECE: Final = 40  # frames of the first piece, counted from the lead cut (1 s)
PLAN_PACE: Final = 2.0  # the pace a schedule plans with before any piece was timed
STEADY_PIECE: Final = 64  # frames of each later piece when the pace cannot grow them (1.6 s)
PACE_SAFETY: Final = 1.25  # a schedule plans at the measured pace divided by this
RELEASE_MARGIN: Final = 8  # frames (0.2 s) a piece arrives before its audio is due
ROUNDING: Final = 1e-6  # frames: float sums that are equal in exact arithmetic

Stats = Literal["first", "own"]
FloatArray = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Piece:
    """Frames ``start`` .. ``end`` (exclusive) of a segment, decoded over ``lo`` .. ``hi``
    (the piece and its context)."""

    start: int
    end: int
    lo: int
    hi: int


def schedule(
    frames: int,
    begin: int,
    first: int,
    pace: float,
    *,
    quiet: Sequence[float] | npt.NDArray[np.floating] | None = None,
    left: int = LEFT_CONTEXT,
    right: int = RIGHT_CONTEXT,
    first_left: int | None = None,
    snap: int = SNAP_FRAMES,
    margin: int = RELEASE_MARGIN,
) -> list[Piece]:
    """Pieces covering frames ``begin`` .. ``frames`` of a segment.

    The first piece holds about ``first`` frames. Each later one holds as many frames as
    the audio already out covers at ``pace`` (audio seconds decoded per second of a worker,
    its context included) with ``margin`` frames to spare: with ``b`` frames out and not
    yet played when it starts, about ``pace * (b - margin) - left - right``; a rest that
    fits, or one shorter than twice :data:`MIN_PIECE`, joins the piece before it. Where
    that is under :data:`MIN_PIECE` (a worker too slow for the audio out: no schedule
    keeps ahead, as at a ``pace`` of 1 or less) each later piece holds
    :data:`STEADY_PIECE` frames, and the first audio waits until enough is decoded that
    the rest keeps ahead (:func:`release_after`): a segment decoded in steady pieces can
    start playing after about ``frames * (1 / pace - 1)``, decoded whole only after
    ``frames / pace``.

    ``quiet``: the loudness of the segment at each frame boundary (``frames + 1`` values,
    any scale; :func:`boundary_loudness`): each join moves to the quietest boundary within
    ``snap`` frames before or after where it would fall (the earlier of equals; a piece
    sized by the pace only earlier: later it would come late), so that pieces join in
    pauses and between words where there are some. ``first_left``: the
    first piece's left context (default ``left``; the frames before ``begin`` are the
    leading pad). Deterministic: the same arguments give the same pieces."""
    if not 0 <= begin < frames:
        raise ValueError(f"begin {begin} outside 0..{frames}")
    first_left = left if first_left is None else first_left
    pieces: list[Piece] = []
    start = begin
    target = begin + max(1, first)
    buffered = 0.0  # frames out and not yet played when the next piece starts
    steady = False
    while True:
        # a piece sized by the pace may end earlier, not later: later, it would arrive
        # after the audio before it runs out (release_after would hold the first audio
        # one piece longer: 0.9 s instead of 0.4 s for 2 of 12 Mandarin openings, F)
        paced = bool(pieces) and not steady
        end = _join(start, target, frames, quiet, snap, 0 if paced else snap)
        lo = max(0, start - (first_left if not pieces else left))
        hi = min(frames, end + right)
        pieces.append(Piece(start, end, lo, hi))
        if end >= frames:
            return pieces
        if len(pieces) > 1:
            buffered = max(0.0, buffered - (hi - lo) / pace)
        buffered += end - start
        start = end
        room = int(pace * (buffered - margin)) - left - right
        # no piece worth its context fits: steady pieces from here, the first audio held
        steady = steady or room < MIN_PIECE
        target = start + (STEADY_PIECE if steady else room)


def release_after(plan: Sequence[Piece], pace: float, margin: int = RELEASE_MARGIN) -> int:
    """The index of the piece after whose decoding the segment's first audio may go out
    (every piece decoded by then goes at once), so that each later piece, decoded one
    after another at ``pace`` (audio per second of decoding, context included), arrives
    ``margin`` frames before the audio before it has played out. 0 when the schedule
    keeps ahead by itself; the last piece when nothing does (the segment whole)."""
    if pace <= 0.0:
        return len(plan) - 1
    done: list[float] = []  # when each piece is decoded, in frames of audio time
    clock = 0.0
    for piece in plan:
        clock += (piece.hi - piece.lo) / pace
        done.append(clock)
    begin = plan[0].start
    for k in range(len(plan)):
        # released at done[k]: piece i (> k) is due at done[k] + (its start - begin)
        # (to a rounding's tolerance: a piece sized by schedule to its room, exactly)
        if all(
            done[i] + margin <= done[k] + plan[i].start - begin + ROUNDING
            for i in range(k + 1, len(plan))
        ):
            return k
    return len(plan) - 1


class PaceMeter:
    """A worker's decoding pace, measured: audio seconds decoded per second of decoding
    (context included), smoothed over the pieces decoded, falling fast and rising slowly
    (a load that arrives slows the next piece at once). What a schedule plans with:
    :meth:`plan_pace`, the pace over :data:`PACE_SAFETY`. Not thread-safe: the caller
    holds a lock (one float's update)."""

    FALL: Final = 0.5  # weight of a slower measurement
    RISE: Final = 0.2  # weight of a faster one

    def __init__(self, initial: float = PLAN_PACE) -> None:
        if initial <= 0.0:
            raise ValueError("a pace is positive")
        self.pace = initial

    def observe(self, audio_s: float, seconds: float) -> None:
        """``audio_s`` of audio (its context included) took ``seconds`` to decode."""
        if audio_s <= 0.0 or seconds <= 0.0:
            return
        measured = audio_s / seconds
        weight = self.FALL if measured < self.pace else self.RISE
        self.pace += weight * (measured - self.pace)

    def plan_pace(self) -> float:
        return self.pace / PACE_SAFETY


def _join(
    start: int,
    target: int,
    frames: int,
    quiet: Sequence[float] | npt.NDArray[np.floating] | None,
    snap: int,
    snap_after: int,
) -> int:
    """Where a piece from ``start`` aiming at ``target`` ends: the segment's end when the
    rest would be shorter than twice :data:`MIN_PIECE` (a piece that short costs more
    context than it holds), else the quietest boundary from ``snap`` frames before
    ``target`` to ``snap_after`` after it that leaves both sides at least
    :data:`MIN_PIECE` (or ``target``). A piece sized by the pace (``snap_after`` 0) may
    not grow past its target to take a short rest (it would come late, and the first
    audio would wait one piece longer): it leaves twice :data:`MIN_PIECE` frames for a
    last piece instead, where that leaves it :data:`MIN_PIECE` frames itself."""
    if frames - target < 2 * MIN_PIECE:
        shorter = frames - 2 * MIN_PIECE
        if snap_after <= 0 and target < frames and shorter >= start + MIN_PIECE:
            return shorter
        return frames
    if quiet is None or snap <= 0:
        return target
    lo = max(start + min(MIN_PIECE, target - start), target - snap)
    hi = min(frames - MIN_PIECE, target + max(0, snap_after))
    if hi < lo:
        return target
    candidates = range(lo, hi + 1)
    return min(candidates, key=lambda j: (float(quiet[j]), j))


def boundary_loudness(energy: npt.NDArray[np.floating]) -> npt.NDArray[np.float32]:
    """The loudness at each frame boundary (``frames + 1`` values) from the front's energy
    curve (``[1, 2 * frames]``, two values a frame; it follows the decoded level closely:
    a correlation of 0.98 with frame dB measured on a Mandarin and an English sentence):
    the largest of the two half frames each side of the boundary."""
    halves = np.asarray(energy, dtype=np.float32).reshape(-1)
    padded = np.concatenate([halves[:1], halves[:1], halves, halves[-1:], halves[-1:]])
    windows = np.lib.stride_tricks.sliding_window_view(padded, 4)[::2]
    return np.asarray(windows.max(axis=1), dtype=np.float32)


def phase_slice(phase: FloatArray, lo: int, hi: int) -> FloatArray:
    """Half frames ``lo`` .. ``hi`` of a segment's source phase (``[1, harmonics,
    halves]``): a piece's phase is the whole segment's there."""
    return np.ascontiguousarray(phase[:, :, lo:hi])


@dataclass(frozen=True)
class Features:
    """The front's output for one segment: aligned features ``[1, 512, frames]``, the F0
    and energy curves ``[1, 2 * frames]``, the source phase ``[1, harmonics, 2 * frames]``
    and the style row ``[1, 256]``."""

    aligned: FloatArray
    f0: FloatArray
    energy: FloatArray
    phase: FloatArray
    style: FloatArray

    @property
    def frames(self) -> int:
        return int(self.aligned.shape[2])


# Statistics of the decoder's normalizations: opaque here (what the decoder returned).
StatsT = Sequence[FloatArray]
# The decoder of one segment: (lo, hi, given statistics or None: its own) -> (the audio of
# frames lo .. hi, the statistics it normalized with).
Decoder = Callable[[int, int, StatsT | None], tuple[FloatArray, StatsT]]


def decode(
    pieces: Sequence[Piece],
    decoder: Decoder,
    hop: int,
    stats: Stats = "first",
    release: int = 0,
) -> Iterator[FloatArray]:
    """The audio of ``pieces`` (float, ``hop`` samples per frame), one array per piece as
    soon as it is decoded, joined as the module docstring says: the arrays joined are
    ``(pieces[-1].end - pieces[0].start) * hop`` samples, frame ``pieces[0].start`` first.
    ``release``: the pieces before this index are held back until it is decoded
    (:func:`release_after`), then go at once. The caller may stop iterating after any
    piece it is given: nothing more is decoded."""
    waiting: list[FloatArray] = []
    for index, out in enumerate(_decoded(pieces, decoder, hop, stats)):
        waiting.append(out)
        if index >= release:
            yield from waiting
            waiting.clear()
    yield from waiting


def _decoded(
    pieces: Sequence[Piece], decoder: Decoder, hop: int, stats: Stats
) -> Iterator[FloatArray]:
    given: StatsT | None = None
    held: FloatArray | None = None  # the previous piece's samples around the join
    around: FloatArray | None = None  # the previous piece's frames around the join
    half = CROSSFADE // 2
    span = LEVEL_MATCH_FRAMES * hop
    for piece in pieces:
        lo, hi = piece.lo, piece.hi
        audio, used = decoder(lo, hi, given)
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        if stats == "first" and given is None:
            given = used
        first = (piece.start - lo) * hop  # the piece's first sample in ``audio``
        last = (piece.end - lo) * hop
        joined = held is not None
        final = piece.end >= pieces[-1].end
        out = audio[first - half if joined else first : last if final else last + half].copy()
        if joined and stats == "own" and around is not None:
            gain = level_ratio(around, audio[max(0, first - span) : first + span])
            if gain != 1.0:  # the matched level at the join, back to 1 at the piece's end
                out *= np.linspace(gain, 1.0, out.size, dtype=np.float32)
        if held is not None:
            fade = min(held.size, out.size)
            ramp = (np.arange(fade, dtype=np.float32) + 0.5) / fade
            out[:fade] = held[:fade] * (1 - ramp) + out[:fade] * ramp
        if final:
            held = None
        else:
            held = out[-2 * half :].copy()
            around = audio[max(0, last - span) : last + span]
            out = out[: -2 * half]
        yield out


def level_ratio(before: FloatArray, after: FloatArray) -> float:
    """The gain that brings ``after`` to the level of ``before`` (the same frames around a
    join, decoded by two pieces), within 0.5 .. 2; 1 when either is near silence."""
    n = min(before.size, after.size)
    if n == 0:
        return 1.0
    level_before = float(np.sqrt(np.mean(np.square(before[:n], dtype=np.float64))))
    level_after = float(np.sqrt(np.mean(np.square(after[:n], dtype=np.float64))))
    if level_after < 1e-4 or level_before < 1e-4:
        return 1.0
    return float(np.clip(level_before / level_after, 0.5, 2.0))
