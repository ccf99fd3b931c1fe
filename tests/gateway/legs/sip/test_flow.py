"""The flow runner as an application on a call: prompts, gathers, retries, hangup.

The call is a real :class:`gateway.calls.Call`; its session is a fake that records what
is spoken and lets the test play the events a real session would publish."""

from __future__ import annotations

import asyncio

import pytest

from gateway.calls import Call
from gateway.errors import ErrorCode, SessionError
from gateway.events import Cleared, Dtmf
from gateway.legs.sip.flow import FlowRunner
from gateway.legs.sip.routes import DEFAULT_ROUTES, Flow, parse_routes
from tests.gateway.legs.sip.fakes import FakeSession, Host, make_call, played


def demo_flow() -> Flow:
    flow = parse_routes(DEFAULT_ROUTES).routes["ivr"].flow
    assert flow is not None
    return flow


def make(flow: Flow) -> tuple[Call, FakeSession, Host, FlowRunner]:
    session = FakeSession()
    host = Host()
    call = make_call(session, host)
    return call, session, host, FlowRunner(call, flow, host)


async def test_the_demo_greets_takes_1_confirms_and_hangs_up() -> None:
    call, session, host, runner = make(demo_flow())
    task = asyncio.ensure_future(runner.run())
    assert "press 1" in await played(call, session, 1)
    call.publish(Dtmf("1"))
    assert await played(call, session, 2) == "You pressed 1. Thank you."
    assert await played(call, session, 3) == "Goodbye."
    await asyncio.wait_for(task, 1)
    assert runner.visited == ["greet", "confirm", "goodbye"]
    assert host.hung_up == 1
    assert runner not in call.subscribers


async def test_a_digit_during_the_prompt_stops_it() -> None:
    call, session, _host, runner = make(demo_flow())
    task = asyncio.ensure_future(runner.run())
    for _ in range(100):
        if session.spoken:
            break
        await asyncio.sleep(0.005)
    call.publish(Dtmf("1"))
    assert session.clears == 1
    call.publish(Cleared())  # what the session publishes when it drops the prompt
    assert await played(call, session, 2) == "You pressed 1. Thank you."
    await played(call, session, 3)
    await asyncio.wait_for(task, 1)


async def test_a_wrong_digit_retries_then_silence_falls_back_to_goodbye(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    flow = (
        parse_routes(
            DEFAULT_ROUTES.replace("timeout_s = 6, attempts = 3", "timeout_s = 0.5, attempts = 2")
        )
        .routes["ivr"]
        .flow
    )
    assert flow is not None
    call, session, host, runner = make(flow)
    task = asyncio.ensure_future(runner.run())
    await played(call, session, 1)
    call.publish(Dtmf("7"))  # no match: the prompt again
    assert "press 1" in await played(call, session, 2)
    # silence for the whole timeout: attempts used up, the fallback says goodbye
    assert await played(call, session, 3) == "Goodbye."
    await asyncio.wait_for(task, 2)
    assert runner.visited == ["greet", "goodbye"]
    assert runner.last_digits == "7"
    assert host.hung_up == 1


async def test_multi_digit_gather_ends_on_pound_and_transfer() -> None:
    flow = (
        parse_routes(
            """
[routes.x]
flow = "f"
[flows.f]
start = "ask"
[flows.f.steps.ask]
say = "Enter your account number, then pound."
gather = { digits = 8, timeout_s = 2 }
on = { "1234" = "agent" }
[flows.f.steps.agent]
say = "Transferring."
transfer = "sip:agent@pbx.example"
fallback = "sorry"
[flows.f.steps.sorry]
say = "Sorry, no agent is free."
hangup = true
"""
        )
        .routes["x"]
        .flow
    )
    assert flow is not None
    call, session, host, runner = make(flow)
    host.accept_transfer = False
    task = asyncio.ensure_future(runner.run())
    await played(call, session, 1)
    for digit in "1234#":
        call.publish(Dtmf(digit))
    assert await played(call, session, 2) == "Transferring."
    assert await played(call, session, 3) == "Sorry, no agent is free."
    await asyncio.wait_for(task, 1)
    assert host.transfers == ["sip:agent@pbx.example"]
    assert runner.visited == ["ask", "agent", "sorry"]
    assert host.hung_up == 1


async def test_a_refused_prompt_hangs_up_instead_of_spinning() -> None:
    _call, session, host, runner = make(demo_flow())
    session.refuse = SessionError(ErrorCode.OVERLOADED, "busy")
    await asyncio.wait_for(runner.run(), 1)
    assert host.hung_up == 1
    assert runner.visited == ["greet"]


async def test_an_endless_announcement_ends_after_the_step_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("gateway.legs.sip.flow.MAX_STEPS_PER_CALL", 5)
    flow = (
        parse_routes(
            "[routes.x]\nflow = 'f'\n[flows.f.steps.a]\nsay = 'Please hold.'\nnext = 'a'\n"
        )
        .routes["x"]
        .flow
    )
    assert flow is not None
    call, session, host, runner = make(flow)
    task = asyncio.ensure_future(runner.run())
    for count in range(1, 6):
        await played(call, session, count)
    await asyncio.wait_for(task, 1)
    assert len(runner.visited) == 5 and host.hung_up == 1
