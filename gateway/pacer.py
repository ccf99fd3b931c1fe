"""One pacing clock per gateway worker.

A single task ticks every ``tick_s`` on absolute deadlines (``start + k * tick_s``,
skipping ticks it missed rather than bunching them) and pumps every session that has
audio to send; each session decides from its own absolute frame deadlines how many
frames are due (see :meth:`gateway.session.Session.pump`). There is no sleep per
stream. A session that gets new audio while idle is woken at once (``wake``), so first
audio does not wait for the next tick. Between a session's frames the tick skips it
(``next_due``): with 20 ms frames and a 5 ms tick, three ticks in four would otherwise
call ``pump`` only to find nothing due.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Protocol

from gateway.metrics import GatewayMetrics

log = logging.getLogger(__name__)


class Pumpable(Protocol):
    # Set by pump(): before this monotonic time pump() would send nothing (0: poll).
    next_due: float

    def pump(self, now: float) -> int: ...

    def pump_failed(self) -> None:
        """``pump`` raised (a bug): the session must end and never be pumped again."""

    @property
    def has_work(self) -> bool: ...


class Pacer:
    def __init__(
        self,
        metrics: GatewayMetrics,
        *,
        tick_s: float = 0.005,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._metrics = metrics
        self.tick_s = tick_s
        self._clock = clock
        self._active: dict[Pumpable, None] = {}  # insertion-ordered set
        self._woken: dict[Pumpable, None] = {}
        self._wake_scheduled = False
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._frames_pending = 0

    def start(self) -> None:
        if self._task is None:
            self._loop = asyncio.get_running_loop()
            self._task = asyncio.create_task(self._run(), name="pacer")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def wake(self, session: Pumpable) -> None:
        """``session`` has something new: pump it soon (this loop iteration)."""
        self._active[session] = None
        self._woken[session] = None
        if not self._wake_scheduled and self._loop is not None:
            self._wake_scheduled = True
            self._loop.call_soon(self._pump_woken)

    def discard(self, session: Pumpable) -> None:
        self._active.pop(session, None)
        self._woken.pop(session, None)

    @property
    def active_count(self) -> int:
        return len(self._active)

    def _pump_woken(self) -> None:
        self._wake_scheduled = False
        woken, self._woken = self._woken, {}
        now = self._clock()
        for session in woken:
            self._pump(session, now)
        self._flush_counters()

    def _pump(self, session: Pumpable, now: float) -> None:
        try:
            self._frames_pending += session.pump(now)
        except Exception:
            log.exception("pacer: session pump failed; ending that session")
            self.discard(session)
            session.pump_failed()
            return
        if not session.has_work:
            self._active.pop(session, None)

    def _flush_counters(self) -> None:
        if self._frames_pending:
            self._metrics.frames_sent.inc(self._frames_pending)
            self._frames_pending = 0

    async def _run(self) -> None:
        next_tick = self._clock()
        while True:
            now = self._clock()
            lag = now - next_tick
            if lag > 0:
                self._metrics.pacer_lag.observe(lag)
            if lag > self.tick_s:  # missed ticks: skip them, stay on the grid
                next_tick += (lag // self.tick_s) * self.tick_s
            for session in list(self._active):
                if session.next_due <= now:  # cheap skip between a session's frames
                    self._pump(session, now)
            self._flush_counters()
            next_tick += self.tick_s
            await asyncio.sleep(max(0.0, next_tick - self._clock()))
