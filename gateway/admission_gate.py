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
from gateway.metrics import GatewayMetrics

__all__ = ["AdmissionGate", "QueueFull", "Ticket"]


@dataclass(eq=False)
class Ticket:
    """One utterance's place at the gate. ``release``/``expire`` are set by the session."""

    release: Callable[[], None]
    expire: Callable[[], None]
    submitted_at: float = 0.0
    dispatched_at: float | None = None
    closed: bool = field(default=False)


class AdmissionGate:
    def __init__(
        self,
        settings: AdmissionSettings,
        metrics: GatewayMetrics,
        *,
        poll_s: float = 0.02,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.controller = AdmissionController(settings)
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
        admitted = self.controller.submit(ticket, now)
        if admitted:
            ticket.dispatched_at = now
        self._publish()
        return admitted

    def first_audio(self, ticket: Ticket) -> None:
        """The engine produced the ticket's first audio: one less in flight."""
        if ticket.dispatched_at is not None and not ticket.closed:
            now = self._clock()
            latency = now - ticket.dispatched_at
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
