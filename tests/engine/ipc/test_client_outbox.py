"""The engine client writes what one turn of the event loop sent in one write."""

from __future__ import annotations

import asyncio

from engine.ipc.client import EngineClient
from engine.ipc.schema import FrameDecoder, Ping


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closing


async def test_messages_of_one_turn_go_out_in_one_write_in_order() -> None:
    client = EngineClient("test")
    transport = _Transport()
    client.connection_made(transport)  # type: ignore[arg-type]
    for seq in (1, 2, 3):
        client.send(Ping(seq=seq))
    assert transport.writes == []  # not yet: at the end of this turn
    await asyncio.sleep(0)
    assert len(transport.writes) == 1
    messages = FrameDecoder("to_engine").feed(transport.writes[0])
    assert [m.seq for m in messages if isinstance(m, Ping)] == [1, 2, 3]
    client.send(Ping(seq=4))
    await asyncio.sleep(0)
    assert len(transport.writes) == 2


async def test_nothing_is_written_to_a_closing_transport() -> None:
    client = EngineClient("test")
    transport = _Transport()
    client.connection_made(transport)  # type: ignore[arg-type]
    client.send(Ping(seq=1))
    transport.closing = True
    await asyncio.sleep(0)
    assert transport.writes == []
