"""The asyncio side of :mod:`gateway.admission`: one gate per gateway worker.

Sessions ask the gate before sending an utterance's text to the engine
(:meth:`AdmissionGate.submit`). Admitted utterances go at once; queued ones are released
by the gate (:meth:`Ticket.release`) as in-flight work gets its first audio, or expire
with ``queue_timeout``. One owned task re-checks the queue every ``poll_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.admission import AdmissionController, AdmissionSettings, QueueFull
from gateway.likely_hits import LikelyHits
from gateway.metrics import GatewayMetrics

__all__ = ["AdmissionGate", "QueueFull", "Ticket", "UtteranceAdmission"]


@dataclass(eq=False)
class Ticket:
    """One utterance's place at the gate. ``release``/``expire`` are set by the session."""

    release: Callable[[], None]
    expire: Callable[[], None]
    submitted_at: float = 0.0
    dispatched_at: float | None = None
    closed: bool = field(default=False)
    # gateway.likely_hits's keys, when known: the tenant's own, then the shared prompts'
    cache_keys: tuple[str, ...] = ()


class AdmissionGate:
    def __init__(
        self,
        settings: AdmissionSettings,
        metrics: GatewayMetrics,
        *,
        poll_s: float = 0.02,
        clock: Callable[[], float] = time.monotonic,
        likely_hits: LikelyHits | None = None,
    ) -> None:
        self.controller = AdmissionController(settings)
        self.likely_hits = likely_hits if likely_hits is not None else LikelyHits(clock=clock)
        self._metrics = metrics
        self._poll_s = poll_s
        self._clock = clock
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="admission-gate")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def submit(self, ticket: Ticket) -> bool:
        """True: send now. False: queued. Raises :class:`QueueFull`."""
        now = self._clock()
        ticket.submitted_at = now
        likely_hit = any(self.likely_hits.likely(key) for key in ticket.cache_keys)
        admitted = self.controller.submit(ticket, now, at_once=likely_hit)
        if admitted:
            ticket.dispatched_at = now
        self._publish()
        return admitted

    def first_audio(self, ticket: Ticket, cache: str = "") -> None:
        """The engine produced the ticket's first audio: one less in flight.

        ``cache`` "hit": it came from the speech cache ("join": from another stream's
        synthesis of it, already in flight). Its latency is still
        counted in the engine's first-audio histogram but not by the controller, whose
        median and throughput measure synthesis: a host serving cached greetings in
        milliseconds must neither look healthy while synthesis is slow nor be credited
        with a pace its synthesis does not have. The answer also teaches
        :attr:`likely_hits` (the next utterance of the same key skips the queue on a hit)."""
        if ticket.cache_keys:
            self.likely_hits.observe(ticket.cache_keys, cache)
        if ticket.dispatched_at is not None and not ticket.closed:
            now = self._clock()
            latency = now - ticket.dispatched_at
            if cache not in ("hit", "join"):  # synthesis of its own: what the median is of
                self.controller.observe_latency(latency, now)
            self._metrics.engine_first_audio.observe(latency)
        self.close(ticket)

    def close(self, ticket: Ticket) -> None:
        """The utterance finished, failed or was dropped (idempotent)."""
        if ticket.closed:
            return
        ticket.closed = True
        self.controller.done(ticket)
        self._pump()

    def _pump(self) -> None:
        now = self._clock()
        admitted, expired = self.controller.ready(now)
        for item in admitted:
            assert isinstance(item, Ticket)
            item.dispatched_at = now
            item.release()
        for item in expired:
            assert isinstance(item, Ticket)
            item.closed = True
            self._metrics.golden_errors.labels(type="queue_timeout").inc()
            item.expire()
        self._publish()

    def _publish(self) -> None:
        self._metrics.queue_length.set(self.controller.queue_length)
        self._metrics.admission_degraded.set(1 if self.controller.degraded else 0)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._poll_s)
            self._pump()


class UtteranceAdmission:
    """One session's utterances at the gate: a ticket per utterance, and the text of an
    utterance held here while its ticket waits in the gate's queue.

    ``send(seq, text, final, release)`` forwards text to the engine; ``expired(seq)`` tells the
    session that a queued utterance waited too long (its held text is already dropped).
    Without a gate (``gate`` None) every utterance is admitted at once.
    """

    def __init__(
        self,
        gate: AdmissionGate | None,
        *,
        send: Callable[[int, str, bool, bool], None],
        expired: Callable[[int, str], None],
    ) -> None:
        self._gate = gate
        self._send = send
        self._expired = expired
        self._tickets: dict[int, Ticket] = {}
        self._held: dict[int, list[tuple[str, bool, bool]]] = {}

    def admit(self, seq: int, utterance_id: str, cache_keys: tuple[str, ...] = ()) -> None:
        """Ask the gate for utterance ``seq``; raises :class:`QueueFull`. ``cache_keys``
        (:func:`gateway.likely_hits.likely_hit_key`: the tenant's, the shared prompts'):
        a likely speech-cache hit is dispatched at once."""
        if self._gate is None:
            return
        ticket = Ticket(
            release=lambda: self._release(seq),
            expire=lambda: self._expire(seq, utterance_id),
            cache_keys=cache_keys,
        )
        if not self._gate.submit(ticket):
            self._held[seq] = []
        self._tickets[seq] = ticket

    def send(self, seq: int, text: str, final: bool, release: bool = False) -> None:
        """Text for ``seq``: to the engine, or held while ``seq`` waits at the gate."""
        held = self._held.get(seq)
        if held is not None:
            held.append((text, final, release))
        else:
            self._send(seq, text, final, release)

    def holding(self, seq: int) -> bool:
        """``seq`` waits at the gate: none of its text reached the engine."""
        return seq in self._held

    def submitted_at(self, seq: int) -> float | None:
        ticket = self._tickets.get(seq)
        return None if ticket is None else ticket.submitted_at

    def first_audio(self, seq: int, cache: str = "") -> None:
        """The engine produced ``seq``'s first audio (one less in flight at the gate);
        ``cache`` is :attr:`UtteranceAudio.cache` ("hit": from the speech cache)."""
        ticket = self._tickets.get(seq)
        if ticket is not None and self._gate is not None:
            self._gate.first_audio(ticket, cache)

    def close(self, seq: int) -> None:
        """``seq`` finished, failed or was dropped."""
        ticket = self._tickets.pop(seq, None)
        self._held.pop(seq, None)
        if ticket is not None and self._gate is not None:
            self._gate.close(ticket)

    def close_all(self) -> None:
        for seq in list(self._tickets):
            self.close(seq)
        self._held.clear()

    def _release(self, seq: int) -> None:
        for text, final, release in self._held.pop(seq, None) or ():
            self._send(seq, text, final, release)

    def _expire(self, seq: int, utterance_id: str) -> None:
        self._held.pop(seq, None)
        self._tickets.pop(seq, None)
        self._expired(seq, utterance_id)
