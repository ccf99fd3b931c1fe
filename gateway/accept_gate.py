"""New connections wait their turn so that calls already speaking never do.

A reconnect storm (every media server of a failed instance at once) costs a worker
about a millisecond of CPU per new session (upgrade, token, engine slot, ``ready``): a
thousand within a second is more than the worker's core, and work the event loop does
for new connections is time the pacing clock does not get. So a connection that arrives
while the worker is busy is accepted but not read from: it waits (in this queue, with
its socket paused) until the pacer lets it in. On every pacer tick (5 ms) the gate lets
in an allowance of waiting connections, which grows by one per tick while the clock is
on time and halves when a tick is late (additive increase, multiplicative decrease, as
TCP does): new sessions fill whatever the established ones leave, and get less as soon
as the established ones would feel it. While nobody waits, a new connection under the
tick's allowance goes straight in (no added latency at ordinary rates).

:class:`AcceptPacing` is the decision (sans-I/O); :class:`AcceptGate` holds the waiting
connections; :class:`WaitingProtocol` stands in for the HTTP protocol of a connection
until it is let in, then hands the transport over (``transport.set_protocol``).
Waiting connections count against ``GATEWAY_MAX_CONNECTIONS``; the handshake deadline
starts when a connection is let in.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from gateway.metrics import GatewayMetrics

log = logging.getLogger(__name__)


@dataclass
class AcceptPacing:
    """How many new connections each pacer tick lets in (AIMD on the tick's lateness)."""

    initial: int = 4
    minimum: int = 1  # even when every tick is late: new sessions still progress
    maximum: int = 64
    on_time_s: float = 0.002  # a tick later than this is not on time: no increase
    late_s: float = 0.005  # a tick later than this halves the allowance

    def __post_init__(self) -> None:
        self.per_tick = self.initial

    def on_tick(self, lag_s: float) -> int:
        """The allowance of the tick that ran ``lag_s`` late."""
        if lag_s > self.late_s:
            self.per_tick = max(self.minimum, self.per_tick // 2)
        elif lag_s <= self.on_time_s:
            self.per_tick = min(self.maximum, self.per_tick + 1)
        return self.per_tick


class WaitingProtocol(asyncio.Protocol):
    """A connection's protocol until the gate lets it in."""

    def __init__(self, gate: AcceptGate, make: Callable[[], asyncio.BaseProtocol]) -> None:
        self._gate = gate
        self._make = make
        self._transport: asyncio.Transport | None = None
        self._early: list[bytes] = []
        self._eof = False
        self.lost = False
        self.paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self._gate.offer(self)

    def pause(self) -> None:
        assert self._transport is not None
        self._transport.pause_reading()
        self.paused = True

    def admit(self) -> None:
        """Hand the transport to the real protocol, as if it had just connected."""
        transport = self._transport
        assert transport is not None
        real = self._make()
        transport.set_protocol(real)
        real.connection_made(transport)
        stream = cast(asyncio.Protocol, real)
        for data in self._early:  # sent before reading was paused (not expected)
            stream.data_received(data)
        self._early.clear()
        if self._eof:
            stream.eof_received()
        if self.paused and not transport.is_closing():
            transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self._early.append(data)

    def eof_received(self) -> bool | None:
        self._eof = True
        return True  # keep the transport: the real protocol decides when it is let in

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True  # the peer gave up while waiting; the gate skips it


class AcceptGate:
    def __init__(self, metrics: GatewayMetrics, pacing: AcceptPacing | None = None) -> None:
        self._metrics = metrics
        self.pacing = pacing or AcceptPacing()
        self._waiting: deque[WaitingProtocol] = deque()
        self._admitted_this_tick = 0

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def protocol(self, make: Callable[[], asyncio.BaseProtocol]) -> asyncio.Protocol:
        """The protocol for a new connection: the real one (``make()``) once let in."""
        return WaitingProtocol(self, make)

    def offer(self, connection: WaitingProtocol) -> None:
        """A new connection: straight in while nobody waits and the tick has room."""
        if not self._waiting and self._admitted_this_tick < self.pacing.per_tick:
            self._admitted_this_tick += 1
            connection.admit()
            return
        connection.pause()
        self._waiting.append(connection)
        self._metrics.connections_deferred.inc()
        self._metrics.connections_waiting.set(len(self._waiting))

    def on_tick(self, lag_s: float) -> None:
        """A pacer tick (``lag_s`` late): let in this tick's allowance."""
        allowance = self.pacing.on_tick(lag_s)
        self._admitted_this_tick = 0
        waiting = self._waiting
        while waiting and self._admitted_this_tick < allowance:
            connection = waiting.popleft()
            if connection.lost:
                continue
            self._admitted_this_tick += 1
            try:
                connection.admit()
            except Exception:
                log.exception("accept gate: letting a connection in failed")
        self._metrics.connections_waiting.set(len(waiting))
