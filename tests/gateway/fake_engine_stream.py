"""An engine stream without an engine, for tests of the gateway's connection and leg code:
real rings (nothing writes audio unless the test does), a cancel the engine confirms at
once, and a close that is counted."""

from __future__ import annotations

import asyncio

from engine.ipc.ring import SpscRing


class FakeStream:
    def __init__(self) -> None:
        self.outbound = SpscRing.create(bytearray(SpscRing.region_size(65536)), 65536)
        self.inbound = SpscRing.create(bytearray(SpscRing.region_size(65536)), 65536)
        self.boundaries = SpscRing.create(bytearray(SpscRing.region_size(4096)), 4096)
        self.closed = 0

    def speak(
        self,
        utterance: int,
        text: str,
        *,
        final: bool,
        release: bool = False,
        instruct: str | None = None,
        retain: bool | None = None,
    ) -> None:
        pass

    def cancel_utterance(self, utterance: int) -> None:
        pass

    def request_cancel(self, timeout: float = 2.0) -> asyncio.Future[int]:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        future.set_result(self.outbound.write_pos)
        return future

    async def close(self, timeout: float = 2.0) -> None:
        self.closed += 1
