"""The SIP bridge of one gateway worker: a UDP socket, the sans-I/O SIP core
(``telephony/sip``) and the calls it carries.

Every datagram is checked against the trusted networks first (``GATEWAY_SIP_ALLOW``).
From anywhere else, only a trunk that answers a digest challenge gets in
(:mod:`gateway.legs.sip.trunks`: a stateless 401 first, its calls billed to the trunk's
tenant); everything else gets a stateless 403 and nothing is kept. Then the core parses it,
runs its transactions and dialogs, and reports events; this module turns them into call
legs (:class:`gateway.legs.sip.leg.SipLeg`) and back into SIP: answers, rejections, BYE,
REFER. Limits before anything is allocated for a new call: the INVITE rate
(``GATEWAY_SIP_INVITES_PER_S``), calls per source (``GATEWAY_SIP_MAX_CALLS_PER_SOURCE``)
and in all (``GATEWAY_SIP_MAX_CALLS``), each a 503 with Retry-After; a draining worker
refuses new calls the same way. No route for the Request-URI user: 404; no codec in
common, or media at an address family the RTP sockets cannot reach (an IPv6 ``c=`` to an
IPv4 bridge): 488, before an RTP port is taken; a malformed SDP: 400. Where a call's
media may go (``GATEWAY_SIP_MEDIA_NETWORKS``) is the leg's to enforce
(:mod:`gateway.legs.sip.leg`).

Timers (retransmissions, timeouts) are the core's; this module sets one loop timer at
the core's earliest deadline and feeds it the time.
"""

from __future__ import annotations

import asyncio
import logging
import time

from gateway.context import LegContext
from gateway.legs.sip.config import SipSettings, media_allowed, tenant_for
from gateway.legs.sip.leg import SipLeg
from gateway.legs.sip.media import (
    PortRangeExhausted,
    RtpPortPool,
    open_media,
    reachable,
    socket_families,
    valid_destination,
)
from gateway.legs.sip.metrics import SipMetrics
from gateway.legs.sip.routes import Route, Routes
from gateway.legs.sip.trunks import TrunkGate, Verdict
from gateway.legs.sip.webhook import WebhookClient
from telephony.sdp import (
    Negotiated,
    SdpError,
    SessionDescription,
    build_answer,
    negotiate,
    parse_sdp,
)
from telephony.sip import (
    REASON_PHRASES,
    CallCancelled,
    CallConfirmed,
    CallEnded,
    DialogId,
    DialogState,
    Dtmf,
    IncomingCall,
    ReferResult,
    ReInvite,
    SipEvent,
    SipUas,
    SipUsageError,
)

log = logging.getLogger(__name__)
USER_AGENT = "voice-gateway"


class _RateLimit:
    """A token bucket: ``rate`` per second, bursts up to ``rate``."""

    def __init__(self, rate: int) -> None:
        self._rate = float(rate)
        self._tokens = float(rate)
        self._at = time.monotonic()

    def allow(self, now: float) -> bool:
        self._tokens = min(self._rate, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False


class SipBridge(asyncio.DatagramProtocol):
    def __init__(self, state: LegContext, settings: SipSettings, routes: Routes) -> None:
        self._state = state
        self.settings = settings
        self._routes = routes
        self.metrics = SipMetrics(state.metrics.registry)
        self._webhooks = WebhookClient(self.metrics)
        self._ports = RtpPortPool(*settings.rtp_ports)
        self._rate = _RateLimit(settings.invites_per_s)
        self._trunks = TrunkGate(
            routes.trunks,
            realm=routes.realm,
            max_calls=2 * settings.max_calls,
            max_calls_per_host=2 * settings.max_calls_per_source,
            algorithms=routes.digest_algorithms,
        )
        self._transport: asyncio.DatagramTransport | None = None
        self._core: SipUas | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._legs: dict[DialogId, SipLeg] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._refers: dict[DialogId, asyncio.Future[int]] = {}
        self._stopping = False
        self._media_families: frozenset[int] = frozenset()  # what the RTP sockets reach
        self._requests_seen: dict[str, int] = {}
        self._responses_seen: dict[int, int] = {}
        self.port = 0

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        host, port = self.settings.listen
        transport, _ = await loop.create_datagram_endpoint(lambda: self, local_addr=(host, port))
        self._transport = transport
        self.port = int(transport.get_extra_info("sockname")[1])
        # RTP binds the same host as SIP: the same family, the same dual-stack or not
        self._media_families = socket_families(transport.get_extra_info("socket"))
        self._core = SipUas(
            host=self.settings.public_addr,
            port=self.port,
            user_agent=USER_AGENT,
            max_dialogs=self.settings.max_calls,
            retry_after_s=self.settings.retry_after_s,
        )
        log.info("sip: listening on udp %s:%d", host, self.port)

    def describe(self) -> str:
        address = f"{self.settings.public_addr}:{self.port}"
        return f"SIP       : sip:ivr@{address} (UDP; the demo IVR)"

    async def stop(self) -> None:
        """End every call (their teardowns send BYE), then close the socket."""
        self._stopping = True  # no new call from here on (503)
        for leg in list(self._legs.values()):
            leg.hangup()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        for task in list(self._tasks):  # still starting after 5 s: give up on them
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=2)
        self._flush()
        if self._timer is not None:
            self._timer.cancel()
        if self._transport is not None:
            self._transport.close()
        await self._webhooks.close()

    @property
    def calls(self) -> int:
        return len(self._legs)

    # --- datagrams in ------------------------------------------------------------------------

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        core = self._core
        if core is None:
            return
        source = (str(addr[0]), int(addr[1]))
        if tenant_for(self.settings.allow, source[0]) is None and not self._admit(data, source):
            return
        try:
            events = core.receive(data, source, time.monotonic())
        except Exception:
            log.exception("sip: the core failed on a datagram from %s", source[0])
            return
        self._handle(events)

    def _admit(self, data: bytes, source: tuple[str, int]) -> bool:
        """A datagram from outside the trusted networks: in when it is a trunk's call,
        else answered statelessly (401 challenge, 403, 400, 503) and forgotten."""
        core = self._require_core()
        admission = self._trunks.admit(data, source[0], now=time.monotonic(), wall=time.time())
        if admission.verdict is Verdict.ACCEPT:
            return True
        if admission.verdict is Verdict.DROP:
            return False
        self.metrics.refused.labels(reason=admission.reason).inc()
        status = _ADMISSION_STATUS[admission.verdict]
        headers = list(admission.headers)
        if status == 503:
            headers.append(("Retry-After", str(self.settings.retry_after_s)))
        try:
            core.refuse(data, source, status, _reason(status), headers)
        except Exception:
            log.exception("sip: the core failed refusing a datagram")
        self._send_queued()
        return False

    def error_received(self, exc: Exception) -> None:
        log.debug("sip: socket error %r", exc)

    # --- events ------------------------------------------------------------------------------

    def _handle(self, events: list[SipEvent]) -> None:
        """Dispatch ``events`` and whatever the intents they cause queue in turn, then
        send what the core queued and re-arm its timer."""
        core = self._core
        while events:
            for event in events:
                try:
                    self._dispatch(event)
                except Exception:
                    log.exception("sip: handling %s failed", type(event).__name__)
            events = core.take_events() if core is not None else []
        self._send_queued()

    def _dispatch(self, event: SipEvent) -> None:
        if isinstance(event, IncomingCall):
            self._incoming(event)
            return
        leg = self._legs.get(event.dialog)
        if isinstance(event, ReferResult):
            waiter = self._refers.pop(event.dialog, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(event.status)
        elif leg is None:
            return
        elif isinstance(event, CallConfirmed):
            leg.confirmed()  # the ACK: media may flow
        elif isinstance(event, CallCancelled):
            leg.end_reason = "cancelled"
            leg.ended("cancelled", remote=True)
        elif isinstance(event, CallEnded):
            leg.ended(event.reason, remote=event.reason == "remote_bye")
        elif isinstance(event, ReInvite):
            self._reinvite(leg, event)
        elif isinstance(event, Dtmf):
            leg.dtmf(event.digit)  # SIP INFO (application/dtmf-relay)

    def _incoming(self, event: IncomingCall) -> None:
        core = self._require_core()
        now = time.monotonic()
        tenant = tenant_for(self.settings.allow, event.source[0]) or self._trunks.tenant(
            event.call_id, event.source[0]
        )
        retry = [("Retry-After", str(self.settings.retry_after_s))]
        if tenant is None:  # cannot happen: others are refused before the core
            core.reject(event.dialog, 403, "Forbidden")
            return
        if self._state.connections.draining or self._stopping:
            core.reject(event.dialog, 503, "Service Unavailable", retry)
            return
        if not self._rate.allow(now):
            self.metrics.refused.labels(reason="rate").inc()
            core.reject(event.dialog, 503, "Service Unavailable", retry)
            return
        if core.dialogs_from(event.source[0]) > self.settings.max_calls_per_source:
            self.metrics.refused.labels(reason="per_source").inc()
            core.reject(event.dialog, 503, "Service Unavailable", retry)
            return
        route = self._routes.match(event.request_uri.user)
        if route is None:
            core.reject(event.dialog, 404, "Not Found")
            return
        try:
            offer = parse_sdp(event.offer)
            negotiated = negotiate(offer)
        except SdpError as exc:
            core.reject(
                event.dialog,
                exc.status,
                "Not Acceptable Here" if exc.status == 488 else "Bad Request",
            )
            return
        if not self._reachable(negotiated):
            self.metrics.refused.labels(reason="address_family").inc()
            core.reject(event.dialog, 488, "Not Acceptable Here")
            return
        task = asyncio.ensure_future(self._open_call(event, tenant, route, offer, negotiated, now))
        self._own(task)

    async def _open_call(
        self,
        event: IncomingCall,
        tenant: str,
        route: Route,
        offer: SessionDescription,
        negotiated: Negotiated,
        now: float,
    ) -> None:
        core = self._require_core()
        try:
            media = await open_media(self._ports, self.settings.listen[0], _PendingSink())
        except PortRangeExhausted as exc:
            log.warning("sip: no RTP port for call %s: %s", event.call_id[:64], exc)
            core.reject(
                event.dialog,
                503,
                "Service Unavailable",
                [("Retry-After", str(self.settings.retry_after_s))],
            )
            self._flush()
            return
        if core.dialog_state(event.dialog) is not DialogState.EARLY or self._stopping:
            media.close()
            self._ports.release(media.port)
            self.metrics.calls.labels(reason="cancelled").inc()
            return
        leg = SipLeg(
            self._state,
            signalling=self,
            metrics=self.metrics,
            dialog=event.dialog,
            call_id=event.call_id,
            tenant=tenant,
            route=route,
            offer=offer,
            negotiated=negotiated,
            media=media,
            invited_at=now,
            signalling_host=event.source[0],
            max_call_s=self.settings.max_call_s,
            rtp_timeout_s=self.settings.rtp_timeout_s,
            caller=str(event.from_.uri)[:256],
            called=(event.request_uri.user or "")[:128],
            webhooks=self._webhooks,
        )
        media.attach(leg)
        self._legs[event.dialog] = leg
        self._trunks.call_started(event.call_id, event.source[0])
        try:
            await leg.run()
        finally:
            self._trunks.call_ended(event.call_id, event.source[0], time.monotonic())
            self._legs.pop(event.dialog, None)
            self._ports.release(media.port)
            self._flush()

    def _reinvite(self, leg: SipLeg, event: ReInvite) -> None:
        core = self._require_core()
        try:  # the codec stays: the session speaks it (RFC 3264 8.3.2 lets us keep it)
            offer = parse_sdp(event.offer)
            negotiated = negotiate(offer, supported=(leg.negotiated.codec.name,))
        except SdpError as exc:
            core.reject_reinvite(leg.dialog, exc.status, _reason(exc.status))
            return
        if not self._reachable(negotiated):  # the call stays as it was
            core.reject_reinvite(leg.dialog, 488, _reason(488))
            return
        leg.offer = offer
        leg.renegotiated(negotiated)
        core.answer_reinvite(leg.dialog, self._answer_sdp(leg), time.monotonic())

    # --- Signalling (what legs ask) ------------------------------------------------------

    def ring(self, leg: SipLeg) -> None:
        self._require_core().ring(leg.dialog)
        self._flush()

    def answer(self, leg: SipLeg) -> bool:
        try:
            self._require_core().answer(leg.dialog, self._answer_sdp(leg), time.monotonic())
        except SipUsageError as exc:  # the caller cancelled or hung up in the meantime
            log.info("sip call %s: not answered: %s", leg.call_id[:64], exc)
            return False
        finally:
            self._flush()
        return True

    def reject(self, leg: SipLeg, status: int, retry_after_s: int | None = None) -> None:
        if status == 503 and retry_after_s is None:
            retry_after_s = self.settings.retry_after_s
        headers = [("Retry-After", str(retry_after_s))] if retry_after_s is not None else []
        try:
            self._require_core().reject(leg.dialog, status, _reason(status), headers)
        except SipUsageError as exc:  # answered or gone meanwhile
            log.info("sip call %s: not rejected: %s", leg.call_id[:64], exc)
        finally:
            self._flush()

    def media_allowed(self, source: str, host: str) -> bool:
        return media_allowed(self.settings.media_networks, source, host)

    def bye(self, leg: SipLeg) -> None:
        self._require_core().bye(leg.dialog, time.monotonic())
        self._flush()

    async def refer(self, leg: SipLeg, target: str) -> int:
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        try:
            self._require_core().refer(leg.dialog, target, time.monotonic())
        except SipUsageError as exc:  # a target the core cannot send, or the call is gone
            log.info("sip call %s: no REFER to %s: %s", leg.call_id[:64], target[:64], exc)
            return 400
        finally:
            self._flush()
        self._refers[leg.dialog] = waiter
        try:
            async with asyncio.timeout(32):
                return await waiter
        except TimeoutError:
            return 408
        finally:
            self._refers.pop(leg.dialog, None)

    # --- helpers -------------------------------------------------------------------------------

    def _answer_sdp(self, leg: SipLeg) -> bytes:
        leg.sdp_version += 1
        return build_answer(
            leg.offer,
            leg.negotiated,
            address=self.settings.public_addr,
            port=leg.media.port,
            session_id=leg.sdp_session_id,
            session_version=leg.sdp_version,
        )

    def _reachable(self, negotiated: Negotiated) -> bool:
        """The RTP sockets can send to where the SDP puts RTP and RTCP (None: on hold)."""
        return all(
            destination is None or reachable(destination[0], self._media_families)
            for destination in (negotiated.remote_rtp, negotiated.remote_rtcp)
        )

    def _require_core(self) -> SipUas:
        if self._core is None:
            raise RuntimeError("the SIP bridge is not started")
        return self._core

    def _own(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("sip: a call failed", exc_info=task.exception())

    def _flush(self) -> None:
        """After an intent: handle the events it queued, send, re-arm the timer."""
        core = self._core
        self._handle(core.take_events() if core is not None else [])

    def _send_queued(self) -> None:
        core, transport = self._core, self._transport
        if core is None or transport is None:
            return
        for data, destination in core.outgoing():
            if valid_destination(destination):
                transport.sendto(data, destination)
        self._count(core)
        deadline = core.next_timer()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if deadline is not None:
            loop = asyncio.get_running_loop()
            delay = max(0.0, deadline - time.monotonic())
            self._timer = loop.call_later(delay, self._on_timer)

    def _count(self, core: SipUas) -> None:
        """Carry the core's request and response counters into the metrics."""
        for method, count in core.requests_received.items():
            seen = self._requests_seen.get(method, 0)
            if count > seen:
                self.metrics.requests.labels(method=method).inc(count - seen)
                self._requests_seen[method] = count
        for status, count in core.responses_sent.items():
            seen = self._responses_seen.get(status, 0)
            if count > seen:
                self.metrics.responses.labels(code=str(status)).inc(count - seen)
                self._responses_seen[status] = count

    def _on_timer(self) -> None:
        self._timer = None
        core = self._core
        if core is None:
            return
        try:
            events = core.on_timer(time.monotonic())
        except Exception:  # a bug must not stop every retransmission and timeout
            log.exception("sip: the core failed on a timer")
            events = []
        self._handle(events)


_ADMISSION_STATUS = {  # DROP sends nothing
    Verdict.CHALLENGE: 401,
    Verdict.FORBID: 403,
    Verdict.BAD_REQUEST: 400,
    Verdict.BUSY: 503,
}


def _reason(status: int) -> str:
    return REASON_PHRASES.get(status, "Error")


class _PendingSink:
    """Drops what arrives on a call's ports before its leg exists (microseconds)."""

    def on_rtp(self, data: bytes, source: tuple[str, int]) -> None:
        return None

    def on_rtcp(self, data: bytes, source: tuple[str, int]) -> None:
        return None
