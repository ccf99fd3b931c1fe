"""The connection lifecycle's teardown under races: whatever ends a connection while its
session starts or while it is being released, nothing stays held."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import cast

from aiohttp import WSMessage, WSMsgType

from gateway.auth import mint_token
from gateway.connections import shutting_down
from gateway.protocols.native import NativeConnection
from gateway.session import Session, SessionState
from gateway.state import GatewayState
from gateway.wsframe import FrameWriter
from tests.gateway.fake_engine_stream import FakeStream
from tests.gateway.protocols.test_connection_fuzz import (
    SECRET,
    FakeEngine,
    FakeTransport,
    make_state,
)

START = WSMessage(
    WSMsgType.TEXT, json.dumps({"type": "start", "voice": "en-us", "format": "mulaw_8000"}), None
)


class OpenWebSocket:
    """Hands out ``frames``, then waits like a peer that stays connected and quiet."""

    def __init__(self, frames: list[WSMessage]) -> None:
        self._frames = list(frames)
        self.closed = False
        self.close_code: int | None = None

    async def receive(self, timeout: float | None = None) -> WSMessage:
        await asyncio.sleep(0)
        if self._frames:
            return self._frames.pop(0)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def close(self, *, code: int = 1000, message: bytes = b"") -> bool:
        self.closed, self.close_code = True, code
        return True


def connection(tmp_path: Path) -> tuple[NativeConnection, OpenWebSocket, FakeEngine]:
    state, engine = make_state(tmp_path)
    ws = OpenWebSocket([START])
    conn = NativeConnection(ws, FrameWriter(FakeTransport()), state)  # type: ignore[arg-type]
    conn.authenticate(mint_token(secret=SECRET, subject="x", tenant="t"))
    return conn, ws, engine


def state_of(conn: NativeConnection) -> GatewayState:
    """The worker state the test built (the connection sees it as a narrow context)."""
    return cast(GatewayState, conn._state)


def assert_released(conn: NativeConnection, engine: FakeEngine) -> None:
    state = state_of(conn)
    assert conn.session.state is SessionState.CLOSED
    assert state.limits.held == 0 and state.limits.leases.local_count("t") == 0
    assert all(stream.closed == 1 for stream in engine.streams)
    assert state.pacer.active_count == 0 and not state.connections.live


async def test_ended_while_the_lease_is_being_acquired(tmp_path: Path) -> None:
    conn, _ws, engine = connection(tmp_path)
    limits = state_of(conn).limits
    acquire = limits.acquire_lease

    async def slow_acquire(session: Session) -> None:
        await asyncio.sleep(0.1)  # a Redis round trip
        await acquire(session)

    limits.acquire_lease = slow_acquire  # type: ignore[method-assign]
    run = asyncio.create_task(conn.run())
    await asyncio.sleep(0.05)
    conn._token_expired()  # the session ends while start awaits the lease
    await run
    await conn._state.connections.close()
    assert_released(conn, engine)


async def test_ended_while_the_engine_opens_the_stream(tmp_path: Path) -> None:
    conn, ws, engine = connection(tmp_path)
    gate = asyncio.Event()
    opened: list[FakeStream] = []
    open_stream = engine.open_stream

    async def slow_open(**kwargs: object) -> FakeStream:
        await gate.wait()
        stream = await open_stream(**kwargs)
        opened.append(stream)
        return stream

    engine.open_stream = slow_open  # type: ignore[method-assign]
    run = asyncio.create_task(conn.run())
    await asyncio.sleep(0.05)
    conn._token_expired()
    await asyncio.wait_for(run, 5)  # the start is cancelled, not waited for
    gate.set()
    await asyncio.sleep(0.01)
    assert ws.close_code == 1008 and opened == []  # cancelled before the engine answered
    assert_released(conn, engine)


async def test_the_handler_cancelled_during_the_release_still_closes_the_stream(
    tmp_path: Path,
) -> None:
    conn, _ws, engine = connection(tmp_path)
    limits = state_of(conn).limits
    release = limits.release_lease

    async def slow_release(session: Session) -> None:
        await asyncio.sleep(0.2)  # a Redis round trip
        await release(session)

    limits.release_lease = slow_release  # type: ignore[method-assign]
    run = asyncio.create_task(conn.run())
    await asyncio.sleep(0.05)
    assert conn.session.state is SessionState.ACTIVE
    conn.session.fail(shutting_down())  # the drain ran out
    await asyncio.sleep(0.05)  # the teardown is now releasing the lease
    run.cancel()  # aiohttp cancels handlers at shutdown
    await asyncio.wait([run])
    await conn._state.connections.close()  # the teardown went on, owned
    assert_released(conn, engine)
