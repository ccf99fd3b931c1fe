"""The gateway's SIP user-agent server: RFC 3261 (UAS subset) over UDP, sans-I/O.

One :class:`SipUas` serves one listening socket. Feed it every datagram
(:meth:`SipUas.receive`) and the time when its earliest deadline passes
(:meth:`SipUas.on_timer`); put what :meth:`SipUas.outgoing` returns on the socket. It never
touches a socket, a clock or an event loop: time comes in as ``now`` (seconds, monotonic).

What the application sees: events (:data:`SipEvent`) returned by ``receive``/``on_timer``,
and intents it calls with the :class:`DialogId` an :class:`IncomingCall` carried:
``ring``, ``answer``, ``reject``, ``bye``, ``answer_reinvite``, ``reject_reinvite``,
``refer``.

What the core does on its own:

* Transactions (17): INVITE and non-INVITE server transactions absorb retransmitted
  requests and answer them with the last response; the ACK for a non-2xx is absorbed
  (timers G, H, I); the 2xx is retransmitted by the core (13.3.1.4: T1 doubling to T2)
  until its ACK, and without one for 64*T1 the call ends (``ack_timeout``) with a BYE.
  Our BYE and REFER are non-INVITE client transactions (timers E, F, K). State machines:
  :mod:`telephony.sip.transactions` and :mod:`telephony.sip.dialogs`, one table each.
* 100 Trying at once for every INVITE (17.2.1 allows it; 8.2.6.1).
* CANCEL (9.2): before our final response, 200 to the CANCEL and 487 to the INVITE
  (:class:`CallCancelled`); after it, 200 only; matching no transaction, 481.
* BYE (15.1.2): 200, :class:`CallEnded` ``remote_bye``; a pending (re-)INVITE gets 487.
* re-INVITE (14.2): :class:`ReInvite` for the application; a second one while the first is
  with the application gets 500 with Retry-After (14.2: "a second INVITE before it sends
  the final response to a first INVITE"), one while our 2xx waits for its ACK gets 491.
* OPTIONS (11.2): 200 with Allow, Accept, Supported, in or out of a dialog. NOTIFY in a
  dialog (the subscription a REFER creates, RFC 3515 2.4.4): 200. INFO in a dialog: 200,
  and a :class:`Dtmf` event for ``application/dtmf-relay``/``application/dtmf`` bodies.
* Refusals (8.2): a method not known at all, 501; known but not ours (REGISTER,
  SUBSCRIBE, MESSAGE, PUBLISH, UPDATE, PRACK, REFER), 405; both with Allow (8.2.1). A
  Request-URI scheme other than sip/sips/tel, 416 (8.2.2.1). An INVITE merged by a forking
  proxy (same Call-ID, From tag and CSeq, another branch), 482 (8.2.2.2). Require with any
  option, 420 with Unsupported (8.2.2.3). BYE/INFO/NOTIFY/re-INVITE/OPTIONS with a To tag
  naming no dialog, and BYE/INFO/NOTIFY without one, 481 (12.2.2). An in-dialog CSeq lower
  than the last, 500 (12.2.2). An INVITE without a SIP Contact (8.1.1.8), with a bad
  Record-Route, or with a Call-ID the gateway cannot use as its call id
  (:func:`telephony.limits.call_id_problem`), 400. A request that does not parse but whose
  Via, From, To, Call-ID and CSeq were found: the parser's status (400 with a reason naming
  the problem, 505, 513), statelessly; anything else is dropped and counted
  (:attr:`SipUas.dropped`).

Where datagrams go (a deliberate choice for a UAS that faces NATed phones and SBCs):

* Responses (18.2.2, RFC 3581) go only to where the request came from. The core sets
  ``received`` in the top Via to the packet's source address on every request it answers,
  replacing any ``received`` the client wrote itself, and when the Via has ``rport`` (with
  or without a value) sets it to the packet's source port. With ``rport``, a response goes
  to the source address and port; without it, to the source address at the sent-by port
  (default 5060; the sent-by host is never looked up). A client's own ``received``,
  ``rport`` value and ``maddr`` are never a destination: the host is always the packet's
  source, so a request cannot aim its responses (and their retransmissions, which follow
  the transaction's destination) at another address. A stateless refusal through
  :meth:`SipUas.refuse` (an untrusted or rate-limited source) goes to the packet's source
  address and port, whatever the Via says.
* Requests we send in a dialog (BYE, REFER) go to the source address of the INVITE that
  created it: the flow. Not to the remote target or the route set's first hop, which
  behind a NAT are unreachable private addresses, and resolving them would need DNS. The
  request itself is still built by 12.2.1.1 (Request-URI, Route), so a proxy or SBC on the
  flow routes it on.

The intents' contract: ``bye``, ``reject`` and ``ring`` on a dialog that is over (ended by
the remote end, a timer or an earlier intent; or forgotten) do nothing: the application
cannot order its hangup against the network's. ``answer``, ``answer_reinvite``,
``reject_reinvite`` and ``refer`` on such a dialog raise :class:`SipUsageError`
``dialog_gone``, so the application learns it lost a race. An intent the dialog's state
forbids (``answer`` twice, ``bye`` before the answer: 15 says reject instead, ``reject``
after ``answer``, ``answer_reinvite`` with no re-INVITE pending) raises ``illegal_state``.
``bye`` ends the call for the application at once (:class:`CallEnded` ``local_bye`` is
queued: returned by the next ``receive``/``on_timer``, or by :meth:`SipUas.take_events`);
before the 2xx is acknowledged the BYE itself waits for the ACK or its timeout (15).

Limits: ``max_dialogs`` (a new INVITE beyond it: 503 with Retry-After, no event),
``max_transactions`` server transactions (a new request beyond it: a stateless 503 with
Retry-After; a BYE or CANCEL for a dialog or transaction we hold is still served, since
those are bounded by the dialogs), REFERs one at a time per dialog, client transactions
up to ``max_transactions`` (a BYE always gets one: at most one per dialog), an INVITE the
application leaves unanswered for ``max_ringing_s`` (480, :class:`CallEnded`
``no_answer``; a re-INVITE gets 500 and the call goes on), and the message limits of
:mod:`telephony.sip.message`. Dialogs are forgotten when they end; transactions by their
own timers.

Counters for metrics: :attr:`SipUas.responses_sent` (by status; first transmissions,
stateless ones included), :attr:`SipUas.requests_received` (by method, ``other`` for
unknown ones) and :attr:`SipUas.dropped` (datagrams that got neither a response nor an
effect: unparseable, unanswerable, stray responses and ACKs).
"""

from __future__ import annotations

import collections
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Final, TypeAlias

from telephony.limits import DTMF_DIGITS, call_id_problem
from telephony.sip.dialogs import Dialog, DialogId, DialogState, DialogTrigger
from telephony.sip.message import (
    MAGIC_COOKIE,
    MAX_MESSAGE_BYTES,
    Headers,
    NameAddr,
    ParseErrorCode,
    SipParseError,
    SipRequest,
    SipResponse,
    SipUri,
    SipUsageError,
    UsageErrorCode,
    Via,
    build_response,
    format_hostport,
    ip_literal,
    parse_message,
    parse_name_addr,
    parse_via,
    serialize,
    split_list,
)
from telephony.sip.transactions import (
    Address,
    InviteServerTransaction,
    NonInviteClientTransaction,
    NonInviteServerTransaction,
    TimerQueue,
    Timing,
    Transaction,
    TxKey,
    TxState,
)

__all__ = [
    "ACCEPT",
    "ALLOW",
    "CallCancelled",
    "CallConfirmed",
    "CallEnded",
    "Dtmf",
    "IncomingCall",
    "ReInvite",
    "ReferResult",
    "SipEvent",
    "SipUas",
    "response_destination",
]

#: 8.2.1 / 11.2: the methods this UAS accepts (REFER is only sent, never accepted).
ALLOW: Final = "INVITE, ACK, CANCEL, BYE, OPTIONS, INFO, NOTIFY"
ACCEPT: Final = "application/sdp"
_IMPLEMENTED: Final = frozenset({"INVITE", "ACK", "CANCEL", "BYE", "OPTIONS", "INFO", "NOTIFY"})
#: Known methods we do not implement: 405 (8.2.1). Anything else is unknown: 501 (21.5.11).
_NOT_ALLOWED: Final = frozenset(
    {"REGISTER", "SUBSCRIBE", "MESSAGE", "PUBLISH", "UPDATE", "PRACK", "REFER"}
)
_KNOWN_METHODS: Final = _IMPLEMENTED | _NOT_ALLOWED
_URI_SCHEMES: Final = frozenset({"sip", "sips", "tel"})
_DTMF_TYPES: Final = frozenset({"application/dtmf-relay", "application/dtmf"})
#: RFC 4733 event codes 10-15 as some phones put them in ``Signal=``.
_DTMF_CODES: Final = {"10": "*", "11": "#", "12": "A", "13": "B", "14": "C", "15": "D"}
_MAX_FORWARDS: Final = 70  # 8.1.1.6: "SHOULD be 70"

REMOTE_BYE: Final = "remote_bye"
LOCAL_BYE: Final = "local_bye"
ACK_TIMEOUT: Final = "ack_timeout"
NO_ANSWER: Final = "no_answer"


# --------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class IncomingCall:
    """A new INVITE (13.3.1); the core has sent 100 Trying. Answer with ``ring``/``answer``
    or ``reject``. ``offer`` is the body (an SDP offer, or empty: then our 2xx carries an
    offer and the ACK the answer, 13.2.1), ``headers`` every header field as received."""

    dialog: DialogId
    call_id: str
    request_uri: SipUri
    from_: NameAddr
    to: NameAddr
    source: Address
    offer: bytes = field(repr=False)
    content_type: str | None
    headers: tuple[tuple[str, str], ...] = field(repr=False)


@dataclass(frozen=True, slots=True)
class CallConfirmed:
    """The ACK for our 2xx arrived (13.3.1.4): the dialog is confirmed."""

    dialog: DialogId


@dataclass(frozen=True, slots=True)
class CallCancelled:
    """CANCEL before our final response (9.2): the core answered 200 and 487."""

    dialog: DialogId


@dataclass(frozen=True, slots=True)
class CallEnded:
    """The call is over for the application: ``remote_bye`` (the core answered 200),
    ``local_bye`` (after :meth:`SipUas.bye`), ``ack_timeout`` (no ACK for our 2xx in 64*T1:
    the core sent a BYE) or ``no_answer`` (the core answered 480 after ``max_ringing_s``)."""

    dialog: DialogId
    reason: str


@dataclass(frozen=True, slots=True)
class ReInvite:
    """An INVITE inside the dialog (14.2: hold, unhold, new media): answer with
    :meth:`SipUas.answer_reinvite` or :meth:`SipUas.reject_reinvite`."""

    dialog: DialogId
    offer: bytes = field(repr=False)
    content_type: str | None = None


@dataclass(frozen=True, slots=True)
class ReferResult:
    """The final response to our REFER (RFC 3515 2.4.2: 202 when accepted); 408 when the
    transaction timed out (8.1.3.1)."""

    dialog: DialogId
    status: int


@dataclass(frozen=True, slots=True)
class Dtmf:
    """A digit from an INFO with an ``application/dtmf-relay`` (``Signal=5``) or
    ``application/dtmf`` body; one of :data:`telephony.limits.DTMF_DIGITS`."""

    dialog: DialogId
    digit: str


SipEvent: TypeAlias = (
    IncomingCall | CallConfirmed | CallCancelled | CallEnded | ReInvite | ReferResult | Dtmf
)


# --------------------------------------------------------------------------- addressing


def response_destination(via: Via, source: Address) -> Address:
    """Where a response to a request from ``source`` goes (18.2.2 for unreliable
    transports, RFC 3581 section 4), never anywhere but the source's address.

    ``via`` is the request's top Via. With ``rport``, the source address and port; else the
    source address at the sent-by port (default 5060), or the source port when sent-by is
    a name without a port and no ``received`` was added (never a DNS lookup). The Via's
    ``received``, ``rport`` value and ``maddr`` are the client's word and never used: the
    core writes the true ones (:meth:`SipUas` annotates every request it answers).
    """
    if via.has_param("rport"):
        return source
    if via.port is None and ip_literal(via.host) is None and not via.has_param("received"):
        return source
    return source[0], via.port or 5060


def _server_key(request: SipRequest, top: Via, method: str | None = None) -> TxKey:
    """17.2.3: branch, sent-by and method (ACK matches its INVITE); for an RFC 2543 peer
    (no magic cookie), Call-ID, From tag, CSeq number and sent-by stand in."""
    if method is None:
        method = "INVITE" if request.method == "ACK" else request.method
    branch = top.branch or ""
    sent_by = top.sent_by.lower()
    if branch.startswith(MAGIC_COOKIE):
        return ("3261", branch, sent_by, method)
    from_tag = request.from_.tag or ""
    return ("2543", branch, request.call_id, from_tag, str(request.cseq[0]), sent_by, method)


def _dialog_key(request: SipRequest) -> DialogId:
    """12.2.2: a request's dialog seen from us: (Call-ID, To tag, From tag)."""
    return DialogId(request.call_id, request.to.tag or "", request.from_.tag or "")


def _dtmf_digit(body: bytes, content_type: str) -> str | None:
    text = body.decode("utf-8", "replace").strip()
    value = text
    if content_type == "application/dtmf-relay":
        value = ""
        for line in text.splitlines():
            name, _, rest = line.partition("=")
            if name.strip().lower() == "signal":
                value = rest.strip()
                break
    value = _DTMF_CODES.get(value, value).upper()
    return value if len(value) == 1 and value in DTMF_DIGITS else None


def _media_type(content_type: str | None) -> str:
    return (content_type or "").split(";")[0].strip().lower()


# --------------------------------------------------------------------------- the UAS


class SipUas:
    """The user-agent server for one listening socket (see the module docstring)."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        user_agent: str = "voice-gateway",
        max_dialogs: int = 2000,
        max_transactions: int = 10000,
        t1: float = 0.5,
        t2: float = 4.0,
        rng: random.Random | None = None,
        t4: float = 5.0,
        retry_after_s: int = 5,
        max_ringing_s: float = 180.0,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        if max_dialogs <= 0 or max_transactions <= 0 or max_message_bytes <= 0:
            raise ValueError("limits must be positive")
        if not 0 < t1 <= t2 or t4 <= 0 or max_ringing_s <= 0 or retry_after_s < 0:
            raise ValueError("timers must be positive, and T1 <= T2")
        if not 0 < port <= 65_535:
            raise ValueError(f"port {port} is not 1..65535")
        if not host or any(c.isspace() or c in '<>;,"' or ord(c) < 32 for c in host):
            raise ValueError(f"host {host!r} is not a host")
        if any(ord(c) < 32 for c in user_agent):
            raise ValueError("control character in user_agent")
        self.host = host
        self.port = port
        self.user_agent = user_agent
        self._hostport = format_hostport(host, port)
        self._contact = f"<sip:{self._hostport}>"
        self._timing = Timing(t1, t2, t4)
        self._rng: random.Random = rng if rng is not None else random.SystemRandom()
        self._max_dialogs = max_dialogs
        self._max_transactions = max_transactions
        self._retry_after_s = retry_after_s
        self._max_ringing_s = max_ringing_s
        self._max_message_bytes = max_message_bytes
        self._timers = TimerQueue()
        self._now = 0.0  # the latest time any call brought (for intents without ``now``)
        self._out: list[tuple[bytes, Address]] = []
        self._events: list[SipEvent] = []
        self._server: dict[TxKey, InviteServerTransaction | NonInviteServerTransaction] = {}
        self._client: dict[TxKey, NonInviteClientTransaction] = {}
        self._invites: dict[tuple[str, str, int], TxKey] = {}  # (Call-ID, From tag, CSeq)
        self._dialogs: dict[DialogId, Dialog] = {}
        self._per_host: collections.Counter[str] = collections.Counter()
        #: Responses sent, by status (first transmissions; stateless ones included).
        self.responses_sent: collections.Counter[int] = collections.Counter()
        #: Requests received, by method ("other" for methods we do not know).
        self.requests_received: collections.Counter[str] = collections.Counter()
        #: Datagrams that got neither a response nor an effect.
        self.dropped = 0

    # ----------------------------------------------------------------- inspection

    @property
    def dialog_count(self) -> int:
        """Dialogs held: unanswered, answered, confirmed or closing."""
        return len(self._dialogs)

    def dialogs_from(self, source_host: str) -> int:
        """Dialogs whose INVITE came from ``source_host`` (for a per-source limit)."""
        return self._per_host.get(source_host, 0)

    def dialog_state(self, dialog: DialogId) -> DialogState | None:
        """The dialog's state, or None once it is over and forgotten."""
        held = self._dialogs.get(dialog)
        return held.state if held is not None else None

    @property
    def transaction_count(self) -> int:
        return len(self._server) + len(self._client)

    # ----------------------------------------------------------------- I/O plumbing

    def outgoing(self) -> list[tuple[bytes, Address]]:
        """Datagrams queued since the last call, in order, with their destinations."""
        out, self._out = self._out, []
        return out

    def next_timer(self) -> float | None:
        """The earliest deadline of any timer, or None."""
        return self._timers.next_deadline()

    def on_timer(self, now: float) -> list[SipEvent]:
        """Fire every timer due at ``now`` (retransmissions, timeouts)."""
        self._now = now
        while (timer := self._timers.pop_due(now)) is not None:
            timer.callback(now)
        return self.take_events()

    def take_events(self) -> list[SipEvent]:
        """Events queued by intents (``bye``'s CallEnded) and not yet returned."""
        events, self._events = self._events, []
        return events

    def _send(self, data: bytes, destination: Address) -> None:
        self._out.append((data, destination))

    def _new_tag(self) -> str:
        return f"{self._rng.getrandbits(64):016x}"  # 19.3: at least 32 bits of randomness

    def _new_branch(self) -> str:
        return f"{MAGIC_COOKIE}{self._rng.getrandbits(80):020x}"  # 8.1.1.7

    # ----------------------------------------------------------------- datagrams in

    def receive(self, data: bytes, source: Address, now: float) -> list[SipEvent]:
        """Process one datagram from ``source``; return the events it caused (plus any
        queued by intents since the last call). Never raises for what the remote sends."""
        self._now = now
        try:
            message = parse_message(data, max_bytes=self._max_message_bytes)
        except SipParseError as exc:
            if exc.code is not ParseErrorCode.EMPTY:  # a CRLF keepalive is not a drop
                self._answer_unparseable(exc, source)
            return self.take_events()
        if isinstance(message, SipResponse):
            self._on_response(message, now)
        else:
            self._on_request(message, source, now)
        return self.take_events()

    def refuse(
        self,
        data: bytes,
        source: Address,
        status: int,
        reason: str,
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        """Answer ``data`` statelessly with ``status`` (an untrusted or rate-limited
        source): no transaction, no dialog, no timer. ACKs, responses and datagrams that
        do not parse are dropped (and counted)."""
        if not 300 <= status <= 699:
            raise SipUsageError(UsageErrorCode.BAD_STATUS, f"refuse with {status}")
        try:
            message = parse_message(data, max_bytes=self._max_message_bytes)
        except SipParseError as exc:
            if exc.code is not ParseErrorCode.EMPTY:
                self.dropped += 1
            return
        if isinstance(message, SipResponse) or message.method == "ACK":
            self.dropped += 1
            return
        self._annotate_via(message, source)
        self._respond_stateless(message, source, status, reason, headers)

    def _answer_unparseable(self, exc: SipParseError, source: Address) -> None:
        request = exc.partial
        if (
            not isinstance(request, SipRequest)
            or request.method == "ACK"
            or any(name not in request.headers for name in ("From", "To", "Call-ID", "CSeq"))
        ):
            self.dropped += 1
            return
        try:
            top = self._annotate_via(request, source)
        except (SipParseError, IndexError):
            self.dropped += 1  # no Via we can answer along
            return
        self._respond_stateless(request, response_destination(top, source), exc.status, exc.reason)

    def _annotate_via(self, request: SipRequest, source: Address) -> Via:
        """18.2.1 and RFC 3581 section 4: set ``received`` in the top Via to the source's
        address (always, replacing every ``received`` the client wrote) and, when the Via
        has ``rport``, set ``rport`` to the source's port (replacing a client's value).
        Returns the top Via as it now is. Raises on a request with no parseable Via."""
        first = request.headers.raw("Via")[0]
        values = split_list(first)
        top = parse_via(values[0])
        params: list[tuple[str, str | None]] = []
        rport = False
        for name, value in top.params:
            lowered = name.lower()
            if lowered == "received" or (lowered == "rport" and rport):
                continue  # the client's own: never kept (a duplicate rport goes too)
            if lowered == "rport":
                rport = True
                value = str(source[1])
            params.append((name, value))
        params.append(("received", source[0]))
        annotated = replace(top, params=tuple(params))
        if annotated != top:
            values[0] = str(annotated)
            request.headers.replace_first("Via", ", ".join(values))
        return annotated

    # ----------------------------------------------------------------- responses out

    def _respond_stateless(
        self,
        request: SipRequest,
        destination: Address,
        status: int,
        reason: str | None,
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        response = build_response(
            request,
            status,
            reason,
            to_tag=self._new_tag(),
            headers=[*headers, ("Server", self.user_agent)],
        )
        self._send(serialize(response), destination)
        self.responses_sent[status] += 1

    def _respond(
        self,
        tx: InviteServerTransaction | NonInviteServerTransaction,
        status: int,
        reason: str | None = None,
        *,
        now: float,
        headers: Sequence[tuple[str, str]] = (),
        body: bytes = b"",
        content_type: str | None = None,
        record_route: bool = False,
    ) -> bytes:
        """Build, count and send a response through ``tx``; return its bytes. The To tag:
        none on a 100 (8.2.6.2), the INVITE transaction's own tag, else a fresh one."""
        assert tx.request is not None
        to_tag: str | None = None
        if status > 100:
            local = tx.local_tag if isinstance(tx, InviteServerTransaction) else ""
            to_tag = local or self._new_tag()
        response = build_response(
            tx.request,
            status,
            reason,
            to_tag=to_tag,
            headers=[*headers, ("Server", self.user_agent)],
            body=body,
            content_type=content_type,
            record_route=record_route,
        )
        data = serialize(response)
        tx.respond(status, data, now)
        self.responses_sent[status] += 1
        return data

    def _retry_after(self) -> tuple[str, str]:
        return ("Retry-After", str(self._retry_after_s))

    # ----------------------------------------------------------------- transactions

    def _new_server_tx(
        self,
        request: SipRequest,
        key: TxKey,
        destination: Address,
        *,
        dialog: DialogId | None = None,
        local_tag: str | None = None,
    ) -> InviteServerTransaction | NonInviteServerTransaction:
        tx: InviteServerTransaction | NonInviteServerTransaction
        if request.method == "INVITE":
            tx = InviteServerTransaction(
                key=key,
                destination=destination,
                timing=self._timing,
                timers=self._timers,
                send=self._send,
                on_terminated=self._server_gone,
                request=request,
                dialog=dialog,
                local_tag=local_tag or self._new_tag(),
            )
            index = (request.call_id, request.from_.tag or "", request.cseq[0])
            self._invites.setdefault(index, key)  # the first INVITE keeps it (8.2.2.2)
        else:
            tx = NonInviteServerTransaction(
                key=key,
                destination=destination,
                timing=self._timing,
                timers=self._timers,
                send=self._send,
                on_terminated=self._server_gone,
                request=request,
            )
        self._server[key] = tx
        return tx

    def _server_gone(self, tx: Transaction) -> None:
        self._server.pop(tx.key, None)
        if isinstance(tx, InviteServerTransaction) and tx.request is not None:
            index = (tx.request.call_id, tx.request.from_.tag or "", tx.request.cseq[0])
            if self._invites.get(index) == tx.key:
                del self._invites[index]

    def _client_gone(self, tx: Transaction) -> None:
        self._client.pop(tx.key, None)

    def _answer(
        self,
        request: SipRequest,
        key: TxKey,
        destination: Address,
        status: int,
        reason: str | None,
        now: float,
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        """A new transaction answered at once with a final response."""
        tx = self._new_server_tx(request, key, destination)
        self._respond(tx, status, reason, now=now, headers=headers)

    # ----------------------------------------------------------------- requests in

    def _on_request(self, request: SipRequest, source: Address, now: float) -> None:
        method = request.method
        self.requests_received[method if method in _KNOWN_METHODS else "other"] += 1
        top = self._annotate_via(request, source)
        destination = response_destination(top, source)
        if method == "ACK":
            self._on_ack(request, top, now)
            return
        key = _server_key(request, top)
        existing = self._server.get(key)
        if existing is not None:  # 17.2.3: a retransmission
            existing.on_request(now)
            return
        if len(self._server) >= self._max_transactions and not self._exempt(request, top):
            self._respond_stateless(
                request, destination, 503, "Service Unavailable", [self._retry_after()]
            )
            return
        if method == "CANCEL":
            self._on_cancel(request, key, top, destination, now)
            return
        refusal = self._inspect(request)
        if refusal is not None:
            status, reason, headers = refusal
            self._answer(request, key, destination, status, reason, now, headers)
            return
        if request.to.tag is not None:
            self._in_dialog(request, key, source, destination, now)
        elif method == "INVITE":
            self._new_invite(request, key, source, destination, now)
        elif method == "OPTIONS":
            self._options(request, key, destination, now)
        else:  # BYE, INFO, NOTIFY outside any dialog (12.2.2, 15.1.2)
            self._answer(request, key, destination, 481, None, now)

    def _exempt(self, request: SipRequest, top: Via) -> bool:
        """At the transaction limit, a BYE for a dialog we hold or a CANCEL for an INVITE
        transaction we hold is still served: both are bounded by what we hold."""
        if request.method == "BYE":
            return _dialog_key(request) in self._dialogs
        if request.method == "CANCEL":
            return _server_key(request, top, "INVITE") in self._server
        return False

    def _inspect(self, request: SipRequest) -> tuple[int, str, list[tuple[str, str]]] | None:
        """8.2.1 method inspection, 8.2.2.1 Request-URI scheme, 8.2.2.3 Require."""
        method = request.method
        if method not in _KNOWN_METHODS:
            return 501, "Not Implemented", [("Allow", ALLOW)]
        if method not in _IMPLEMENTED:
            return 405, "Method Not Allowed", [("Allow", ALLOW)]
        if request.request_uri.scheme not in _URI_SCHEMES:
            return 416, "Unsupported URI Scheme", []
        required = request.headers.get_all("Require")
        if required:
            return 420, "Bad Extension", [("Unsupported", ", ".join(required))]
        return None

    def _on_ack(self, request: SipRequest, top: Via, now: float) -> None:
        tx = self._server.get(_server_key(request, top))
        if tx is None:
            # An ACK for a non-2xx with a branch of its own (17.1.1.3 says it must reuse the
            # INVITE's; some UAs do not): match the INVITE by Call-ID, From tag, CSeq, tag.
            index = self._invites.get((request.call_id, request.from_.tag or "", request.cseq[0]))
            candidate = self._server.get(index) if index is not None else None
            if (
                isinstance(candidate, InviteServerTransaction)
                and candidate.state in (TxState.COMPLETED, TxState.CONFIRMED)
                and request.to.tag == candidate.local_tag
            ):
                tx = candidate
        if isinstance(tx, InviteServerTransaction):
            if tx.on_ack(now):  # RFC 6026 7.1: an ACK for the 2xx goes to the core
                self._dialog_ack(request, now)
            return
        if not self._dialog_ack(request, now):
            self.dropped += 1

    def _dialog_ack(self, request: SipRequest, now: float) -> bool:
        """The ACK for a 2xx (13.3.1.4). False when it names no dialog of ours."""
        dialog = self._dialogs.get(_dialog_key(request))
        if dialog is None:
            return False
        if dialog.pending_2xx is None or request.cseq[0] != dialog.pending_2xx_cseq:
            return True  # a duplicate, or a late ACK for an earlier 2xx: absorbed
        before = dialog.state
        if dialog.step(DialogTrigger.ACK) is None:
            return True
        self._disarm(dialog, "retransmit", "ack")
        dialog.pending_2xx = None
        if before is DialogState.ANSWERED:
            self._events.append(CallConfirmed(dialog.id))
        elif before is DialogState.CLOSING:
            self._send_bye(dialog, now)
        return True

    def _on_cancel(
        self, request: SipRequest, key: TxKey, top: Via, destination: Address, now: float
    ) -> None:
        """9.2: the CANCEL matches the INVITE server transaction with its branch."""
        invite_tx = self._server.get(_server_key(request, top, "INVITE"))
        cancel_tx = self._new_server_tx(request, key, destination)
        if not isinstance(invite_tx, InviteServerTransaction):
            self._respond(cancel_tx, 481, now=now)
            return
        # 9.2: the To tag of the 200 to the CANCEL SHOULD be the INVITE response's one.
        assert isinstance(cancel_tx, NonInviteServerTransaction)
        self._respond_with_tag(cancel_tx, 200, invite_tx.local_tag, now)
        if invite_tx.final_sent:  # 9.2: nothing else once the INVITE has its answer
            return
        if not isinstance(invite_tx.dialog, DialogId):
            return  # an INVITE refused without a dialog (503, 481...) already has its answer
        dialog = self._dialogs.get(invite_tx.dialog)
        if dialog is None:
            return
        before = dialog.state
        if dialog.step(DialogTrigger.CANCEL) is None:
            return
        self._respond(invite_tx, 487, now=now)
        if before is DialogState.EARLY:
            self._terminate(dialog)
            self._events.append(CallCancelled(dialog.id))
        else:  # a re-INVITE was cancelled; the dialog goes on (9.2, 14.2)
            self._disarm(dialog, "no_answer")
            dialog.reinvite_withdrawn = True
            dialog.pending_target = None

    def _respond_with_tag(
        self, tx: NonInviteServerTransaction, status: int, tag: str, now: float
    ) -> None:
        assert tx.request is not None
        response = build_response(
            tx.request, status, to_tag=tag, headers=[("Server", self.user_agent)]
        )
        tx.respond(status, serialize(response), now)
        self.responses_sent[status] += 1

    def _new_invite(
        self, request: SipRequest, key: TxKey, source: Address, destination: Address, now: float
    ) -> None:
        call_id = request.call_id
        from_ = request.from_
        number = request.cseq[0]
        merged = self._invites.get((call_id, from_.tag or "", number))
        if merged is not None and merged != key:  # 8.2.2.2: the same INVITE by another path
            self._answer(request, key, destination, 482, None, now)
            return
        if len(self._dialogs) >= self._max_dialogs:
            self._answer(
                request, key, destination, 503, "Service Unavailable", now, [self._retry_after()]
            )
            return
        problem = call_id_problem(call_id)  # the Call-ID becomes the gateway's call id
        if problem is not None:
            self._answer(request, key, destination, 400, "Bad Call-ID Header", now)
            return
        contact = self._contact_of(request)
        if contact is None:  # 8.1.1.8: an INVITE MUST carry one SIP URI Contact
            self._answer(request, key, destination, 400, "Bad Contact Header", now)
            return
        try:
            route_set = tuple(request.headers.get_all("Record-Route"))
            for value in route_set:
                parse_name_addr(value)
        except SipParseError:
            self._answer(request, key, destination, 400, "Bad Record-Route Header", now)
            return
        local_tag = self._new_tag()
        dialog_id = DialogId(call_id, local_tag, from_.tag or "")
        tx = self._new_server_tx(request, key, destination, dialog=dialog_id, local_tag=local_tag)
        self._respond(tx, 100, now=now)  # 17.2.1 / 8.2.6.1: at once
        dialog = Dialog(
            id=dialog_id,
            source=source,
            local_party=request.to.with_tag(local_tag),
            remote_party=from_,
            remote_target=contact.uri,
            route_set=route_set,
            remote_seq=number,
            local_seq=self._rng.randrange(1, 2**30),  # 8.1.1.5: below 2**31, with room
            invite_tx=key,
        )
        self._dialogs[dialog_id] = dialog
        self._per_host[source[0]] += 1
        self._arm(dialog, "no_answer", now + self._max_ringing_s, self._no_answer)
        self._events.append(
            IncomingCall(
                dialog=dialog_id,
                call_id=call_id,
                request_uri=request.request_uri,
                from_=from_,
                to=request.to,
                source=source,
                offer=request.body,
                content_type=request.content_type,
                headers=tuple(request.headers),
            )
        )

    @staticmethod
    def _contact_of(request: SipRequest) -> NameAddr | None:
        try:
            values = request.headers.get_all("Contact")
            contact = parse_name_addr(values[0]) if values else None
        except SipParseError:
            return None
        if contact is None or not contact.uri.is_sip:
            return None
        return contact

    def _in_dialog(
        self, request: SipRequest, key: TxKey, source: Address, destination: Address, now: float
    ) -> None:
        """12.2.2: a request with a To tag."""
        dialog = self._dialogs.get(_dialog_key(request))
        if dialog is None:
            self._answer(request, key, destination, 481, None, now)
            return
        number = request.cseq[0]
        if number < dialog.remote_seq:  # 12.2.2: out of order
            self._answer(request, key, destination, 500, "CSeq Out of Order", now)
            return
        dialog.remote_seq = number
        method = request.method
        if method == "INVITE":
            self._reinvite(request, dialog, key, destination, now)
        elif method == "BYE":
            self._remote_bye(request, dialog, key, destination, now)
        elif method == "OPTIONS":
            self._options(request, key, destination, now)
        elif method == "INFO":
            self._info(request, dialog, key, destination, now)
        else:  # NOTIFY: the subscription our REFER created (RFC 3515 2.4.4)
            self._answer(request, key, destination, 200, None, now)

    def _options(self, request: SipRequest, key: TxKey, destination: Address, now: float) -> None:
        """11.2: what we would answer to an INVITE, and what we support."""
        headers = [
            ("Allow", ALLOW),
            ("Accept", ACCEPT),
            ("Supported", ""),
            ("Contact", self._contact),
        ]
        self._answer(request, key, destination, 200, None, now, headers)

    def _info(
        self, request: SipRequest, dialog: Dialog, key: TxKey, destination: Address, now: float
    ) -> None:
        media_type = _media_type(request.content_type)
        if request.body and media_type not in _DTMF_TYPES:  # 8.2.3
            accept = [("Accept", ", ".join(sorted(_DTMF_TYPES)))]
            self._answer(request, key, destination, 415, None, now, accept)
            return
        self._answer(request, key, destination, 200, None, now)
        digit = _dtmf_digit(request.body, media_type) if request.body else None
        if digit is not None and dialog.live:
            self._events.append(Dtmf(dialog.id, digit))

    def _remote_bye(
        self, request: SipRequest, dialog: Dialog, key: TxKey, destination: Address, now: float
    ) -> None:
        """15.1.2: 200; a pending (re-)INVITE gets 487."""
        before = dialog.state
        tx = self._new_server_tx(request, key, destination)
        if dialog.step(DialogTrigger.REMOTE_BYE) is None:  # cannot happen: every held state
            self._respond(tx, 481, now=now)
            return
        self._respond(tx, 200, now=now)
        if before in (DialogState.EARLY, DialogState.REINVITE_PENDING):
            invite_tx = self._server.get(dialog.invite_tx)
            if isinstance(invite_tx, InviteServerTransaction) and not invite_tx.final_sent:
                self._respond(invite_tx, 487, now=now)
        self._terminate(dialog)
        if before is not DialogState.CLOSING:
            self._events.append(CallEnded(dialog.id, REMOTE_BYE))

    def _reinvite(
        self, request: SipRequest, dialog: Dialog, key: TxKey, destination: Address, now: float
    ) -> None:
        """14.2: a re-INVITE goes to the application, unless one is already in progress."""
        before = dialog.state
        tx = self._new_server_tx(
            request, key, destination, dialog=dialog.id, local_tag=dialog.id.local_tag
        )
        if dialog.step(DialogTrigger.REINVITE) is None:  # cannot happen: every held state
            self._respond(tx, 500, now=now)
            return
        if before is DialogState.CONFIRMED:
            self._respond(tx, 100, now=now)
            dialog.invite_tx = key
            dialog.reinvite_withdrawn = False
            contact = self._contact_of(request)
            dialog.pending_target = contact.uri if contact is not None else None
            self._arm(dialog, "no_answer", now + self._max_ringing_s, self._no_answer)
            self._events.append(ReInvite(dialog.id, request.body, request.content_type))
        elif before in (DialogState.EARLY, DialogState.REINVITE_PENDING):
            # 14.2: 500 with "a randomly chosen value of between 0 and 10 seconds"
            retry = ("Retry-After", str(self._rng.randint(0, 10)))
            self._respond(tx, 500, "Server Internal Error", now=now, headers=[retry])
        else:  # our 2xx to the last INVITE still waits for its ACK
            self._respond(tx, 491, now=now)

    # ----------------------------------------------------------------- responses in

    def _on_response(self, response: SipResponse, now: float) -> None:
        """17.1.3: match by the top Via's branch and the CSeq method; 18.1.2: the sent-by
        must be ours. Anything else is stray and dropped."""
        top = response.vias[0]
        tx = self._client.get((top.branch or "", response.cseq[1]))
        if tx is None or top.sent_by.lower() != self._hostport.lower():
            self.dropped += 1
            return
        tx.on_response(response.status, now)

    # ----------------------------------------------------------------- dialog plumbing

    def _arm(
        self,
        dialog: Dialog,
        name: str,
        deadline: float,
        handler: Callable[[Dialog, float], None],
    ) -> None:
        self._timers.cancel(dialog.timers.get(name))
        dialog.timers[name] = self._timers.start(deadline, partial(handler, dialog))

    def _disarm(self, dialog: Dialog, *names: str) -> None:
        for name in names:
            self._timers.cancel(dialog.timers.pop(name, None))

    def _terminate(self, dialog: Dialog) -> None:
        dialog.state = DialogState.TERMINATED
        self._disarm(dialog, *list(dialog.timers))
        if self._dialogs.pop(dialog.id, None) is not None:
            host = dialog.source[0]
            self._per_host[host] -= 1
            if self._per_host[host] <= 0:
                del self._per_host[host]

    def _invite_tx(self, dialog: Dialog) -> InviteServerTransaction:
        tx = self._server.get(dialog.invite_tx)
        assert isinstance(tx, InviteServerTransaction), "a pending INVITE keeps its transaction"
        return tx

    def _send_2xx(
        self,
        dialog: Dialog,
        tx: InviteServerTransaction,
        sdp: bytes,
        now: float,
        *,
        record_route: bool,
    ) -> None:
        """13.3.1.4: the 2xx, retransmitted by the core from T1 doubling to T2 until the
        ACK, for at most 64*T1."""
        assert tx.request is not None
        data = self._respond(
            tx,
            200,
            now=now,
            headers=[("Contact", self._contact), ("Allow", ALLOW)],
            body=sdp,
            content_type=ACCEPT,
            record_route=record_route,
        )
        dialog.pending_2xx = data
        dialog.pending_2xx_cseq = tx.request.cseq[0]
        dialog.pending_2xx_to = tx.destination
        dialog.retransmit_interval = self._timing.t1
        self._arm(dialog, "retransmit", now + self._timing.t1, self._retransmit_2xx)
        self._arm(dialog, "ack", now + self._timing.timeout, self._ack_timeout)

    def _retransmit_2xx(self, dialog: Dialog, now: float) -> None:
        if dialog.step(DialogTrigger.RETRANSMIT_2XX) is None or dialog.pending_2xx is None:
            return
        self._send(dialog.pending_2xx, dialog.pending_2xx_to)
        dialog.retransmit_interval = min(2 * dialog.retransmit_interval, self._timing.t2)
        self._arm(dialog, "retransmit", now + dialog.retransmit_interval, self._retransmit_2xx)

    def _ack_timeout(self, dialog: Dialog, now: float) -> None:
        before = dialog.state
        if dialog.step(DialogTrigger.ACK_TIMEOUT) is None:
            return
        dialog.pending_2xx = None
        self._send_bye(dialog, now)  # 13.3.1.4: "the session SHOULD be terminated" by BYE
        if before is not DialogState.CLOSING:
            self._events.append(CallEnded(dialog.id, ACK_TIMEOUT))

    def _no_answer(self, dialog: Dialog, now: float) -> None:
        """The application gave the (re-)INVITE no final response in ``max_ringing_s``."""
        before = dialog.state
        if dialog.step(DialogTrigger.NO_ANSWER) is None:
            return
        if before is DialogState.EARLY:
            self._respond(self._invite_tx(dialog), 480, now=now)
            self._terminate(dialog)
            self._events.append(CallEnded(dialog.id, NO_ANSWER))
        else:  # a re-INVITE: refused, the call goes on; a late answer is ignored
            self._respond(self._invite_tx(dialog), 500, now=now)
            dialog.reinvite_withdrawn = True
            dialog.pending_target = None

    def _request_target(self, dialog: Dialog) -> tuple[str, list[str]]:
        """12.2.1.1: the Request-URI and Route values of a request in the dialog."""
        target = str(dialog.remote_target)
        if not dialog.route_set:
            return target, []
        first = parse_name_addr(dialog.route_set[0])
        if first.uri.has_param("lr"):  # loose routing: the route set as it is
            return target, list(dialog.route_set)
        # strict routing: the first route becomes the Request-URI (stripped of what a
        # Request-URI may not carry, 19.1.1), the remote target goes last
        strict = replace(
            first.uri, headers=(), params=tuple(p for p in first.uri.params if p[0] != "method")
        )
        return str(strict), [*dialog.route_set[1:], f"<{target}>"]

    def _send_request(
        self,
        dialog: Dialog,
        method: str,
        extra: Sequence[tuple[str, str]],
        now: float,
        on_final: Callable[[NonInviteClientTransaction, int], None] | None = None,
    ) -> NonInviteClientTransaction:
        """12.2.1.1: a request inside the dialog, sent to the dialog's flow (module doc)."""
        dialog.local_seq += 1
        branch = self._new_branch()
        uri, routes = self._request_target(dialog)
        request = SipRequest(method, uri, Headers())
        headers = request.headers
        # rport (RFC 3581): responses come back along the flow even through a NAT
        headers.add("Via", f"SIP/2.0/UDP {self._hostport};branch={branch};rport")
        headers.add("Max-Forwards", str(_MAX_FORWARDS))
        for route in routes:
            headers.add("Route", route)
        headers.add("From", str(dialog.local_party))
        headers.add("To", str(dialog.remote_party))
        headers.add("Call-ID", dialog.id.call_id)
        headers.add("CSeq", f"{dialog.local_seq} {method}")
        for name, value in extra:
            headers.add(name, value)
        headers.add("User-Agent", self.user_agent)
        tx = NonInviteClientTransaction(
            key=(branch, method),
            destination=dialog.source,
            timing=self._timing,
            timers=self._timers,
            send=self._send,
            on_terminated=self._client_gone,
            request=serialize(request),
            method=method,
            dialog=dialog.id,
            on_final=on_final,
        )
        self._client[tx.key] = tx
        tx.start(now)
        return tx

    def _send_bye(self, dialog: Dialog, now: float) -> None:
        """15.1.1: BYE ends the dialog at once; its transaction lives on alone."""
        self._send_request(dialog, "BYE", (), now)
        self._terminate(dialog)

    def _refer_final(self, tx: NonInviteClientTransaction, status: int) -> None:
        if not isinstance(tx.dialog, DialogId):
            return
        dialog = self._dialogs.get(tx.dialog)
        if dialog is not None:
            dialog.refer_pending = False
        self._events.append(ReferResult(tx.dialog, status))

    # ----------------------------------------------------------------- intents

    def _held(self, dialog: DialogId) -> Dialog | None:
        """The dialog when the application still has it, else None."""
        held = self._dialogs.get(dialog)
        return held if held is not None and held.live else None

    def _require(self, dialog: DialogId, what: str) -> Dialog:
        held = self._held(dialog)
        if held is None:
            raise SipUsageError(
                UsageErrorCode.DIALOG_GONE, f"{what}: the dialog is over or unknown"
            )
        return held

    @staticmethod
    def _check_final(status: int, reason: str, headers: Sequence[tuple[str, str]]) -> None:
        if not 300 <= status <= 699:
            raise SipUsageError(UsageErrorCode.BAD_STATUS, f"{status} is not a 300-699 status")
        if any(ord(c) < 32 for c in reason):
            raise SipUsageError(UsageErrorCode.BAD_ARGUMENT, "control character in the reason")
        Headers(headers)  # validates names and values (SipUsageError)

    def ring(self, dialog: DialogId, *, now: float | None = None) -> None:
        """180 Ringing (13.3.1.1) with our tag, Contact and Record-Route (12.1.1)."""
        held = self._held(dialog)
        if held is None:
            return
        held.step(DialogTrigger.RING)
        self._respond(
            self._invite_tx(held),
            180,
            now=self._now if now is None else now,
            headers=[("Contact", self._contact)],
            record_route=True,
        )

    def answer(self, dialog: DialogId, sdp: bytes, now: float) -> None:
        """200 OK with the SDP answer (13.3.1.4), retransmitted until the ACK; no ACK in
        64*T1: CallEnded("ack_timeout") and a BYE."""
        self._now = now
        held = self._require(dialog, "answer")
        held.step(DialogTrigger.ANSWER)
        self._disarm(held, "no_answer")
        self._send_2xx(held, self._invite_tx(held), sdp, now, record_route=True)

    def reject(
        self,
        dialog: DialogId,
        status: int,
        reason: str,
        headers: Sequence[tuple[str, str]] = (),
        *,
        now: float | None = None,
    ) -> None:
        """A final 300-699 to the INVITE (13.3.1.3); the transaction absorbs the ACK."""
        self._check_final(status, reason, headers)
        held = self._held(dialog)
        if held is None:
            return
        held.step(DialogTrigger.REJECT)
        self._respond(
            self._invite_tx(held),
            status,
            reason,
            now=self._now if now is None else now,
            headers=headers,
        )
        self._terminate(held)

    def bye(self, dialog: DialogId, now: float) -> None:
        """Hang up (15.1.1): CallEnded("local_bye") is queued at once; the BYE goes now,
        or, while our 2xx waits for its ACK, on the ACK or its timeout (15)."""
        self._now = now
        held = self._held(dialog)
        if held is None:
            return
        before = held.state
        next_state = held.step(DialogTrigger.BYE)  # EARLY: illegal_state (15: reject it)
        self._events.append(CallEnded(dialog, LOCAL_BYE))
        if next_state is DialogState.CLOSING:
            return
        if before is DialogState.REINVITE_PENDING:
            self._respond(self._invite_tx(held), 487, now=now)
        self._send_bye(held, now)

    def answer_reinvite(self, dialog: DialogId, sdp: bytes, now: float) -> None:
        """200 OK with the SDP answer to the pending re-INVITE, retransmitted until its
        ACK; the re-INVITE's Contact becomes the remote target (12.2.2 target refresh)."""
        self._now = now
        held = self._require(dialog, "answer_reinvite")
        if held.state is DialogState.CONFIRMED and held.reinvite_withdrawn:
            return  # a CANCEL (487) or the deadline (500) answered it first
        held.step(DialogTrigger.ANSWER_REINVITE)
        self._disarm(held, "no_answer")
        if held.pending_target is not None:
            held.remote_target, held.pending_target = held.pending_target, None
        self._send_2xx(held, self._invite_tx(held), sdp, now, record_route=False)

    def reject_reinvite(
        self, dialog: DialogId, status: int, reason: str, *, now: float | None = None
    ) -> None:
        """A final 300-699 to the pending re-INVITE; the dialog and session go on (14.2)."""
        self._check_final(status, reason, ())
        held = self._require(dialog, "reject_reinvite")
        if held.state is DialogState.CONFIRMED and held.reinvite_withdrawn:
            return
        held.step(DialogTrigger.REJECT_REINVITE)
        self._disarm(held, "no_answer")
        held.pending_target = None
        self._respond(self._invite_tx(held), status, reason, now=self._now if now is None else now)

    def refer(self, dialog: DialogId, refer_to: str, now: float) -> None:
        """REFER (RFC 3515) in the dialog; its final response comes back as ReferResult
        (408 on timeout). One at a time per dialog."""
        self._now = now
        held = self._require(dialog, "refer")
        target = refer_to.strip()
        if "\r" in target or "\n" in target:
            raise SipUsageError(UsageErrorCode.BAD_ARGUMENT, "CR or LF in refer_to")
        if not target.startswith("<") and "<" not in target:
            target = f"<{target}>"
        try:
            parse_name_addr(target)
        except SipParseError as exc:
            raise SipUsageError(UsageErrorCode.BAD_ARGUMENT, f"refer_to: {exc.message}") from None
        if held.refer_pending:
            raise SipUsageError(UsageErrorCode.REFER_PENDING, "a REFER is still in progress")
        if len(self._client) >= self._max_transactions:
            raise SipUsageError(UsageErrorCode.TOO_MANY_TRANSACTIONS, "client transactions")
        held.step(DialogTrigger.REFER)
        held.refer_pending = True
        extra = [("Refer-To", target), ("Contact", self._contact)]
        self._send_request(held, "REFER", extra, now, on_final=self._refer_final)
