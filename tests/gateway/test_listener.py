"""The listener's guards (gateway/listener.py): the write-stall watch, and what it relies on
in aiohttp."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from aiohttp import web

from gateway.listener import StallWatch
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
