"""The AudioSocket listener of one gateway worker: a TCP server Asterisk connects to, one
connection per call.

AudioSocket carries no credentials, so trust is by source network
(``GATEWAY_AUDIOSOCKET_ALLOW``, each network naming the tenant its calls are billed to).
A connection is closed at once, before anything is allocated for it and counted in
``gateway_audiosocket_connections_refused_total``, when it comes from anywhere else
(``untrusted``), when ``GATEWAY_AUDIOSOCKET_MAX_CALLS`` connections are open (``limit``)
or when the worker is draining (``draining``). A trusted connection must then send its
UUID within ``uuid_timeout_s`` (5 s; Asterisk sends it first, at once): otherwise it is
closed (``uuid_timeout``), as is one whose first message is anything else or that closes
first (``bad_start``). Only then is a call leg
(:class:`gateway.legs.audiosocket.leg.AudioSocketLeg`) made for it.

Every connection is a task this listener owns; :meth:`AudioSocketListener.stop` stops
accepting, hangs up every call (a terminate message, then the close) and waits for them,
bounded. A connection whose peer reads nothing of what we write for
``GATEWAY_SEND_STALL_S`` is aborted (:class:`gateway.listener.StallWatch`, counted in
``gateway_connections_aborted_total{reason="write_stall"}``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from gateway.context import LegContext
from gateway.legs.audiosocket.config import AudioSocketSettings, tenant_for
from gateway.legs.audiosocket.leg import MAX_PAYLOAD_BYTES, READ_BYTES, AudioSocketLeg
from gateway.legs.audiosocket.metrics import AudioSocketMetrics
from gateway.listener import StallWatch
from gateway.peer_log import PeerLog
from telephony.audiosocket import (
    AudioSocketConnection,
    AudioSocketEvent,
    AudioSocketProtocolError,
)

log = logging.getLogger(__name__)
STOP_WAIT_S = 5.0  # at stop: for the calls' teardowns
CANCEL_WAIT_S = 2.0  # at stop: for the connections still running after that, cancelled

__all__ = ["AudioSocketListener"]


class AudioSocketListener:
    def __init__(self, state: LegContext, settings: AudioSocketSettings) -> None:
        self._state = state
        self.settings = settings
        self.metrics = AudioSocketMetrics(state.metrics.registry)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()  # every connection served
        self._waiting: set[asyncio.StreamWriter] = set()  # those still before their UUID
        self._legs: set[AudioSocketLeg] = set()
        self._stopping = False
        self._refusals = PeerLog(log, "audiosocket listener")
        self._stall = StallWatch(
            lambda: [w.transport for w in self._writers],
            state.settings.send_stall_s,
            state.metrics,
        )
        self._stall_task: asyncio.Task[None] | None = None
        self.port = 0

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        host, port = self.settings.listen
        self._server = await asyncio.start_server(self._accept, host, port)
        sockets = self._server.sockets
        self.port = int(sockets[0].getsockname()[1]) if sockets else port
        self._stall_task = asyncio.create_task(self._stall.run(), name="audiosocket-stall-watch")
        log.info("audiosocket: listening on tcp %s:%d", host, self.port)

    def describe(self) -> str:
        address = f"{self.settings.listen[0]}:{self.port}"
        return f"AudioSocket: {address} (TCP, for Asterisk's AudioSocket)"

    async def stop(self) -> None:
        """Stop accepting, end every call (a terminate, then the close), close the
        connections still waiting for their UUID, and wait for all of them (bounded)."""
        self._stopping = True
        server = self._server
        if server is not None:
            server.close()
        for leg in list(self._legs):
            leg.hangup()
        for writer in list(self._waiting):
            writer.transport.close()  # the read waiting for the UUID ends
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=STOP_WAIT_S)
        for task in list(self._tasks):  # still running: give up on them
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=CANCEL_WAIT_S)
        if self._stall_task is not None:
            self._stall_task.cancel()
            await asyncio.wait([self._stall_task])
            self._stall_task = None
        if server is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CANCEL_WAIT_S):
                    await server.wait_closed()

    @property
    def calls(self) -> int:
        return len(self._legs)

    @property
    def connections(self) -> int:
        return len(self._writers)

    # --- connections ---------------------------------------------------------------------------

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A new connection (a plain callback: the task that serves it is ours)."""
        peer = writer.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        tenant = tenant_for(self.settings.allow, host)
        if tenant is None:
            reason = "untrusted"
        elif self._stopping or self._state.connections.draining:
            reason = "draining"
        elif len(self._writers) >= self.settings.max_calls:
            reason = "limit"
        else:
            self._writers.add(writer)
            self._waiting.add(writer)
            task = asyncio.ensure_future(self._serve(reader, writer, host, tenant))
            self._tasks.add(task)
            task.add_done_callback(self._task_done)
            return
        self.metrics.refused.labels(reason=reason).inc()
        self._refusals.info("refused a connection from %s: %s", host, reason)
        writer.transport.close()

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("audiosocket: a connection failed", exc_info=task.exception())

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, tenant: str
    ) -> None:
        try:
            core = AudioSocketConnection(max_payload=MAX_PAYLOAD_BYTES)
            events = await self._await_uuid(reader, core, host)
            self._waiting.discard(writer)
            if events is None:
                return
            if self._stopping or self._state.connections.draining:
                self.metrics.refused.labels(reason="draining").inc()
                writer.write(core.hangup())
                return
            leg = AudioSocketLeg(
                self._state,
                reader=reader,
                writer=writer,
                core=core,
                pending=events[1:],
                tenant=tenant,
                settings=self.settings,
                metrics=self.metrics,
            )
            self._legs.add(leg)
            try:
                await leg.run()
            finally:
                self._legs.discard(leg)
        finally:
            self._waiting.discard(writer)
            self._writers.discard(writer)
            writer.close()  # a no-op after the leg's own close

    async def _await_uuid(
        self, reader: asyncio.StreamReader, core: AudioSocketConnection, host: str
    ) -> list[AudioSocketEvent] | None:
        """The events of the reads up to and including the UUID (the UUID first), or None
        when the connection is refused: no UUID in time, something else first, or closed."""
        try:
            async with asyncio.timeout(self.settings.uuid_timeout_s):
                while True:
                    data = await reader.read(READ_BYTES)
                    if not data:
                        reason = "bad_start"
                        break
                    events = core.receive(data)
                    if events:  # the core accepts nothing but a UUID first
                        return events
        except TimeoutError:
            reason = "uuid_timeout"
        except (AudioSocketProtocolError, ConnectionError):
            reason = "bad_start"
        if self._stopping:
            reason = "draining"  # stop() closed it
        self.metrics.refused.labels(reason=reason).inc()
        self._refusals.info("closed a connection from %s: %s", host, reason)
        return None
