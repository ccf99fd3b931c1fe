"""A webhook route on a call: what is posted, the actions run, the limits, the failures.

The webhook is a real aiohttp server on the loopback; the call is a real
:class:`gateway.calls.Call` with a recording session (``fakes.py``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from gateway.events import Dtmf
from gateway.legs.sip.metrics import SipMetrics
from gateway.legs.sip.routes import Route
from gateway.legs.sip.webhook import (
    MAX_ACTIONS,
    GatherDigits,
    Hangup,
    Say,
    Transfer,
    WebhookClient,
    WebhookError,
    WebhookRunner,
    parse_actions,
    signature,
)
from tests.gateway.legs.sip.fakes import FakeSession, Host, make_call, played

Answer = Callable[[dict[str, Any]], Awaitable[web.StreamResponse]]
SECRET = b"webhook-secret-for-tests"


class Webhook:
    """A real HTTP server; ``answer`` decides each reply; every request is kept."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.request: web.Request | None = None  # the one being answered
        self.requests: list[tuple[dict[str, Any], dict[str, str], bytes]] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.request = request
        body = await request.read()
        doc = json.loads(body)
        self.requests.append((doc, dict(request.headers), body))
        return await self.answer(doc)

    @property
    def events(self) -> list[dict[str, Any]]:
        return [doc for doc, _headers, _body in self.requests]


def actions(*items: dict[str, Any]) -> web.Response:
    return web.json_response({"actions": list(items)})


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Answer], Awaitable[tuple[Webhook, str]]]]:
    servers: list[TestServer] = []

    async def start(answer: Answer) -> tuple[Webhook, str]:
        hook = Webhook(answer)
        app = web.Application()
        app.router.add_post("/sip", hook.handle)
        server = TestServer(app)
        await server.start_server()
        servers.append(server)
        return hook, str(server.make_url("/sip"))

    yield start
    for server in servers:
        await server.close()


def runner_for(
    url: str, *, timeout_s: float = 2.0, secret: bytes | None = SECRET
) -> tuple[FakeSession, Host, WebhookRunner, WebhookClient, SipMetrics]:
    session, host = FakeSession(), Host()
    call = make_call(session, host, **{"from": "sip:+15551234@pbx.example", "to": "hotline"})
    metrics = SipMetrics(CollectorRegistry())
    client = WebhookClient(metrics)
    route = Route(user="hotline", webhook=url, webhook_timeout_s=timeout_s, webhook_secret=secret)
    return session, host, WebhookRunner(call, route, host, client), client, metrics


def outcomes(metrics: SipMetrics) -> dict[str, float]:
    return {
        sample.labels["outcome"]: sample.value
        for metric in metrics.webhook_requests.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    }


async def test_a_menu_posts_each_event_and_runs_the_actions(serve: Any) -> None:
    async def answer(doc: dict[str, Any]) -> web.Response:
        if doc["event"] == "call_started":
            return actions(
                {"say": "Welcome."},
                {"say": "Press 1 for sales, 2 for support.", "gather": {"digits": 1}},
            )
        assert doc == {**doc, "event": "gathered", "digits": "2"}
        return actions({"say": "You pressed {digits}."}, {"transfer": "sip:support@pbx"})

    hook, url = await serve(answer)
    session, host, runner, client, metrics = runner_for(url)
    task = asyncio.ensure_future(runner.run())
    call = runner._call
    assert await played(call, session, 1) == "Welcome."
    assert "Press 1" in await played(call, session, 2)
    call.publish(Dtmf("2"))
    assert await played(call, session, 3) == "You pressed 2."
    await asyncio.wait_for(task, 2)
    await client.close()

    assert host.transfers == ["sip:support@pbx"] and host.hung_up == 1
    first, second = hook.events
    assert first == {
        "event": "call_started",
        "call_id": "c1",
        "tenant": "t",
        "from": "sip:+15551234@pbx.example",
        "to": "hotline",
        "sequence": 1,
    }
    assert second["event"] == "gathered" and second["sequence"] == 2
    for _doc, headers, body in hook.requests:  # signed: the webhook can check it is us
        assert headers["Content-Type"] == "application/json"
        stamp = headers["X-Gateway-Timestamp"]
        assert headers["X-Gateway-Signature"] == signature(SECRET, stamp, body)
    assert outcomes(metrics) == {"ok": 2.0}
    assert runner not in call.subscribers


async def test_silence_gathers_nothing_and_a_refused_transfer_is_posted(serve: Any) -> None:
    async def answer(doc: dict[str, Any]) -> web.Response:
        if doc["event"] == "call_started":
            return actions({"gather": {"digits": 4, "timeout_s": 0.5}})
        if doc["event"] == "gathered":
            assert doc["digits"] == ""
            return actions({"transfer": "sip:agent@pbx"})
        assert doc["event"] == "transfer_failed" and doc["target"] == "sip:agent@pbx"
        return actions({"say": "Nobody is free."}, {"hangup": True})

    hook, url = await serve(answer)
    session, host, runner, client, _metrics = runner_for(url, secret=None)
    host.accept_transfer = False
    task = asyncio.ensure_future(runner.run())
    assert await played(runner._call, session, 1) == "Nobody is free."
    await asyncio.wait_for(task, 3)
    await client.close()
    assert [e["event"] for e in hook.events] == ["call_started", "gathered", "transfer_failed"]
    assert "X-Gateway-Signature" not in hook.requests[0][1]
    assert host.hung_up == 1


async def test_an_answer_that_arrives_in_pieces_is_read_whole(serve: Any) -> None:
    async def answer(doc: dict[str, Any]) -> web.StreamResponse:
        raise AssertionError("replaced below")

    hook, url = await serve(answer)
    body = json.dumps({"actions": [{"say": "x" * 1900}, {"hangup": True}]}).encode()

    async def in_pieces(doc: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        assert hook.request is not None
        await response.prepare(hook.request)
        for start in range(0, len(body), 500):
            await response.write(body[start : start + 500])
            await asyncio.sleep(0.02)
        await response.write_eof()
        return response

    hook.answer = in_pieces
    session, host, runner, client, metrics = runner_for(url)
    task = asyncio.ensure_future(runner.run())
    assert await played(runner._call, session, 1) == "x" * 1900
    await asyncio.wait_for(task, 2)
    await client.close()
    assert host.hung_up == 1 and outcomes(metrics) == {"ok": 1.0}


async def test_a_list_without_an_ending_hangs_up(serve: Any) -> None:
    async def answer(doc: dict[str, Any]) -> web.Response:
        return actions({"say": "Our offices are closed."})

    _hook, url = await serve(answer)
    session, host, runner, client, _metrics = runner_for(url)
    task = asyncio.ensure_future(runner.run())
    await played(runner._call, session, 1)
    await asyncio.wait_for(task, 2)
    await client.close()
    assert host.hung_up == 1


async def test_a_webhook_that_loops_is_hung_up_after_the_exchange_limit(
    serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gateway.legs.sip.webhook.MAX_EXCHANGES_PER_CALL", 3)

    async def answer(doc: dict[str, Any]) -> web.Response:
        return actions({"transfer": "sip:busy@pbx"})  # refused each time: asks again

    hook, url = await serve(answer)
    _session, host, runner, client, _metrics = runner_for(url)
    host.accept_transfer = False
    await asyncio.wait_for(runner.run(), 2)
    await client.close()
    assert len(hook.requests) == 3 and runner.exchanges == 3
    assert host.hung_up == 1


async def _status_500(doc: dict[str, Any]) -> web.Response:
    return web.Response(status=500, text="boom")


async def _slow(doc: dict[str, Any]) -> web.Response:
    await asyncio.sleep(5)
    return actions({"hangup": True})


async def _not_json(doc: dict[str, Any]) -> web.Response:
    return web.Response(text="<html>hello</html>", content_type="text/html")


async def _huge(doc: dict[str, Any]) -> web.Response:
    return web.json_response({"actions": [], "padding": "x" * (70 * 1024)})


async def _redirect(doc: dict[str, Any]) -> web.Response:
    return web.Response(status=302, headers={"Location": "http://127.0.0.1:1/elsewhere"})


@pytest.mark.parametrize(
    ("answer", "outcome"),
    [
        (_status_500, "http_error"),
        (_slow, "timeout"),
        (_not_json, "invalid"),
        (_huge, "too_large"),
        (_redirect, "http_error"),
    ],
)
async def test_a_failing_webhook_hangs_the_call_up(
    serve: Any, answer: Answer, outcome: str
) -> None:
    _hook, url = await serve(answer)
    session, host, runner, client, metrics = runner_for(url, timeout_s=0.5)
    await asyncio.wait_for(runner.run(), 3)
    await client.close()
    assert host.hung_up == 1 and session.spoken == []
    assert outcomes(metrics) == {outcome: 1.0}


async def test_an_unreachable_webhook_hangs_the_call_up() -> None:
    import socket

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    _session, host, runner, client, metrics = runner_for(f"http://127.0.0.1:{port}/sip")
    await asyncio.wait_for(runner.run(), 3)
    await client.close()
    assert host.hung_up == 1
    assert outcomes(metrics) == {"connection": 1.0}


def test_the_answer_parses_into_actions() -> None:
    parsed = parse_actions(
        json.dumps(
            {
                "actions": [
                    {"say": "Hello."},
                    {"say": "Account number?", "gather": {"digits": 8, "timeout_s": 4}},
                ]
            }
        ).encode()
    )
    assert parsed[0] == Say("Hello.")
    assert isinstance(parsed[1], GatherDigits) and parsed[1].prompt == "Account number?"
    assert (parsed[1].gather.digits, parsed[1].gather.timeout_s) == (8, 4.0)
    assert parse_actions(b'{"actions": [{"transfer": "tel:+15550100"}]}') == [
        Transfer("tel:+15550100")
    ]
    assert parse_actions(b'{"actions": [{"hangup": true}]}') == [Hangup()]


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (b"[]", "must be"),
        (b'{"actions": {}}', "must be"),
        (b'{"actions": [{"hangup": true}, {"say": "late"}]}', "must end the list"),
        (b'{"actions": [{"gather": {"digits": 1}}, {"say": "x"}]}', "must end the list"),
        (b'{"actions": [{"hangup": false}]}', "not an action"),
        (b'{"actions": [{"play": "x.wav"}]}', "not an action"),
        (b'{"actions": [{"say": "a", "transfer": "sip:a@b"}]}', "not an action"),
        (b'{"actions": [{"transfer": "http://x"}]}', "SIP or tel URI"),
        (b'{"actions": [{"gather": {"digits": 99}}]}', "digits"),
        (b'{"actions": [{"gather": {"digits": 1, "retries": 3}}]}', "gather must be"),
        (b'{"actions": [{"say": 5}]}', "string"),
        (json.dumps({"actions": [{"say": "x"}] * (MAX_ACTIONS + 1)}).encode(), "more than"),
        (b"[" * 100_000, "not JSON"),
    ],
)
def test_bad_answers_are_refused(answer: bytes, why: str) -> None:
    with pytest.raises(WebhookError, match=why) as caught:
        parse_actions(answer)
    assert caught.value.outcome == "invalid"
