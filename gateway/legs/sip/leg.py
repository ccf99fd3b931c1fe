"""One SIP call: a dialog, its RTP, its session, its route.

:class:`SipLeg` is a :class:`gateway.legs.base.CallLeg` (the call in the registry with
protocol ``sip`` and the SIP Call-ID as id, what an attached application sees) whose
media is RTP:

- outbound: the session's frames, paced by the worker's pacer like every other session,
  become RTP packets (``telephony/rtp.py``: continuous sequence numbers and timestamps,
  the marker bit at each talkspurt) sent to the address the SDP offer named, or, once
  the caller's first packet arrives, to where it came from (symmetric RTP, RFC 4961):
  what a phone behind NAT needs. Packets from any other source are dropped and counted;
- where media may go (issue 29): nothing is sent before the ACK or the caller's first
  RTP, whichever comes first (an INVITE never acknowledged sends nothing); the SDP's
  address, and the source a latch follows, only when :func:`gateway.legs.sip.config.
  media_allowed` says so (the signalling source's own address, or
  ``GATEWAY_SIP_MEDIA_NETWORKS``); an address it refuses gets nothing until the caller's
  RTP arrives from an allowed one. A re-INVITE's new address obeys the same rule. Toward
  an address that has not answered (no latch), at most :attr:`SipLeg.unanswered_cap`
  RTP packets (``GATEWAY_SIP_RTP_TIMEOUT_S`` of audio) and one RTCP report per
  :data:`RTCP_INTERVAL_S` of it go out in the whole call, whatever re-INVITEs and holds
  do, and the RTP watchdog hangs the call up;
- inbound: the caller's audio goes to the session (VAD barge-in as on Twilio legs);
  RFC 4733 events become ``dtmf`` for the flow or the application;
- RTCP: a sender report every :data:`RTCP_INTERVAL_S` (RFC 3550 6.2, one call's share
  of the bandwidth is far below it); the peer's reports are read for loss and jitter;
- hold (a re-INVITE with ``sendonly``/``inactive``/``c=0.0.0.0``) pauses the session's
  output without losing it; unhold resumes where it stopped.

The lifecycle (:meth:`SipLeg.run`): start the session in the negotiated codec (admission
applies: ``overloaded`` is a 503 with Retry-After), answer, run the route, and end on
BYE, CANCEL, hangup or session end; whatever ends it, the session, the call, the RTP
ports and the dialog are released (a BYE is sent when the call was answered and the far
end did not end it).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from typing import Any, ClassVar, Protocol

from prometheus_client import Gauge

from gateway.context import LegContext
from gateway.errors import ErrorCode, SessionError
from gateway.events import MarkReached
from gateway.legs.base import StandaloneLeg
from gateway.legs.sip.flow import FlowRunner
from gateway.legs.sip.media import Address, MediaPorts
from gateway.legs.sip.metrics import SipMetrics
from gateway.legs.sip.routes import Route
from gateway.legs.sip.webhook import WebhookClient, WebhookRunner
from gateway.peer_log import PeerLog
from gateway.tenant_quota import quota_for
from telephony.rtp import (
    DtmfReceiver,
    RtpError,
    RtpReceiver,
    RtpSender,
    parse_rtp,
)
from telephony.sdp import Negotiated, SessionDescription
from telephony.sip import DialogId

log = logging.getLogger(__name__)
RTCP_INTERVAL_S = 5.0
CNAME = "voice-gateway"
CODEC_FORMATS = {"PCMU": "mulaw_8000", "PCMA": "alaw_8000"}


class Signalling(Protocol):
    """What a leg asks of the SIP side (:class:`gateway.legs.sip.bridge.SipBridge`)."""

    def ring(self, leg: SipLeg) -> None: ...
    def answer(self, leg: SipLeg) -> bool:
        """Send the 200 OK; False when the dialog ended meanwhile."""
        ...

    def reject(self, leg: SipLeg, status: int, retry_after_s: int | None = None) -> None: ...
    def bye(self, leg: SipLeg) -> None: ...
    async def refer(self, leg: SipLeg, target: str) -> int: ...
    def media_allowed(self, source: str, host: str) -> bool:
        """A call signalled from ``source`` may have its media at ``host``
        (:func:`gateway.legs.sip.config.media_allowed` with ``GATEWAY_SIP_MEDIA_NETWORKS``)."""
        ...


#: Session refusals that are about load or this instance, not the call: 503 with
#: Retry-After, so the PBX or SBC tries again or elsewhere.
TRY_ELSEWHERE = frozenset(
    {
        ErrorCode.OVERLOADED,
        ErrorCode.QUEUE_TIMEOUT,
        ErrorCode.SHUTTING_DOWN,
        ErrorCode.ENGINE_UNAVAILABLE,
        ErrorCode.TENANT_LIMIT,
        ErrorCode.LIMITS_UNAVAILABLE,
    }
)


def status_for(error: SessionError) -> int:
    """A session start's refusal as a final response to the INVITE: 503 for load, 500
    for the rest (a route naming a voice the engine lacks, a Call-ID already in use)."""
    return 503 if error.code in TRY_ELSEWHERE else 500


class SipLeg(StandaloneLeg):
    protocol: ClassVar[str] = "sip"

    def __init__(
        self,
        state: LegContext,
        *,
        signalling: Signalling,
        metrics: SipMetrics,
        dialog: DialogId,
        call_id: str,
        tenant: str,
        route: Route,
        offer: SessionDescription,
        negotiated: Negotiated,
        media: MediaPorts,
        invited_at: float,
        signalling_host: str,
        max_call_s: float,
        rtp_timeout_s: float,
        caller: str = "",
        called: str = "",
        webhooks: WebhookClient | None = None,
    ) -> None:
        self._state = state
        self._signalling = signalling
        self._metrics = metrics
        self.dialog = dialog
        self.call_id = call_id
        self.tenant = tenant
        self.route = route
        self.offer = offer  # the last SDP offer (the answer mirrors its m-lines)
        self.negotiated = negotiated
        self.sdp_session_id = random.SystemRandom().getrandbits(31)
        self.sdp_version = 0  # incremented with every answer (RFC 3264 section 8)
        self.media = media
        self.invited_at = invited_at
        self._signalling_host = signalling_host
        self._max_call_s = max_call_s
        self._rtp_timeout_s = rtp_timeout_s
        self._last_rtp_at = invited_at
        self.caller = caller  # the From URI
        self.called = called  # the Request-URI user
        self._webhooks = webhooks
        self.session = state.new_session(self, self.protocol, quota_for(tenant))
        self.peer_log = PeerLog(log, f"sip {call_id[:64]}")
        rng = random.SystemRandom()
        self._sender = RtpSender(
            ssrc=rng.getrandbits(32),
            payload_type=negotiated.codec.payload_type,
            first_sequence=rng.getrandbits(16),
            first_timestamp=rng.getrandbits(32),
        )
        self._receiver = RtpReceiver()
        self._dtmf = (
            DtmfReceiver(payload_type=negotiated.dtmf_payload_type)
            if negotiated.dtmf_payload_type is not None
            else None
        )
        self._offered: Address | None = negotiated.remote_rtp  # the last SDP address
        self._remote = self._allowed(negotiated.remote_rtp)  # None: wait for the latch
        self._rtcp_default = self._allowed(negotiated.remote_rtcp)
        self._latched: Address | None = None
        self._rtcp_remote: Address | None = None
        self._flowing = False  # media out only after the ACK or the caller's first RTP
        #: RTP packets that may go, in the whole call, to an address that never answered
        self.unanswered_cap = int(rtp_timeout_s * 1000 / negotiated.ptime)
        self.unanswered_sent = 0
        #: RTCP reports likewise (the RTP watchdog sleeps while on hold; this cap does not)
        self.unanswered_reports_cap = max(1, math.ceil(rtp_timeout_s / RTCP_INTERVAL_S))
        self.unanswered_reports = 0
        self._paused = negotiated.on_hold
        self._ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.answered = False
        self.rejected = False
        self.remote_ended = False
        self.end_reason = ""

    # --- Connection (for the drain) -------------------------------------------------------

    @property
    def established(self) -> bool:
        return self.answered

    # --- Peer -----------------------------------------------------------------------------

    def backlogged(self) -> bool:
        return self._paused or not self._flowing  # before the ACK: held, nothing lost

    def send_audio(self, frame: bytes) -> None:
        if not self._flowing:
            return
        destination = self._latched
        if destination is None:
            destination = self._remote
            if destination is None or self.unanswered_sent >= self.unanswered_cap:
                return  # nobody answered from there: the watchdog hangs up
            self.unanswered_sent += 1
        if self.media.send_rtp(self._sender.packet(frame, time.monotonic()), destination):
            self._metrics.rtp_out.inc()

    def on_interrupt(self) -> None:
        return None  # RTP cannot flush the far end: at most the pacing lead is in flight

    def mark_reached(self, name: str) -> None:
        self.publish(MarkReached(name))  # no vendor echo: reached when its audio was sent

    def vendor_hangup(self) -> None:
        return None  # the teardown sends the BYE

    # --- RTP in ---------------------------------------------------------------------------

    def on_rtp(self, data: bytes, source: Address) -> None:
        if self._latched is not None and source != self._latched:
            self._metrics.rtp_unexpected_source.inc()
            return
        try:
            packet = parse_rtp(data)
        except RtpError:
            self._metrics.rtp_malformed.inc()
            return
        if self._latched is None:
            if not self._may_latch(packet.payload_type, source[0]):
                self._metrics.rtp_unexpected_source.inc()
                return
            self._latched = source  # symmetric RTP: answer where the caller sends from
            self._rtcp_remote = (source[0], source[1] + 1) if source[1] < 65535 else None
            self.confirmed()  # the caller is there: media may flow even before the ACK
        self._last_rtp_at = time.monotonic()
        self._metrics.rtp_in.inc()
        if self._dtmf is not None and packet.payload_type == self._dtmf.payload_type:
            try:
                digit = self._dtmf.on_packet(packet)
            except RtpError:
                self._metrics.rtp_malformed.inc()
                return
            if digit is not None:
                self._metrics.dtmf.inc()
                self.dtmf(digit)
            return
        if packet.payload_type != self.negotiated.codec.payload_type:
            self._metrics.rtp_unknown_payload.inc()
            return
        duplicates = self._receiver.duplicates
        if not self._receiver.on_packet(packet, time.monotonic()) and (
            self._receiver.duplicates > duplicates
        ):  # a source on probation (RFC 3550 A.1) is still the caller: only repeats go
            self._metrics.rtp_duplicate.inc()
            return
        if self.session.started and packet.payload:
            try:
                self.session.feed_caller_audio(packet.payload)
            except SessionError as exc:
                self.peer_log.info("caller audio refused: %s", exc.code)

    def on_rtcp(self, data: bytes, source: Address) -> None:
        if self._latched is None or source[0] != self._latched[0]:
            self._metrics.rtp_unexpected_source.inc()  # RTCP follows the latched RTP
            return
        try:
            self._receiver.on_rtcp(data, time.monotonic())
        except RtpError:
            self._metrics.rtp_malformed.inc()
            return
        self._rtcp_remote = source

    def _may_latch(self, payload_type: int, host: str) -> bool:
        """Latch only on the call's own media: a negotiated payload type, from where its
        media may be (the signalling peer's address or ``GATEWAY_SIP_MEDIA_NETWORKS``;
        a stray packet of an earlier call on a reused port, or one spoofed from a third
        party's address, must not take the audio there)."""
        negotiated = self.negotiated
        if payload_type not in (negotiated.codec.payload_type, negotiated.dtmf_payload_type):
            return False
        return self._signalling.media_allowed(self._signalling_host, host)

    def _allowed(self, destination: Address | None) -> Address | None:
        """``destination`` if media may go there before the caller's RTP shows where."""
        if destination is None:
            return None
        if not self._signalling.media_allowed(self._signalling_host, destination[0]):
            self.peer_log.info("media address not allowed: waiting for the caller's RTP")
            return None
        return destination

    # --- signalling in ----------------------------------------------------------------------

    def confirmed(self) -> None:
        """The ACK arrived (or the caller's RTP did): media may flow from now on."""
        if not self._flowing:
            self._flowing = True
            if not self._paused:
                self._state.pacer.wake(self.session)

    def ended(self, reason: str, *, remote: bool) -> None:
        """The dialog ended (BYE, CANCEL, no ACK): tear the call down."""
        if not self._ended.done():
            self.remote_ended = remote
            self._ended.set_result(reason)

    def renegotiated(self, negotiated: Negotiated) -> None:
        """A re-INVITE was answered: new address, hold or unhold."""
        dtmf = negotiated.dtmf_payload_type
        if dtmf != self.negotiated.dtmf_payload_type:
            self._dtmf = DtmfReceiver(payload_type=dtmf) if dtmf is not None else None
        if negotiated.remote_rtp is not None and negotiated.remote_rtp != self._offered:
            # the media moved: latch again; the new address obeys the same rule
            self._offered = negotiated.remote_rtp
            self._remote = self._allowed(negotiated.remote_rtp)
            self._rtcp_default = self._allowed(negotiated.remote_rtcp)
            self._latched = self._rtcp_remote = None
        self.negotiated = negotiated
        self.pause(negotiated.on_hold)

    async def transfer(self, target: str) -> bool:
        status = await self._signalling.refer(self, target)
        return 200 <= status < 300

    # --- lifecycle --------------------------------------------------------------------------

    @property
    def calls_active(self) -> Gauge:
        return self._metrics.calls_active

    async def _serve(self) -> None:
        starting = asyncio.ensure_future(self._start())
        first: list[asyncio.Future[Any]] = [starting, self._ended, self.session.done]
        await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():  # CANCEL, BYE, or the drain while the session started
            starting.cancel()
            await asyncio.wait([starting])
            if not self._ended.done():  # the drain: try another instance
                self._reject(503, self._state.settings.retry_after_ms)
            return
        error = starting.exception()
        if error is not None:
            if not isinstance(error, SessionError):
                raise error  # the teardown answers 500
            self.peer_log.info("refused: %s", error.code)
            self._reject(status_for(error), error.retry_after_ms)
            return
        if self._ended.done() or not self._signalling.answer(self):
            return
        self.answered = True
        self._metrics.setup.observe(time.monotonic() - self.invited_at)
        route = asyncio.ensure_future(self._run_route())
        rtcp = asyncio.ensure_future(self._send_reports())
        ending: list[asyncio.Future[Any]] = [self.session.done, self._ended]
        try:
            await asyncio.wait([*ending, route], return_when=asyncio.FIRST_COMPLETED)
            if route.done() and not route.cancelled() and route.exception() is not None:
                log.error("sip call %s: route failed", self.call_id, exc_info=route.exception())
            elif route.done():  # the flow ended without hanging up (it always does)
                await asyncio.wait(ending, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (route, rtcp):
                task.cancel()
            await asyncio.wait([route, rtcp])
            if not rtcp.cancelled() and rtcp.exception() is not None:
                log.error("sip call %s: reports failed", self.call_id, exc_info=rtcp.exception())

    def _reject(self, status: int, retry_after_ms: int | None = None) -> None:
        retry = -(-retry_after_ms // 1000) if retry_after_ms else None
        self._signalling.reject(self, status, retry)
        self.rejected = True
        self.end_reason = "rejected"

    async def _start(self) -> None:
        if self.route.answer_after_s > 0:
            self._signalling.ring(self)
            await asyncio.sleep(self.route.answer_after_s)
        parameters = {"from": self.caller, "to": self.called}
        if self.route.voice:
            parameters["voice"] = self.route.voice
        await self.start_call(
            call_id=self.call_id,
            tenant=self.tenant,
            format_name=CODEC_FORMATS[self.negotiated.codec.name],
            parameters=parameters,
        )

    async def _run_route(self) -> None:
        call = self.call
        assert call is not None
        if self.route.flow is not None:
            await FlowRunner(call, self.route.flow, self).run()
            return
        if self.route.webhook is not None and self._webhooks is not None:
            await WebhookRunner(call, self.route, self, self._webhooks).run()
            return
        # An IVR application attaches with start.call = the Call-ID; none in time: hang up.
        await asyncio.sleep(self.route.attach_timeout_s)
        if not call.subscribers:
            self.peer_log.info("no application attached in %.0f s", self.route.attach_timeout_s)
            self.hangup()
        await asyncio.Future()  # the application drives the call until it ends

    async def _send_reports(self) -> None:
        """RTCP every few seconds, and the call's two watchdogs: its maximum length
        (``GATEWAY_SIP_MAX_CALL_S``) and a caller whose RTP stopped without a BYE
        (``GATEWAY_SIP_RTP_TIMEOUT_S``; not while on hold)."""
        while True:
            await asyncio.sleep(RTCP_INTERVAL_S)
            now = time.monotonic()
            if now - self.invited_at > self._max_call_s:
                self.peer_log.info("longer than %.0f s: hanging up", self._max_call_s)
                self.end_reason = "max_duration"
                self.hangup()
            elif not self._paused and now - self._last_rtp_at > self._rtp_timeout_s:
                self.peer_log.info("no RTP for %.0f s: hanging up", self._rtp_timeout_s)
                self.end_reason = "rtp_timeout"
                self.hangup()
            destination = self._rtcp_remote if self._latched else self._rtcp_default
            unanswered = self._latched is None  # nobody answered from there (yet): capped
            if unanswered and self.unanswered_reports >= self.unanswered_reports_cap:
                destination = None
            if destination is not None and self._sender.packets_sent and self._flowing:
                report = self._sender.sender_report(
                    wallclock=time.time(),
                    now=time.monotonic(),
                    receiver=self._receiver,
                    cname=CNAME,
                )
                if unanswered:
                    self.unanswered_reports += 1
                self.media.send_rtcp(report, destination)

    async def _teardown(self) -> None:
        reason = self._ended.result() if self._ended.done() else self.end_reason or "hangup"
        if self.session.done.done() and not self._ended.done():
            reason = self.session.done.result()[1]
        # how the call ended, decided now: our own BYE below ends the dialog too
        how = reason if self._ended.done() else (self.end_reason or "local_bye")
        try:
            self.release_call(reason)
        except Exception:
            log.exception("sip call %s: release failed", self.call_id)
        try:
            await self.session.aclose(reason)
        finally:
            try:
                if self.answered and not self.remote_ended:
                    self._signalling.bye(self)
                elif not (self.answered or self.rejected or self._ended.done()):
                    self._signalling.reject(self, 500)  # a bug before the answer
            finally:
                self.media.close()
                self._metrics.calls_active.dec()
                self._state.connections.untrack(self)
                self._state.metrics.sessions_active.labels(protocol=self.protocol).dec()
                self._count_end(how)

    def _count_end(self, how: str) -> None:
        self._metrics.calls.labels(reason=how).inc()
        if self._receiver.received:
            self._metrics.rtp_lost.inc(max(0, self._receiver.lost))
            self._metrics.rtp_jitter.observe(self._receiver.jitter_ms / 1000)
