"""One TTS session: the state machine between a wire protocol and an engine stream.

A :class:`Session` is protocol-neutral. A wire protocol (``gateway/protocols/*``)
decodes peer messages into calls on it (``start``, ``speak``, ``flush``, ``clear``,
``mark``, ``request_close``) and receives audio frames and typed events back through
its :class:`Peer`. The per-worker :class:`gateway.pacer.Pacer` calls :meth:`Session.pump`
to put frames on the wire by absolute deadline.

States (the only legal moves are in ``_TRANSITIONS``; each move is logged)::

    AWAITING_START --start--> STARTING --engine stream open--> ACTIVE
    ACTIVE --close requested--> DRAINING --queue played out--> CLOSED
    any --error / peer gone / engine lost--> CLOSED
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from engine.ipc.boundaries import BoundaryReader
from engine.ipc.client import EngineClient, EngineRejected, EngineStream, EngineUnavailable
from engine.ipc.schema import (
    SpeechStarted,
    UtteranceAudio,
    UtteranceEnd,
    UtteranceFailed,
    UtteranceWords,
)
from gateway.admission_gate import AdmissionGate, QueueFull, UtteranceAdmission
from gateway.errors import CloseCode, ErrorCode, IllegalTransition, ProtocolViolation, SessionError
from gateway.events import BargeIn, Cleared, ErrorEvent, Ready, SessionEvent, Word
from gateway.formats import AudioFormat, FrameEncoder
from gateway.likely_hits import SHARED, likely_hit_key
from gateway.metrics import GatewayMetrics
from gateway.playback import FrameStatus, Playback
from gateway.tenant_quota import UNASSIGNED, TenantQuota

log = logging.getLogger(__name__)

Pacing = Literal["realtime", "burst"]


class SessionState(enum.Enum):
    AWAITING_START = "awaiting_start"
    STARTING = "starting"
    ACTIVE = "active"
    DRAINING = "draining"
    CLOSED = "closed"


_TRANSITIONS: dict[SessionState, frozenset[SessionState]] = {
    SessionState.AWAITING_START: frozenset({SessionState.STARTING, SessionState.CLOSED}),
    SessionState.STARTING: frozenset({SessionState.ACTIVE, SessionState.CLOSED}),
    SessionState.ACTIVE: frozenset({SessionState.DRAINING, SessionState.CLOSED}),
    SessionState.DRAINING: frozenset({SessionState.CLOSED}),
    SessionState.CLOSED: frozenset(),
}


class Peer(Protocol):
    """What a wire protocol gives the session to talk to its peer. Never blocks."""

    def send_audio(self, frame: bytes) -> None: ...
    def send_event(self, event: SessionEvent) -> None: ...
    def backlogged(self) -> bool: ...

    def on_interrupt(self) -> None:
        """Clear or barge-in, before the session drops its queue (telephony legs flush
        the vendor's buffer here)."""


class SessionLeases(Protocol):
    """Cluster-wide per-tenant session limits (see :mod:`gateway.leases`)."""

    async def acquire_lease(self, session: Session) -> None: ...
    async def release_lease(self, session: Session) -> None: ...


class PacerHandle(Protocol):
    def wake(self, session: Session) -> None: ...
    def discard(self, session: Session) -> None: ...


@dataclass(frozen=True)
class SessionLimits:
    max_text_chars: int = 2000
    max_queued_items: int = 64
    realtime_lead_s: float = 0.060
    burst_lead_s: float = 2.0
    cancel_timeout_s: float = 2.0
    retry_after_ms: int = 2000
    # Tenants whose speech the cache never keeps (GATEWAY_SPEECH_CACHE_NO_RETENTION).
    no_retention: frozenset[str] = frozenset()


DEFAULT_MAX_BUFFER_DELAY_MS = 3000


@dataclass(frozen=True)
class StartOptions:
    voice: str
    format: AudioFormat
    language: str | None = None
    speed: float = 1.0
    pacing: Pacing = "realtime"
    input_format: AudioFormat | None = None
    barge_in: bool = False
    voice_profile: bytes | None = None  # a registered voice's features
    #: ``speak`` with ``flush: false`` (streamed LLM tokens): text waits for a clause to
    #: end, at most this long, then what is complete is spoken (0: at once).
    max_buffer_delay_ms: int = DEFAULT_MAX_BUFFER_DELAY_MS
    word_timestamps: bool = False  # ``start.timestamps: "word"``: Words events
    instruct: str | None = None  # a style instruction for the whole session (CosyVoice2)
    # ``start.cache``: False keeps nothing of this session's speech in the speech cache
    # (None: the tenant's default); the tenant's setting is a ceiling (TenantQuota.retains).
    cache: bool | None = None
    voice_digest: str = ""  # a registered voice's (engine/speech_cache/key.py)


@dataclass
class _OpenUtterance:
    seq: int
    utterance_id: str
    chars: int


class Session:
    def __init__(
        self,
        *,
        peer: Peer,
        engine: Callable[[], EngineClient],
        pacer: PacerHandle,
        metrics: GatewayMetrics,
        limits: SessionLimits,
        protocol: str = "native",
        quota: TenantQuota = UNASSIGNED,
        clock: Callable[[], float] = time.monotonic,
        gate: AdmissionGate | None = None,
        leases: SessionLeases | None = None,
    ) -> None:
        self.id = uuid.uuid4().hex[:16]
        self.state = SessionState.AWAITING_START
        self.protocol = protocol
        # Whose session it is and under what limit: from gateway.tenant_quota.quota_for only
        self.quota = quota
        self._peer = peer
        self._engine = engine
        self._pacer = pacer
        self._metrics = metrics
        self._limits = limits
        self._clock = clock
        self.options: StartOptions | None = None
        self.stream: EngineStream | None = None
        self.playback: Playback | None = None
        self._encoder: FrameEncoder | None = None
        self._lead_s = limits.realtime_lead_s
        self._frame_s = 0.02
        # Frame k of the current run is due at _run_base + k * _frame_s.
        self._run_base = 0.0
        self._run_index = 0
        # Monotonic time before which pump() has nothing to do (the next frame is not due
        # and nothing is starving); the pacer skips the session until then. 0: poll.
        self.next_due = 0.0
        self._starving = False
        self._seq = itertools.count(1)
        self._auto_ids = itertools.count(1)
        # Style instructions and ``cache`` settings of utterances whose first text has
        # not reached the engine (dropped with them: queue timeout, clear, barge-in).
        self._instructs: dict[int, str] = {}
        self._retains: dict[int, bool] = {}
        self._open: _OpenUtterance | None = None
        self._release_timer: asyncio.TimerHandle | None = None  # max_buffer_delay_ms
        self._admission = UtteranceAdmission(
            gate, send=self._to_engine, expired=self._queue_timeout
        )
        self._leases = leases
        self.frames_sent = 0
        self.underruns = 0
        self._ended_logged = False
        self._broken = False  # pump raised once: never pumped again
        # Resolved with (close code, reason) when the session wants its socket closed.
        self.done: asyncio.Future[tuple[int, str]] = asyncio.get_running_loop().create_future()

    # --- state ------------------------------------------------------------------------

    def _transition(self, new: SessionState, reason: str = "") -> None:
        if new not in _TRANSITIONS[self.state]:
            raise IllegalTransition(f"session {self.id}: {self.state.value} -> {new.value}")
        log.info(
            "session %s %s -> %s%s",
            self.id,
            self.state.value,
            new.value,
            f" ({reason})" if reason else "",
        )
        self.state = new

    @property
    def tenant(self) -> str:
        return self.quota.tenant

    @property
    def started(self) -> bool:
        return self.state in (SessionState.ACTIVE, SessionState.DRAINING)

    def finish(self, code: int, reason: str) -> None:
        """Ask the protocol layer to close the socket with ``code``; idempotent."""
        if not self.done.done():
            self.done.set_result((code, reason))

    def fail(self, error: SessionError) -> None:
        """Report ``error`` to the peer and, if it is fatal, end the session."""
        self._metrics.errors.labels(code=error.code).inc()
        self._peer.send_event(
            ErrorEvent(error.code, error.message, error.utterance_id, error.retry_after_ms)
        )
        if error.close_code is not None:
            self.finish(error.close_code, error.code)

    # --- commands from the peer -----------------------------------------------------------

    async def start(self, options: StartOptions) -> None:
        """Open the engine stream and answer ``ready``; raises :class:`SessionError`.

        All or nothing: whatever ends the start (an error, the session being closed
        meanwhile, the caller being cancelled), the tenant lease and the engine stream
        it acquired are given back."""
        if self.state is not SessionState.AWAITING_START:
            raise ProtocolViolation(ErrorCode.ALREADY_STARTED, "start was already received")
        self._transition(
            SessionState.STARTING, f"voice={options.voice} format={options.format.name}"
        )
        stream: EngineStream | None = None
        try:
            if self._leases is not None:
                await self._leases.acquire_lease(self)
                self._still_starting()
            client = self._engine()
            stream = await client.open_stream(
                voice=options.voice,
                sample_rate=options.format.sample_rate,
                speed=options.speed,
                language=options.language,
                listener=self,
                voice_profile=options.voice_profile,
                instruct=options.instruct,
                tenant=self.tenant,
                retain=self.quota.retains(self._limits.no_retention, options.cache),
                voice_digest=options.voice_digest,
                input_sample_rate=(
                    options.input_format.sample_rate if options.input_format else None
                ),
            )
            self._still_starting()
        except BaseException as exc:
            await self._abandon_start(stream, exc)
            raise self._start_error(exc) from None
        self.stream = stream
        self.options = options
        fmt = options.format
        self._encoder = fmt.encoder()
        self._frame_s = fmt.frame_ms / 1000
        self._lead_s = (
            self._limits.realtime_lead_s
            if options.pacing == "realtime"
            else self._limits.burst_lead_s
        )
        self.playback = Playback(
            sample_rate=fmt.sample_rate,
            frame_bytes=fmt.pcm_frame_bytes,
            max_items=self._limits.max_queued_items,
            boundaries=BoundaryReader(self.stream.boundaries),
            emit_words=options.word_timestamps,
        )
        self._transition(SessionState.ACTIVE)
        self._peer.send_event(Ready(self.id, fmt.name, fmt.sample_rate, fmt.frame_ms))

    def _still_starting(self) -> None:
        """After an await in :meth:`start`: the session may have been closed meanwhile
        (the peer left, its token expired, the drain ended it)."""
        if self.state is not SessionState.STARTING:
            raise SessionError(ErrorCode.CLOSING, "the session ended while starting")

    async def _abandon_start(self, stream: EngineStream | None, cause: BaseException) -> None:
        """Give back what a failed :meth:`start` acquired, even while being cancelled."""
        if isinstance(cause, SessionError | EngineRejected):
            reason = str(cause.code)
        else:
            reason = type(cause).__name__
        if self.state is not SessionState.CLOSED:
            self._transition(SessionState.CLOSED, reason)
        cleanup = asyncio.ensure_future(self._release_start(stream))
        try:
            await asyncio.shield(cleanup)
        except asyncio.CancelledError:
            await asyncio.wait([cleanup])  # finish giving back, then go on cancelling
            raise

    async def _release_start(self, stream: EngineStream | None) -> None:
        try:
            await self._release_lease()
        except Exception:
            log.exception("session %s: tenant lease release failed", self.id)
        if stream is not None:
            with contextlib.suppress(EngineUnavailable):  # gone, and its slots with it
                await stream.close()

    def _start_error(self, exc: BaseException) -> BaseException:
        """What :meth:`start` raises for ``exc``: a :class:`SessionError` with its code,
        or ``exc`` itself (cancellation, a bug)."""
        if isinstance(exc, EngineRejected):
            self._metrics.rejections.labels(reason=exc.code).inc()
            if exc.code == ErrorCode.OVERLOADED:
                self._metrics.golden_errors.labels(type="overloaded").inc()
                return SessionError(
                    ErrorCode.OVERLOADED,
                    exc.message,
                    CloseCode.TRY_AGAIN_LATER,
                    retry_after_ms=self._limits.retry_after_ms,
                )
            return SessionError(ErrorCode.from_engine(exc.code), exc.message, CloseCode.POLICY)
        if isinstance(exc, EngineUnavailable):
            self._metrics.rejections.labels(reason="engine_unavailable").inc()
            return SessionError(
                ErrorCode.ENGINE_UNAVAILABLE,
                "the TTS engine is not available",
                CloseCode.TRY_AGAIN_LATER,
                retry_after_ms=self._limits.retry_after_ms,
            )
        return exc

    def _require_active(self) -> tuple[EngineStream, Playback]:
        if self.state is SessionState.DRAINING:
            raise SessionError(ErrorCode.CLOSING, "the session is closing")
        if self.state is not SessionState.ACTIVE or self.stream is None or self.playback is None:
            raise ProtocolViolation(ErrorCode.NOT_STARTED, "send start first", CloseCode.POLICY)
        return self.stream, self.playback

    def speak(
        self,
        text: str,
        utterance_id: str | None = None,
        *,
        flush: bool = True,
        instruct: str | None = None,
        cache: bool | None = None,
    ) -> str:
        """Queue ``text``. Continues the open utterance when ids match (or none is given);
        ``instruct`` gives a new utterance its own style instruction and ``cache`` its own
        retention (``false``: the speech cache keeps nothing of it); both are ignored
        when the text continues an open one.

        Returns the utterance id. Raises :class:`SessionError` (``text_too_long``,
        ``queue_full``, ``invalid_message``).
        """
        _stream, playback = self._require_active()
        current = self._open
        if current is not None and utterance_id in (None, current.utterance_id):
            target = current
        else:
            if current is not None:  # a new utterance implicitly ends the open one
                self._finalize_open()
            if playback.full:
                raise SessionError(
                    ErrorCode.QUEUE_FULL, "too many queued utterances", None, utterance_id
                )
            if utterance_id is None:
                utterance_id = f"u{next(self._auto_ids)}"
            elif utterance_id in playback.pending_utterance_ids():  # bounded by the queue
                raise SessionError(
                    ErrorCode.INVALID_MESSAGE, "utterance_id is already queued", None, utterance_id
                )
            target = _OpenUtterance(next(self._seq), utterance_id, 0)
            self._admit(target.seq, utterance_id, self._likely_hit_keys(text, instruct))
            if instruct:
                self._instructs[target.seq] = instruct
            if cache is not None:
                self._retains[target.seq] = self.quota.retains(self._limits.no_retention, cache)
            playback.enqueue_utterance(target.seq, utterance_id, self._clock())
        if target.chars + len(text) > self._limits.max_text_chars:
            # What was already accepted is still spoken; the excess is refused.
            self._open = target
            self._finalize_open()
            raise SessionError(
                ErrorCode.TEXT_TOO_LONG,
                f"utterance text over {self._limits.max_text_chars} characters",
                None,
                target.utterance_id,
            )
        target.chars += len(text)
        self._admission.send(target.seq, text, flush)
        self._open = None if flush else target
        if flush:
            self._stop_buffer_deadline()
        elif text:
            self._buffer_deadline(target.seq)
        return target.utterance_id

    def _likely_hit_keys(self, text: str, instruct: str | None) -> tuple[str, ...]:
        """The utterance's keys among the likely speech-cache hits: its tenant's own,
        then the operator's shared prompts'."""
        options = self.options
        if options is None or not text:
            return ()
        return tuple(
            likely_hit_key(tenant, options.voice, options.speed, instruct, text)
            for tenant in (self.tenant, SHARED)
        )

    def _admit(self, seq: int, utterance_id: str, cache_keys: tuple[str, ...] = ()) -> None:
        """Ask the admission gate for ``seq``; raises ``overloaded`` if it cannot wait."""
        try:
            self._admission.admit(seq, utterance_id, cache_keys)
        except QueueFull:
            self._metrics.golden_errors.labels(type="overloaded").inc()
            raise SessionError(
                ErrorCode.OVERLOADED, "the gateway's admission queue is full", None, utterance_id
            ) from None

    def _to_engine(self, seq: int, text: str, final: bool, release: bool = False) -> None:
        instruct = self._instructs.pop(seq, None)  # go with the utterance's first text
        retain = self._retains.pop(seq, None)
        if self.stream is not None and self.state is not SessionState.CLOSED:
            self.stream.speak(
                seq, text, final=final, release=release, instruct=instruct, retain=retain
            )

    def _buffer_deadline(self, seq: int) -> None:
        """Open utterance ``seq`` got text that may wait for a clause end: bound the wait
        (``max_buffer_delay_ms``)."""
        delay_ms = self.options.max_buffer_delay_ms if self.options is not None else 0
        if delay_ms <= 0:
            self._admission.send(seq, "", False, True)
        elif self._release_timer is None:
            loop = asyncio.get_running_loop()
            self._release_timer = loop.call_later(delay_ms / 1000, self._release_buffered)

    def _release_buffered(self) -> None:
        self._release_timer = None
        if self._open is not None and self.state is SessionState.ACTIVE:
            self._admission.send(self._open.seq, "", False, True)

    def _stop_buffer_deadline(self) -> None:
        if self._release_timer is not None:
            self._release_timer.cancel()
            self._release_timer = None

    def _queue_timeout(self, seq: int, utterance_id: str) -> None:
        """Utterance ``seq`` waited too long at the admission gate: drop it."""
        self._instructs.pop(seq, None)
        self._retains.pop(seq, None)
        if self._open is not None and self._open.seq == seq:
            self._open = None
            self._stop_buffer_deadline()
        if self.playback is not None:
            self.playback.drop(seq)
            self._pacer.wake(self)
        self._metrics.errors.labels(code=ErrorCode.QUEUE_TIMEOUT).inc()
        self._peer.send_event(
            ErrorEvent(ErrorCode.QUEUE_TIMEOUT, "waited too long for the engine", utterance_id)
        )

    def flush(self, utterance_id: str | None = None, *, flush_id: str | None = None) -> None:
        """End the open utterance (``speak`` with ``flush: false``) so that it is spoken
        now, and answer ``flushed`` (with ``flush_id``) once everything queued before
        this flush was sent."""
        _, playback = self._require_active()
        if self._open is not None and utterance_id in (None, self._open.utterance_id):
            self._finalize_open()
        if playback.full:
            raise SessionError(ErrorCode.QUEUE_FULL, "too many queued items")
        playback.enqueue_flush(flush_id)
        self._pacer.wake(self)

    def cancel(self, utterance_id: str) -> None:
        """Drop one queued or playing utterance, leaving the others: it ends with
        ``utterance_done`` (``cancelled``). Raises ``unknown_utterance`` when no utterance
        with that id is queued or playing."""
        _, playback = self._require_active()
        if self._open is not None and self._open.utterance_id == utterance_id:
            self._finalize_open()  # the engine finishes its text; its audio is skipped
        seq = playback.seq_of(utterance_id)
        in_engine = seq is not None and not self._admission.holding(seq)
        dropped = playback.cancel(utterance_id, in_engine=in_engine, now=self._clock())
        if dropped is None:
            raise SessionError(
                ErrorCode.UNKNOWN_UTTERANCE,
                "no utterance with that id is queued or playing",
                None,
                utterance_id,
            )
        seq, events = dropped
        if not in_engine:  # else the gate counts it until the engine ends it
            self._admission.close(seq)
            self._instructs.pop(seq, None)
            self._retains.pop(seq, None)
        elif self.stream is not None:
            # it ends after its segment in progress; a lost engine ends the session anyway
            with contextlib.suppress(EngineUnavailable):
                self.stream.cancel_utterance(seq)
        for event in events:
            self._peer.send_event(event)
        self._pacer.wake(self)

    def _finalize_open(self) -> None:
        self._stop_buffer_deadline()
        if self._open is not None and self.stream is not None:
            self._admission.send(self._open.seq, "", True)
        self._open = None

    def mark(self, name: str) -> None:
        _, playback = self._require_active()
        if playback.full:
            raise SessionError(ErrorCode.QUEUE_FULL, "too many queued items")
        playback.enqueue_mark(name)
        self._pacer.wake(self)

    def clear(self) -> None:
        """``clear``: stop audio now, drop everything queued, cancel the engine's work."""
        _, playback = self._require_active()
        self._interrupt(Cleared(playback.playing()))

    def _interrupt(self, reason: Cleared | BargeIn) -> None:
        """Stop playback before the next frame and cancel the engine's work.

        The peer gets the dropped marks (``cleared``) and then ``reason``. No frame is
        sent until the engine confirms where the cancelled audio ends in the ring.
        """
        stream, playback = self.stream, self.playback
        if stream is None or playback is None:
            return
        self._open = None
        self._stop_buffer_deadline()
        self._admission.close_all()
        self._instructs.clear()
        self._retains.clear()
        self._peer.on_interrupt()  # e.g. a telephony leg flushes its vendor's buffer first
        for event in playback.clear():
            self._peer.send_event(event)
        self._peer.send_event(reason)
        self._starving = False
        self._run_base, self._run_index = 0.0, 0  # the peer dropped its buffer
        self.next_due = 0.0
        cancelled = stream.request_cancel(self._limits.cancel_timeout_s)

        def confirmed(future: asyncio.Future[int]) -> None:
            if future.cancelled() or future.exception() is not None:
                playback.cancel_failed()  # the engine is gone: on_engine_lost ends us
                return
            playback.on_cancelled(stream.outbound, future.result())
            self._pacer.wake(self)

        cancelled.add_done_callback(confirmed)

    # --- caller audio (duplex) ----------------------------------------------------------

    def feed_caller_audio(self, data: bytes) -> None:
        """Caller audio in the session's ``input_format``: to the engine's VAD.

        Raises :class:`SessionError` (``unexpected_binary``) when the session has no
        input format. Audio that does not fit the inbound ring (the engine is behind) is
        dropped and counted, never queued without bound.
        """
        stream, options = self.stream, self.options
        if stream is None or options is None or options.input_format is None:
            raise ProtocolViolation(ErrorCode.UNEXPECTED_BINARY, "this session has no input_format")
        try:
            pcm = options.input_format.decode_input(data)
        except ValueError as exc:
            raise ProtocolViolation(ErrorCode.INVALID_AUDIO, str(exc)[:200]) from None
        written = stream.inbound.write(pcm)
        if written < len(pcm):
            self._metrics.caller_audio_dropped.inc(len(pcm) - written)

    @property
    def playing(self) -> bool:
        """Audio is queued or being sent (what barge-in interrupts)."""
        return self.playback is not None and not self.playback.idle

    def on_speech_started(self, event: SpeechStarted) -> None:
        options = self.options
        if options is None or not self.started:
            return
        if options.barge_in and self.playing:
            log.info("session %s: barge-in at %d ms of caller audio", self.id, event.audio_ms)
            self._metrics.barge_ins.labels(protocol=self.protocol).inc()
            assert self.playback is not None  # playing
            self._interrupt(BargeIn(self.playback.playing()))

    def request_close(self) -> None:
        """``close``: finish what is queued, then close normally."""
        if self.state is SessionState.ACTIVE:
            self._finalize_open()
            self._transition(SessionState.DRAINING, "close requested")
            self._pacer.wake(self)
        elif self.state is SessionState.AWAITING_START:
            self.finish(CloseCode.NORMAL, "closed before start")

    # --- pacing -----------------------------------------------------------------------

    def _log_underrun(self, playback: Playback) -> None:
        """One line per dry spell, for the on-call engineer: which utterance ran dry, how
        far into it, and where its first audio came from. Never its words: they may be a
        caller's amount or code."""
        played = playback.playing()
        log.warning(
            "session %s: underrun in utterance %s after %d ms of it (its first audio: %s)",
            self.id,
            played.utterance_id if played else "?",
            played.played_ms if played else 0,
            playback.head_source() or "not known",
        )

    def pump(self, now: float) -> int:
        """Send every frame due by ``now`` + lead; returns the number of frames sent.

        Deadlines are absolute: frame k of a run is due at ``base + k * frame``. After a
        gap (idle, waiting for first audio, an underrun) the clock is re-based to now, so
        a late stream never bursts to catch up beyond the lead.
        """
        self.next_due = 0.0
        stream, playback, encoder = self.stream, self.playback, self._encoder
        if stream is None or playback is None or encoder is None or not self.started:
            return 0
        if self._broken or self.done.done():
            return 0  # ending: the peer may already have stopped taking media
        if self._peer.backlogged():
            return 0
        sent = 0
        lead_s = self._lead_s
        horizon = now + lead_s
        peer = self._peer
        frame_s = self._frame_s
        while True:
            deadline = self._run_base + self._run_index * frame_s
            if deadline > horizon + 1e-9:
                self.next_due = deadline - lead_s  # nothing to do before then
                break
            result = playback.next_frame(stream.outbound, now)
            for event in result.before:
                peer.send_event(event)
            if result.frame is None:
                starved = result.status is FrameStatus.STARVED and deadline <= now
                if starved and not self._starving:
                    self._starving = True
                    self.underruns += 1
                    self._metrics.underruns.inc()
                    self._log_underrun(playback)
                break
            if deadline < now:  # after a gap: a new run starts now
                self._run_base, self._run_index = now, 0
            peer.send_audio(encoder.encode(result.frame))
            self._run_index += 1
            self._starving = False
            sent += 1
            for event in result.after:
                peer.send_event(event)
        if playback.finished:
            self._record_finished(playback)
        if self.state is SessionState.DRAINING and playback.idle:
            self.finish(CloseCode.NORMAL, "done")
        self.frames_sent += sent
        return sent

    def pump_failed(self) -> None:
        """The pacer hit a bug pumping this session: end it (1011), send nothing more."""
        self._broken = True
        self._metrics.errors.labels(code=ErrorCode.INTERNAL_ERROR).inc()
        self.finish(CloseCode.INTERNAL_ERROR, "internal_error")

    @property
    def has_work(self) -> bool:
        return (
            self.stream is not None
            and self.playback is not None
            and (not self.playback.idle or self.playback.skipping)
            and self.state is not SessionState.CLOSED
            and not self.done.done()
        )

    def _record_finished(self, playback: Playback) -> None:
        for item in playback.finished:
            if item.first_frame_at is not None:
                since = max(item.requested_at, item.head_at or item.requested_at)
                self._metrics.first_audio.observe(item.first_frame_at - since)
                if item.cache in ("hit", "join", "miss"):
                    self._metrics.speech_cache_first_audio.labels(cache=item.cache).observe(
                        item.first_frame_at - since
                    )
                if item.audio_ready_at is not None:
                    self._metrics.gateway_latency.observe(
                        max(0.0, item.first_frame_at - item.audio_ready_at)
                    )
        playback.finished.clear()

    # --- engine events (StreamListener) -------------------------------------------------

    def on_utterance_audio(self, event: UtteranceAudio) -> None:
        self._admission.first_audio(event.utterance, event.cache)
        if self.playback is not None:
            self.playback.on_audio(event.utterance, event.start_pos, self._clock(), event.cache)
            self._pacer.wake(self)

    def on_utterance_words(self, event: UtteranceWords) -> None:
        if self.playback is not None:
            self.playback.on_words(
                event.utterance, [Word(w.text, w.start_ms, w.end_ms) for w in event.words]
            )

    def on_utterance_end(self, event: UtteranceEnd) -> None:
        submitted_at = self._admission.submitted_at(event.utterance)
        if submitted_at is not None:
            self._metrics.request_duration.observe(self._clock() - submitted_at)
        self._admission.close(event.utterance)
        if self.playback is not None:
            self.playback.on_end(event.utterance, event.start_pos, event.end_pos, event.samples)
            self._pacer.wake(self)

    def on_utterance_failed(self, event: UtteranceFailed) -> None:
        self._admission.close(event.utterance)
        # A GPU batch that held it failed, or the engine could not start it in time
        # (ENGINE_START_TIMEOUT_MS): golden errors, as the gateway's own queue timeouts.
        if event.code in (ErrorCode.CUDA_OOM, ErrorCode.QUEUE_TIMEOUT):
            self._metrics.golden_errors.labels(type=str(event.code)).inc()
        if self.playback is not None:
            self._metrics.errors.labels(code=event.code).inc()
            self.playback.on_failed(
                event.utterance, event.code, event.message, event.start_pos, event.end_pos
            )
            self._pacer.wake(self)

    def on_engine_lost(self) -> None:
        if self.state is SessionState.CLOSED:
            return
        self.fail(
            SessionError(
                ErrorCode.ENGINE_UNAVAILABLE,
                "the TTS engine stopped; reconnect to continue",
                CloseCode.INTERNAL_ERROR,
            )
        )

    # --- teardown ---------------------------------------------------------------------

    async def _release_lease(self) -> None:
        if self._leases is not None:
            await self._leases.release_lease(self)

    async def aclose(self, reason: str = "") -> None:
        """Release everything; safe to call more than once, and whatever fails on the way
        (a store or engine error) the rest is still released."""
        self._pacer.discard(self)
        self._stop_buffer_deadline()
        self._admission.close_all()
        if self.state is not SessionState.CLOSED:
            self._transition(SessionState.CLOSED, reason)
        stream, self.stream = self.stream, None
        try:
            await self._release_lease()
        except Exception:
            log.exception("session %s: tenant lease release failed", self.id)
        finally:  # even when cancelled while releasing the lease
            if stream is not None:
                try:
                    await stream.close()
                except Exception:
                    log.exception("session %s: engine stream close failed", self.id)
        if self.playback is not None:
            self._record_finished(self.playback)
        # Engine events that arrived while we awaited above may have woken us again.
        self._pacer.discard(self)
        if not self._ended_logged:
            self._ended_logged = True
            log.info(
                "session %s ended: frames=%d underruns=%d",
                self.id,
                self.frames_sent,
                self.underruns,
            )
