"""One connection lifecycle for every WebSocket wire protocol.

:func:`serve` upgrades the request and runs a :class:`Connection`; each wire protocol
(native, Twilio, Asterisk, and every later leg) is a subclass that only decodes its
frames (:meth:`Connection.on_text`, :meth:`Connection.on_binary`) and says how it
authenticates. Everything else lives here, once:

- the upgrade (426 for plain HTTP) and credentials at the upgrade, or later at the
  vendor's ``start`` for peers that cannot set headers (Twilio);
- the start deadline: a connection that is not established within
  ``GATEWAY_START_TIMEOUT_S`` of its upgrade is closed with ``start_timeout`` (1008),
  whatever control frames (ping, pong) it sends meanwhile;
- the receive loop: errors are mapped to codes here; a connection that sends more than
  ``GATEWAY_MAX_PROTOCOL_ERRORS`` malformed messages is closed (``too_many_errors``,
  1008); while the peer does not read what we send, we do not read what it sends (its
  TCP window fills, so it cannot make us queue errors or events without bound);
- token expiry: a session whose token can be renewed by reconnecting ends at its
  token's ``exp`` plus ``GATEWAY_JWT_LEEWAY_S`` (``token_expired``, 1008);
- teardown: whatever is raised in the receive loop, and even if the handler task is
  cancelled, the session's engine slot, tenant lease, pacer entry and call are
  released, the socket is closed, and the gateway stops counting the connection.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import time
from typing import Any, ClassVar

from aiohttp import WSMessage, WSMsgType, web

from gateway.auth import AuthError, Principal
from gateway.context import ConnectionContext
from gateway.errors import CloseCode, ErrorCode, ProtocolViolation, SessionError
from gateway.events import SessionEvent
from gateway.peer_log import PeerLog
from gateway.state import STATE_KEY
from gateway.tenant_quota import UNASSIGNED, quota_for
from gateway.wsframe import FrameWriter

log = logging.getLogger(__name__)
SCOPE = "tts:stream"
BACKPRESSURE_POLL_S = 0.02  # how often a paused reader looks at the peer's backlog


class Connection(abc.ABC):
    """One WebSocket connection and its :class:`Session`; the session's peer.

    Subclasses set :attr:`protocol`, implement the frame handlers and :meth:`send_event`
    / :meth:`send_audio`, and may override the hooks below. Handlers raise
    :class:`SessionError` (a :class:`ProtocolViolation` for malformed input) to report
    an error; the base maps it to an ``error`` event and, when it carries a close code,
    closes the connection.
    """

    protocol: ClassVar[str]
    #: Whether the session ends when its token expires. A telephony vendor cannot renew
    #: the token of a call in progress, so its legs keep running (docs/protocol.md).
    expires_with_token: ClassVar[bool] = True
    #: WebSocket subprotocols this protocol accepts (the client's choice is echoed).
    subprotocols: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self, ws: web.WebSocketResponse, writer: FrameWriter, state: ConnectionContext
    ) -> None:
        self._ws = ws
        self._writer = writer
        self._state = state
        self.principal: Principal | None = None
        self.session = state.new_session(self, self.protocol, UNASSIGNED)  # until authenticated
        self.peer_log = PeerLog(log, f"{self.protocol} {self.session.id}")
        self._violations = 0
        self._expiry: asyncio.TimerHandle | None = None
        self._counted_active = False  # in gateway_sessions_active

    # --- what a protocol provides -----------------------------------------------------

    @abc.abstractmethod
    async def on_text(self, text: str) -> None:
        """One text frame from the peer."""

    @abc.abstractmethod
    async def on_binary(self, data: bytes) -> None:
        """One binary frame from the peer."""

    @abc.abstractmethod
    def send_audio(self, frame: bytes) -> None: ...

    @abc.abstractmethod
    def send_event(self, event: SessionEvent) -> None: ...

    def backlogged(self) -> bool:
        return self._writer.backlogged()

    def on_interrupt(self) -> None:
        """Clear or barge-in: nothing to flush beyond our own queue (legs override)."""
        return None

    @property
    def established(self) -> bool:
        """Past the start phase (the start deadline no longer applies)."""
        return self.session.started

    def credentials(self, request: web.Request) -> str | None:
        """The token the upgrade request carries; None: authenticate later (see
        :meth:`authenticate`) or refuse with ``token_missing``."""
        return None

    @classmethod
    def authenticates_at_upgrade(cls) -> bool:
        """True: a request without valid credentials is refused at the upgrade."""
        return True

    def refuse(self, error: SessionError) -> None:
        """Tell the peer why the upgrade was refused, before the close frame."""
        return None

    async def on_release(self, reason: str) -> None:
        """Release what the protocol holds (a call in the registry); runs once, before the
        session is closed, whatever ended the connection."""
        return None

    # --- authentication ---------------------------------------------------------------

    def authenticate(self, token: str | None) -> Principal:
        """Verify ``token`` for this connection's session. Raises :class:`SessionError`
        (the auth code, 1008); counts and logs the failure without the token."""
        try:
            principal = self._state.verify(token, SCOPE)
        except AuthError as exc:
            self.peer_log.info("auth failed: %s", exc.code)
            raise SessionError(ErrorCode(exc.code), exc.message, CloseCode.POLICY) from None
        self.principal = principal
        self.session.quota = quota_for(principal)
        if self.expires_with_token:
            self._schedule_expiry(principal)
        return principal

    def _schedule_expiry(self, principal: Principal) -> None:
        grace = self._state.token_leeway_s
        delay = principal.expires_at + grace - time.time()
        loop = asyncio.get_running_loop()
        self._expiry = loop.call_later(max(0.0, delay), self._token_expired)

    def _token_expired(self) -> None:
        self._expiry = None
        self.peer_log.info("token expired")
        message = "the access token expired; connect again with a new one"
        self.session.fail(SessionError(ErrorCode.TOKEN_EXPIRED, message, CloseCode.POLICY))

    # --- the lifecycle ----------------------------------------------------------------

    async def run(self) -> None:
        """Serve the connection until it ends; always releases everything it holds.

        The teardown runs as a task of its own, shielded: if this handler is cancelled
        (shutdown, aiohttp), the teardown still finishes (the worker's
        :class:`gateway.connections.Connections` owns it until then)."""
        session = self.session
        state = self._state
        metrics = state.metrics
        metrics.sessions_active.labels(protocol=self.protocol).inc()
        self._counted_active = True
        metrics.sessions_total.labels(protocol=self.protocol).inc()
        state.connections.track(self)
        receiver = asyncio.create_task(self._receive(), name=f"{self.protocol}-recv-{session.id}")
        try:
            waits: list[asyncio.Future[Any]] = [receiver, session.done]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            teardown = asyncio.ensure_future(self._teardown(receiver))
            state.connections.own(teardown)
            await asyncio.shield(teardown)

    async def _teardown(self, receiver: asyncio.Task[None]) -> None:
        """Stop reading, release the session's slot, lease, pacer entry and call, then
        close the socket (the peer sees the close once everything is free)."""
        session = self.session
        receiver.cancel()  # a start in progress rolls back what it acquired
        await asyncio.wait([receiver])
        failure = None if receiver.cancelled() else receiver.exception()
        if failure is not None:
            log.error(
                "%s session %s: receive loop failed", self.protocol, session.id, exc_info=failure
            )
            session.fail(
                SessionError(ErrorCode.INTERNAL_ERROR, "internal error", CloseCode.INTERNAL_ERROR)
            )
        code, reason = (
            session.done.result() if session.done.done() else (CloseCode.NORMAL, "socket closed")
        )
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        try:
            await self.on_release(reason)
        except Exception:
            log.exception("%s session %s: release failed", self.protocol, session.id)
        finally:
            try:
                await session.aclose(reason)
            finally:
                self._writer.closed = True
                try:
                    if not self._ws.closed:
                        await self._ws.close(code=code, message=reason.encode()[:120])
                finally:
                    self._state.connections.untrack(self)
                    self.uncount_active()

    def uncount_active(self) -> None:
        """Leave ``gateway_sessions_active`` (once): at the end, or when the connection
        is relayed to the worker holding its call, where it is counted instead."""
        if self._counted_active:
            self._counted_active = False
            self._state.metrics.sessions_active.labels(protocol=self.protocol).dec()

    async def _receive(self) -> None:
        session = self.session
        loop = asyncio.get_running_loop()
        start_deadline = loop.time() + self._state.settings.start_timeout_s
        idle_s = self._state.settings.idle_timeout_s
        msg: WSMessage | None
        while True:
            try:
                if not self.established:  # one deadline for the whole start phase
                    async with asyncio.timeout_at(start_deadline):
                        msg = await self._ws.receive()
                elif idle_s > 0:
                    msg = await self._receive_before_idle(idle_s)
                else:
                    msg = await self._ws.receive()
            except TimeoutError:
                self._error(
                    SessionError(ErrorCode.START_TIMEOUT, "no start in time", CloseCode.POLICY)
                )
                return
            if msg is None:
                self.peer_log.info("idle for %.0f s: closing", idle_s)
                message = f"no message for {idle_s:.0f} s; send keepalive to stay connected"
                self.session.fail(SessionError(ErrorCode.IDLE_TIMEOUT, message, CloseCode.NORMAL))
                return
            try:
                if msg.type is WSMsgType.TEXT:
                    await self.on_text(msg.data)
                elif msg.type is WSMsgType.BINARY:
                    await self.on_binary(msg.data)
                elif msg.type is WSMsgType.ERROR:
                    self._on_ws_error(msg.data)
                    return
                else:  # CLOSE, CLOSING, CLOSED
                    return
            except SessionError as exc:
                self._error(exc)
            if session.done.done():
                return
            await self._wait_until_peer_reads()

    async def _receive_before_idle(self, idle_s: float) -> WSMessage | None:
        """The next message; None when the client sent none for ``idle_s`` while nothing
        was playing (a long prompt is not idleness: the wait starts again)."""
        while True:
            try:
                async with asyncio.timeout(idle_s):
                    return await self._ws.receive()
            except TimeoutError:
                if not self.idle:
                    continue
                return None

    @property
    def idle(self) -> bool:
        """Nothing is playing for this connection (telephony legs: never, the vendor
        ends the call)."""
        return not self.session.playing

    def _error(self, exc: SessionError) -> None:
        """Report ``exc``; before the session is established every error is fatal, and
        malformed input beyond the budget closes the connection."""
        if isinstance(exc, ProtocolViolation):
            self._violations += 1
            if self._violations > self._state.settings.max_protocol_errors:
                exc = ProtocolViolation(
                    ErrorCode.TOO_MANY_ERRORS,
                    f"more than {self._state.settings.max_protocol_errors} malformed messages",
                    CloseCode.POLICY,
                )
        if exc.close_code is None and not self.established:
            exc.close_code = CloseCode.POLICY  # nothing is valid before start
        self.peer_log.info("%s (%s)", exc.code, exc.message)
        self.session.fail(exc)

    def _on_ws_error(self, error: object) -> None:
        if self._ws.close_code == CloseCode.TOO_BIG:
            self._state.metrics.errors.labels(code=ErrorCode.MESSAGE_TOO_BIG).inc()
            self.peer_log.info("message over the size limit")
        else:
            self.peer_log.info("websocket error %r", error)

    async def _wait_until_peer_reads(self) -> None:
        """Read back-pressure: while our frames pile up unread in the transport, read
        nothing more from the peer (the heartbeat ends a peer that never reads)."""
        writer, ws, done = self._writer, self._ws, self.session.done
        # A transport has no "drained below our threshold" event to wait on; this polls
        # only while the peer is behind.
        while writer.backlogged() and not ws.closed and not done.done():  # noqa: ASYNC110
            await asyncio.sleep(BACKPRESSURE_POLL_S)


def _websocket(state: ConnectionContext, subprotocols: tuple[str, ...]) -> web.WebSocketResponse:
    settings = state.settings
    return web.WebSocketResponse(
        max_msg_size=settings.max_message_bytes,
        compress=False,  # frames are written straight to the transport (gateway/wsframe.py)
        heartbeat=settings.ws_heartbeat_s,
        autoping=True,
        protocols=subprotocols,
    )


async def serve(
    request: web.Request, connection: type[Connection], /, **kwargs: Any
) -> web.StreamResponse:
    """The aiohttp handler of every WebSocket protocol: upgrade, authenticate, run."""
    state = request.app[STATE_KEY]
    ws = _websocket(state, connection.subprotocols)
    if not ws.can_prepare(request).ok:
        return web.json_response(
            {
                "error": {
                    "code": ErrorCode.WEBSOCKET_REQUIRED,
                    "message": "connect with a WebSocket",
                }
            },
            status=426,
        )
    await ws.prepare(request)
    transport = request.transport
    if transport is None:  # the peer left during the upgrade
        return ws
    conn = connection(ws, FrameWriter(transport), state, **kwargs)
    token = conn.credentials(request)
    if token is not None or connection.authenticates_at_upgrade():
        try:
            conn.authenticate(token)
        except SessionError as exc:
            state.metrics.errors.labels(code=exc.code).inc()
            conn.refuse(exc)
            await ws.close(code=exc.close_code or CloseCode.POLICY, message=exc.code.encode())
            return ws
    await conn.run()
    return ws


__all__ = ["SCOPE", "Connection", "serve"]
