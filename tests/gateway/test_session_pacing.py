"""Tests for gateway.session.Session without a network: state machine, commands, pacing.

The engine, the peer and the pacer are fakes; the outbound ring is a real SpscRing and
time is a manual clock that the tests advance in 5 ms pacer ticks.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, cast

import pytest

from engine.ipc.client import EngineClient, EngineRejected, EngineUnavailable
from engine.ipc.ring import SpscRing
from engine.ipc.schema import UtteranceAudio, UtteranceEnd, UtteranceFailed
from gateway.errors import CloseCode, ErrorCode, IllegalTransition, SessionError
from gateway.events import (
    Cleared,
    ErrorEvent,
    MarkReached,
    Ready,
    SessionEvent,
    UtteranceDone,
    UtteranceStarted,
)
from gateway.formats import FORMATS
from gateway.metrics import GatewayMetrics
from gateway.session import (
    _TRANSITIONS,
    Pacing,
    Session,
    SessionLimits,
    SessionState,
    StartOptions,
)
from gateway.tenant_quota import UNASSIGNED, TenantQuota

TICK_MS = 5
FRAME_S = 0.020
LEAD_S = 0.060
EPS = 1e-9
PCM16_FRAME = FORMATS["pcm_16000"].pcm_frame_bytes  # 640

# --------------------------------------------------------------------------- fakes


class Clock:
    """Manual clock: ``base + ms / 1000`` (no accumulated float error)."""

    def __init__(self, base: float = 100.0) -> None:
        self.base = base
        self.ms = 0

    def __call__(self) -> float:
        return self.base + self.ms / 1000


class FakePeer:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.audio: list[tuple[float, bytes]] = []
        self.events: list[tuple[float, SessionEvent]] = []
        self.wire: list[bytes | SessionEvent] = []  # everything, in order
        self.backlog = False

    def send_audio(self, frame: bytes) -> None:
        self.audio.append((self.clock(), frame))
        self.wire.append(frame)

    def send_event(self, event: SessionEvent) -> None:
        self.events.append((self.clock(), event))
        self.wire.append(event)

    def backlogged(self) -> bool:
        return self.backlog

    def on_interrupt(self) -> None:
        pass

    def event_list(self) -> list[SessionEvent]:
        return [e for _, e in self.events]

    def frames(self) -> list[bytes]:
        return [f for _, f in self.audio]


class FakeStream:
    def __init__(self, capacity: int = 1 << 20) -> None:
        self.outbound = SpscRing.create(bytearray(SpscRing.region_size(capacity)), capacity)
        self.boundaries = SpscRing.create(bytearray(SpscRing.region_size(4096)), 4096)
        self.speaks: list[tuple[int, str, bool]] = []
        self.instructs: list[str | None] = []
        self.retains: list[bool | None] = []
        self.cancel_gate: asyncio.Event | None = None
        self.cancel_error: Exception | None = None
        self.cancels = 0
        self.closed = 0
        self._answers: set[asyncio.Task[None]] = set()

    def speak(
        self,
        utterance: int,
        text: str,
        *,
        final: bool,
        release: bool = False,
        instruct: str | None = None,
        retain: bool | None = None,
    ) -> None:
        self.speaks.append((utterance, text, final))
        self.instructs.append(instruct)
        self.retains.append(retain)

    def cancel_utterance(self, utterance: int) -> None:
        pass

    def request_cancel(self, timeout: float = 2.0) -> asyncio.Future[int]:
        self.cancels += 1
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()

        async def answer() -> None:
            if self.cancel_gate is not None:
                await self.cancel_gate.wait()
            if self.cancel_error is not None:
                future.set_exception(self.cancel_error)
            else:
                future.set_result(self.outbound.write_pos)

        self._answers.add(loop.create_task(answer()))
        return future

    async def close(self, timeout: float = 2.0) -> None:
        self.closed += 1


async def settle() -> None:
    """Let callbacks and answer tasks scheduled on the loop run."""
    for _ in range(5):
        await asyncio.sleep(0)


class FakeClient:
    def __init__(self, stream: FakeStream, error: Exception | None = None) -> None:
        self.stream = stream
        self.error = error
        self.opened: list[dict[str, Any]] = []

    async def open_stream(self, **kwargs: Any) -> FakeStream:
        self.opened.append(kwargs)
        if self.error is not None:
            raise self.error
        return self.stream


class FakePacer:
    def __init__(self) -> None:
        self.woken = 0
        self.discarded = 0

    def wake(self, session: Session) -> None:
        self.woken += 1

    def discard(self, session: Session) -> None:
        self.discarded += 1


@dataclass
class Harness:
    session: Session
    peer: FakePeer
    stream: FakeStream
    client: FakeClient
    clock: Clock
    pacer: FakePacer
    metrics: GatewayMetrics
    pumped: list[tuple[float, int]] = field(default_factory=list)

    @property
    def ring(self) -> SpscRing:
        return self.stream.outbound

    def tick(self, n: int = 1) -> int:
        """Pump at the current time, then advance one pacer tick; ``n`` times."""
        sent = 0
        for _ in range(n):
            k = self.session.pump(self.clock())
            self.pumped.append((self.clock(), k))
            sent += k
            self.clock.ms += TICK_MS
        return sent

    def produce(self, seq: int, pcm: bytes, *, end: bool = True, announce: bool = True) -> int:
        """The engine writes ``pcm`` for utterance ``seq``; returns its start position."""
        start = self.ring.write_pos
        assert self.ring.write(pcm) == len(pcm)
        if announce:
            self.session.on_utterance_audio(
                UtteranceAudio(stream_id=1, utterance=seq, start_pos=start)
            )
        if end:
            self.end(seq, start)
        return start

    def end(self, seq: int, start: int, samples: int | None = None) -> None:
        end = self.ring.write_pos
        self.session.on_utterance_end(
            UtteranceEnd(
                stream_id=1,
                utterance=seq,
                start_pos=start,
                end_pos=end,
                samples=(end - start) // 2 if samples is None else samples,
            )
        )

    def last_seq(self) -> int:
        return self.stream.speaks[-1][0]

    def counter(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels or None)
        return 0.0 if value is None else value


def make_session(
    clock: Clock | None = None,
    limits: SessionLimits | None = None,
    engine_error: Exception | None = None,
    quota: TenantQuota = UNASSIGNED,
) -> Harness:
    clock = clock or Clock()
    peer = FakePeer(clock)
    stream = FakeStream()
    client = FakeClient(stream, engine_error)
    pacer = FakePacer()
    metrics = GatewayMetrics()
    engine: Callable[[], EngineClient] = lambda: cast(EngineClient, client)  # noqa: E731
    session = Session(
        peer=peer,
        engine=engine,
        pacer=pacer,
        metrics=metrics,
        limits=limits or SessionLimits(),
        clock=clock,
        quota=quota,
    )
    return Harness(session, peer, stream, client, clock, pacer, metrics)


def options(fmt: str = "pcm_16000", pacing: Pacing = "realtime") -> StartOptions:
    return StartOptions(voice="en-us", format=FORMATS[fmt], pacing=pacing)


async def started(
    fmt: str = "pcm_16000",
    pacing: Pacing = "realtime",
    clock: Clock | None = None,
    limits: SessionLimits | None = None,
) -> Harness:
    h = make_session(clock, limits)
    await h.session.start(options(fmt, pacing))
    return h


def pcm(frames: float, seed: int = 1, frame_bytes: int = PCM16_FRAME) -> bytes:
    """Recognisable, never-zero 16-bit audio: ``frames`` frames of it."""
    n = int(frames * frame_bytes)
    n -= n % 2
    return bytes(1 + (seed * 37 + i * 11) % 241 for i in range(n))


def split(data: bytes, frame_bytes: int = PCM16_FRAME) -> list[bytes]:
    data += bytes(-len(data) % frame_bytes)
    return [data[i : i + frame_bytes] for i in range(0, len(data), frame_bytes)]


def state_of(session: Session) -> SessionState:
    return session.state


# --------------------------------------------------------------------------- start


async def test_start_opens_the_stream_and_sends_ready():
    h = make_session()
    assert state_of(h.session) is SessionState.AWAITING_START
    assert not h.session.started
    opts = StartOptions(
        voice="en-us", format=FORMATS["mulaw_8000"], language="en", speed=1.25, pacing="burst"
    )
    await h.session.start(opts)
    assert state_of(h.session) is SessionState.ACTIVE
    assert h.session.started
    assert h.session.options is opts
    assert h.client.opened == [
        {
            "voice": "en-us",
            "sample_rate": 8000,
            "speed": 1.25,
            "language": "en",
            "listener": h.session,
            "voice_profile": None,
            "instruct": None,
            "input_sample_rate": None,
            "tenant": "",
            "retain": True,
            "voice_digest": "",
        }
    ]
    assert h.peer.event_list() == [Ready(h.session.id, "mulaw_8000", 8000, 20)]


async def test_an_utterance_s_instruction_goes_with_its_first_text_only():
    h = make_session()
    await h.session.start(StartOptions(voice="cosyvoice2", format=FORMATS["pcm_16000"]))
    h.session.speak("你好，", "a", flush=False, instruct="开心")
    h.session.speak("再见。", "a", instruct="ignored: the utterance is open")
    h.session.speak("Next.", "b")
    assert h.stream.instructs == ["开心", None, None]


@pytest.mark.parametrize(
    ("quota", "no_retention", "on_start", "stream", "utterances"),
    [
        # (token's claim / the tenant, the setting, start.cache) -> stream, speak retains
        (TenantQuota("acme"), frozenset(), None, True, [None, False, True]),
        (TenantQuota("acme"), frozenset(), False, False, [None, False, True]),
        (TenantQuota("acme", cache=False), frozenset(), True, False, [None, False, False]),
        (TenantQuota("acme"), frozenset({"acme"}), True, False, [None, False, False]),
        (TenantQuota("acme"), frozenset({"*"}), None, False, [None, False, False]),
        (TenantQuota("other"), frozenset({"acme"}), None, True, [None, False, True]),
    ],
)
async def test_zero_retention_reaches_the_engine(quota, no_retention, on_start, stream, utterances):
    """``cache`` on start (the session) and speak (one utterance) reach the engine as
    ``retain``, under the tenant's setting (the token's ``cache`` claim,
    GATEWAY_SPEECH_CACHE_NO_RETENTION), which no request lifts; the stream is the tenant's."""
    h = make_session(limits=SessionLimits(no_retention=no_retention), quota=quota)
    await h.session.start(replace(options(), cache=on_start))
    assert (h.client.opened[0]["tenant"], h.client.opened[0]["retain"]) == (quota.tenant, stream)
    h.session.speak("Hello.", "a")
    h.session.speak("Your code is 1234.", "b", cache=False)
    h.session.speak("Welcome back.", "c", cache=True)
    assert h.stream.retains == utterances


async def test_start_twice_is_refused():
    h = await started()
    with pytest.raises(SessionError) as info:
        await h.session.start(options())
    assert info.value.code == "already_started"
    assert h.session.state is SessionState.ACTIVE


@pytest.mark.parametrize(
    ("error", "code", "close_code"),
    [
        (EngineUnavailable("gone"), "engine_unavailable", CloseCode.TRY_AGAIN_LATER),
        (EngineRejected("overloaded", "busy"), "overloaded", CloseCode.TRY_AGAIN_LATER),
        (EngineRejected("unknown_voice", "no such voice"), "unknown_voice", CloseCode.POLICY),
    ],
)
async def test_start_engine_failures(error: Exception, code: str, close_code: int):
    h = make_session(engine_error=error)
    with pytest.raises(SessionError) as info:
        await h.session.start(options())
    assert (info.value.code, info.value.close_code) == (code, close_code)
    assert h.session.state is SessionState.CLOSED
    assert h.peer.events == []


# ------------------------------------------------------------------ realtime pacing


async def test_realtime_pacing_lead_then_one_frame_per_20_ms():
    h = await started()
    uid = h.session.speak("Hello there.")
    seq = h.last_seq()
    assert h.stream.speaks == [(seq, "Hello there.", True)]
    audio = pcm(50, seed=3)  # one second
    h.produce(seq, audio)
    base = h.clock()

    first = h.tick()
    assert first == 4  # frame 0 now, frames 1-3 within the 60 ms lead
    h.tick(260)  # 1.3 s

    assert h.peer.frames() == split(audio)
    for k, (sent_at, _) in enumerate(h.peer.audio):
        due = base + k * FRAME_S
        assert sent_at >= due - LEAD_S - EPS, f"frame {k} early"
        # ... and sent at the first pacer tick where it is due (or the tick after a tie).
        assert sent_at <= max(base, due - LEAD_S) + TICK_MS / 1000 + EPS, f"frame {k} late"
    # After the lead, never more than one frame per pump.
    assert all(n <= 1 for _, n in h.pumped[1:])
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(h.peer.audio[4:])]
    assert all(0.015 - EPS <= g <= 0.025 + EPS for g in gaps)
    assert abs(sum(gaps) - 45 * FRAME_S) <= TICK_MS / 1000 + EPS

    assert h.session.frames_sent == 50
    assert h.session.underruns == 0
    events = h.peer.event_list()
    assert events[-2:] == [
        UtteranceStarted(uid),
        UtteranceDone(uid, audio_ms=1000, first_audio_ms=0),
    ]
    assert h.peer.wire[1] == UtteranceStarted(uid)
    assert h.peer.wire[-1] == UtteranceDone(uid, audio_ms=1000, first_audio_ms=0)


async def test_first_audio_ms_measures_the_wait_for_the_engine():
    h = await started()
    uid = h.session.speak("Hi.")
    h.tick(30)  # 150 ms with no audio: waiting, not an underrun
    assert h.peer.audio == []
    assert h.session.underruns == 0
    h.produce(h.last_seq(), pcm(2))
    assert h.tick() == 2
    assert h.peer.event_list()[-1] == UtteranceDone(uid, audio_ms=40, first_audio_ms=150)
    assert h.metrics.registry.get_sample_value("gateway_first_audio_seconds_count") == 1


async def test_mulaw_session_sends_encoded_160_byte_frames():
    h = await started("mulaw_8000")
    h.session.speak("Hi.")
    frame = FORMATS["mulaw_8000"].pcm_frame_bytes
    h.produce(h.last_seq(), bytes(frame * 3 + 40))
    h.tick(20)
    assert [len(f) for f in h.peer.frames()] == [160] * 4
    assert all(f == b"\xff" * 160 for f in h.peer.frames())  # mu-law silence


async def test_burst_pacing_runs_ahead_up_to_the_burst_lead():
    h = await started(pacing="burst")
    lead = SessionLimits().burst_lead_s
    h.session.speak("A long prompt.")
    audio = pcm(150, seed=5)  # three seconds
    h.produce(h.last_seq(), audio)
    base = h.clock()
    first = h.tick()
    assert first in (100, 101)  # frames due up to now + 2 s (the last one is a tie)
    h.tick(300)
    assert h.peer.frames() == split(audio)
    for k, (sent_at, _) in enumerate(h.peer.audio):
        assert sent_at >= base + k * FRAME_S - lead - EPS, f"frame {k} early"
    # Past the lead it is paced like realtime: the rest take about one second.
    last_at = h.peer.audio[-1][0]
    assert base + 149 * FRAME_S - lead - EPS <= last_at <= base + 1.0 + 0.01
    assert all(n <= 1 for _, n in h.pumped[1:])


# ------------------------------------------------------------------------ underruns


async def test_underrun_is_counted_once_per_dry_spell(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.WARNING, logger="gateway.session")
    h = await started()
    h.session.speak("Your code is 4821.", "u7")
    seq = h.last_seq()
    start = h.produce(seq, pcm(10, seed=1), end=False)
    base = h.clock()
    # Frames 0-3 at once, frame k at ~(k-3)*20 ms; frame 10 would be due at 200 ms.
    h.tick(39)  # up to 195 ms: dry, but nothing is due yet
    assert len(h.peer.audio) == 10
    assert h.session.underruns == 0
    h.tick(2)  # 200 ms: frame 10 is due and there is none
    assert h.session.underruns == 1
    h.tick(40)  # stays dry for 200 ms more
    assert h.session.underruns == 1
    assert h.counter("gateway_underruns_total") == 1
    # One line for the spell: the session, the utterance, how far into it; never its words.
    [line] = [r.getMessage() for r in caplog.records if "underrun" in r.getMessage()]
    assert line.startswith(f"session {h.session.id}: underrun in utterance u7 after 200 ms")
    assert "4821" not in line and "code" not in line

    # The engine catches up: the clock re-bases to now, no burst to catch up.
    assert h.ring.write(pcm(20, seed=2)) == 20 * PCM16_FRAME
    resumed_at = h.clock()
    assert resumed_at == pytest.approx(base + 0.405)
    assert h.tick() == 4  # only the lead, not the ~10 frames "owed" since 200 ms
    h.tick(100)
    assert len(h.peer.audio) == 30
    for k, (sent_at, _) in enumerate(h.peer.audio[10:]):
        assert sent_at >= resumed_at + k * FRAME_S - LEAD_S - EPS
    assert h.session.underruns == 2  # dry again at the end (still no UtteranceEnd)
    h.end(seq, start)
    h.tick()
    assert h.session.underruns == 2
    assert isinstance(h.peer.event_list()[-1], UtteranceDone)


async def test_starvation_within_the_lead_is_not_an_underrun():
    h = await started()
    h.session.speak("Streaming text.")
    seq = h.last_seq()
    h.produce(seq, pcm(4), end=False)
    h.tick(4)  # 20 ms: four frames sent, frame 4 due at 80 ms
    h.ring.write(pcm(4))
    h.tick(4)
    h.ring.write(pcm(4))
    h.tick(40)  # last pump at 235 ms; frame 12 would be due at 240 ms
    assert len(h.peer.audio) == 12
    assert h.session.underruns == 0
    h.tick()
    assert h.session.underruns == 1


async def test_idle_gap_rebases_the_clock():
    h = await started()
    h.session.speak("One.")
    h.produce(h.last_seq(), pcm(5, seed=1))
    h.tick(40)
    assert len(h.peer.audio) == 5
    h.tick(200)  # a second of silence: idle, not an underrun
    assert h.session.underruns == 0
    h.session.speak("Two.")
    second = pcm(20, seed=2)
    h.produce(h.last_seq(), second)
    base = h.clock()
    assert h.tick() == 4
    h.tick(100)
    frames = h.peer.audio[5:]
    assert [f for _, f in frames] == split(second)
    for k, (sent_at, _) in enumerate(frames):
        assert sent_at >= base + k * FRAME_S - LEAD_S - EPS


async def test_backlogged_peer_gets_nothing_until_it_drains():
    h = await started()
    h.session.speak("Hi.")
    h.produce(h.last_seq(), pcm(10))
    h.peer.backlog = True
    assert h.tick(10) == 0
    assert h.peer.wire[1:] == []
    h.peer.backlog = False
    assert h.tick() == 4  # re-based: it does not burst to make up for the stall


async def test_lead_does_not_depend_on_the_clock_value():
    h = await started(clock=Clock(base=12345.678))
    h.session.speak("Hi.")
    h.produce(h.last_seq(), pcm(10))
    assert h.tick() == 4  # frames 0..3 are due by now + 60 ms, as at any other time


# -------------------------------------------------------------------------- marks


async def test_marks_follow_the_audio_before_them():
    h = await started()
    h.session.mark("start")
    h.session.speak("One.")
    seq1 = h.last_seq()
    h.session.mark("one")
    h.session.speak("Two.")
    seq2 = h.last_seq()
    h.session.mark("two")
    h.produce(seq1, pcm(2, seed=1))
    h.produce(seq2, pcm(1, seed=2))
    h.tick(20)
    kinds = [w if not isinstance(w, bytes) else "frame" for w in h.peer.wire[1:]]
    assert kinds == [
        MarkReached("start"),
        UtteranceStarted("u1"),
        "frame",
        "frame",
        UtteranceDone("u1", audio_ms=40, first_audio_ms=0),
        MarkReached("one"),
        UtteranceStarted("u2"),
        "frame",
        UtteranceDone("u2", audio_ms=20, first_audio_ms=0),
        MarkReached("two"),
    ]


# --------------------------------------------------------------------------- clear


async def test_clear_reports_marks_then_cleared_and_drops_old_audio():
    h = await started()
    h.session.speak("A long prompt.")
    seq1 = h.last_seq()
    h.session.mark("m1")
    h.session.speak("Another one.")
    h.session.mark("m2")
    old = pcm(100, seed=7)
    start = h.produce(seq1, old[: 40 * PCM16_FRAME], end=False)
    h.tick(20)  # 100 ms of playback
    sent_before = len(h.peer.audio)
    assert sent_before > 0

    h.stream.cancel_gate = asyncio.Event()
    h.session.clear()  # playback stops at once; the engine's confirmation comes later
    assert h.peer.event_list()[-3:] == [
        MarkReached("m1", cleared=True),
        MarkReached("m2", cleared=True),
        Cleared(),
    ]
    # Until the engine confirms, no frame goes out although the ring has audio...
    assert h.ring.write(old[40 * PCM16_FRAME :]) == 60 * PCM16_FRAME
    n_events = len(h.peer.events)
    assert h.tick(20) == 0
    h.stream.cancel_gate.set()
    await settle()
    assert h.stream.cancels == 1
    # ... and after it, every byte written before the cancel is discarded.
    assert h.ring.read_pos == h.ring.write_pos
    h.end(seq1, start)  # a late UtteranceEnd of the dropped work is ignored
    h.tick(40)
    assert len(h.peer.audio) == sent_before
    assert len(h.peer.events) == n_events

    uid = h.session.speak("New prompt.")
    new = pcm(3, seed=9)
    h.produce(h.last_seq(), new)
    h.tick(20)
    assert h.peer.frames()[sent_before:] == split(new)
    assert h.peer.event_list()[-2:] == [
        UtteranceStarted(uid),
        UtteranceDone(uid, audio_ms=60, first_audio_ms=0),
    ]


async def test_clear_with_nothing_queued_sends_only_cleared():
    h = await started()
    h.session.clear()
    await settle()
    assert h.peer.event_list()[1:] == [Cleared()]
    assert h.stream.cancels == 1


async def test_clear_drops_the_open_utterance():
    h = await started()
    h.session.speak("Hello", flush=False)
    open_seq = h.last_seq()
    h.session.clear()
    await settle()
    h.session.speak("World")
    assert h.last_seq() != open_seq
    assert h.stream.speaks[-1][1:] == ("World", True)


async def test_clear_when_cancel_fails_does_not_block_forever():
    h = await started()
    h.session.speak("One.")
    h.stream.cancel_error = EngineUnavailable("no answer")
    h.session.clear()
    await settle()
    h.session.speak("Two.")
    new = pcm(1, seed=4)
    h.produce(h.last_seq(), new)
    h.tick(5)
    assert h.peer.frames() == [new]


# --------------------------------------------------------------------------- close


async def test_request_close_drains_the_queue_then_closes_normally():
    h = await started()
    h.session.speak("Goodbye.")
    h.produce(h.last_seq(), pcm(10))
    h.session.request_close()
    assert h.session.state is SessionState.DRAINING
    with pytest.raises(SessionError) as info:
        h.session.speak("More.")
    assert info.value.code == "closing"
    h.tick(4)
    assert not h.session.done.done()
    h.tick(40)
    assert len(h.peer.audio) == 10
    assert h.session.done.done()
    assert h.session.done.result() == (1000, "done")
    code, _ = await h.session.done
    assert code == CloseCode.NORMAL


async def test_request_close_finalizes_the_open_utterance():
    h = await started()
    h.session.speak("Hello", flush=False)
    seq = h.last_seq()
    h.session.request_close()
    assert h.stream.speaks == [(seq, "Hello", False), (seq, "", True)]


async def test_request_close_when_idle_closes_on_the_next_pump():
    h = await started()
    h.session.request_close()
    h.tick()
    assert h.session.done.result() == (1000, "done")


async def test_a_finished_session_sends_no_more_frames_before_its_teardown():
    # A Twilio 'stop' (or a hangup) finishes the session while audio is queued; the
    # socket closes a moment later. Meanwhile the pacer must send nothing more: the
    # vendor core refuses media once the stream stopped.
    h = await started()
    h.session.speak("Hello.")
    h.produce(h.last_seq(), pcm(20))
    h.tick(2)
    sent = len(h.peer.audio)
    assert 0 < sent < 20
    h.session.finish(CloseCode.NORMAL, "stop")
    assert not h.session.has_work
    h.tick(20)
    assert len(h.peer.audio) == sent
    assert h.session.pump(h.clock()) == 0


async def test_request_close_before_start():
    h = make_session()
    h.session.request_close()
    assert h.session.done.result() == (1000, "closed before start")


async def test_aclose_closes_the_stream_once():
    h = await started()
    await h.session.aclose("bye")
    await h.session.aclose("again")
    assert h.session.state is SessionState.CLOSED
    assert h.stream.closed == 1
    assert h.pacer.discarded == 4  # at the start and the end of each aclose
    assert h.session.pump(h.clock()) == 0


async def test_engine_lost_reports_and_closes():
    h = await started()
    h.session.on_engine_lost()
    assert h.peer.event_list()[-1] == ErrorEvent(
        ErrorCode.ENGINE_UNAVAILABLE, "the TTS engine stopped; reconnect to continue"
    )
    assert h.session.done.result() == (1011, "engine_unavailable")


@pytest.mark.parametrize(
    ("code", "golden"),
    [(ErrorCode.ENGINE_ERROR, None), (ErrorCode.CUDA_OOM, "cuda_oom"),
     (ErrorCode.QUEUE_TIMEOUT, "queue_timeout")],
)  # fmt: skip
async def test_failed_utterance_reports_error_then_done(code: ErrorCode, golden: str | None):
    """The utterance ends with its error, the session goes on; a GPU out of memory and an
    utterance the engine could not start in time (``ENGINE_START_TIMEOUT_MS``) are also
    golden errors (``cosy2_tts_errors_total{type=...}``)."""
    h = await started()
    uid = h.session.speak("Hi.")
    h.session.on_utterance_failed(
        UtteranceFailed(stream_id=1, utterance=h.last_seq(), code=code, message="x")
    )
    h.tick()
    assert h.peer.event_list()[-2:] == [
        ErrorEvent(code, "x", uid),
        UtteranceDone(uid, audio_ms=0, first_audio_ms=None),
    ]
    assert h.counter("gateway_errors_total", code=code) == 1
    for kind in ("cuda_oom", "queue_timeout"):
        assert h.counter("cosy2_tts_errors_total", type=kind) == (kind == golden)
    assert not h.session.done.done()


# ----------------------------------------------------------------- speak / limits


async def test_speak_before_start_is_not_started():
    h = make_session()
    for call in (
        lambda: h.session.speak("Hi."),
        lambda: h.session.mark("m"),
        lambda: h.session.flush(),
    ):
        with pytest.raises(SessionError) as info:
            call()
        assert info.value.code == "not_started"
        assert info.value.close_code == CloseCode.POLICY
    with pytest.raises(SessionError) as info:
        h.session.clear()
    await settle()
    assert info.value.code == "not_started"


async def test_speak_over_the_text_limit():
    h = await started(limits=SessionLimits(max_text_chars=10))
    assert h.session.speak("x" * 10) == "u1"
    with pytest.raises(SessionError) as info:
        h.session.speak("y" * 11)
    assert info.value.code == "text_too_long"
    assert info.value.utterance_id == "u2"
    assert info.value.close_code is None  # the session goes on


async def test_speak_continuation_counts_towards_the_limit():
    h = await started(limits=SessionLimits(max_text_chars=10))
    h.session.speak("12345", flush=False)
    seq = h.last_seq()
    h.session.speak("678", flush=False)
    with pytest.raises(SessionError) as info:
        h.session.speak("9ab")
    assert info.value.code == "text_too_long"
    # What was accepted is still spoken: the utterance is closed without the excess.
    assert h.stream.speaks == [(seq, "12345", False), (seq, "678", False), (seq, "", True)]


async def test_speak_ids_and_continuation():
    h = await started()
    assert h.session.speak("One.") == "u1"
    assert h.session.speak("Two.", "greeting", flush=False) == "greeting"
    seq = h.last_seq()
    assert h.session.speak(" more", flush=False) == "greeting"
    assert h.session.speak(" end.", "greeting") == "greeting"
    assert [s for s, _, _ in h.stream.speaks[1:]] == [seq, seq, seq]
    with pytest.raises(SessionError) as info:
        h.session.speak("again", "greeting")
    assert info.value.code == "invalid_message"


async def test_queue_full():
    h = await started(limits=SessionLimits(max_queued_items=2))
    h.session.speak("One.")
    h.session.mark("m")
    with pytest.raises(SessionError) as info:
        h.session.speak("Two.")
    assert info.value.code == "queue_full"
    with pytest.raises(SessionError) as info:
        h.session.mark("m2")
    assert info.value.code == "queue_full"


# ------------------------------------------------------------------ state machine


ALL_MOVES = list(itertools.product(SessionState, SessionState))


@pytest.mark.parametrize(
    ("old", "new"), ALL_MOVES, ids=[f"{a.name}->{b.name}" for a, b in ALL_MOVES]
)
async def test_transition_table(old: SessionState, new: SessionState):
    h = make_session()
    h.session.state = old
    if new in _TRANSITIONS[old]:
        h.session._transition(new)
        assert h.session.state is new
    else:
        with pytest.raises(IllegalTransition):
            h.session._transition(new)
        assert h.session.state is old


def test_transition_table_shape():
    assert _TRANSITIONS[SessionState.CLOSED] == frozenset()
    for state in SessionState:
        assert state not in _TRANSITIONS[state]
        if state is not SessionState.CLOSED:
            assert SessionState.CLOSED in _TRANSITIONS[state]
    assert _TRANSITIONS[SessionState.DRAINING] == frozenset({SessionState.CLOSED})


async def test_engine_events_during_close_do_not_leave_the_session_in_the_pacer():
    """A caller hangs up while synthesis runs: engine events that arrive while the
    session awaits its lease release and stream close must not re-register it with the
    pacer for good."""
    h = await started()
    active: set[Session] = set()
    h.pacer.wake = lambda session: active.add(session)  # type: ignore[method-assign]
    h.pacer.discard = lambda session: active.discard(session)  # type: ignore[method-assign]
    h.session.speak("Hello there.")
    seq = h.last_seq()
    gate = asyncio.Event()
    original_close = h.stream.close

    async def slow_close(timeout: float = 2.0) -> None:
        await gate.wait()
        await original_close(timeout)

    h.stream.close = slow_close  # type: ignore[method-assign]
    closing = asyncio.create_task(h.session.aclose("caller hung up"))
    await settle()
    h.stream.outbound.write(pcm(3))
    h.session.on_utterance_audio(UtteranceAudio(stream_id=1, utterance=seq, start_pos=0))
    assert h.session in active  # woken while closing
    gate.set()
    await closing
    assert h.session not in active
    assert not h.session.has_work
