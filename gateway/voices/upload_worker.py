"""Decoding uploaded reference audio in worker processes, never in the gateway's own.

:func:`gateway.voices.reference_audio.process_reference` is CPU-bound (numpy, libsndfile,
libsoxr) and holds the GIL for much of its work: run in a thread of the gateway it
starves the event loop that paces every call's audio. :class:`UploadWorkers` runs it in a
:class:`~concurrent.futures.ProcessPoolExecutor` instead:

* processes come from a **forkserver** (never a fork of the gateway, whose threads,
  sockets and shared-memory rings a child must not inherit) that has already imported
  this module, so numpy, soundfile and soxr are loaded once, not per worker;
* each worker handles at most :data:`MAX_TASKS_PER_CHILD` uploads and is then replaced,
  so what decoding leaves in a worker's heap is given back to the system;
* everything the pool starts runs at a lower CPU priority (nice :data:`WORKER_NICE`):
  when cores are scarce the gateway and the engine, which pace real-time audio, get them
  first. The forkserver itself (which imports numpy when it starts) is started from a
  thread of ours that runs at that priority, and on Linux a process inherits the nice
  value of the thread that starts it; each worker sets it again, for other systems;
* the pool is created at the first upload, not at start-up, and :meth:`UploadWorkers.close`
  shuts it down (the application's cleanup);
* the worker is handed a **path**, not the bytes: the upload is spooled to a temporary
  file by the caller, and the result (normalized 16 kHz PCM, at most about 1 MB) is
  the only large object that comes back.

The gateway's event loop never waits on the pool: creating it, starting processes,
submitting work and shutting down happen in that thread; results arrive as awaitables.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypeVar

from gateway.voices.reference_audio import (
    MAX_UPLOAD_BYTES,
    ReferenceAudio,
    ReferenceAudioError,
    RejectionCode,
    process_reference,
)

__all__ = ["MAX_TASKS_PER_CHILD", "WORKER_NICE", "UploadWorkerError", "UploadWorkers"]

log = logging.getLogger(__name__)
MAX_TASKS_PER_CHILD: Final = 8
CLOSE_WAIT_S: Final = 5.0  # at shutdown, for jobs still running, before killing them
WORKER_NICE: Final = 10  # the nice value of the pool's processes (0 is the default)
START_METHOD: Final = "forkserver"

T = TypeVar("T")


class UploadWorkerError(Exception):
    """The pool could not process the upload (a worker died, or the pool is closed).

    Not the upload's fault as far as anyone can tell: the client may try again.
    """


@dataclass(frozen=True, slots=True)
class _Rejected:
    """A :class:`ReferenceAudioError` on its way back from a worker.

    (The exception itself does not survive pickling: its constructor takes two
    arguments and it passes one to ``Exception``.)
    """

    code: RejectionCode
    message: str


def _lower_priority() -> None:
    """Give the calling thread (on Linux; elsewhere the process) nice ``WORKER_NICE``,
    unless it is already lower. Processes it starts from then on inherit it."""
    current = os.getpriority(os.PRIO_PROCESS, 0)
    os.setpriority(os.PRIO_PROCESS, 0, max(current, WORKER_NICE))


def _init_worker() -> None:
    """In each worker process, once: lower the priority, leave ^C to the gateway."""
    _lower_priority()
    # A ^C in a terminal reaches the whole process group; the gateway shuts the pool
    # down itself, a worker must not die of it half-way.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _process_file(path: str) -> ReferenceAudio | _Rejected:
    """In a worker: :func:`process_reference` of the file at ``path`` (read, not removed).

    Reads at most one byte more than :data:`MAX_UPLOAD_BYTES`, so an oversized file is
    refused as ``audio_too_large`` without being read in full.
    """
    with open(path, "rb") as f:
        data = f.read(MAX_UPLOAD_BYTES + 1)
    try:
        return process_reference(data)
    except ReferenceAudioError as exc:
        return _Rejected(exc.code, exc.message)


class UploadWorkers:
    """A lazily started pool of ``workers`` processes that run :func:`process_reference`.

    One instance per gateway worker process; its coroutines are called from that
    process's event loop. The pool itself is created, used and shut down only in one
    thread of its own (the "spawner", at the pool's priority), so creating it, starting
    its processes and waiting for them never happen in the event loop's thread. Not a
    bound on concurrency: callers limit how many uploads they submit (work beyond
    ``workers`` waits in the pool's queue).
    """

    def __init__(self, workers: int, *, max_tasks_per_child: int = MAX_TASKS_PER_CHILD) -> None:
        if workers < 1 or max_tasks_per_child < 1:
            raise ValueError("workers and max_tasks_per_child must be at least 1")
        self.workers = workers
        self.max_tasks_per_child = max_tasks_per_child
        self._executor: ProcessPoolExecutor | None = None  # only touched by the spawner
        self._spawner = ThreadPoolExecutor(  # its thread starts at the first upload
            max_workers=1, thread_name_prefix="upload-spawner", initializer=_lower_priority
        )
        self._closed = False

    def _submit(self, path: str) -> tuple[ProcessPoolExecutor, Future[ReferenceAudio | _Rejected]]:
        """(In the spawner.) The pool, created on first use (or again, when found broken
        now), and the job submitted to it.

        Creating the pool starts the multiprocessing resource tracker; the first submit
        starts the forkserver (which imports this module, so numpy) and a worker.
        """
        if self._executor is not None:
            try:
                return self._executor, self._executor.submit(_process_file, path)
            except BrokenProcessPool:
                self._shut_down(self._executor)
        context = multiprocessing.get_context(START_METHOD)
        context.set_forkserver_preload([__name__])  # used when the forkserver starts
        self._executor = ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=context,
            initializer=_init_worker,
            max_tasks_per_child=self.max_tasks_per_child,
        )
        return self._executor, self._executor.submit(_process_file, path)

    def _shut_down(self, executor: ProcessPoolExecutor | None, *, kill: bool = False) -> None:
        """(In the spawner.) Shut ``executor`` (None: the current pool) down, waiting for
        its processes (killing them first with ``kill``); the next submit starts a new
        pool."""
        if executor is None or executor is self._executor:
            executor, self._executor = self._executor, None
        if executor is None:
            return
        if kill:
            # concurrent.futures has no public way to stop a running job; its process
            # table is the only handle on the workers (children of the forkserver).
            for process in list((getattr(executor, "_processes", None) or {}).values()):
                with contextlib.suppress(Exception):
                    process.kill()
        executor.shutdown(wait=True, cancel_futures=True)

    async def _in_spawner(self, call: Callable[[], T]) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._spawner, call)
        except RuntimeError as exc:
            if self._closed:  # after close(): the spawner is shut down too
                raise UploadWorkerError("the upload workers are shut down") from exc
            raise

    async def process(self, path: Path) -> ReferenceAudio:
        """Normalized reference audio from the uploaded file at ``path``.

        The file must stay in place until this returns; it is read, never removed.
        Raises :class:`ReferenceAudioError` (the upload's fault: ``code`` and
        ``message`` are for the client) or :class:`UploadWorkerError`. Cancelling
        stops waiting; work a worker has already begun runs to its end, unobserved.
        """
        if self._closed:
            raise UploadWorkerError("the upload workers are shut down")
        name = os.fspath(path)
        executor, submitted = await self._in_spawner(lambda: self._submit(name))
        try:
            outcome = await asyncio.wrap_future(submitted)
        except BrokenProcessPool as exc:  # a worker died: no later job may use this pool
            await self._in_spawner(lambda: self._shut_down(executor))
            raise UploadWorkerError("an upload worker process died") from exc
        if isinstance(outcome, _Rejected):
            raise ReferenceAudioError(outcome.code, outcome.message)
        return outcome

    async def close(self) -> None:
        """Shut the pool down: queued work is cancelled, running work is waited for.

        Idempotent; afterwards :meth:`process` raises :class:`UploadWorkerError`.
        """
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        executor = self._executor
        try:
            async with asyncio.timeout(CLOSE_WAIT_S):
                await loop.run_in_executor(self._spawner, lambda: self._shut_down(executor))
        except TimeoutError:  # a job still running: do not hold up the shutdown for it
            log.warning("upload workers still busy after %.0f s: killing them", CLOSE_WAIT_S)
            await loop.run_in_executor(None, lambda: self._shut_down(executor, kill=True))
        self._spawner.shutdown(wait=True)
