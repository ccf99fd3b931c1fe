"""Every connection of one gateway worker, from its upgrade until its teardown is done;
and the graceful drain at shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from gateway.errors import CloseCode, ErrorCode, SessionError
from gateway.session import Session, SessionState

log = logging.getLogger(__name__)
TEARDOWN_WAIT_S = 5.0  # at shutdown, for teardowns still running
CLOSE_FRAMES_WAIT_S = 2.0  # after the drain, for the close frames to go out


def shutting_down() -> SessionError:
    """What a session is told when this instance goes away: connect again elsewhere."""
    return SessionError(
        ErrorCode.SHUTTING_DOWN,
        "this gateway instance is shutting down; connect again",
        CloseCode.TRY_AGAIN_LATER,
        retry_after_ms=0,
    )


class Connection(Protocol):
    """What the drain needs of a connection (gateway/protocols/base.py)."""

    session: Session

    @property
    def established(self) -> bool:
        """Started, or attached to a call: past the start phase."""
        ...


class Connections:
    def __init__(self) -> None:
        self.live: set[Connection] = set()  # every open connection
        self.draining = False  # shutting down: no new sessions, calls in progress finish
        self._drained = asyncio.Event()
        self._owned: set[asyncio.Future[None]] = set()

    def track(self, connection: Connection) -> None:
        """A connection is served (from the upgrade until its teardown is done)."""
        self.live.add(connection)

    def untrack(self, connection: Connection) -> None:
        self.live.discard(connection)
        if not self.live:
            self._drained.set()

    def own(self, task: asyncio.Future[None]) -> None:
        """Keep ``task`` (a connection's teardown) until it finishes; :meth:`close`
        awaits what is left."""
        self._owned.add(task)
        task.add_done_callback(self._owned.discard)

    async def close(self) -> None:
        """Wait for the teardowns still running (at shutdown, after the drain)."""
        if self._owned:
            await asyncio.wait(list(self._owned), timeout=TEARDOWN_WAIT_S)

    async def drain(self, timeout_s: float) -> int:
        """Graceful shutdown: refuse new sessions, let those in progress finish for up to
        ``timeout_s``, then end the rest with ``shutting_down`` (1013: a client connects
        again, to another instance). Connections that never started are told at once (an
        application attached to a call is established: it goes on driving its call).
        Returns how many had to be ended at the timeout."""
        self.draining = True
        for connection in list(self.live):
            if not connection.established:
                connection.session.fail(shutting_down())
        log.info("draining: %d session(s) in progress, up to %.0f s", len(self.live), timeout_s)
        if self.live:
            self._drained.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self._drained.wait()
        remaining = [c.session for c in self.live if c.session.state is not SessionState.CLOSED]
        for session in remaining:
            session.fail(shutting_down())
        if self.live:
            if remaining:
                log.warning("draining: ended %d session(s) still open", len(remaining))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CLOSE_FRAMES_WAIT_S):
                    await self._drained.wait()
        return len(remaining)
