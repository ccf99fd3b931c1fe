"""The accept gate: new connections wait their turn while the pacing clock is late."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.accept_gate import AcceptGate, AcceptPacing, WaitingProtocol
from gateway.metrics import GatewayMetrics


@pytest.mark.parametrize(
    ("lags_ms", "allowances"),
    [
        ([0, 0, 0], [5, 6, 7]),  # on time: one more per tick
        ([3, 3], [4, 4]),  # neither on time nor late: unchanged
        ([0, 0, 0, 6], [5, 6, 7, 3]),  # late: halved
        ([9, 9, 9, 9], [2, 1, 1, 1]),  # never below the minimum
    ],
)
def test_pacing_is_additive_increase_multiplicative_decrease(
    lags_ms: list[float], allowances: list[int]
) -> None:
    pacing = AcceptPacing(initial=4)
    assert [pacing.on_tick(lag / 1000) for lag in lags_ms] == allowances


def test_pacing_has_a_ceiling() -> None:
    pacing = AcceptPacing(initial=4, maximum=10)
    for _ in range(100):
        pacing.on_tick(0.0)
    assert pacing.per_tick == 10


class FakeTransport:
    def __init__(self) -> None:
        self.protocol: Any = None
        self.reading = True
        self.closing = False

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return self.closing


class RealProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: Any = None
        self.data: list[bytes] = []

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.data.append(data)


def connect(gate: AcceptGate) -> tuple[WaitingProtocol, FakeTransport, list[RealProtocol]]:
    made: list[RealProtocol] = []

    def make() -> RealProtocol:
        made.append(RealProtocol())
        return made[-1]

    waiting = gate.protocol(make)
    assert isinstance(waiting, WaitingProtocol)
    transport = FakeTransport()
    waiting.connection_made(transport)  # type: ignore[arg-type]
    return waiting, transport, made


def test_connections_go_straight_in_within_the_ticks_allowance() -> None:
    gate = AcceptGate(GatewayMetrics(), AcceptPacing(initial=2))
    _, transport, made = connect(gate)
    assert len(made) == 1 and transport.protocol is made[0] and transport.reading
    assert made[0].transport is transport
    connect(gate)
    _, third_transport, third = connect(gate)  # over the allowance: waits, not read
    assert third == [] and not third_transport.reading and gate.waiting == 1


def test_waiting_connections_are_let_in_on_ticks_in_arrival_order() -> None:
    metrics = GatewayMetrics()
    gate = AcceptGate(metrics, AcceptPacing(initial=1, maximum=1))
    connect(gate)  # uses the allowance
    queued = [connect(gate) for _ in range(3)]
    assert gate.waiting == 3
    gate.on_tick(0.0)
    assert [len(made) for _, _, made in queued] == [1, 0, 0]
    assert queued[0][1].reading and not queued[1][1].reading
    gate.on_tick(0.0)
    gate.on_tick(0.0)
    assert [len(made) for _, _, made in queued] == [1, 1, 1]
    assert gate.waiting == 0
    assert metrics.connections_deferred._value.get() == 3


def test_a_new_connection_does_not_jump_the_queue() -> None:
    gate = AcceptGate(GatewayMetrics(), AcceptPacing(initial=1, maximum=1))
    connect(gate)
    first_waiting = connect(gate)
    gate.on_tick(0.0)  # lets first_waiting in, allowance used
    assert len(first_waiting[2]) == 1
    late = connect(gate)
    assert late[2] == []  # the tick's allowance is spent: it waits


def test_a_peer_that_left_while_waiting_is_skipped_and_data_is_kept() -> None:
    gate = AcceptGate(GatewayMetrics(), AcceptPacing(initial=1, maximum=1))
    connect(gate)
    gone, _, gone_made = connect(gate)
    early, early_transport, early_made = connect(gate)
    gone.connection_lost(None)
    early.data_received(b"GET / HTTP/1.1\r\n")  # arrived before reading paused
    gate.on_tick(0.0)
    assert gone_made == []
    assert early_made[0].data == [b"GET / HTTP/1.1\r\n"] and early_transport.reading
