"""What the telephony legs (Twilio media streams, Asterisk chan_websocket) share.

A leg is a :class:`gateway.session.Session` speaking into a call, a :class:`Call` in
the worker's registry, and a vendor protocol core (``telephony/twilio.py``,
``telephony/asterisk.py``). :class:`TelephonyLeg` is the session's
:class:`gateway.session.Peer`: it turns frames into vendor media messages, session
events into vendor commands (a ``clear``/``FLUSH_MEDIA`` on clear and barge-in, a vendor
mark per session mark), and relays what an attached IVR application should see through
the call. Marks reach the application only when the vendor reports them played, or as
cleared when a flush dropped them.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import itertools
import logging
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from gateway.auth import AuthError, Principal
from gateway.calls import Call, CallIdInUse
from gateway.errors import CloseCode, SessionError
from gateway.events import (
    CallEnded,
    CallStarted,
    Dtmf,
    MarkReached,
    Ready,
    SessionEvent,
    UtteranceDone,
)
from gateway.formats import FORMATS
from gateway.session import Session, StartOptions
from gateway.state import GatewayState
from gateway.wsframe import FrameWriter

log = logging.getLogger(__name__)
SCOPE = "tts:stream"
DEFAULT_VOICE = "en-us"
MAX_SAY_CHARS = 2000


class LegClosed(Exception):
    """The leg must close: ``code`` is the WebSocket close code, ``reason`` is logged."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class TelephonyLeg(abc.ABC):
    protocol = "telephony"

    def __init__(self, ws: web.WebSocketResponse, writer: FrameWriter, state: GatewayState) -> None:
        self._ws = ws
        self._writer = writer
        self._state = state
        self.session = Session(
            peer=self,
            engine=state.engine_client,
            pacer=state.pacer,
            metrics=state.metrics,
            limits=state.session_limits(),
            protocol=self.protocol,
            gate=state.gate,
            leases=state,
        )
        self.call: Call | None = None
        self.principal: Principal | None = None
        self._paused = False
        self._mark_ids = itertools.count(1)
        self._vendor_marks: dict[str, str] = {}  # vendor mark id -> session mark name
        self._ended = False

    # --- Peer ---------------------------------------------------------------------------

    def send_audio(self, frame: bytes) -> None:
        self.vendor_media(frame)

    def send_event(self, event: SessionEvent) -> None:
        if isinstance(event, MarkReached) and not event.cleared:
            vendor_id = f"m{next(self._mark_ids)}"
            self._vendor_marks[vendor_id] = event.name
            self.vendor_mark(vendor_id)  # reported when the vendor says it was played
            return
        if isinstance(event, Ready):
            return  # the leg has no client to tell; the application gets call_started
        self._publish(event)
        if isinstance(event, UtteranceDone):
            self.vendor_utterance_done()

    def on_interrupt(self) -> None:
        """Called by the session before it drops its queue (clear, barge-in): flush the
        vendor's buffer and report the marks it held as cleared, oldest first, so the
        application sees every dropped mark in order (the session's own queued marks
        follow). Later vendor echoes of these marks are ignored."""
        self.vendor_clear()
        self._clear_vendor_marks()

    def _clear_vendor_marks(self) -> None:
        for vendor_id in list(self._vendor_marks):
            self.vendor_mark_done(vendor_id, cleared=True)

    def backlogged(self) -> bool:
        return self._paused or self._writer.backlogged()

    # --- vendor hooks -------------------------------------------------------------------

    @abc.abstractmethod
    def vendor_media(self, frame: bytes) -> None:
        """Send one 20 ms frame (already in the call's codec)."""

    @abc.abstractmethod
    def vendor_mark(self, vendor_id: str) -> None: ...

    @abc.abstractmethod
    def vendor_clear(self) -> None:
        """Flush the vendor's playback buffer."""

    @abc.abstractmethod
    def vendor_hangup(self) -> None: ...

    @abc.abstractmethod
    def vendor_utterance_done(self) -> None:
        """An utterance's last frame was sent (vendors that hold partial frames flush)."""

    @abc.abstractmethod
    async def handle_text(self, text: str) -> None:
        """One control message from the vendor; raise :class:`LegClosed` to end the leg."""

    @abc.abstractmethod
    async def handle_binary(self, data: bytes) -> None: ...

    # --- helpers for subclasses ---------------------------------------------------------

    def vendor_mark_done(self, vendor_id: str, *, cleared: bool) -> None:
        name = self._vendor_marks.pop(vendor_id, None)
        if name is not None:
            self._publish(MarkReached(name, cleared=cleared))

    def authenticate(self, token: str | None, request: web.Request) -> Principal:
        """Verify ``token`` (from wherever the vendor can carry one); 1008 otherwise."""
        if token is None:
            token = request.query.get("access_token")
        try:
            if not token:
                raise AuthError("token_missing", "no token")
            principal = self._state.verifier.verify(token, SCOPE)
        except AuthError as exc:
            self._state.metrics.auth_failures.labels(code=exc.code).inc()
            raise LegClosed(CloseCode.POLICY, exc.code) from None
        self.principal = principal
        self.session.tenant = principal.tenant
        self.session.max_streams = principal.max_streams
        return principal

    async def start_call(
        self,
        *,
        call_id: str,
        format_name: str,
        parameters: Mapping[str, str],
    ) -> None:
        """Start the session in the call's codec, register the call, speak ``say``."""
        assert self.principal is not None
        fmt = FORMATS[format_name]
        try:
            voice, profile = await self._state.resolve_voice(
                self.principal.tenant, parameters.get("voice") or DEFAULT_VOICE
            )
            await self.session.start(
                StartOptions(
                    voice=voice,
                    format=fmt,
                    input_format=fmt,
                    barge_in=True,
                    voice_profile=profile,
                )
            )
        except SessionError as exc:
            raise LegClosed(exc.close_code or CloseCode.POLICY, exc.code) from None
        safe_params = {k: v for k, v in parameters.items() if k != "token"}
        call = Call(
            call_id=call_id,
            protocol=self.protocol,
            tenant=self.principal.tenant,
            custom_parameters=safe_params,
            session=self.session,
            hangup=self.hangup,
        )
        try:
            self._state.calls.register(call)
        except CallIdInUse:
            raise LegClosed(CloseCode.POLICY, "call_id_in_use") from None
        self.call = call
        log.info("%s call %s started (session %s)", self.protocol, call_id, self.session.id)
        call.publish(CallStarted(call_id, self.protocol, safe_params))
        say = parameters.get("say")
        if say:
            try:
                self.session.speak(say[:MAX_SAY_CHARS], "say")
            except SessionError as exc:
                log.info("call %s: say refused: %s", call_id, exc.code)

    def dtmf(self, digit: str) -> None:
        self._publish(Dtmf(digit))

    def pause(self, paused: bool) -> None:
        """Flow control from the vendor (Asterisk XOFF/XON): no frame leaves while paused,
        and nothing is lost: the pacer resumes from where it stopped."""
        self._paused = paused
        if not paused:
            self._state.pacer.wake(self.session)

    def hangup(self) -> None:
        """The application asked to end the call."""
        with contextlib.suppress(Exception):
            self.vendor_hangup()
        self.session.finish(CloseCode.NORMAL, "hangup")

    def _publish(self, event: SessionEvent) -> None:
        if self.call is not None:
            self.call.publish(event)

    # --- the receive loop -----------------------------------------------------------------

    async def run(self) -> None:
        metrics = self._state.metrics
        metrics.sessions_active.labels(protocol=self.protocol).inc()
        metrics.sessions_total.labels(protocol=self.protocol).inc()
        receiver = asyncio.create_task(self._receive(), name=f"{self.protocol}-recv")
        self._state.track(self.session)
        try:
            waits: list[asyncio.Future[Any]] = [receiver, self.session.done]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if self.session.done.done():
                code, reason = self.session.done.result()
                await self._end(reason)  # free the slot and lease before the peer knows
                await self._ws.close(code=code, message=reason.encode()[:120])
        finally:
            receiver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await receiver
            self._writer.closed = True
            await self._end("leg closed")
            self._state.untrack(self.session)
            metrics.sessions_active.labels(protocol=self.protocol).dec()

    async def _receive(self) -> None:
        from aiohttp import WSMsgType

        deadline = asyncio.get_running_loop().time() + self._state.settings.start_timeout_s
        try:
            while True:
                timeout = None
                if self.call is None:  # the vendor must start the call in time
                    timeout = deadline - asyncio.get_running_loop().time()
                    if timeout <= 0:
                        raise LegClosed(CloseCode.POLICY, "start_timeout")
                try:
                    msg = await self._ws.receive(timeout=timeout)
                except TimeoutError:
                    continue
                if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED):
                    return
                if msg.type is WSMsgType.ERROR:
                    return
                if msg.type is WSMsgType.TEXT:
                    await self.handle_text(msg.data)
                elif msg.type is WSMsgType.BINARY:
                    await self.handle_binary(msg.data)
                if self.session.done.done():
                    return
        except LegClosed as exc:
            log.warning("%s leg closed: %s", self.protocol, exc.reason)
            self._state.metrics.errors.labels(code=exc.reason).inc()
            self.session.finish(exc.code, exc.reason)

    async def _end(self, reason: str) -> None:
        if self._ended:
            return
        self._ended = True
        call = self.call
        if call is not None:
            self._state.calls.unregister(call)
            self._clear_vendor_marks()  # never reported played: the call is over
            call.publish(CallEnded(call.call_id, reason))
            log.info("%s call %s ended", self.protocol, call.call_id)
        await self.session.aclose(reason)
