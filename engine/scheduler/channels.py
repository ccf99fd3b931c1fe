"""Channels into the coordinator thread: commands from the server's event loop and
results from the lanes' workers travel apart, and a put on either wakes the coordinator
(one event for both, so it can wait on the two at once)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Wakeup:
    """Set by every put; the coordinator waits on it, then drains its channels."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def wait(self, timeout: float) -> None:
        """Return when something was put since the last wait, or after ``timeout``; the
        caller then drains every channel (a put during the drain wakes the next wait)."""
        self._event.wait(timeout)
        self._event.clear()

    def is_set(self) -> bool:
        """Something was put since the last wait or clear."""
        return self._event.is_set()

    def clear(self) -> None:
        """Forget the puts so far: the caller drains every channel next."""
        self._event.clear()


class Channel(Generic[T]):
    """Many writers, one reader (the coordinator)."""

    def __init__(self, wakeup: Wakeup) -> None:
        self._queue: queue.SimpleQueue[T] = queue.SimpleQueue()
        self._wakeup = wakeup

    def put(self, item: T) -> None:
        self._queue.put(item)
        self._wakeup.set()

    def drain(self) -> Iterator[T]:
        """What was put so far (and anything put while it is being drained)."""
        while True:
            try:
                yield self._queue.get_nowait()
            except queue.Empty:
                return
