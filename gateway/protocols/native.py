"""The native protocol v1, ``GET /v1/stream`` (design brief, section 3): the thin asyncio
adapter that feeds frames to the wire codec (:mod:`gateway.protocols.native_codec`) and
the session, over the shared connection base (:mod:`gateway.protocols.base`).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from aiohttp import web

from gateway.auth import token_from_request
from gateway.calls import Call
from gateway.context import LegContext
from gateway.errors import CloseCode, ErrorCode, ProtocolViolation, SessionError
from gateway.events import CallEnded, CallStarted, ErrorEvent, Ready, SessionEvent
from gateway.protocols.base import Connection, serve
from gateway.protocols.native_codec import (
    CancelMsg,
    ClearMsg,
    ClientMessage,
    CloseMsg,
    FlushMsg,
    HangupMsg,
    KeepaliveMsg,
    MarkMsg,
    SpeakMsg,
    StartMsg,
    decode_client_message,
    encode_event,
    start_options,
)
from gateway.protocols.relay import RELAY_HEADER, Relay, RelayEnd, RelayUnavailable
from gateway.session import Session, SessionState
from gateway.wsframe import FrameWriter

log = logging.getLogger(__name__)


class NativeConnection(Connection):
    """One ``/v1/stream`` WebSocket: the native codec over the shared connection base."""

    protocol = "native"
    _state: LegContext  # an application acts on calls as a leg does

    def __init__(self, ws: web.WebSocketResponse, writer: FrameWriter, state: LegContext) -> None:
        super().__init__(ws, writer, state)
        self.call: Call | None = None  # set when attached to a telephony call here
        self.relay: Relay | None = None  # set when attached to a call held elsewhere
        self._relay_pump: asyncio.Task[None] | None = None
        self._token: str | None = None
        self._relayed = False  # this connection is itself a relay from another worker

    def credentials(self, request: web.Request) -> str | None:
        self._relayed = RELAY_HEADER in request.headers
        self._token = token_from_request(request.headers, request.query)
        return self._token

    def refuse(self, error: SessionError) -> None:
        self._writer.send_text(encode_event(ErrorEvent(error.code, error.message)))

    # Peer
    def send_audio(self, frame: bytes) -> None:
        self._writer.send_binary(frame)

    def send_event(self, event: SessionEvent) -> None:
        self._writer.send_text(encode_event(event))

    # CallSubscriber
    def on_call_event(self, event: SessionEvent) -> None:
        self.send_event(event)
        if isinstance(event, CallEnded):
            self.session.finish(CloseCode.NORMAL, "call ended")

    @property
    def established(self) -> bool:
        """Started, or attached to a call (an attached app may stay quiet)."""
        return self.session.started or self.call is not None or self.relay is not None

    @property
    def idle(self) -> bool:
        """Nothing plays on our session or on the call we are attached to (a relayed
        connection is never idle here: the owner applies the idle timeout)."""
        return self.relay is None and not self.target.playing

    @property
    def target(self) -> Session:
        """The session commands act on: the call's when attached, else our own."""
        return self.call.session if self.call is not None else self.session

    async def on_release(self, reason: str) -> None:
        if self.call is not None:
            self.call.subscribers.discard(self)
        pump, self._relay_pump = self._relay_pump, None
        if pump is not None:
            pump.cancel()
            await asyncio.wait([pump])
        relay, self.relay = self.relay, None
        if relay is not None:
            await relay.close()

    async def _attach(self, call_id: str, start_text: str) -> None:
        assert self.principal is not None
        call = self._state.calls.get(call_id, self.principal.tenant)
        if call is None:
            await self._attach_elsewhere(call_id, start_text)
            return
        self.call = call
        call.subscribers.add(self)
        session = call.session
        fmt = session.options.format if session.options else None
        self.send_event(
            Ready(session.id, fmt.name if fmt else "", fmt.sample_rate if fmt else 0, 20)
        )
        self.send_event(CallStarted(call.call_id, call.protocol, dict(call.custom_parameters)))
        log.info("session %s attached to call %s", self.session.id, call.call_id)

    async def _attach_elsewhere(self, call_id: str, start_text: str) -> None:
        """Relay this connection to the worker or instance holding the call."""
        assert self.principal is not None
        unknown = SessionError(
            ErrorCode.UNKNOWN_CALL, f"no call {call_id[:64]!r}", CloseCode.POLICY
        )
        metrics = self._state.metrics
        if self._relayed or self._token is None:
            raise unknown  # a relay is never relayed further
        owner = await self._state.calls.directory.owner(self.principal.tenant, call_id)
        if owner is None:
            raise unknown
        try:
            relay = await Relay.open(
                owner, self._token, max_message_bytes=self._state.settings.max_message_bytes
            )
        except RelayUnavailable as exc:
            metrics.call_relays.labels(result="unreachable").inc()
            log.warning("session %s: call %s: owner unreachable: %s", self.session.id, call_id, exc)
            raise unknown from None
        self.relay = relay
        self.uncount_active()  # a session of the owner's, counted there
        await relay.send_text(start_text)
        self._relay_pump = asyncio.create_task(self._pump(relay), name=f"relay-{self.session.id}")
        metrics.call_relays.labels(result="relayed").inc()
        log.info("session %s relayed to the owner of call %s", self.session.id, call_id)

    async def _pump(self, relay: Relay) -> None:
        """The owner's frames to our peer; when the owner ends, we end alike."""
        try:
            end = await relay.pump(
                self._writer.send_text, self._writer.send_binary, self.backlogged
            )
        except Exception:
            log.exception("session %s: relay failed", self.session.id)
            end = RelayEnd(CloseCode.INTERNAL_ERROR, "relay failed", lost=True)
        if end.lost:
            self._state.metrics.call_relays.labels(result="lost").inc()
            message = "the gateway worker holding the call went away"
            self.session.fail(SessionError(ErrorCode.CALL_LOST, message, CloseCode.INTERNAL_ERROR))
        else:
            self.session.finish(end.code, end.reason)

    async def on_text(self, text: str) -> None:
        if self.relay is not None:
            await self.relay.send_text(text)
            return
        await self._dispatch(decode_client_message(text), text)

    async def _dispatch(self, message: ClientMessage, text: str) -> None:
        own = self.session
        if isinstance(message, KeepaliveMsg):
            return  # any message resets the idle timeout; this one does nothing else
        if isinstance(message, StartMsg):
            if own.state is not SessionState.AWAITING_START or self.call is not None:
                raise ProtocolViolation(ErrorCode.ALREADY_STARTED, "start was already received")
            if message.call is not None:
                await self._attach(message.call, text)
            else:
                assert self.principal is not None
                options = start_options(message)
                voice, profile, digest = await self._state.resolve_voice(
                    self.principal.tenant, options.voice
                )
                await own.start(
                    replace(options, voice=voice, voice_profile=profile, voice_digest=digest)
                )
            return
        if isinstance(message, CloseMsg) and self.call is not None:
            own.finish(CloseCode.NORMAL, "detached")  # the call goes on without us
            return
        if isinstance(message, HangupMsg):
            if self.call is None:
                raise ProtocolViolation(ErrorCode.NOT_ATTACHED, "hangup needs a call (start.call)")
            self.call.hangup()
            return
        session = self.target
        if not session.started and not isinstance(message, CloseMsg):
            if self.call is not None:
                raise SessionError(ErrorCode.CALL_NOT_ACTIVE, "the call is not active")
            raise ProtocolViolation(ErrorCode.NOT_STARTED, "send start first", CloseCode.POLICY)
        if isinstance(message, SpeakMsg):
            session.speak(
                message.text,
                message.utterance_id,
                flush=message.flush,
                instruct=message.instruct,
                cache=message.cache,
            )
        elif isinstance(message, FlushMsg):
            session.flush(message.utterance_id, flush_id=message.flush_id)
        elif isinstance(message, CancelMsg):
            session.cancel(message.utterance_id)
        elif isinstance(message, ClearMsg):
            session.clear()
        elif isinstance(message, MarkMsg):
            session.mark(message.name)
        elif isinstance(message, CloseMsg):
            session.request_close()

    async def on_binary(self, data: bytes) -> None:
        if self.relay is not None:
            await self.relay.send_binary(data)
            return
        if not self.session.started:
            raise ProtocolViolation(ErrorCode.NOT_STARTED, "binary before start", CloseCode.POLICY)
        self.session.feed_caller_audio(data)


async def handle_stream(request: web.Request) -> web.StreamResponse:
    return await serve(request, NativeConnection)
