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
import contextlib
import itertools
import logging
from collections.abc import Mapping
from typing import Protocol

from aiohttp import web

from gateway.calls import Call, CallIdInUse
from gateway.errors import CloseCode, ErrorCode, ProtocolViolation, SessionError, vendor_code
from gateway.events import (
    CallEnded,
    CallStarted,
    Dtmf,
    ErrorEvent,
    MarkReached,
    Ready,
    SessionEvent,
    UtteranceDone,
)
from gateway.formats import FORMATS
from gateway.protocols.base import Connection
from gateway.session import StartOptions
from gateway.state import GatewayState
from gateway.wsframe import FrameWriter
from telephony.limits import DTMF_DIGITS

log = logging.getLogger(__name__)
MAX_SAY_CHARS = 2000
#: Marks sent to the vendor and not yet reported played. A vendor that stops echoing
#: marks (or stops playing) would otherwise make this grow for the whole call; beyond it,
#: a new mark is not sent and the application gets ``mark_backlog_full`` naming it.
MAX_PENDING_VENDOR_MARKS = 256


class VendorProtocolError(Protocol):
    """What the vendor cores raise on bad input (TwilioError, AsteriskError)."""

    @property
    def code(self) -> str: ...


class TelephonyLeg(Connection):
    """A telephony call leg over the shared connection base; subclasses add a vendor core."""

    expires_with_token = False  # the vendor cannot renew a call's token (docs/protocol.md)

    def __init__(
        self,
        ws: web.WebSocketResponse,
        writer: FrameWriter,
        state: GatewayState,
        *,
        request: web.Request,
    ) -> None:
        super().__init__(ws, writer, state)
        self._request = request
        self.call: Call | None = None
        self._paused = False
        self._mark_ids = itertools.count(1)
        self._vendor_marks: dict[str, str] = {}  # vendor mark id -> session mark name

    @property
    def established(self) -> bool:
        return self.call is not None  # the vendor must start the call in time

    # --- Peer ---------------------------------------------------------------------------

    def send_audio(self, frame: bytes) -> None:
        self.vendor_media(frame)

    def send_event(self, event: SessionEvent) -> None:
        if isinstance(event, MarkReached) and not event.cleared:
            self._send_vendor_mark(event.name)
            return
        if isinstance(event, Ready):
            return  # the leg has no client to tell; the application gets call_started
        self._publish(event)
        if isinstance(event, UtteranceDone):
            self.vendor_utterance_done()

    def _send_vendor_mark(self, name: str) -> None:
        """Send a vendor mark for the session's mark ``name``; it is reported to the
        application when the vendor says it was played (bounded backlog)."""
        if self.vendor_pending_marks() >= MAX_PENDING_VENDOR_MARKS:
            self._state.metrics.errors.labels(code=ErrorCode.MARK_BACKLOG_FULL).inc()
            self.peer_log.warning("mark backlog full: the vendor is not echoing marks")
            self._publish(
                ErrorEvent(
                    ErrorCode.MARK_BACKLOG_FULL,
                    f"{MAX_PENDING_VENDOR_MARKS} marks are waiting for the vendor to play "
                    f"them; mark {name[:64]!r} was not sent",
                )
            )
            return
        vendor_id = f"m{next(self._mark_ids)}"
        self._vendor_marks[vendor_id] = name
        self.vendor_mark(vendor_id)

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
    def vendor_pending_marks(self) -> int:
        """Marks the vendor core has sent and not yet seen played or dropped."""

    @abc.abstractmethod
    def vendor_clear(self) -> None:
        """Flush the vendor's playback buffer."""

    @abc.abstractmethod
    def vendor_hangup(self) -> None: ...

    @abc.abstractmethod
    def vendor_utterance_done(self) -> None:
        """An utterance's last frame was sent (vendors that hold partial frames flush)."""

    # --- helpers for subclasses ---------------------------------------------------------

    def vendor_error(self, exc: VendorProtocolError) -> ProtocolViolation:
        """A vendor core's protocol error as the leg's error: ``<protocol>_<code>``,
        closing the leg (1008)."""
        return ProtocolViolation(vendor_code(self.protocol, exc.code), str(exc), CloseCode.POLICY)

    def vendor_mark_done(self, vendor_id: str, *, cleared: bool) -> None:
        name = self._vendor_marks.pop(vendor_id, None)
        if name is not None:
            self._publish(MarkReached(name, cleared=cleared))

    async def start_call(
        self,
        *,
        call_id: str,
        format_name: str,
        parameters: Mapping[str, str],
    ) -> None:
        """Start the session in the call's codec, register the call, speak ``say``.

        Raises :class:`SessionError` (1008 unless the cause says otherwise)."""
        assert self.principal is not None
        fmt = FORMATS[format_name]
        try:
            voice, profile = await self._state.resolve_voice(
                self.principal.tenant,
                parameters.get("voice") or self._state.engine.default_voice,
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
            exc.close_code = exc.close_code or CloseCode.POLICY
            raise
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
            raise ProtocolViolation(
                ErrorCode.CALL_ID_IN_USE,
                "this tenant already has a call with that id",
                CloseCode.POLICY,
            ) from None
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
        """A digit the caller pressed, for the application; anything but the 16 DTMF
        digits is dropped (logged): a vendor's oddity is no reason to end a call."""
        if digit not in DTMF_DIGITS:
            self.peer_log.warning("ignored a DTMF event with digit %r", digit[:8])
            return
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

    async def on_release(self, reason: str) -> None:
        call = self.call
        if call is not None:
            self._state.calls.unregister(call)
            self._clear_vendor_marks()  # never reported played: the call is over
            call.publish(CallEnded(call.call_id, reason))
            log.info("%s call %s ended", self.protocol, call.call_id)
