"""One load-generator process: an event loop (uvloop when installed) running a share of
the calls, talking to the parent over a pipe.

Conversation with the parent (:mod:`tests.bench.loadgen`), in order:

1. worker -> ``("ready", {"ready": n, "failed": m})`` once every call is set up or failed;
2. parent -> ``("go", t_go, t_end)`` (``time.monotonic()`` instants, which every process
   on the machine shares) or ``("stop",)``;
3. worker -> ``("progress", {...})`` every ``progress_s`` while calls run;
4. worker -> ``("result", {...})``: the :class:`Recorder` export and the worker's own
   CPU time inside the window ``[t_go, t_end]``.

Calls still speaking at ``t_end + drain_s`` are cancelled and counted as unfinished.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from tests.bench.calls import DRIVERS, CallDriver, CallSpec
from tests.bench.recorder import Recorder
from tests.bench.script import Behaviour, converse, open_call

CALLER_FRAME_S = 0.020


@dataclass(frozen=True)
class WorkerPlan:
    """A worker's share of the calls and how they behave (picklable)."""

    protocol: str
    calls: list[CallSpec]
    connect_delays_s: list[float]
    behaviour: Behaviour = field(default_factory=Behaviour)
    jitter_ms: float = 20.0
    drain_s: float = 10.0
    progress_s: float = 1.0
    seed: int = 0


def worker_main(plan: WorkerPlan, conn: Connection) -> None:
    """Process entry point."""
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    try:
        asyncio.run(_Worker(plan, conn).run())
    finally:
        conn.close()


class _Worker:
    def __init__(self, plan: WorkerPlan, conn: Connection) -> None:
        self.plan = plan
        self.conn = conn
        self.recorder = Recorder(jitter_s=plan.jitter_ms / 1000)
        self.rng = random.Random(plan.seed)
        driver_cls = DRIVERS[plan.protocol]
        self.drivers: list[CallDriver] = [driver_cls(spec, self.recorder) for spec in plan.calls]

    async def run(self) -> None:
        plan, rec = self.plan, self.recorder
        command = self._listen()
        opened = await asyncio.gather(
            *(
                open_call(d, delay)
                for d, delay in zip(self.drivers, plan.connect_delays_s, strict=True)
            )
        )
        live = [d for d, ok in zip(self.drivers, opened, strict=True) if ok]
        self.conn.send(("ready", {"ready": rec.sessions_ready, "failed": rec.sessions_failed}))
        message = await command
        cpu: dict[str, float] = {}
        if message[0] == "go":
            _, t_go, t_end = message
            cpu = await self._speak(live, t_go, t_end)
            rec.calls_completed = sum(1 for d in live if d.completed)
        await self._close_all()
        self.conn.send(("result", {"recorder": rec.export(), "cpu": cpu}))

    def _listen(self) -> asyncio.Future[tuple[Any, ...]]:
        """The parent's next command, read by a helper thread.

        Not ``loop.add_reader``: uvloop makes a watched descriptor non-blocking, and the
        large result sent over the same pipe would then fail with EAGAIN.
        """

        def receive() -> tuple[Any, ...]:
            try:
                message: tuple[Any, ...] = self.conn.recv()
            except (EOFError, OSError):
                return ("stop",)
            return message

        return asyncio.get_running_loop().run_in_executor(None, receive)

    async def _speak(self, live: list[CallDriver], t_go: float, t_end: float) -> dict[str, float]:
        plan = self.plan
        await asyncio.sleep(max(0.0, t_go - time.monotonic()))
        cpu_go = os.times()
        tasks = [
            asyncio.create_task(
                converse(d, plan.behaviour, t_end, random.Random(self.rng.random()))
            )
            for d in live
        ]
        helpers = [asyncio.create_task(self._report_progress())]
        if any(d.spec.caller_audio for d in live):
            helpers.append(asyncio.create_task(self._caller_audio(live)))
        if tasks:  # the window ends at t_end, or earlier when every call is done
            await asyncio.wait(tasks, timeout=max(0.0, t_end - time.monotonic()))
        else:
            await asyncio.sleep(max(0.0, t_end - time.monotonic()))
        cpu_end = os.times()
        pending = [t for t in tasks if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=max(0.0, t_end + plan.drain_s - time.monotonic()))
        for task in [*tasks, *helpers]:
            task.cancel()
        await asyncio.gather(*tasks, *helpers, return_exceptions=True)
        user = cpu_end.user - cpu_go.user
        system = cpu_end.system - cpu_go.system
        return {"window_s": user + system, "user_s": user, "system_s": system}

    async def _report_progress(self) -> None:
        while True:
            await asyncio.sleep(self.plan.progress_s)
            try:
                self.conn.send(("progress", self.recorder.progress()))
            except OSError:  # the parent is gone: nobody will read the result
                os._exit(3)

    async def _caller_audio(self, live: list[CallDriver]) -> None:
        """One clock for every call of this worker: a silence frame each 20 ms."""
        next_at = time.monotonic()
        while True:
            for driver in live:
                driver.send_caller_audio()
            next_at += CALLER_FRAME_S
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    async def _close_all(self) -> None:
        await asyncio.gather(*(d.close() for d in self.drivers), return_exceptions=True)
