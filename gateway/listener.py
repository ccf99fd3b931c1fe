"""The worker's listening sockets (the public port, the relay listener), guarded against
clients that are slow, silent or many.

- **Handshake deadline.** A connection must deliver a complete request head within
  ``GATEWAY_HANDSHAKE_TIMEOUT_S`` of connecting (or of finishing its previous request,
  on a kept-alive connection); otherwise it is closed. aiohttp's keep-alive timer
  already runs from the moment a connection is made and closes it while it waits for a
  request head, so the deadline is that timer set to the handshake timeout. A
  connection whose request is being handled (a WebSocket session, an upload) is not
  affected; uploads have their own body deadline.
- **Connection cap.** At most ``GATEWAY_MAX_CONNECTIONS`` open connections per worker,
  on its public port and its relay listener together (:class:`ConnectionGuard`); beyond
  it a new connection is answered ``503`` with ``Retry-After`` and closed at once,
  before any parsing, and counted in ``gateway_connections_refused_total``.
  ``gateway_connections_open`` shows how many are open.
- **Write stall.** A connection whose unsent output has not shrunk for
  ``GATEWAY_SEND_STALL_S`` (the peer reads nothing: not our audio, not a pong, not an
  HTTP response, not even the close frame) is aborted, so that it cannot hold its
  session, its engine slot or a place under the cap; counted in
  ``gateway_connections_aborted_total{reason="write_stall"}``. A closing transport waits
  for its buffer to drain, so without this a peer that never reads would keep a closed
  connection open for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import Callable
from typing import cast

from aiohttp import web

from gateway.errors import ErrorCode
from gateway.metrics import GatewayMetrics

_BODY = json.dumps(
    {"error": {"code": ErrorCode.TOO_MANY_CONNECTIONS, "message": "this worker is at its limit"}}
).encode()
REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"Content-Type: application/json\r\n"
    b"Retry-After: 1\r\n"
    b"Connection: close\r\n"
    b"Content-Length: " + str(len(_BODY)).encode() + b"\r\n\r\n" + _BODY
)


class _Refuse(asyncio.Protocol):
    """Answers 503 and closes: what a connection over the cap gets."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        writer = cast(asyncio.WriteTransport, transport)  # uvloop's are not subclasses
        writer.write(REFUSAL)
        writer.close()


STALL_CHECK_S = 1.0


class StallWatch:
    """Aborts transports whose write buffer has been non-empty and not shrinking for
    ``stall_s`` (checked every :data:`STALL_CHECK_S`)."""

    def __init__(
        self,
        transports: Callable[[], list[asyncio.BaseTransport]],
        stall_s: float,
        metrics: GatewayMetrics,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._transports = transports
        self._stall_s = stall_s
        self._metrics = metrics
        self._clock = clock
        # transport -> (buffered bytes at the last check, since when it has not shrunk)
        self._watched: dict[asyncio.BaseTransport, tuple[int, float]] = {}

    def check(self) -> int:
        """One pass; returns how many transports were aborted."""
        now = self._clock()
        watched: dict[asyncio.BaseTransport, tuple[int, float]] = {}
        aborted = 0
        transports = self._transports()
        # Also the open-connection gauge's value where a scrape-time function does not
        # count (several workers' metrics in files, gateway/metrics.py).
        self._metrics.connections_open.set(len(transports))
        for transport in transports:
            writer = cast(asyncio.WriteTransport, transport)
            size = writer.get_write_buffer_size()
            if size == 0:
                continue
            previous = self._watched.get(transport)
            since = now if previous is None or size < previous[0] else previous[1]
            if now - since >= self._stall_s:
                writer.abort()
                aborted += 1
                self._metrics.connections_aborted.labels(reason="write_stall").inc()
                continue
            watched[transport] = (size, since)
        self._watched = watched
        return aborted

    async def run(self) -> None:
        while True:
            await asyncio.sleep(STALL_CHECK_S)
            self.check()


#: The kernel's queue of connections not yet accepted (capped by net.core.somaxconn).
#: A reconnect storm (every media server of a failed instance at once) arrives faster
#: than one event loop accepts: beyond the queue, a connection's SYN is dropped and
#: retried 1 s, then 3 s later; in the queue it waits only its turn.
LISTEN_BACKLOG = 4096


class ConnectionGuard:
    """The worker's connection cap and write-stall watch over every listener it serves
    (the public port and the relay listener, each with its own runner): connections open
    on either count against the one ``GATEWAY_MAX_CONNECTIONS``, and one watch aborts a
    stalled connection on either."""

    def __init__(self, *, max_connections: int, send_stall_s: float, metrics: GatewayMetrics):
        self._max_connections = max_connections
        self._metrics = metrics
        self._runners: list[web.BaseRunner] = []
        self._stall = StallWatch(self._open_transports, send_stall_s, metrics)
        self._stall_task: asyncio.Task[None] | None = None

    def guard(self, runner: web.BaseRunner) -> None:
        """Count ``runner``'s connections from now on (after its ``setup``)."""
        if runner.server is None:
            raise RuntimeError("set the runner up first")
        self._runners.append(runner)

    def _servers(self) -> list[web.Server]:
        return [r.server for r in self._runners if isinstance(r.server, web.Server)]

    def open_connections(self) -> int:
        return sum(len(server.connections) for server in self._servers())

    def _open_transports(self) -> list[asyncio.BaseTransport]:
        """Every open connection's transport, closing ones included. aiohttp's handler
        forgets its transport when it closes it (``handler.transport`` is None) while the
        transport itself waits for its buffer to drain; the server's own table keeps it
        until the connection is lost, which is exactly what must be watched.
        (tests/gateway/test_listener.py checks that the table is there.)"""
        return [t for server in self._servers() for t in server._connections.values()]

    def protocol(self, runner: web.BaseRunner) -> asyncio.BaseProtocol:
        """A new connection's protocol: ``runner``'s, or a 503 beyond the cap."""
        server = runner.server
        assert server is not None
        if self.open_connections() >= self._max_connections:
            self._metrics.connections_refused.labels(reason="limit").inc()
            return _Refuse()
        return server()

    def start(self) -> None:
        # Read at scrape time; when the host's workers share their metrics (values in
        # files, gateway/metrics.py) a function does not count there, so each pass of
        # the stall watch (every second) also sets the value.
        self._metrics.connections_open.set_function(self.open_connections)
        self._stall_task = asyncio.create_task(self._stall.run(), name="write-stall-watch")

    async def stop(self) -> None:
        if self._stall_task is not None:
            self._stall_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._stall_task
            self._stall_task = None


class GuardedSite(web.BaseSite):
    """A listening socket whose connections a :class:`ConnectionGuard` admits: TCP on
    ``host``:``port``, or an already bound ``sock`` (the relay listener: TCP or Unix)."""

    def __init__(
        self,
        runner: web.BaseRunner,
        guard: ConnectionGuard,
        *,
        host: str | None = None,
        port: int | None = None,
        sock: socket.socket | None = None,
        reuse_port: bool = False,
    ) -> None:
        if (sock is None) == (port is None):
            raise ValueError("a site listens on host and port, or on a socket")
        super().__init__(runner, backlog=LISTEN_BACKLOG)
        self._guard = guard
        self._host = host
        self._port = port
        self._sock = sock
        self._reuse_port = reuse_port

    @property
    def name(self) -> str:
        if self._sock is not None:
            return f"http://{self._sock.getsockname()}"
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()  # registers the site with its runner
        runner = self._runner
        loop = asyncio.get_running_loop()
        if self._sock is not None:
            self._server = await loop.create_server(
                lambda: self._guard.protocol(runner), sock=self._sock, backlog=self._backlog
            )
            return
        assert self._port is not None
        self._server = await loop.create_server(
            lambda: self._guard.protocol(runner),
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_port=self._reuse_port,  # GATEWAY_WORKERS: the host's workers share the port
        )
