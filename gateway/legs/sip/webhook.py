"""A route that asks a webhook what to do with a call (``webhook = "https://..."``).

The gateway POSTs JSON describing what happened and runs the actions the answer lists,
in order, on the shared script primitives (:mod:`gateway.legs.sip.script`)::

    POST <webhook>   Content-Type: application/json
    {"event": "call_started", "call_id": "...", "tenant": "...", "from": "sip:...",
     "to": "ivr", "sequence": 1}
    <- 200 {"actions": [{"say": "Welcome."},
                        {"say": "Press 1 for sales, 2 for support.",
                         "gather": {"digits": 1, "timeout_s": 5}}]}

    {"event": "gathered", "digits": "2", ...}          (digits "" when none came in time)
    <- 200 {"actions": [{"say": "Connecting you."}, {"transfer": "sip:support@pbx"}]}

    {"event": "transfer_failed", "target": "sip:support@pbx", ...}
    <- 200 {"actions": [{"say": "Nobody is free. Goodbye."}, {"hangup": true}]}

Actions: ``{"say": TEXT}``; ``{"gather": {"digits": N, "timeout_s": S}, "say": PROMPT}``
(a digit stops the prompt; ``#`` ends early; then ``gathered`` is posted);
``{"transfer": SIP_URI}`` (REFER; ``transfer_failed`` is posted when refused);
``{"hangup": true}``. ``gather``, ``transfer`` and ``hangup`` end a list; a list that ends
without one hangs up.

Limits: each request has the route's ``webhook_timeout_s``; an answer is at most
:data:`MAX_RESPONSE_BYTES` and :data:`MAX_ACTIONS` actions; a call makes at most
:data:`MAX_EXCHANGES_PER_CALL` requests. A failed request (timeout, connection error,
a status other than 2xx, an answer that is not the JSON above) is logged, counted in
``gateway_sip_webhook_requests_total`` by outcome and hangs the call up: a caller never
waits on a webhook that is down. With ``webhook_secret(_env)`` every request carries
``X-Gateway-Timestamp`` (Unix seconds) and ``X-Gateway-Signature: v1=<hex>``, the
HMAC-SHA256 of ``<timestamp>.<body>`` under the secret, so the webhook can check that the
request is ours and recent.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import aiohttp

from gateway.calls import Call
from gateway.legs.sip.metrics import SipMetrics
from gateway.legs.sip.routes import MAX_GATHER_DIGITS, MAX_SAY_CHARS, Gather, Route
from gateway.legs.sip.script import CallScript, ScriptHost, ScriptStopped
from telephony.sip import SipError, parse_uri

log = logging.getLogger(__name__)

MAX_RESPONSE_BYTES = 64 * 1024
MAX_ACTIONS = 32
MAX_EXCHANGES_PER_CALL = 100
#: Connections to all webhooks together, per worker.
MAX_CONNECTIONS = 100
USER_AGENT = "voice-gateway-sip-webhook"


@dataclass(frozen=True)
class Say:
    text: str


@dataclass(frozen=True)
class GatherDigits:
    prompt: str
    gather: Gather


@dataclass(frozen=True)
class Transfer:
    target: str


@dataclass(frozen=True)
class Hangup:
    pass


Action: TypeAlias = Say | GatherDigits | Transfer | Hangup


class WebhookError(Exception):
    """A webhook request failed; ``outcome`` is the metric label."""

    def __init__(self, outcome: str, detail: str) -> None:
        super().__init__(f"{outcome}: {detail}")
        self.outcome = outcome


def _number(value: Any, where: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise WebhookError("invalid", f"{where} must be a number from {low} to {high}")
    return float(value)


def _say_text(value: Any, where: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_SAY_CHARS:
        raise WebhookError("invalid", f"{where} must be a string of at most {MAX_SAY_CHARS}")
    return value


def _action(raw: Any, index: int) -> Action:
    where = f"actions[{index}]"
    if not isinstance(raw, dict):
        raise WebhookError("invalid", f"{where} must be an object")
    keys = set(raw)
    if "gather" in keys and keys <= {"gather", "say"}:
        spec = raw["gather"]
        if not isinstance(spec, dict) or set(spec) - {"digits", "timeout_s"}:
            raise WebhookError("invalid", f"{where}.gather must be {{digits, timeout_s}}")
        gather = Gather(
            digits=int(_number(spec.get("digits", 1), f"{where}.digits", 1, MAX_GATHER_DIGITS)),
            timeout_s=_number(spec.get("timeout_s", 5), f"{where}.timeout_s", 0.5, 120),
            attempts=1,
        )
        return GatherDigits(_say_text(raw.get("say", ""), f"{where}.say"), gather)
    if keys == {"say"}:
        return Say(_say_text(raw["say"], f"{where}.say"))
    if keys == {"transfer"}:
        target = raw["transfer"]
        try:
            if not isinstance(target, str) or len(target) > 256:
                raise SipError("bad_target", "not a string")
            if parse_uri(target).scheme not in ("sip", "sips", "tel"):
                raise SipError("bad_scheme", "not a SIP or tel URI")
        except SipError:
            raise WebhookError("invalid", f"{where}.transfer must be a SIP or tel URI") from None
        return Transfer(target)
    if keys == {"hangup"} and raw["hangup"] is True:
        return Hangup()
    raise WebhookError("invalid", f"{where}: not an action: {sorted(keys)[:8]}")


def parse_actions(body: bytes) -> list[Action]:
    """The actions of a webhook's answer; raises :class:`WebhookError` (``invalid``)."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        raise WebhookError("invalid", "the answer is not JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("actions"), list):
        raise WebhookError("invalid", 'the answer must be {"actions": [...]}')
    raw_actions = doc["actions"]
    if len(raw_actions) > MAX_ACTIONS:
        raise WebhookError("invalid", f"more than {MAX_ACTIONS} actions")
    actions = [_action(raw, i) for i, raw in enumerate(raw_actions)]
    for action in actions[:-1]:
        if not isinstance(action, Say):
            raise WebhookError("invalid", "gather, transfer and hangup must end the list")
    return actions


def signature(secret: bytes, timestamp: str, body: bytes) -> str:
    """``v1=<hex>``: HMAC-SHA256 of ``<timestamp>.<body>`` (what a webhook checks)."""
    mac = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256)
    return "v1=" + mac.hexdigest()


class WebhookClient:
    """The worker's HTTP client for webhooks: bounded connections, bounded answers."""

    def __init__(self, metrics: SipMetrics) -> None:
        self._metrics = metrics
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    async def close(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _client(self) -> aiohttp.ClientSession:
        if self._closed:  # the bridge stopped: no new connections
            raise WebhookError("connection", "the SIP bridge is stopping")
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=MAX_CONNECTIONS),
                headers={"User-Agent": USER_AGENT},
            )
        return self._session

    async def post(self, route: Route, payload: Mapping[str, Any]) -> list[Action]:
        """POST ``payload`` to the route's webhook; its actions, or :class:`WebhookError`."""
        assert route.webhook is not None
        body = json.dumps(payload, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json"}
        if route.webhook_secret is not None:
            timestamp = str(int(time.time()))
            headers["X-Gateway-Timestamp"] = timestamp
            headers["X-Gateway-Signature"] = signature(route.webhook_secret, timestamp, body)
        started = time.monotonic()
        outcome = "cancelled"  # until the request ends one way or another
        try:
            async with asyncio.timeout(route.webhook_timeout_s):
                async with self._client().post(
                    route.webhook, data=body, headers=headers, allow_redirects=False
                ) as response:
                    if not 200 <= response.status < 300:
                        raise WebhookError("http_error", f"status {response.status}")
                    answer = await _read_bounded(response, MAX_RESPONSE_BYTES)
            actions = parse_actions(answer)
            outcome = "ok"
            return actions
        except WebhookError as exc:
            outcome = exc.outcome
            raise
        except TimeoutError:
            outcome = "timeout"
            raise WebhookError("timeout", f"no answer in {route.webhook_timeout_s} s") from None
        except (aiohttp.ClientError, OSError) as exc:
            outcome = "connection"
            raise WebhookError("connection", type(exc).__name__) from None
        finally:
            self._metrics.webhook_requests.labels(outcome=outcome).inc()
            self._metrics.webhook_seconds.observe(time.monotonic() - started)


async def _read_bounded(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The whole body (however it was chunked on the wire), at most ``limit`` bytes."""
    body = bytearray()
    while chunk := await response.content.read(limit + 1 - len(body)):
        body += chunk
        if len(body) > limit:
            raise WebhookError("too_large", f"over {limit} bytes")
    return bytes(body)


class WebhookRunner(CallScript):
    """Runs a webhook route on one call until it hangs up, transfers or fails."""

    def __init__(self, call: Call, route: Route, host: ScriptHost, client: WebhookClient) -> None:
        super().__init__(call, host)
        self._route = route
        self._client = client
        self.exchanges = 0

    async def _script(self) -> None:
        event: dict[str, Any] | None = {"event": "call_started"}
        while event is not None:
            if self.exchanges >= MAX_EXCHANGES_PER_CALL:
                log.warning(
                    "call %s: %d webhook requests; hanging up", self._call.call_id, self.exchanges
                )
                self.hangup()
                return
            actions = await self._ask(event)
            event = await self._perform(actions)

    async def _ask(self, event: dict[str, Any]) -> Sequence[Action]:
        self.exchanges += 1
        call = self._call
        payload = {
            **event,
            "call_id": call.call_id,
            "tenant": call.tenant,
            "from": call.custom_parameters.get("from", ""),
            "to": call.custom_parameters.get("to", ""),
            "sequence": self.exchanges,
        }
        try:
            return await self._client.post(self._route, payload)
        except WebhookError as exc:
            log.warning(
                "call %s: webhook %s failed (%s); hanging up", call.call_id, event["event"], exc
            )
            raise ScriptStopped from None

    async def _perform(self, actions: Sequence[Action]) -> dict[str, Any] | None:
        """Run ``actions``; the next event to post, or None when the call is done."""
        for action in actions:
            if isinstance(action, Say):
                await self.play(action.text)
            elif isinstance(action, GatherDigits):
                digits = await self.gather(action.prompt, action.gather)
                self.last_digits = digits
                return {"event": "gathered", "digits": digits}
            elif isinstance(action, Transfer):
                if await self.transfer(action.target):
                    return None
                return {"event": "transfer_failed", "target": action.target}
            else:
                break
        self.hangup()
        return None
