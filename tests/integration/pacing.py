"""What "on time" means for realtime audio, measured where the caller is.

A telephone receiver plays frame k at ``t0 + k * 20 ms`` once the first frame arrives at
``t0``. The gateway sends each frame up to its lead (``GATEWAY_REALTIME_LEAD_MS``, 60 ms)
early, so a frame is on time if it arrives no later than that playout instant: a short
stall anywhere on the path (the gateway, the kernel, this test process) is absorbed by the
lead and is not heard. A frame that arrives after it should have started playing is a
gap the caller hears. The receiver never has to hold more than the lead either.
"""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
import numpy.typing as npt

from tests.bench.procstat import MachineTimes

FRAME_S = 0.020
LEAD_S = 0.060
# Our own clock and scheduling at the client, for the run-ahead bound only.
CLIENT_ALLOWANCE_S = 0.015


def lateness(times: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Seconds each frame arrived after its playout instant (negative: early)."""
    late: npt.NDArray[np.float64] = (times - times[0]) - np.arange(len(times)) * FRAME_S
    return late


def assert_on_time(times: npt.NDArray[np.float64], audio_ms: float, context: object = None) -> None:
    """Every frame of ``audio_ms`` of audio arrived, none after its playout instant, none
    earlier than the lead allows, and the average rate is one frame per 20 ms."""
    assert abs(len(times) * 20 - audio_ms) <= 20, (len(times), audio_ms)
    late = lateness(times)
    worst = int(late.argmax())
    assert late.max() <= 0.0, f"frame {worst} was {late.max() * 1000:.1f} ms late ({context})"
    assert -late.min() <= LEAD_S + CLIENT_ALLOWANCE_S, f"ran ahead {-late.min() * 1000:.1f} ms"
    assert abs(np.diff(times).mean() - FRAME_S) < 0.001


class LoopStallWatch:
    """The longest time this test's own event loop could not run (a garbage collection,
    the machine's scheduler), measured while the block runs: a frame stamped late by such
    a stall was late at this receiver, not at the gateway. Reported with a lateness
    failure so that it says where the time went; it excuses nothing."""

    TICK_S = 0.005

    def __init__(self) -> None:
        self.worst_s = 0.0
        # The hypervisor's steal meanwhile, in percent of one core (a noisy neighbour).
        self.steal_pct: float | None = None
        self._machine_at_start = MachineTimes.read()  # made at the block's start
        self._task: asyncio.Task[None] | None = None

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(self.TICK_S)
            self.worst_s = max(self.worst_s, loop.time() - before - self.TICK_S)

    async def __aenter__(self) -> LoopStallWatch:
        self._task = asyncio.create_task(self._watch())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.steal_pct = MachineTimes.read().steal_pct_since(self._machine_at_start)
