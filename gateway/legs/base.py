"""What every telephony leg does with its call, whatever carries its media.

A leg (a Twilio media stream, an Asterisk chan_websocket channel, a SIP dialog with its
RTP) is the :class:`gateway.session.Session`'s peer and a :class:`gateway.calls.Call` in
the worker's registry. :class:`CallLeg` holds that part once: starting the session in the
call's codec and registering the call, relaying what an attached IVR application (or an
in-process flow) should see, DTMF, flow control and hangup, and releasing the call. The
transport-specific parts are hooks: how a session mark becomes a vendor mark, what to do
when an utterance's last frame went out, how to hang up.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import ClassVar

from prometheus_client import Gauge

from gateway.calls import Call, CallIdInUse
from gateway.context import LegContext
from gateway.errors import CloseCode, ErrorCode, ProtocolViolation, SessionError
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
from gateway.peer_log import PeerLog
from gateway.session import Session, StartOptions
from telephony.limits import DTMF_DIGITS

log = logging.getLogger(__name__)
#: The longest ``say`` parameter spoken when a call starts.
MAX_SAY_CHARS = 2000


class CallLeg(abc.ABC):
    """The call half of a telephony leg (mixed into a transport class).

    The transport class provides :attr:`session`, :attr:`peer_log` and ``_state`` and the
    hooks; :attr:`call` is set once the call is registered."""

    protocol: ClassVar[str]
    session: Session
    peer_log: PeerLog
    _state: LegContext
    call: Call | None = None
    _paused: bool = False

    # --- hooks ----------------------------------------------------------------------------

    @abc.abstractmethod
    def mark_reached(self, name: str) -> None:
        """The session's mark ``name`` was reached in the audio sent: report it when the
        far end has played it (vendor marks) or at once (RTP has no marks)."""

    def vendor_utterance_done(self) -> None:
        """An utterance's last frame was sent (vendors that hold partial frames flush)."""
        return None

    @abc.abstractmethod
    def vendor_hangup(self) -> None:
        """End the call at the far end (a SIP BYE); a no-op where the stream cannot."""

    # --- the session's peer ---------------------------------------------------------------

    def send_event(self, event: SessionEvent) -> None:
        if isinstance(event, MarkReached) and not event.cleared:
            self.mark_reached(event.name)
            return
        if isinstance(event, Ready):
            return  # the leg has no client to tell; the application gets call_started
        self.publish(event)
        if isinstance(event, UtteranceDone) and not event.cancelled:
            self.vendor_utterance_done()  # (a cancel is not the end of what is playing)

    def backlogged(self) -> bool:
        return self._paused

    # --- the call -------------------------------------------------------------------------

    async def start_call(
        self,
        *,
        call_id: str,
        tenant: str,
        format_name: str,
        parameters: Mapping[str, str],
    ) -> Call:
        """Start the session in the call's codec, register the call, speak ``say``.

        Raises :class:`SessionError` (1008 unless the cause says otherwise):
        ``unknown_voice``, admission refusals, ``call_id_in_use``."""
        fmt = FORMATS[format_name]
        try:
            voice, profile, digest = await self._state.resolve_voice(
                tenant, parameters.get("voice") or self._state.default_voice
            )
            await self.session.start(
                StartOptions(
                    voice=voice,
                    format=fmt,
                    input_format=fmt,
                    barge_in=True,
                    voice_profile=profile,
                    voice_digest=digest,
                )
            )
        except SessionError as exc:
            exc.close_code = exc.close_code or CloseCode.POLICY
            raise
        safe_params = {k: v for k, v in parameters.items() if k != "token"}
        call = Call(
            call_id=call_id,
            protocol=self.protocol,
            tenant=tenant,
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
        return call

    def dtmf(self, digit: str) -> None:
        """A digit the caller pressed, for the application; anything but the 16 DTMF
        digits is dropped (logged): a vendor's oddity is no reason to end a call."""
        if digit not in DTMF_DIGITS:
            self.peer_log.warning("ignored a DTMF event with digit %r", digit[:8])
            return
        self.publish(Dtmf(digit))

    def pause(self, paused: bool) -> None:
        """Flow control from the far end (Asterisk XOFF/XON, a SIP hold): no frame leaves
        while paused, and nothing is lost: the pacer resumes from where it stopped."""
        self._paused = paused
        if not paused:
            self._state.pacer.wake(self.session)

    def hangup(self) -> None:
        """The application asked to end the call."""
        with contextlib.suppress(Exception):
            self.vendor_hangup()
        self.session.finish(CloseCode.NORMAL, "hangup")

    def publish(self, event: SessionEvent) -> None:
        if self.call is not None:
            self.call.publish(event)

    def release_call(self, reason: str) -> None:
        """Unregister the call and tell its applications it ended (once)."""
        call, self.call = self.call, None
        if call is not None:
            self._state.calls.unregister(call)
            call.publish(CallEnded(call.call_id, reason))
            log.info("%s call %s ended", self.protocol, call.call_id)


class StandaloneLeg(CallLeg):
    """A leg that no WebSocket connection carries (a SIP dialog with its RTP, an
    AudioSocket TCP stream): it runs its own lifecycle, counted and tracked for the drain
    like a connection, and always tears down whatever :meth:`_serve` raised."""

    @property
    @abc.abstractmethod
    def established(self) -> bool:
        """Past the start phase (for the drain: a call in progress may finish)."""

    @property
    @abc.abstractmethod
    def calls_active(self) -> Gauge:
        """The leg kind's gauge of calls in progress (incremented here; the teardown
        decrements it)."""

    @abc.abstractmethod
    async def _serve(self) -> None:
        """Serve the call until it ends."""

    @abc.abstractmethod
    async def _teardown(self) -> None:
        """Release the call, the session and the transport; untrack and uncount."""

    async def run(self) -> None:
        """Serve the call until it ends; always releases everything it holds. The
        teardown runs as a task of its own, shielded: a cancelled handler still
        releases (the worker's connections own the task until it ends)."""
        state = self._state
        state.connections.track(self)
        state.metrics.sessions_active.labels(protocol=self.protocol).inc()
        state.metrics.sessions_total.labels(protocol=self.protocol).inc()
        self.calls_active.inc()
        try:
            await self._serve()
        finally:
            teardown = asyncio.ensure_future(self._teardown())
            state.connections.own(teardown)
            await asyncio.shield(teardown)
