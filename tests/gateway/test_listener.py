"""The listener's guards (gateway/listener.py): the write-stall watch, and what it relies on
in aiohttp."""

from __future__ import annotations

import asyncio
import socket
from typing import Any, cast

from aiohttp import web

from gateway.listener import ConnectionGuard, GuardedSite, StallWatch
from gateway.metrics import GatewayMetrics


class FakeTransport:
    def __init__(self, size: int = 0) -> None:
        self.size = size
        self.aborted = False

    def get_write_buffer_size(self) -> int:
        return self.size

    def abort(self) -> None:
        self.aborted = True


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def watch(transports: list[FakeTransport], clock: Clock, stall_s: float = 10.0) -> StallWatch:
    return StallWatch(
        lambda: cast(list[asyncio.BaseTransport], transports),
        stall_s,
        GatewayMetrics(),
        clock=clock,
    )


def test_a_buffer_that_never_shrinks_is_aborted_after_the_stall_time() -> None:
    clock = Clock()
    stuck, growing, idle = FakeTransport(1000), FakeTransport(10), FakeTransport(0)
    w = watch([stuck, growing, idle], clock)
    for second in range(11):
        clock.now = float(second)
        growing.size += 100  # a peer that reads nothing while we keep writing
        aborted = w.check()
        assert aborted == (2 if second == 10 else 0)
    assert stuck.aborted and growing.aborted and not idle.aborted


def test_a_peer_that_reads_slowly_is_kept() -> None:
    clock = Clock()
    slow = FakeTransport(300_000)
    w = watch([slow], clock)
    for second in range(60):
        clock.now = float(second)
        slow.size += -5_000 if second % 5 == 0 else 1_000  # it reads now and then
        w.check()
    assert not slow.aborted


def test_the_clock_restarts_when_the_buffer_empties() -> None:
    clock = Clock()
    t = FakeTransport(10)
    w = watch([t], clock, stall_s=3)
    for second, size in enumerate([10, 10, 0, 10, 10, 10]):
        clock.now = float(second)
        t.size = size
        w.check()
    assert not t.aborted  # non-empty at 3, 4, 5: two seconds, not three
    clock.now = 6.0
    w.check()
    assert t.aborted


async def test_aiohttp_keeps_a_closing_transport_in_its_server_table() -> None:
    # gateway.listener watches Server._connections: a closing connection's handler no
    # longer knows its transport, the table does. An aiohttp that changes this fails here.
    server = web.Server(lambda request: cast(Any, None))
    assert isinstance(server._connections, dict)


async def test_one_cap_over_two_listeners() -> None:
    """The public port and the relay listener (each its own runner) share the cap: two
    connections open on one and one on the other fill a cap of 3 for both."""

    async def hello(_request: web.Request) -> web.Response:
        return web.Response(text="hello")

    runners = []
    for _ in range(2):
        app = web.Application()
        app.router.add_get("/", hello)
        runner = web.AppRunner(app, keepalive_timeout=30)
        await runner.setup()
        runners.append(runner)
    guard = ConnectionGuard(max_connections=3, send_stall_s=10, metrics=GatewayMetrics())
    ports = []
    for runner in runners:
        guard.guard(runner)
        sock = socket.create_server(("127.0.0.1", 0))
        ports.append(sock.getsockname()[1])
        await GuardedSite(runner, guard, sock=sock).start()
    guard.start()
    opened: list[asyncio.StreamWriter] = []
    try:

        async def answer(port: int) -> bytes:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            opened.append(writer)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            return await asyncio.wait_for(reader.read(1024), 5)

        for port in (ports[0], ports[0], ports[1]):
            assert (await answer(port)).startswith(b"HTTP/1.1 200 ")  # kept alive: open
        assert guard.open_connections() == 3
        for port in ports:
            refused = await answer(port)
            assert refused.startswith(b"HTTP/1.1 503 ") and b"too_many_connections" in refused
    finally:
        for writer in opened:
            writer.close()
        await guard.stop()
        for runner in runners:
            await runner.cleanup()
