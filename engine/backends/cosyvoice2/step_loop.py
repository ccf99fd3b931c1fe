"""Continuous batching: streams join the running decode loop at its next step.

The engine's scheduler hands a batch backend its segments through
``synthesize_batch`` calls on up to ``threads`` worker threads. For an autoregressive
model, a batch fixed when a call starts would make a new utterance wait until every stream
of the running batch has finished (seconds). Instead every call adds its streams to one
:class:`StepLoop` and waits: one of the waiting threads at a time (the *driver*) runs steps
over every stream of every call, so a segment handed over now is in the next step. The
driver drives until its own streams are done, then hands the role to another waiting call.
A call returns as soon as its own streams are finished (or cancelled); a step that raises
fails every stream it held (their calls raise it), and the loop goes on for calls that
join later.

Sans model: the loop knows streams only through :class:`LoopStream` and the step function
it is given, so it is tested without one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol


class LoopStream(Protocol):
    finished: bool


Step = Callable[[Sequence[LoopStream]], None]


@dataclass(eq=False)
class _Call:
    streams: Sequence[LoopStream]
    error: BaseException | None = None

    def finished(self) -> bool:
        return self.error is not None or all(s.finished for s in self.streams)


class StepLoop:
    """See the module docstring. ``step`` advances the given unfinished streams by one
    step (setting ``finished`` on those that end); it runs on one thread at a time."""

    def __init__(self, step: Step) -> None:
        self._step = step
        self._cond = threading.Condition()
        self._calls: list[_Call] = []
        self._driver: _Call | None = None
        self.steps = 0  # steps run (a metric for tests and logs)
        self.widest = 0  # the most streams one step advanced

    def active_streams(self) -> int:
        with self._cond:
            return sum(1 for call in self._calls for s in call.streams if not s.finished)

    def run(self, streams: Sequence[LoopStream]) -> None:
        """Add ``streams`` and return when all are finished; raises what failed them."""
        call = _Call(streams)
        with self._cond:
            self._calls.append(call)
            while not call.finished() and self._driver is not None:
                self._cond.wait()
            if not call.finished():
                self._driver = call
        try:
            if self._driver is call:
                self._drive(call)
        finally:
            with self._cond:
                if self._driver is call:
                    self._driver = None
                self._calls.remove(call)
                self._cond.notify_all()
        if call.error is not None:
            raise call.error

    def _drive(self, own: _Call) -> None:
        while not own.finished():
            with self._cond:
                calls = [c for c in self._calls if not c.finished()]
            streams = [s for c in calls for s in c.streams if not s.finished]
            self.widest = max(self.widest, len(streams))
            try:
                self._step(streams)
            except Exception as exc:
                with self._cond:
                    for failed in calls:
                        failed.error = exc
                    self._cond.notify_all()
                return
            self.steps += 1
            if any(c.finished() for c in calls if c is not own):
                with self._cond:  # wake the calls whose streams ended in this step
                    self._cond.notify_all()
