"""Warming prompts in the background: a bounded queue and a few owned tasks.

Nothing waits for the warmer: the gateway answers ``/healthz`` and ``/readyz`` and takes
calls while it works, and the engine renders warm-ups behind every call's work (idle
capacity only). At most ``concurrency`` prompts are with the engine at a time. The queue
is served round-robin by tenant and bounded per tenant (fair_queue.py): one tenant's
burst never delays or refuses another's prompts, and a prompt deleted before its turn
leaves the queue (:meth:`Warmer.discard`). A prompt
whose engine went away (a crash, a restart) is tried again once the engine is back, up to
``max_attempts`` times; one the engine refuses (an unknown voice, text too long, the
cache off) fails at once, logged with where it came from (the prompts file's line).
Progress is logged as prompts finish (every :data:`PROGRESS_EVERY` and when the queue is
empty) and counted in metrics (:class:`WarmupObserver`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final, Protocol

from engine.ipc.client import EngineUnavailable
from engine.ipc.schema import PromptRequest, PromptState
from gateway.speech_cache.catalog import Entry
from gateway.speech_cache.fair_queue import FairQueue
from gateway.speech_cache.prompts import PromptError

log = logging.getLogger(__name__)

PROGRESS_EVERY: Final = 25
#: Retryable answers: the engine's queue was busy for too long; it is tried again later.
RETRYABLE_CODES: Final = frozenset({"queue_timeout", "overloaded", "engine_unavailable"})


class SpeechCacheOff(Exception):
    """The engine runs without a speech cache (its Pong says so)."""


class CacheEngine(Protocol):
    """The engine as the warmer sees it (:class:`gateway.speech_cache.service.EngineCache`)."""

    async def wait_usable(self, timeout: float) -> None:
        """Until the engine is connected and has said whether it caches; raises
        :class:`SpeechCacheOff` or :class:`EngineUnavailable` (not within ``timeout``)."""
        ...

    async def warm(self, request: PromptRequest, timeout: float) -> PromptState: ...


class WarmupObserver(Protocol):
    def finished(self, entry: Entry, result: str) -> None:
        """``result``: "warm", "failed" or "retried"."""
        ...

    def changed(self) -> None:
        """An entry changed state (the gauges of the catalog may be refreshed)."""
        ...


Resolve = Callable[[Entry], Awaitable[PromptRequest]]


class Warmer:
    def __init__(
        self,
        engine: CacheEngine,
        resolve: Resolve,
        observer: WarmupObserver,
        *,
        concurrency: int = 2,
        max_queue: int = 10_000,
        max_per_tenant: int = 1000,
        max_attempts: int = 5,
        warm_timeout_s: float = 120.0,
        engine_wait_s: float = 60.0,
        retry_delay_s: float = 1.0,
    ) -> None:
        self._engine = engine
        self._resolve = resolve
        self._observer = observer
        self._concurrency = concurrency
        self._queue: FairQueue[Entry] = FairQueue(per_tenant=max_per_tenant, total=max_queue)
        self._ready = asyncio.Event()  # set while the queue holds something
        self._unfinished = 0  # queued or being warmed (join)
        self._idle = asyncio.Event()
        self._idle.set()
        self._max_attempts = max_attempts
        self._warm_timeout_s = warm_timeout_s
        self._engine_wait_s = engine_wait_s
        self._retry_delay_s = retry_delay_s
        self._tasks: list[asyncio.Task[None]] = []
        self.done = 0
        self.failed = 0
        self.submitted = 0
        self._started_at = time.monotonic()

    @property
    def pending(self) -> int:
        return len(self._queue)

    def start(self) -> None:
        self._started_at = time.monotonic()
        self._tasks = [
            asyncio.create_task(self._work(), name=f"speech-cache-warmer-{i}")
            for i in range(self._concurrency)
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    def submit(self, entry: Entry) -> bool:
        """Queue ``entry``; False (and the entry failed, ``queue_full``) when its tenant's
        share of the queue, or the queue, is full."""
        entry.state = "pending"
        entry.code = entry.message = ""
        if not self._queue.push(entry.tenant, entry):
            self._fail(entry, "queue_full", "the warm-up queue is full; try again later")
            return False
        self._unfinished += 1
        self._idle.clear()
        self._ready.set()
        self.submitted += 1
        self._observer.changed()
        return True

    def discard(self, entry: Entry) -> bool:
        """Take ``entry`` out of the queue (its prompt was deleted); False when it is not
        queued (being warmed, or done)."""
        if not self._queue.remove(entry.tenant, entry):
            return False
        self._finished_one()
        return True

    def _finished_one(self) -> None:
        self._unfinished -= 1
        if self._unfinished == 0:
            self._idle.set()

    async def _next(self) -> Entry:
        while (entry := self._queue.pop()) is None:
            self._ready.clear()
            await self._ready.wait()
        return entry

    async def _work(self) -> None:
        while True:
            entry = await self._next()
            try:
                await self._warm(entry)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug: this prompt fails, the warmer goes on
                log.exception("speech cache: warming %s (%s) failed", entry.id, entry.source)
                self._fail(entry, "internal_error", "warm-up failed")
            finally:
                self._finished_one()
                self._progress()

    async def _warm(self, entry: Entry) -> None:
        while True:
            entry.attempts += 1
            entry.state = "warming"
            self._observer.changed()
            try:
                await self._engine.wait_usable(self._engine_wait_s)
                request = await self._resolve(entry)
                answer = await self._engine.warm(request, self._warm_timeout_s)
            except SpeechCacheOff:
                self._fail(entry, "speech_cache_off", "the engine runs without a speech cache")
                return
            except PromptError as exc:
                log.error(
                    "speech cache: prompt %s (%s, voice %r) not warmed: %s",
                    entry.id, entry.source, entry.spec.voice[:64], exc.message,
                )  # fmt: skip
                self._fail(entry, exc.code, exc.message)
                return
            except EngineUnavailable as exc:
                if self._retry(entry, "engine_unavailable", str(exc)):
                    await asyncio.sleep(self._retry_delay_s)
                    continue
                return
            if answer.code in RETRYABLE_CODES:
                if self._retry(entry, answer.code, answer.message):
                    await asyncio.sleep(self._retry_delay_s * entry.attempts)
                    continue
                return
            entry.segments = answer.segments
            if answer.code:
                log.error(
                    "speech cache: prompt %s (%s, voice %r) not warmed: %s %s",
                    entry.id, entry.source, entry.spec.voice[:64], answer.code, answer.message,
                )  # fmt: skip
                self._fail(entry, answer.code, answer.message)
                return
            entry.state = "warm"
            entry.code = entry.message = ""
            entry.warmed_at = time.time()
            self.done += 1
            self._observer.finished(entry, "warm")
            self._observer.changed()
            return

    def _retry(self, entry: Entry, code: str, message: str) -> bool:
        """Whether ``entry`` gets another attempt (else it failed with ``code``)."""
        if entry.attempts >= self._max_attempts:
            log.error(
                "speech cache: prompt %s (%s) not warmed after %d attempts: %s",
                entry.id, entry.source, entry.attempts, message,
            )  # fmt: skip
            self._fail(entry, code, message)
            return False
        log.info("speech cache: prompt %s: %s; trying again", entry.id, message)
        entry.state = "pending"
        self._observer.finished(entry, "retried")
        self._observer.changed()
        return True

    def _fail(self, entry: Entry, code: str, message: str) -> None:
        entry.state = "failed"
        entry.code = code
        entry.message = message
        self.failed += 1
        self._observer.finished(entry, "failed")
        self._observer.changed()

    def _progress(self) -> None:
        finished = self.done + self.failed
        if finished % PROGRESS_EVERY == 0 or not self._queue:
            log.info(
                "speech cache warm-up: %d warm, %d failed, %d pending (%.1f s)",
                self.done, self.failed, len(self._queue), time.monotonic() - self._started_at,
            )  # fmt: skip

    async def join(self) -> None:
        """Until every queued prompt is finished (tests, the benchmark)."""
        await self._idle.wait()


__all__ = ["CacheEngine", "SpeechCacheOff", "Warmer", "WarmupObserver"]
