"""The shared level: a store (directory or Redis) behind the cache's own I/O threads.

Entries are named and sealed (sealing.py) here, on these threads: the store only sees
keyed names and sealed values. A value that fails to open (changed, forged, written
under another secret or another name) is a miss, is deleted and counted
(``rejected``); one whose sealed write time is older than the TTL is a miss and is
deleted, whatever the store's own expiry says.

No caller ever waits on the store. Lookups go through a bounded queue to the lookup
thread; each has a deadline (the lookup timeout) and a watchdog thread answers ``None``
for any lookup not answered by its deadline plus half a timeout (a hung store cannot
stall a stream: the store's late answer is dropped). Writes go through a second bounded
queue (items and bytes) to the write thread, which also runs the store's maintenance
(the directory's budget sweep); a full queue drops the write. Failures, timeouts and
dropped writes count as ``errors``; a failed or timed-out lookup is also a miss. After
``errors_to_back_off`` consecutive failures the level backs off for ``back_off_s``:
lookups are answered ``None`` at once (synchronously, counted as errors) and writes
are dropped, then the store is tried again. A down Redis therefore costs at most a few
timeouts, then nothing, until it is back.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from engine.ipc.schema import CacheLevelStats
from engine.speech_cache.counts import LookupCounts
from engine.speech_cache.key import SegmentKey
from engine.speech_cache.sealing import Sealer
from engine.speech_cache.value import CachedSegment

log = logging.getLogger(__name__)

Answer = Callable[[CachedSegment | None], None]


@dataclass(frozen=True, slots=True)
class Address:
    """Where an entry lives in a store: its scope's label, its voice's label (keyed
    hashes, ``_`` for built-in voices) and its name (a keyed hash of its key)."""

    scope: str
    voice: str
    name: str


class SharedStore(Protocol):
    """A store of sealed entries by address; methods may raise."""

    name: str

    def get(self, address: Address) -> bytes | None: ...
    def contains(self, address: Address) -> bool: ...
    def set(self, address: Address, data: bytes) -> None: ...
    def delete(self, address: Address) -> None: ...
    def forget_voice(self, scope: str, voice: str) -> int: ...
    def purge_scope(self, scope: str) -> int: ...
    def usage(self) -> tuple[int, int, int]: ...  # entries, bytes, evictions
    def maintain(self, now: float) -> None: ...
    def close(self) -> None: ...


@dataclass(eq=False, slots=True)
class _Lookup:
    key: SegmentKey
    address: Address
    answer: Answer
    deadline: float
    finished: bool = False


@dataclass(eq=False, slots=True)
class _Probe:
    key: SegmentKey
    address: Address
    deadline: float
    found: bool = False
    ready: threading.Event = field(default_factory=threading.Event)


@dataclass(eq=False, slots=True)
class _Write:
    key: SegmentKey
    address: Address
    segment: CachedSegment
    size: int


@dataclass(eq=False, slots=True)
class _Forget:
    """Remove a voice's entries (``voice`` set) or a whole scope's (``voice`` None)."""

    scope: str
    voice: str | None
    done: bool = False
    ready: threading.Event = field(default_factory=threading.Event)


_STOP = object()


class SharedLevel:
    def __init__(
        self,
        store: SharedStore,
        sealer: Sealer,
        *,
        timeout_s: float,
        ttl_s: float = float("inf"),
        queue_items: int = 1024,
        queue_bytes: int = 64 * 1024 * 1024,
        errors_to_back_off: int = 3,
        back_off_s: float = 2.0,
        maintain_every_s: float = 30.0,
    ) -> None:
        self.store = store
        self.sealer = sealer
        self.timeout_s = timeout_s
        self.ttl_s = ttl_s
        self._grace_s = timeout_s / 2
        self._queue_bytes = queue_bytes
        self._errors_to_back_off = errors_to_back_off
        self._back_off_s = back_off_s
        self._maintain_every_s = maintain_every_s
        self.counts = LookupCounts()
        self._lock = threading.Lock()
        self._consecutive_errors = 0
        self._back_off_until = 0.0
        self._pending_bytes = 0
        self._closed = False
        self._lookups: queue.Queue[object] = queue.Queue(maxsize=queue_items)
        self._writes: queue.Queue[object] = queue.Queue(maxsize=queue_items)
        self._watch = threading.Condition(threading.Lock())
        self._watched: collections.deque[_Lookup] = collections.deque()
        self._threads = [
            threading.Thread(target=self._lookup_loop, name="speech-cache-lookup", daemon=True),
            threading.Thread(target=self._write_loop, name="speech-cache-write", daemon=True),
            threading.Thread(target=self._watch_loop, name="speech-cache-watchdog", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    # ------------------------------------------------------------------ callers

    def address(self, key: SegmentKey) -> Address:
        sealer = self.sealer
        return Address(
            sealer.label("scope", key.scope), sealer.label("voice", key.voice_digest),
            sealer.name(key),
        )  # fmt: skip

    def lookup(self, key: SegmentKey, answer: Answer) -> None:
        """Look ``key`` up; ``answer`` is called exactly once: from an I/O thread, or at
        once (synchronously) when the level is closed, backing off, or its queue is full."""
        now = time.monotonic()
        if self._closed or self._backing_off(now):
            self.counts.miss(key.backend, error=not self._closed)
            _call(answer, None)
            return
        job = _Lookup(key, self.address(key), answer, now + self.timeout_s)
        with self._watch:
            self._watched.append(job)
            if len(self._watched) == 1:
                self._watch.notify()
        try:
            self._lookups.put_nowait(job)
        except queue.Full:
            self._finish(job, None, error=True)

    def contains(self, key: SegmentKey) -> bool:
        """Whether the store holds ``key``, an entry that opens and has not expired;
        waits at most about the lookup timeout (False when it could not tell)."""
        if self._closed or self._backing_off(time.monotonic()):
            return False
        probe = _Probe(key, self.address(key), time.monotonic() + self.timeout_s)
        try:
            self._lookups.put_nowait(probe)
        except queue.Full:
            return False
        probe.ready.wait(self.timeout_s + self._grace_s)
        return probe.found

    def write(self, key: SegmentKey, segment: CachedSegment) -> None:
        """Queue a write; dropped (counted as an error) when the queue is full or the
        level is backing off. Never blocks."""
        if self._closed:
            return
        if self._backing_off(time.monotonic()):
            self.counts.error()
            return
        size = len(segment.pcm) + 64 * len(segment.words)
        with self._lock:
            if self._pending_bytes + size > self._queue_bytes:
                self.counts.error()
                return
            self._pending_bytes += size
        try:
            self._writes.put_nowait(_Write(key, self.address(key), segment, size))
        except queue.Full:
            with self._lock:
                self._pending_bytes -= size
            self.counts.error()

    def forget_voice(self, scope: str, voice_digest: str, wait_s: float = 5.0) -> bool:
        """Remove the voice's entries, after every write queued before (so none comes
        back); waits up to ``wait_s``. False when it failed or did not finish in time."""
        voice = self.sealer.label("voice", voice_digest)
        return self._forget(_Forget(self.sealer.label("scope", scope), voice), wait_s)

    def purge_scope(self, scope: str, wait_s: float = 30.0) -> bool:
        """Remove every entry of ``scope``, after every write queued before."""
        return self._forget(_Forget(self.sealer.label("scope", scope), None), wait_s)

    def _forget(self, job: _Forget, wait_s: float) -> bool:
        if self._closed:
            return False
        try:
            self._writes.put(job, timeout=wait_s)
        except queue.Full:
            self.counts.error()
            return False
        return job.ready.wait(wait_s) and job.done

    def stats(self) -> CacheLevelStats:
        hits, misses, errors = self.counts.snapshot()
        try:
            entries, size, evictions = self.store.usage()
        except Exception:
            entries = size = evictions = 0
        return CacheLevelStats(
            level="shared",
            store=self.store.name,
            hits=hits,
            misses=misses,
            entries=entries,
            bytes=size,
            evictions=evictions,
            errors=errors,
            rejected=self.counts.rejections,
        )

    def close(self, flush_s: float = 2.0) -> None:
        """Stop the threads; queued writes get up to ``flush_s`` to finish."""
        if self._closed:
            return
        self._closed = True
        with self._watch:
            self._watch.notify_all()
        for q in (self._lookups, self._writes):
            with contextlib.suppress(queue.Full):
                q.put(_STOP, timeout=flush_s)
        deadline = time.monotonic() + flush_s
        for thread in self._threads:
            thread.join(max(0.1, deadline - time.monotonic()))
            if thread.is_alive():
                log.warning("speech cache: %s did not stop within %.1f s", thread.name, flush_s)
        with self._watch:
            left = list(self._watched)
            self._watched.clear()
        for job in left:
            self._finish(job, None, error=False)
        with contextlib.suppress(Exception):
            self.store.close()

    # ------------------------------------------------------------------ failure state

    def _backing_off(self, now: float) -> bool:
        return now < self._back_off_until

    def _succeeded(self) -> None:
        with self._lock:
            if self._consecutive_errors >= self._errors_to_back_off:
                log.info("speech cache: the %s store answers again", self.store.name)
            self._consecutive_errors = 0

    def _failed(self, what: str, exc: BaseException | None) -> None:
        with self._lock:
            self._consecutive_errors += 1
            if self._consecutive_errors < self._errors_to_back_off:
                return
            first = self._consecutive_errors == self._errors_to_back_off
            self._back_off_until = time.monotonic() + self._back_off_s
        if first:
            log.warning(
                "speech cache: the %s store failed %d times (%s: %s); misses for %.1f s, "
                "then it is tried again",
                self.store.name,
                self._errors_to_back_off,
                what,
                exc if exc is not None else "timed out",
                self._back_off_s,
            )

    def _finish(self, job: _Lookup, segment: CachedSegment | None, *, error: bool) -> None:
        with self._lock:
            if job.finished:
                return
            job.finished = True
        if segment is not None:
            self.counts.hit(job.key.backend)
        else:
            self.counts.miss(job.key.backend, error=error)
        _call(job.answer, segment)

    # ------------------------------------------------------------------ threads

    def _lookup_loop(self) -> None:
        while True:
            job = self._lookups.get()
            if job is _STOP or self._closed:
                return
            if isinstance(job, _Lookup):
                self._serve_lookup(job)
            elif isinstance(job, _Probe):
                self._serve_probe(job)

    def _serve_lookup(self, job: _Lookup) -> None:
        if job.finished:
            return
        now = time.monotonic()
        if now >= job.deadline or self._backing_off(now):
            self._finish(job, None, error=True)
            return
        try:
            data = self.store.get(job.address)
        except Exception as exc:
            self._failed("lookup", exc)
            self._finish(job, None, error=True)
            return
        if job.finished:
            return  # the watchdog answered None and counted the failure
        self._succeeded()
        segment = self._open(job.address, data) if data is not None else None
        self._finish(job, segment, error=False)

    def _open(self, address: Address, data: bytes) -> CachedSegment | None:
        """The segment sealed in ``data``, or None (then the entry is deleted): failed
        authentication or decoding (counted ``rejected``), or expired."""
        try:
            written_at, payload = self.sealer.open(address.name, data)
            if time.time() - written_at > self.ttl_s:
                segment = None
            else:
                segment = CachedSegment.decode(payload)
        except ValueError as exc:
            log.warning("speech cache: rejecting a %s entry: %s", self.store.name, exc)
            self.counts.rejected()
            segment = None
        if segment is None:
            with contextlib.suppress(Exception):
                self.store.delete(address)
        return segment

    def _serve_probe(self, probe: _Probe) -> None:
        try:
            if time.monotonic() < probe.deadline:
                data = self.store.get(probe.address)
                self._succeeded()
                probe.found = data is not None and self._open(probe.address, data) is not None
        except Exception as exc:
            self._failed("probe", exc)
            self.counts.error()
        finally:
            probe.ready.set()

    def _write_loop(self) -> None:
        last_maintain = -float("inf")
        while True:
            now = time.monotonic()
            if now - last_maintain >= self._maintain_every_s:
                last_maintain = now
                self._maintain(now)
            try:
                job = self._writes.get(timeout=self._maintain_every_s)
            except queue.Empty:
                if self._closed:
                    return  # close() could not queue its stop: the queue is drained now
                continue
            if job is _STOP:
                return
            if isinstance(job, _Write):
                self._serve_write(job)
                self._maintain(time.monotonic())
            elif isinstance(job, _Forget):
                try:
                    if job.voice is None:
                        self.store.purge_scope(job.scope)
                    else:
                        self.store.forget_voice(job.scope, job.voice)
                except Exception as exc:
                    log.warning("speech cache: removing entries in %s: %s", self.store.name, exc)
                    self.counts.error()
                else:
                    job.done = True
                finally:
                    job.ready.set()

    def _serve_write(self, job: _Write) -> None:
        with self._lock:
            self._pending_bytes -= job.size
        if self._backing_off(time.monotonic()):
            self.counts.error()
            return
        try:
            data = self.sealer.seal(job.address.name, job.segment.encode())
        except ValueError:
            return  # too large to cache: not an error of the store
        try:
            self.store.set(job.address, data)
        except Exception as exc:
            self._failed("write", exc)
            self.counts.error()
        else:
            self._succeeded()

    def _maintain(self, now: float) -> None:
        try:
            self.store.maintain(now)
        except Exception as exc:
            log.warning("speech cache: %s maintenance failed: %s", self.store.name, exc)

    def _watch_loop(self) -> None:
        while True:
            expired: _Lookup | None = None
            with self._watch:
                if self._closed:
                    return
                while self._watched and self._watched[0].finished:
                    self._watched.popleft()
                if not self._watched:
                    self._watch.wait()
                    continue
                wait = self._watched[0].deadline + self._grace_s - time.monotonic()
                if wait > 0:
                    self._watch.wait(wait)
                    continue
                expired = self._watched.popleft()
            self._failed("lookup", None)
            self._finish(expired, None, error=True)


def _call(answer: Answer, segment: CachedSegment | None) -> None:
    try:
        answer(segment)
    except Exception:
        log.exception("speech cache: a lookup's callback failed")
