"""The SIP UAS core, byte for byte, without sockets, clocks or an event loop.

The caller is a phone behind a NAT (RFC 3261 24.2 style messages, Alice calling the IVR):
it writes its private address in Via and Contact and asks for ``rport`` (RFC 3581), and its
datagrams arrive from the NAT's public address :data:`PHONE`. Every datagram the core
queues is parsed back and checked; where a whole datagram is predictable it is compared
byte for byte. Time is a number passed in: retransmission schedules are checked exactly.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from telephony.sip import (
    ALLOW,
    DIALOG_TRANSITIONS,
    CallCancelled,
    CallConfirmed,
    CallEnded,
    DialogId,
    DialogState,
    DialogTrigger,
    Dtmf,
    IncomingCall,
    ReferResult,
    ReInvite,
    SipEvent,
    SipParseError,
    SipRequest,
    SipResponse,
    SipUas,
    SipUri,
    SipUsageError,
    UsageErrorCode,
    Via,
    parse_message,
    parse_name_addr,
    parse_via,
    response_destination,
    split_list,
)

GW = ("192.0.2.1", 5060)
PHONE = ("203.0.113.9", 40000)  # the NAT's public address: where Alice's packets come from
CALL_ID = "a84b4c76e66710@pc33.atlanta.example.com"
OFFER = (
    b"v=0\r\no=alice 2890844526 2890844526 IN IP4 10.0.0.7\r\ns=-\r\n"
    b"c=IN IP4 10.0.0.7\r\nt=0 0\r\nm=audio 49170 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
)
ANSWER = (
    b"v=0\r\no=gw 1 1 IN IP4 192.0.2.1\r\ns=-\r\n"
    b"c=IN IP4 192.0.2.1\r\nt=0 0\r\nm=audio 30000 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
)
TIMEOUT = 32.0  # 64*T1


def crlf(text: str) -> bytes:
    return text.replace("\n", "\r\n").encode()


INVITE = (
    crlf(
        """INVITE sip:ivr@192.0.2.1 SIP/2.0
Via: SIP/2.0/UDP 10.0.0.7:5062;branch=z9hG4bK776asdhds;rport
Max-Forwards: 70
To: IVR <sip:ivr@192.0.2.1>
From: Alice <sip:alice@atlanta.example.com>;tag=1928301774
Call-ID: a84b4c76e66710@pc33.atlanta.example.com
CSeq: 314159 INVITE
Contact: <sip:alice@10.0.0.7:5062>
Content-Type: application/sdp
Content-Length: 130

"""
    )
    + OFFER
)

# The top Via as the core rewrites it (18.2.1, RFC 3581): what every response carries.
VIA_OUT = "SIP/2.0/UDP 10.0.0.7:5062;branch=z9hG4bK776asdhds;rport=40000;received=203.0.113.9"


def msg(
    method: str,
    *,
    branch: str,
    cseq: int,
    to_tag: str | None = None,
    via: str | None = None,
    call_id: str = CALL_ID,
    from_tag: str = "1928301774",
    uri: str = "sip:ivr@192.0.2.1",
    extra: str = "",
    body: bytes = b"",
    cseq_method: str | None = None,
) -> bytes:
    """A request from Alice (an in-dialog one when ``to_tag`` is given)."""
    to = "IVR <sip:ivr@192.0.2.1>" + (f";tag={to_tag}" if to_tag else "")
    via = via or f"SIP/2.0/UDP 10.0.0.7:5062;branch={branch};rport"
    head = (
        f"{method} {uri} SIP/2.0\n"
        f"Via: {via}\n"
        "Max-Forwards: 70\n"
        f"To: {to}\n"
        f"From: Alice <sip:alice@atlanta.example.com>;tag={from_tag}\n"
        f"Call-ID: {call_id}\n"
        f"CSeq: {cseq} {cseq_method or method}\n"
        f"{extra}"
        f"Content-Length: {len(body)}\n\n"
    )
    return crlf(head) + body


def ack(tag: str, *, branch: str = "z9hG4bKack1", cseq: int = 314159) -> bytes:
    return msg("ACK", branch=branch, cseq=cseq, to_tag=tag)


def make_uas(**kwargs: object) -> SipUas:
    return SipUas(host=GW[0], port=GW[1], rng=random.Random(3), **kwargs)  # type: ignore[arg-type]


Sent = list[tuple[SipRequest | SipResponse, tuple[str, int]]]


def sent(uas: SipUas) -> Sent:
    return [(parse_message(data), destination) for data, destination in uas.outgoing()]


def responses(uas: SipUas) -> list[SipResponse]:
    out = []
    for message, destination in sent(uas):
        assert isinstance(message, SipResponse)
        assert destination == PHONE
        out.append(message)
    return out


def statuses(uas: SipUas) -> list[int]:
    return [r.status for r in responses(uas)]


def only_request(uas: SipUas) -> SipRequest:
    out = sent(uas)
    assert len(out) == 1
    message, destination = out[0]
    assert isinstance(message, SipRequest) and destination == PHONE
    return message


def incoming(uas: SipUas, data: bytes = INVITE, now: float = 0.0) -> IncomingCall:
    events = uas.receive(data, PHONE, now)
    assert len(events) == 1 and isinstance(events[0], IncomingCall)
    assert statuses(uas) == [100]
    return events[0]


def confirmed_call(uas: SipUas, *, data: bytes = INVITE) -> DialogId:
    call = incoming(uas, data)
    uas.answer(call.dialog, ANSWER, 0.0)
    assert statuses(uas) == [200]
    assert uas.receive(ack(call.dialog.local_tag), PHONE, 0.1) == [CallConfirmed(call.dialog)]
    return call.dialog


def reply_to(request: SipRequest, status: int, reason: str = "OK") -> bytes:
    """Alice's answer to one of our requests (RFC 3261 8.2.6.2)."""
    lines = [f"SIP/2.0 {status} {reason}"]
    lines += [f"Via: {v}" for v in request.headers.raw("Via")]
    for name in ("From", "To", "Call-ID", "CSeq"):
        lines.append(f"{name}: {request.headers.get(name)}")
    lines += ["Content-Length: 0", "", ""]
    return "\r\n".join(lines).encode("utf-8", "surrogateescape")


def fire_all(uas: SipUas, until: float) -> list[tuple[float, list[SipEvent], Sent]]:
    """Fire timers one deadline at a time up to ``until``: (time, events, datagrams)."""
    out = []
    while (deadline := uas.next_timer()) is not None and deadline <= until:
        events = uas.on_timer(deadline)
        out.append((deadline, events, sent(uas)))
    return out


# --------------------------------------------------------------------------- a whole call


def test_invite_gets_100_trying_at_once_and_an_incoming_call() -> None:
    uas = make_uas()
    events = uas.receive(INVITE, PHONE, 0.0)
    [(data, destination)] = uas.outgoing()
    assert destination == PHONE  # rport: back where it came from, through the NAT
    assert data == crlf(
        f"""SIP/2.0 100 Trying
Via: {VIA_OUT}
From: Alice <sip:alice@atlanta.example.com>;tag=1928301774
To: IVR <sip:ivr@192.0.2.1>
Call-ID: a84b4c76e66710@pc33.atlanta.example.com
CSeq: 314159 INVITE
Server: voice-gateway
Content-Length: 0

"""
    )
    [call] = events
    assert isinstance(call, IncomingCall)
    assert call.call_id == CALL_ID and call.source == PHONE
    assert call.request_uri == SipUri("sip", "ivr", "192.0.2.1")
    assert call.from_.display == "Alice" and call.from_.tag == "1928301774"
    assert call.to.tag is None and call.offer == OFFER
    assert call.content_type == "application/sdp"
    assert ("Contact", "<sip:alice@10.0.0.7:5062>") in call.headers
    assert call.dialog.call_id == CALL_ID and call.dialog.remote_tag == "1928301774"
    assert uas.dialog_count == 1 and uas.dialogs_from(PHONE[0]) == 1
    assert uas.dialog_state(call.dialog) is DialogState.EARLY
    assert uas.responses_sent[100] == 1 and uas.requests_received["INVITE"] == 1


def test_full_call_with_inbound_bye() -> None:
    uas = make_uas()
    call = incoming(uas)
    tag = call.dialog.local_tag
    uas.answer(call.dialog, ANSWER, 1.0)
    [(data, destination)] = uas.outgoing()
    assert destination == PHONE
    assert (
        data
        == crlf(
            f"""SIP/2.0 200 OK
Via: {VIA_OUT}
From: Alice <sip:alice@atlanta.example.com>;tag=1928301774
To: IVR <sip:ivr@192.0.2.1>;tag={tag}
Call-ID: a84b4c76e66710@pc33.atlanta.example.com
CSeq: 314159 INVITE
Contact: <sip:192.0.2.1:5060>
Allow: INVITE, ACK, CANCEL, BYE, OPTIONS, INFO, NOTIFY
Server: voice-gateway
Content-Type: application/sdp
Content-Length: {len(ANSWER)}

"""
        )
        + ANSWER
    )
    assert uas.receive(ack(tag), PHONE, 1.2) == [CallConfirmed(call.dialog)]
    assert uas.outgoing() == []
    assert uas.dialog_state(call.dialog) is DialogState.CONFIRMED
    bye = msg("BYE", branch="z9hG4bKbye1", cseq=314160, to_tag=tag)
    assert uas.receive(bye, PHONE, 5.0) == [CallEnded(call.dialog, "remote_bye")]
    [(data, destination)] = uas.outgoing()
    assert data == crlf(
        f"""SIP/2.0 200 OK
Via: SIP/2.0/UDP 10.0.0.7:5062;branch=z9hG4bKbye1;rport=40000;received=203.0.113.9
From: Alice <sip:alice@atlanta.example.com>;tag=1928301774
To: IVR <sip:ivr@192.0.2.1>;tag={tag}
Call-ID: a84b4c76e66710@pc33.atlanta.example.com
CSeq: 314160 BYE
Server: voice-gateway
Content-Length: 0

"""
    )
    assert uas.dialog_count == 0 and uas.dialogs_from(PHONE[0]) == 0
    assert uas.dialog_state(call.dialog) is None
    # the BYE's retransmission is answered by its transaction, with no second event
    assert uas.receive(bye, PHONE, 5.5) == []
    assert statuses(uas) == [200]
    # everything is forgotten once the transactions' timers ran out (timers L, J)
    fire_all(uas, 100.0)
    assert uas.transaction_count == 0 and uas.next_timer() is None
    assert uas.dropped == 0


def test_full_call_with_outbound_bye() -> None:
    uas = make_uas()
    dialog = confirmed_call(uas)
    uas.bye(dialog, 10.0)
    assert uas.take_events() == [CallEnded(dialog, "local_bye")]  # at once, for the app
    bye = only_request(uas)
    assert (bye.method, bye.uri) == ("BYE", "sip:alice@10.0.0.7:5062")  # the remote target
    via = bye.vias[0]
    assert via.sent_by == "192.0.2.1:5060" and via.rport_requested
    assert via.branch is not None and via.branch.startswith("z9hG4bK")
    assert bye.max_forwards == 70
    assert bye.from_ == parse_name_addr(f"IVR <sip:ivr@192.0.2.1>;tag={dialog.local_tag}")
    assert bye.to == parse_name_addr("Alice <sip:alice@atlanta.example.com>;tag=1928301774")
    assert bye.call_id == CALL_ID and bye.cseq[1] == "BYE"
    assert bye.headers.get("User-Agent") == "voice-gateway" and "Route" not in bye.headers
    assert "Contact" not in bye.headers  # RFC 3261 table 2: not applicable to BYE
    assert uas.dialog_count == 0
    # timer E: retransmitted at T1, then 2*T1, until a final response
    assert uas.next_timer() == 10.5
    uas.on_timer(10.5)
    assert only_request(uas) == bye
    assert uas.next_timer() == 11.5
    assert uas.receive(reply_to(bye, 200), PHONE, 11.0) == []
    assert uas.outgoing() == [] and uas.dropped == 0
    # a retransmitted 200 is absorbed by the completed transaction (timer K)
    assert uas.receive(reply_to(bye, 200), PHONE, 11.2) == [] and uas.dropped == 0
    fire_all(uas, 100.0)
    assert uas.transaction_count == 0 and uas.outgoing() == []
    assert uas.receive(reply_to(bye, 200), PHONE, 100.0) == [] and uas.dropped == 1


def test_local_cseq_starts_random_and_increases() -> None:
    uas = make_uas()
    dialog = confirmed_call(uas)
    uas.refer(dialog, "sip:agent@192.0.2.50", 1.0)
    refer = only_request(uas)
    uas.receive(reply_to(refer, 202, "Accepted"), PHONE, 1.1)
    uas.bye(dialog, 2.0)
    bye = only_request(uas)
    assert 0 < refer.cseq[0] < 2**31 and bye.cseq[0] == refer.cseq[0] + 1
    assert refer.vias[0].branch != bye.vias[0].branch


def test_bye_gives_up_at_timer_f() -> None:
    uas = make_uas()
    dialog = confirmed_call(uas)
    uas.bye(dialog, 0.0)
    uas.outgoing()
    assert uas.take_events() == [CallEnded(dialog, "local_bye")]
    fired = fire_all(uas, 100.0)
    times = [t for t, _, out in fired if out]
    assert times == [0.5, 1.5, 3.5, 7.5, 11.5, 15.5, 19.5, 23.5, 27.5, 31.5]
    assert all(events == [] for _, events, _ in fired)  # no event: the call was already over
    assert uas.transaction_count == 0


def test_200_ok_retransmitted_until_ack_timeout_then_bye() -> None:
    uas = make_uas()
    call = incoming(uas)
    uas.answer(call.dialog, ANSWER, 0.0)
    [ok] = responses(uas)
    fired = fire_all(uas, 40.0)
    retransmissions = [(t, out) for t, _, out in fired if out and out[0][0] == ok]
    # 13.3.1.4: T1, doubling up to T2 (4 s)
    assert [t for t, _ in retransmissions] == [
        0.5,
        1.5,
        3.5,
        7.5,
        11.5,
        15.5,
        19.5,
        23.5,
        27.5,
        31.5,
    ]
    assert all(out == [(ok, PHONE)] for _, out in retransmissions)
    [(when, events, out)] = [(t, e, o) for t, e, o in fired if e]
    assert when == TIMEOUT and events == [CallEnded(call.dialog, "ack_timeout")]
    [(bye, destination)] = out
    assert isinstance(bye, SipRequest) and bye.method == "BYE" and destination == PHONE
    assert uas.dialog_count == 0


def test_ack_stops_the_200_retransmissions() -> None:
    uas = make_uas()
    call = incoming(uas)
    uas.answer(call.dialog, ANSWER, 0.0)
    uas.outgoing()
    uas.on_timer(0.5)
    assert statuses(uas) == [200]
    assert uas.receive(ack(call.dialog.local_tag), PHONE, 0.7) == [CallConfirmed(call.dialog)]
    # a duplicate ACK (each 200 retransmission draws one) is absorbed
    assert uas.receive(ack(call.dialog.local_tag), PHONE, 0.8) == []
    fired = fire_all(uas, 100.0)
    assert all(out == [] and events == [] for _, events, out in fired)
    assert uas.dialog_state(call.dialog) is DialogState.CONFIRMED
    assert uas.transaction_count == 0  # timer L ended the INVITE transaction
    assert uas.dropped == 0


def test_invite_retransmissions_are_absorbed_and_reanswered() -> None:
    uas = make_uas()
    call = incoming(uas)
    assert uas.receive(INVITE, PHONE, 0.4) == []
    assert statuses(uas) == [100]
    uas.ring(call.dialog)
    [ringing] = responses(uas)
    assert uas.receive(INVITE, PHONE, 1.0) == []
    assert responses(uas) == [ringing]
    uas.answer(call.dialog, ANSWER, 2.0)
    [ok] = responses(uas)
    assert uas.receive(INVITE, PHONE, 2.1) == []  # RFC 6026 Accepted: absorbed
    assert responses(uas) == [ok]
    assert uas.dialog_count == 1 and uas.requests_received["INVITE"] == 4


def test_to_tag_is_stable_across_180_200_and_retransmissions() -> None:
    uas = make_uas()
    call = incoming(uas)
    uas.ring(call.dialog)
    uas.ring(call.dialog)
    uas.answer(call.dialog, ANSWER, 0.0)
    uas.on_timer(0.5)
    uas.receive(INVITE, PHONE, 0.6)
    out = responses(uas)
    assert [r.status for r in out] == [180, 180, 200, 200, 200]
    assert {r.to.tag for r in out} == {call.dialog.local_tag}
    ringing = out[0]
    assert ringing.headers.get("Contact") == "<sip:192.0.2.1:5060>"


# --------------------------------------------------------------------------- CANCEL


def cancel(branch: str = "z9hG4bK776asdhds") -> bytes:
    return msg("CANCEL", branch=branch, cseq=314159)


def test_cancel_before_the_answer() -> None:
    uas = make_uas()
    call = incoming(uas)
    uas.ring(call.dialog)
    uas.outgoing()
    assert uas.receive(cancel(), PHONE, 1.0) == [CallCancelled(call.dialog)]
    ok, terminated = responses(uas)
    assert (ok.status, ok.cseq) == (200, (314159, "CANCEL"))
    assert (terminated.status, terminated.reason, terminated.cseq) == (
        487,
        "Request Terminated",
        (314159, "INVITE"),
    )
    assert ok.to.tag == terminated.to.tag == call.dialog.local_tag  # 9.2 SHOULD
    assert uas.dialog_count == 0
    # the ACK for the 487 reuses the INVITE's branch: absorbed by the transaction
    absorbed = msg("ACK", branch="z9hG4bK776asdhds", cseq=314159, to_tag=call.dialog.local_tag)
    assert uas.receive(absorbed, PHONE, 1.1) == [] and uas.outgoing() == []
    assert uas.receive(cancel(), PHONE, 1.2) == []  # a retransmitted CANCEL: the same 200
    assert responses(uas) == [ok]
    fired = fire_all(uas, 100.0)
    assert all(out == [] for _, _, out in fired)  # no 487 retransmission after the ACK
    assert uas.transaction_count == 0 and uas.dropped == 0
    # the application's late intents on the cancelled call
    uas.reject(call.dialog, 486, "Busy Here")  # nothing to do
    uas.ring(call.dialog)
    uas.bye(call.dialog, 2.0)
    with pytest.raises(SipUsageError) as info:
        uas.answer(call.dialog, ANSWER, 2.0)
    assert info.value.code is UsageErrorCode.DIALOG_GONE
    assert uas.outgoing() == [] and uas.take_events() == []


def test_cancel_matching_no_transaction_gets_481() -> None:
    uas = make_uas()
    assert uas.receive(cancel("z9hG4bKnothing"), PHONE, 0.0) == []
    [response] = responses(uas)
    assert (response.status, response.reason) == (481, "Call/Transaction Does Not Exist")
    assert response.to.tag is not None


def test_cancel_after_the_final_response_gets_200_only() -> None:
    uas = make_uas()
    call = incoming(uas)
    uas.answer(call.dialog, ANSWER, 0.0)
    uas.outgoing()
    assert uas.receive(cancel(), PHONE, 0.2) == []
    [ok] = responses(uas)
    assert ok.status == 200 and ok.cseq[1] == "CANCEL"
    assert uas.dialog_state(call.dialog) is DialogState.ANSWERED


def test_reject_then_ack_absorbed_and_487_style_retransmission_without_ack() -> None:
    uas = make_uas()
    call = incoming(uas)
    uas.reject(call.dialog, 486, "Busy Here", now=0.0)
    [busy] = responses(uas)
    assert (busy.status, busy.reason, busy.to.tag) == (486, "Busy Here", call.dialog.local_tag)
    assert uas.dialog_count == 0
    # no ACK: timer G retransmits (T1 doubling to T2) until timer H at 64*T1
    fired = fire_all(uas, 100.0)
    assert [t for t, _, out in fired if out] == [
        0.5,
        1.5,
        3.5,
        7.5,
        11.5,
        15.5,
        19.5,
        23.5,
        27.5,
        31.5,
    ]
    assert all(out in ([], [(busy, PHONE)]) for _, _, out in fired)
    assert uas.transaction_count == 0


def test_non_2xx_ack_with_a_branch_of_its_own_is_absorbed() -> None:
    # 17.1.1.3 wants the INVITE's branch; sipp's scenarios use a new one: still absorbed
    uas = make_uas()
    call = incoming(uas)
    uas.reject(call.dialog, 404, "Not Found", [("Warning", '399 gw "no route"')], now=0.0)
    [not_found] = responses(uas)
    assert not_found.headers.get("Warning") == '399 gw "no route"'
    stray_branch = ack(call.dialog.local_tag, branch="z9hG4bKsipp-ack")
    assert uas.receive(stray_branch, PHONE, 0.1) == []
    assert fire_all(uas, 100.0) == [(5.1, [], [])]  # only timer I: no retransmission
    assert uas.dropped == 0


# --------------------------------------------------------------------------- core answers


def test_options_out_of_dialog_and_in_dialog() -> None:
    uas = make_uas()
    assert uas.receive(msg("OPTIONS", branch="z9hG4bKopt1", cseq=1, call_id="ka"), PHONE, 0) == []
    [ok] = responses(uas)
    assert ok.status == 200 and ok.to.tag is not None
    assert ok.headers.get("Allow") == ALLOW
    assert ok.headers.get("Accept") == "application/sdp"
    assert ok.headers.get("Supported") == ""
    assert uas.dialog_count == 0
    dialog = confirmed_call(uas)
    in_dialog = msg("OPTIONS", branch="z9hG4bKopt2", cseq=314160, to_tag=dialog.local_tag)
    assert uas.receive(in_dialog, PHONE, 1.0) == []
    [ok] = responses(uas)
    assert ok.status == 200 and ok.to.tag == dialog.local_tag


def test_unknown_and_unsupported_methods() -> None:
    uas = make_uas()
    uas.receive(msg("FROBNICATE", branch="z9hG4bKm1", cseq=1), PHONE, 0)
    uas.receive(msg("SUBSCRIBE", branch="z9hG4bKm2", cseq=1), PHONE, 0)
    uas.receive(msg("REFER", branch="z9hG4bKm3", cseq=1), PHONE, 0)
    out = responses(uas)
    assert [(r.status, r.reason) for r in out] == [
        (501, "Not Implemented"),
        (405, "Method Not Allowed"),
        (405, "Method Not Allowed"),
    ]
    assert all(r.headers.get("Allow") == ALLOW for r in out)  # 8.2.1
    assert uas.requests_received["other"] == 1 and uas.requests_received["SUBSCRIBE"] == 1


def test_requests_for_unknown_dialogs_get_481() -> None:
    uas = make_uas()
    for method in ("BYE", "INFO", "NOTIFY", "INVITE", "OPTIONS"):
        uas.receive(msg(method, branch=f"z9hG4bK{method}", cseq=2, to_tag="nosuch"), PHONE, 0)
    uas.receive(msg("BYE", branch="z9hG4bKnotag", cseq=2), PHONE, 0)  # no To tag at all
    assert statuses(uas) == [481] * 6
    assert uas.dialog_count == 0


def test_malformed_request_answered_when_possible() -> None:
    # the integration test's probe: CSeq "x OPTIONS"
    uas = make_uas()
    bad = msg("OPTIONS", branch="z9hG4bKbad", cseq=1).replace(
        b"CSeq: 1 OPTIONS", b"CSeq: x OPTIONS"
    )
    assert uas.receive(bad, PHONE, 0.0) == []
    [(data, destination)] = uas.outgoing()
    assert destination == PHONE
    tag = data.split(b";tag=")[2].split(b"\r\n")[0].decode()
    assert data == crlf(
        f"""SIP/2.0 400 Bad CSeq Header
Via: SIP/2.0/UDP 10.0.0.7:5062;branch=z9hG4bKbad;rport=40000;received=203.0.113.9
From: Alice <sip:alice@atlanta.example.com>;tag=1928301774
To: IVR <sip:ivr@192.0.2.1>;tag={tag}
Call-ID: a84b4c76e66710@pc33.atlanta.example.com
CSeq: x OPTIONS
Server: voice-gateway
Content-Length: 0

"""
    )  # the CSeq copied as received, however wrong
    assert uas.transaction_count == 0 and uas.responses_sent[400] == 1
    version = msg("OPTIONS", branch="z9hG4bKv", cseq=1).replace(b"SIP/2.0\r\n", b"SIP/3.0\r\n", 1)
    uas.receive(version, PHONE, 0.0)
    assert [(r.status, r.reason) for r in responses(uas)] == [(505, "Version Not Supported")]
    assert uas.dropped == 0


@pytest.mark.parametrize(
    "data",
    [
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS hello
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        msg("OPTIONS", branch="z9hG4bKnovia", cseq=1).replace(
            b"Via: SIP/2.0/UDP 10.0.0.7:5062;branch=z9hG4bKnovia;rport\r\n", b""
        ),
        msg("OPTIONS", branch="z9hG4bKbadvia", cseq=1).replace(b"SIP/2.0/UDP 10", b"SIP/2.0 10"),
        msg("OPTIONS", branch="z9hG4bKnocid", cseq=1).replace(b"Call-ID", b"X-Call-ID"),
        msg("ACK", branch="z9hG4bKbadack", cseq=1).replace(b"CSeq: 1 ACK", b"CSeq: x ACK"),
        crlf("SIP/2.0 200 OK\nVia: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKx\n\n"),
    ],
)
def test_unanswerable_datagrams_are_dropped_and_counted(data: bytes) -> None:
    uas = make_uas()
    assert uas.receive(data, PHONE, 0.0) == []
    assert uas.outgoing() == [] and uas.dropped == 1


def test_keepalives_are_ignored_quietly() -> None:
    uas = make_uas()
    assert uas.receive(b"\r\n\r\n", PHONE, 0.0) == []
    assert uas.outgoing() == [] and uas.dropped == 0


def test_header_inspection_refusals() -> None:
    uas = make_uas()
    uas.receive(msg("OPTIONS", branch="z9hG4bKu1", cseq=1, uri="mailto:ivr@example.com"), PHONE, 0)
    uas.receive(
        msg("OPTIONS", branch="z9hG4bKu2", cseq=1, extra="Require: 100rel, foo\n"), PHONE, 0
    )
    out = responses(uas)
    assert [(r.status, r.reason) for r in out] == [
        (416, "Unsupported URI Scheme"),  # 8.2.2.1
        (420, "Bad Extension"),  # 8.2.2.3
    ]
    assert out[1].headers.get("Unsupported") == "100rel, foo"


def test_merged_invite_gets_482() -> None:
    # 8.2.2.2: the same INVITE (Call-ID, From tag, CSeq) by another path, another branch
    uas = make_uas()
    incoming(uas)
    forked = INVITE.replace(b"z9hG4bK776asdhds", b"z9hG4bKotherpath")
    assert uas.receive(forked, PHONE, 0.1) == []
    assert [(r.status, r.reason) for r in responses(uas)] == [(482, "Loop Detected")]
    assert uas.dialog_count == 1


@pytest.mark.parametrize(
    ("old", "new", "reason"),
    [
        (b"Contact: <sip:alice@10.0.0.7:5062>\r\n", b"", "Bad Contact Header"),
        (b"Contact: <sip:alice@10.0.0.7:5062>", b"Contact: *", "Bad Contact Header"),
        (CALL_ID.encode(), b"x" * 200, "Bad Call-ID Header"),
        (b"Max-Forwards", b"Record-Route: <sip:p1;lr\r\nMax-Forwards", "Bad Record-Route Header"),
    ],
)
def test_invites_the_core_refuses(old: bytes, new: bytes, reason: str) -> None:
    uas = make_uas()
    assert uas.receive(INVITE.replace(old, new), PHONE, 0.0) == []
    [refused] = responses(uas)
    assert (refused.status, refused.reason) == (400, reason)
    assert uas.dialog_count == 0


def test_in_dialog_cseq_lower_than_the_last_gets_500() -> None:
    uas = make_uas()
    dialog = confirmed_call(uas)
    old = msg("OPTIONS", branch="z9hG4bKold", cseq=3, to_tag=dialog.local_tag)
    uas.receive(old, PHONE, 1.0)
    assert [(r.status, r.reason) for r in responses(uas)] == [(500, "CSeq Out of Order")]


def test_dtmf_info() -> None:
    uas = make_uas()
    dialog = confirmed_call(uas)
    events = []
    for index, (content_type, body) in enumerate(
        [
            ("application/dtmf-relay", b"Signal=5\r\nDuration=160\r\n"),
            ("application/dtmf-relay", b"Signal= 11\r\nDuration=100\r\n"),
            ("application/dtmf", b"*"),
            ("application/dtmf-relay", b"Signal=Z\r\n"),
        ]
    ):
        info = msg(
            "INFO",
            branch=f"z9hG4bKinfo{index}",
            cseq=314160 + index,
            to_tag=dialog.local_tag,
            extra=f"Content-Type: {content_type}\n",
            body=body,
        )
        events += uas.receive(info, PHONE, 1.0 + index)
    assert events == [Dtmf(dialog, "5"), Dtmf(dialog, "#"), Dtmf(dialog, "*")]
    assert statuses(uas) == [200, 200, 200, 200]
    other = msg(
        "INFO",
        branch="z9hG4bKinfoX",
        cseq=314170,
        to_tag=dialog.local_tag,
        extra="Content-Type: application/json\n",
        body=b"{}",
    )
    uas.receive(other, PHONE, 9.0)
    [unsupported] = responses(uas)
    assert unsupported.status == 415
    assert unsupported.headers.get("Accept") == "application/dtmf, application/dtmf-relay"


# --------------------------------------------------------------------------- re-INVITE


def reinvite(tag: str, cseq: int, branch: str, body: bytes = OFFER) -> bytes:
    return msg(
        "INVITE",
        branch=branch,
        cseq=cseq,
        to_tag=tag,
        extra="Contact: <sip:alice@10.0.0.8:5062>\nContent-Type: application/sdp\n",
        body=body,
    )


def test_reinvite_answered() -> None:
    uas = make_uas()
    dialog = confirmed_call(uas)
    hold = OFFER.replace(b"a=rtpmap", b"a=sendonly\r\na=rtpmap")
    events = uas.receive(reinvite(dialog.local_tag, 314160, "z9hG4bKre1", hold), PHONE, 5.0)
    assert events == [ReInvite(dialog, hold, "application/sdp")]
    assert statuses(uas) == [100]
    assert uas.dialog_state(dialog) is DialogState.REINVITE_PENDING
    uas.answer_reinvite(dialog, ANSWER, 5.1)
    [ok] = responses(uas)
    assert (ok.status, ok.cseq, ok.body) == (200, (314160, "INVITE"), ANSWER)
    assert ok.to.tag == dialog.local_tag and "Record-Route" not in ok.headers
    uas.on_timer(5.6)
    assert responses(uas) == [ok]  # retransmitted until its ACK (13.3.1.4)
    assert uas.receive(ack(dialog.local_tag, cseq=314160), PHONE, 5.7) == []
    assert uas.dialog_state(dialog) is DialogState.CONFIRMED
    # the re-INVITE's Contact is the new remote target (12.2.2 target refresh)
    uas.bye(dialog, 6.0)
    assert only_request(uas).uri == "sip:alice@10.0.0.8:5062"


def test_overlapping_reinvites() -> None:
    uas = make_uas()
    dialog = confirmed_call(uas)
    uas.receive(reinvite(dialog.local_tag, 314160, "z9hG4bKre1"), PHONE, 5.0)
    assert statuses(uas) == [100]
    # 14.2: a second INVITE before our final response to the first: 500 + Retry-After 0..10
    assert uas.receive(reinvite(dialog.local_tag, 314161, "z9hG4bKre2"), PHONE, 5.1) == []
    [refused] = responses(uas)
    assert (refused.status, refused.reason) == (500, "Server Internal Error")
    retry = refused.headers.get("Retry-After")
    assert retry is not None and 0 <= int(retry) <= 10
    uas.answer_reinvite(dialog, ANSWER, 5.2)
    assert statuses(uas) == [200]
    # our 2xx still waits for its ACK: 491 Request Pending
    assert uas.receive(reinvite(dialog.local_tag, 314162, "z9hG4bKre3"), PHONE, 5.3) == []
    assert [(r.status, r.reason) for r in responses(uas)] == [(491, "Request Pending")]
    # the refused INVITEs' ACKs are absorbed by their transactions
    for branch, cseq in (("z9hG4bKre2", 314161), ("z9hG4bKre3", 314162)):
        absorbed = msg("ACK", branch=branch, cseq=cseq, to_tag=dialog.local_tag)
        assert uas.receive(absorbed, PHONE, 5.4) == []
    assert uas.receive(ack(dialog.local_tag, cseq=314160), PHONE, 5.5) == []
    assert uas.dialog_state(dialog) is DialogState.CONFIRMED
    assert uas.dropped == 0


def test_reinvite_rejected_and_cancelled() -> None:
    uas = make_uas()
    dialog = confirmed_call(uas)
    uas.receive(reinvite(dialog.local_tag, 314160, "z9hG4bKre1"), PHONE, 5.0)
    uas.outgoing()
    uas.reject_reinvite(dialog, 488, "Not Acceptable Here")
    [refused] = responses(uas)
    assert (refused.status, refused.to.tag) == (488, dialog.local_tag)
    assert uas.dialog_state(dialog) is DialogState.CONFIRMED  # 14.2: the call goes on
    with pytest.raises(SipUsageError) as info:
        uas.answer_reinvite(dialog, ANSWER, 5.1)
    assert info.value.code is UsageErrorCode.ILLEGAL_STATE
    # a re-INVITE CANCELled before the application answered it: 200 + 487, no event
    uas.receive(reinvite(dialog.local_tag, 314161, "z9hG4bKre2"), PHONE, 6.0)
    uas.outgoing()
    assert uas.receive(msg("CANCEL", branch="z9hG4bKre2", cseq=314161, to_tag=dialog.local_tag),
                       PHONE, 6.1) == []  # fmt: skip
    assert statuses(uas) == [200, 487]
    uas.answer_reinvite(dialog, ANSWER, 6.2)  # the CANCEL won: nothing to do
    assert uas.outgoing() == [] and uas.dialog_state(dialog) is DialogState.CONFIRMED


def test_reinvite_the_application_never_answers() -> None:
    uas = make_uas(max_ringing_s=10)
    dialog = confirmed_call(uas)
    uas.receive(reinvite(dialog.local_tag, 314160, "z9hG4bKre1"), PHONE, 5.0)
    uas.outgoing()
    assert uas.next_timer() == 15.0
    assert uas.on_timer(15.0) == []
    [refused] = responses(uas)
    assert (refused.status, refused.cseq) == (500, (314160, "INVITE"))
    assert uas.dialog_state(dialog) is DialogState.CONFIRMED  # the call goes on
    uas.answer_reinvite(dialog, ANSWER, 16.0)  # too late: ignored
    assert uas.outgoing() == []
    fire_all(uas, 100.0)
    assert uas.transaction_count == 0 and uas.next_timer() is None


def test_odd_but_valid_remote_names_survive_into_our_requests() -> None:
    # RFC 4475 3.1.1.2 allows NUL, BEL and DEL as quoted-pairs in a display name
    uas = make_uas()
    odd = INVITE.replace(b"From: Alice", b'From: "BEL:\\\x07 NUL:\\\x00 \\"q\\""')
    dialog = confirmed_call(uas, data=odd)
    uas.bye(dialog, 1.0)
    bye = only_request(uas)
    assert bye.to.display == 'BEL:\x07 NUL:\x00 "q"' and bye.to.tag == "1928301774"


def test_bye_while_a_reinvite_is_pending() -> None:
    uas = make_uas()
    dialog = confirmed_call(uas)
    uas.receive(reinvite(dialog.local_tag, 314160, "z9hG4bKre1"), PHONE, 5.0)
    uas.outgoing()
    bye = msg("BYE", branch="z9hG4bKbye", cseq=314161, to_tag=dialog.local_tag)
    assert uas.receive(bye, PHONE, 5.1) == [CallEnded(dialog, "remote_bye")]
    ok, terminated = responses(uas)
    assert (ok.status, ok.cseq[1]) == (200, "BYE")
    assert (terminated.status, terminated.cseq) == (487, (314160, "INVITE"))  # 15.1.2


# --------------------------------------------------------------------------- addressing


@pytest.mark.parametrize(
    ("via", "source", "expected_via", "destination"),
    [
        # RFC 3581: rport -> the source address, received and rport filled in
        (
            "SIP/2.0/UDP 10.0.0.7:5062;branch=z9hG4bKa;rport",
            ("203.0.113.9", 40000),
            "SIP/2.0/UDP 10.0.0.7:5062;branch=z9hG4bKa;rport=40000;received=203.0.113.9",
            ("203.0.113.9", 40000),
        ),
        # RFC 3581 4: received even when sent-by is the source's address
        (
            "SIP/2.0/UDP 198.51.100.4;rport;branch=z9hG4bKb",
            ("198.51.100.4", 5060),
            "SIP/2.0/UDP 198.51.100.4;rport=5060;branch=z9hG4bKb;received=198.51.100.4",
            ("198.51.100.4", 5060),
        ),
        # 18.2.2: no rport, sent-by is the source IP: to the sent-by port, not the source's;
        # received is set on every request answered (issue 29), equal or not
        (
            "SIP/2.0/UDP 198.51.100.4:5070;branch=z9hG4bKc",
            ("198.51.100.4", 33333),
            "SIP/2.0/UDP 198.51.100.4:5070;branch=z9hG4bKc;received=198.51.100.4",
            ("198.51.100.4", 5070),
        ),
        # 18.2.1: sent-by is another address: received, and the sent-by port
        (
            "SIP/2.0/UDP 10.0.0.7:5062;branch=z9hG4bKd",
            ("203.0.113.9", 40000),
            "SIP/2.0/UDP 10.0.0.7:5062;branch=z9hG4bKd;received=203.0.113.9",
            ("203.0.113.9", 5062),
        ),
        # a domain name: received, never DNS; default port 5060
        (
            "SIP/2.0/UDP sbc.carrier.example.net;branch=z9hG4bKe",
            ("198.51.100.77", 5060),
            "SIP/2.0/UDP sbc.carrier.example.net;branch=z9hG4bKe;received=198.51.100.77",
            ("198.51.100.77", 5060),
        ),
        (
            "SIP/2.0/UDP [2001:db8::7]:5062;branch=z9hG4bKf;rport",
            ("2001:db8::7", 41000),
            "SIP/2.0/UDP [2001:db8::7]:5062;branch=z9hG4bKf;rport=41000;received=2001:db8::7",
            ("2001:db8::7", 41000),
        ),
    ],
)
def test_received_rport_and_response_destinations(
    via: str, source: tuple[str, int], expected_via: str, destination: tuple[str, int]
) -> None:
    uas = make_uas()
    uas.receive(msg("OPTIONS", branch="unused", cseq=1, via=via), source, 0.0)
    [(data, sent_to)] = uas.outgoing()
    response = parse_message(data)
    assert isinstance(response, SipResponse) and response.status == 200
    assert response.headers.get("Via") == expected_via
    assert sent_to == destination
    assert response_destination(parse_via(expected_via), source) == destination


VICTIM = "198.51.100.99"  # an address a request names but never sent from


@pytest.mark.parametrize(
    ("via", "expected_via", "destination"),
    [
        # the found case (issue 29): sent-by is the source's IP, no rport, the client's
        # own received names a victim: the core writes the true received, and the
        # response goes to the source's IP at the sent-by port
        (
            f"SIP/2.0/UDP 203.0.113.9:5062;branch=z9hG4bKv1;received={VICTIM}",
            "SIP/2.0/UDP 203.0.113.9:5062;branch=z9hG4bKv1;received=203.0.113.9",
            ("203.0.113.9", 5062),
        ),
        # rport with the client's own value and received: both replaced by the source's
        (
            f"SIP/2.0/UDP 10.0.0.7:5062;branch=z9hG4bKv2;rport=9;received={VICTIM}",
            "SIP/2.0/UDP 10.0.0.7:5062;branch=z9hG4bKv2;rport=40000;received=203.0.113.9",
            PHONE,
        ),
        # received before rport, twice, in another case: every one of the client's goes
        (
            f"SIP/2.0/UDP 10.0.0.7:5062;RECEIVED={VICTIM};branch=z9hG4bKv3;received=10.9.9.9"
            ";rport=7;rport",
            "SIP/2.0/UDP 10.0.0.7:5062;branch=z9hG4bKv3;rport=40000;received=203.0.113.9",
            PHONE,
        ),
        # maddr is never a destination (kept in the echo: it is the client's Via)
        (
            f"SIP/2.0/UDP 203.0.113.9;branch=z9hG4bKv4;maddr={VICTIM};ttl=1",
            f"SIP/2.0/UDP 203.0.113.9;branch=z9hG4bKv4;maddr={VICTIM};ttl=1;received=203.0.113.9",
            ("203.0.113.9", 5060),
        ),
        # an IPv6 received from the client, an IPv4 source
        (
            "SIP/2.0/UDP 203.0.113.9:5062;branch=z9hG4bKv5;received=[2001:db8::9]",
            "SIP/2.0/UDP 203.0.113.9:5062;branch=z9hG4bKv5;received=203.0.113.9",
            ("203.0.113.9", 5062),
        ),
    ],
)
def test_client_supplied_received_rport_and_maddr_are_never_a_destination(
    via: str, expected_via: str, destination: tuple[str, int]
) -> None:
    uas = make_uas()
    uas.receive(msg("OPTIONS", branch="unused", cseq=1, via=via), PHONE, 0.0)
    [(data, sent_to)] = uas.outgoing()
    assert data.startswith(b"SIP/2.0 200 OK\r\n")
    assert f"\r\nVia: {expected_via}\r\n".encode() in data
    assert sent_to == destination
    # the helper alone, given the client's Via as it came: never the named address
    assert response_destination(parse_via(via), PHONE)[0] == PHONE[0]


@pytest.mark.parametrize("answered", [False, True])
def test_a_404_and_its_retransmissions_go_to_the_source_not_the_named_address(
    answered: bool,
) -> None:
    """The found amplification: an INVITE naming a victim in received, refused with a
    final response that is retransmitted until the ACK (17.2.1 timer G); or answered, the
    2xx retransmitted by the core until the ACK (13.3.1.4), then the BYE of its timeout."""
    uas = make_uas()
    via = f"SIP/2.0/UDP 203.0.113.9:5062;branch=z9hG4bKamp;received={VICTIM}"
    invite = INVITE.replace(
        b"Via: SIP/2.0/UDP 10.0.0.7:5062;branch=z9hG4bK776asdhds;rport", f"Via: {via}".encode()
    )
    [call] = uas.receive(invite, PHONE, 0.0)
    assert isinstance(call, IncomingCall)
    if answered:
        uas.answer(call.dialog, ANSWER, 0.0)
    else:
        uas.reject(call.dialog, 404, "Not Found", now=0.0)
    destinations = [d for _, d in uas.outgoing()]
    for _, _, datagrams in fire_all(uas, TIMEOUT + 1):
        destinations += [d for _, d in datagrams]
    assert len(destinations) >= 2 + 5  # 100, the final response and its retransmissions
    if answered:  # the 2xx along the Via; the BYE of ack_timeout along the flow (12.2.1.1)
        assert set(destinations) == {("203.0.113.9", 5062), PHONE}
    else:
        assert set(destinations) == {("203.0.113.9", 5062)}


@pytest.mark.parametrize(
    "via",
    [
        f"SIP/2.0/UDP 203.0.113.9:5062;branch=z9hG4bKr1;received={VICTIM}",
        f"SIP/2.0/UDP 10.0.0.7:5062;branch=z9hG4bKr2;rport=9;received={VICTIM}",
        f"SIP/2.0/UDP {VICTIM}:5060;branch=z9hG4bKr3;maddr={VICTIM}",
        "SIP/2.0/UDP 203.0.113.9:5070;branch=z9hG4bKr4",
    ],
)
def test_a_stateless_refusal_goes_to_the_packet_source_only(via: str) -> None:
    uas = make_uas()
    uas.refuse(msg("INVITE", branch="unused", cseq=1, via=via), PHONE, 403, "Forbidden")
    [(data, destination)] = uas.outgoing()
    assert data.startswith(b"SIP/2.0 403 Forbidden\r\n")
    assert destination == PHONE  # address and port: nothing the Via says
    top = data.split(b"\r\nVia: ", 1)[1].split(b"\r\n", 1)[0].decode()
    assert parse_via(top).received == PHONE[0] and top.lower().count(";received=") == 1
    assert uas.transaction_count == 0 and uas.dialog_count == 0


def test_an_unparseable_request_naming_a_victim_is_answered_at_the_source() -> None:
    uas = make_uas()
    via = f"SIP/2.0/UDP 203.0.113.9:5062;branch=z9hG4bKbad;received={VICTIM}"
    bad = msg("OPTIONS", branch="unused", cseq=1, via=via).replace(
        b"CSeq: 1 OPTIONS", b"CSeq: x OPTIONS"
    )
    uas.receive(bad, PHONE, 0.0)
    [(data, destination)] = uas.outgoing()
    assert data.startswith(b"SIP/2.0 400 ") and destination == ("203.0.113.9", 5062)
    assert b";received=203.0.113.9\r\n" in data and VICTIM.encode() not in data


def test_response_destination_without_annotation() -> None:
    # the helper on its own: a name and no received -> the source (never DNS)
    assert response_destination(parse_via("SIP/2.0/UDP host.example;branch=z9hG4bKx"),
                                ("198.51.100.1", 7000)) == ("198.51.100.1", 7000)  # fmt: skip


def test_in_dialog_requests_go_to_the_flow_not_the_contact() -> None:
    # Alice's INVITE came through an SBC at 198.51.100.20 (no rport, a Via of its own)
    uas = make_uas()
    via = "SIP/2.0/UDP 198.51.100.20:5060;branch=z9hG4bKsbc1"
    invite = INVITE.replace(
        b"Via: SIP/2.0/UDP 10.0.0.7:5062;branch=z9hG4bK776asdhds;rport", f"Via: {via}".encode()
    )
    sbc = ("198.51.100.20", 5060)
    [call] = uas.receive(invite, sbc, 0.0)
    assert isinstance(call, IncomingCall)
    assert [d for _, d in uas.outgoing()] == [sbc]
    uas.answer(call.dialog, ANSWER, 0.0)
    uas.receive(ack(call.dialog.local_tag), sbc, 0.1)
    uas.outgoing()
    uas.bye(call.dialog, 1.0)
    [(data, destination)] = uas.outgoing()
    assert destination == sbc
    assert data.startswith(b"BYE sip:alice@10.0.0.7:5062 SIP/2.0\r\n")


RECORD_ROUTED = INVITE.replace(
    b"Max-Forwards: 70\r\n",
    b"Max-Forwards: 70\r\n"
    b"Record-Route: <sip:sbc1.carrier.example.net;lr>,<sip:p2.carrier.example.net;lr;ftag=1>\r\n"
    b"Record-Route: <sip:p3.carrier.example.net;lr>\r\n",
)


def test_record_route_copied_and_used_as_route() -> None:
    uas = make_uas()
    call = incoming(uas, RECORD_ROUTED)
    uas.ring(call.dialog)
    uas.answer(call.dialog, ANSWER, 0.0)
    ringing, ok = responses(uas)
    for response in (ringing, ok):  # 12.1.1: copied into 18x and 2xx, as received
        assert response.headers.raw("Record-Route") == [
            "<sip:sbc1.carrier.example.net;lr>,<sip:p2.carrier.example.net;lr;ftag=1>",
            "<sip:p3.carrier.example.net;lr>",
        ]
    uas.receive(ack(call.dialog.local_tag), PHONE, 0.1)
    uas.bye(call.dialog, 1.0)
    bye = only_request(uas)
    # 12.1.1 UAS: the route set is the Record-Route list in order; 12.2.1.1 loose routing
    assert bye.uri == "sip:alice@10.0.0.7:5062"
    assert bye.headers.get_all("Route") == [
        "<sip:sbc1.carrier.example.net;lr>",
        "<sip:p2.carrier.example.net;lr;ftag=1>",
        "<sip:p3.carrier.example.net;lr>",
    ]
    assert bye.headers.raw("Route") == bye.headers.get_all("Route")  # one field per route


def test_strict_route_becomes_the_request_uri() -> None:
    uas = make_uas()
    strict = INVITE.replace(
        b"Max-Forwards: 70\r\n",
        b"Max-Forwards: 70\r\nRecord-Route: <sip:strict.example.net;method=INVITE>, "
        b"<sip:p2.example.net;lr>\r\n",
    )
    dialog = confirmed_call(uas, data=strict)
    uas.bye(dialog, 1.0)
    bye = only_request(uas)
    assert bye.uri == "sip:strict.example.net"  # 12.2.1.1, stripped of ``method``
    assert bye.headers.get_all("Route") == [
        "<sip:p2.example.net;lr>",
        "<sip:alice@10.0.0.7:5062>",
    ]


# --------------------------------------------------------------------------- limits


def test_refuse_answers_statelessly() -> None:
    uas = make_uas()
    uas.refuse(INVITE, PHONE, 403, "Forbidden")
    [(data, destination)] = uas.outgoing()
    forbidden = parse_message(data)
    assert isinstance(forbidden, SipResponse) and destination == PHONE
    assert (forbidden.status, forbidden.reason) == (403, "Forbidden")
    assert forbidden.headers.get("Via") == VIA_OUT
    assert forbidden.to.tag is not None
    assert uas.dialog_count == 0 and uas.transaction_count == 0 and uas.next_timer() is None
    uas.refuse(INVITE, PHONE, 503, "Service Unavailable", [("Retry-After", "5")])
    [again] = responses(uas)
    assert again.status == 503 and again.headers.get("Retry-After") == "5"
    for quiet in (ack("x"), b"garbage", b"\r\n\r\n", reply_to(forbidden_as_request(), 200)):
        uas.refuse(quiet, PHONE, 403, "Forbidden")
    assert uas.outgoing() == [] and uas.dropped == 3
    assert uas.responses_sent[403] == 1 and uas.responses_sent[503] == 1
    with pytest.raises(SipUsageError):
        uas.refuse(INVITE, PHONE, 200, "OK")


def forbidden_as_request() -> SipRequest:
    request = parse_message(INVITE)
    assert isinstance(request, SipRequest)
    return request


def test_max_dialogs_gives_503_with_retry_after() -> None:
    uas = make_uas(max_dialogs=1, retry_after_s=7)
    incoming(uas)
    second = INVITE.replace(b"z9hG4bK776asdhds", b"z9hG4bKsecond").replace(
        CALL_ID.encode(), b"second-call@pc33"
    )
    assert uas.receive(second, PHONE, 0.1) == []
    [unavailable] = responses(uas)
    assert (unavailable.status, unavailable.headers.get("Retry-After")) == (503, "7")
    assert uas.dialog_count == 1
    absorbed = msg(
        "ACK", branch="z9hG4bKsecond", cseq=314159, call_id="second-call@pc33",
        to_tag=unavailable.to.tag,
    )  # fmt: skip
    assert uas.receive(absorbed, PHONE, 0.2) == [] and uas.dropped == 0


def test_transaction_limit() -> None:
    uas = make_uas(max_transactions=2)
    dialog = confirmed_call(uas)  # the INVITE transaction is one (Accepted, timer L)
    uas.receive(msg("OPTIONS", branch="z9hG4bKo1", cseq=1, call_id="o1"), PHONE, 1.0)
    assert statuses(uas) == [200]
    uas.receive(msg("OPTIONS", branch="z9hG4bKo2", cseq=1, call_id="o2"), PHONE, 1.0)
    [busy] = responses(uas)
    assert (busy.status, busy.headers.get("Retry-After")) == (503, "5")
    # a BYE for a dialog we hold is still served
    bye = msg("BYE", branch="z9hG4bKbye", cseq=314160, to_tag=dialog.local_tag)
    assert uas.receive(bye, PHONE, 1.1) == [CallEnded(dialog, "remote_bye")]
    assert statuses(uas) == [200]


def test_no_answer_limit() -> None:
    uas = make_uas(max_ringing_s=60)
    call = incoming(uas)
    assert uas.next_timer() == 60.0
    assert uas.on_timer(60.0) == [CallEnded(call.dialog, "no_answer")]
    [unavailable] = responses(uas)
    assert (unavailable.status, unavailable.to.tag) == (480, call.dialog.local_tag)
    assert uas.dialog_count == 0


# --------------------------------------------------------------------------- REFER, NOTIFY


def test_refer_and_its_result() -> None:
    uas = make_uas()
    dialog = confirmed_call(uas)
    uas.refer(dialog, "sip:agent@192.0.2.50", 2.0)
    refer = only_request(uas)
    assert refer.method == "REFER" and refer.headers.get("Refer-To") == "<sip:agent@192.0.2.50>"
    assert refer.headers.get("Contact") == "<sip:192.0.2.1:5060>"
    with pytest.raises(SipUsageError) as info:
        uas.refer(dialog, "sip:other@192.0.2.51", 2.1)
    assert info.value.code is UsageErrorCode.REFER_PENDING
    trying = reply_to(refer, 100, "Trying")
    assert uas.receive(trying, PHONE, 2.1) == []
    assert uas.receive(reply_to(refer, 202, "Accepted"), PHONE, 2.2) == [ReferResult(dialog, 202)]
    notify = msg(
        "NOTIFY",
        branch="z9hG4bKn1",
        cseq=314160,
        to_tag=dialog.local_tag,
        extra="Event: refer\nSubscription-State: terminated;reason=noresource\n"
        "Content-Type: message/sipfrag;version=2.0\n",
        body=b"SIP/2.0 200 OK\r\n",
    )
    assert uas.receive(notify, PHONE, 3.0) == []
    assert statuses(uas) == [200]
    uas.refer(dialog, "<sip:second@192.0.2.52>", 4.0)  # the first one is over
    assert only_request(uas).headers.get("Refer-To") == "<sip:second@192.0.2.52>"


def test_refer_timeout_is_408() -> None:
    uas = make_uas()
    dialog = confirmed_call(uas)
    uas.refer(dialog, "sip:agent@192.0.2.50", 0.0)
    fired = fire_all(uas, 40.0)
    assert [e for _, events, _ in fired for e in events] == [ReferResult(dialog, 408)]


def test_notify_outside_a_dialog_is_481() -> None:
    uas = make_uas()
    uas.receive(msg("NOTIFY", branch="z9hG4bKn", cseq=1, extra="Event: refer\n"), PHONE, 0.0)
    assert statuses(uas) == [481]


# --------------------------------------------------------------------------- intents


def test_bye_before_the_ack_waits_for_it() -> None:
    uas = make_uas()
    call = incoming(uas)
    uas.answer(call.dialog, ANSWER, 0.0)
    uas.outgoing()
    uas.bye(call.dialog, 0.2)  # 15: no BYE until the ACK (or its timeout)
    assert uas.take_events() == [CallEnded(call.dialog, "local_bye")]
    assert uas.outgoing() == []
    assert uas.dialog_state(call.dialog) is DialogState.CLOSING
    uas.on_timer(0.5)
    assert statuses(uas) == [200]  # the 2xx is still retransmitted
    assert uas.receive(ack(call.dialog.local_tag), PHONE, 0.6) == []  # no CallConfirmed
    assert only_request(uas).method == "BYE"
    assert uas.dialog_count == 0


def test_bye_before_the_ack_and_no_ack_ever() -> None:
    uas = make_uas()
    call = incoming(uas)
    uas.answer(call.dialog, ANSWER, 0.0)
    uas.bye(call.dialog, 0.2)
    uas.take_events()
    fired = fire_all(uas, TIMEOUT)
    assert [e for _, events, _ in fired for e in events] == []  # CallEnded came already
    last = fired[-1][2]
    assert [m.method for m, _ in last if isinstance(m, SipRequest)] == ["BYE"]


def test_usage_errors() -> None:
    uas = make_uas()
    call = incoming(uas)
    with pytest.raises(SipUsageError) as info:
        uas.bye(call.dialog, 0.0)  # 15: reject an unanswered call, never BYE it
    assert info.value.code is UsageErrorCode.ILLEGAL_STATE
    with pytest.raises(SipUsageError):
        uas.refer(call.dialog, "sip:x@y", 0.0)
    with pytest.raises(SipUsageError):
        uas.answer_reinvite(call.dialog, ANSWER, 0.0)
    for status in (200, 180, 99):
        with pytest.raises(SipUsageError) as info:
            uas.reject(call.dialog, status, "No")
        assert info.value.code is UsageErrorCode.BAD_STATUS
    with pytest.raises(SipUsageError) as info:
        uas.reject(call.dialog, 503, "Busy", [("Retry-After", "5\r\nX: injected")])
    assert info.value.code is UsageErrorCode.BAD_HEADER
    uas.answer(call.dialog, ANSWER, 0.0)
    attempts: list[Callable[[], None]] = [
        lambda: uas.answer(call.dialog, ANSWER, 0.0),
        lambda: uas.reject(call.dialog, 486, "Busy Here"),
        lambda: uas.ring(call.dialog),
    ]
    for attempt in attempts:
        with pytest.raises(SipUsageError) as info:
            attempt()
        assert info.value.code is UsageErrorCode.ILLEGAL_STATE
    with pytest.raises(SipUsageError) as info:
        uas.refer(call.dialog, "<not a uri", 0.0)
    assert info.value.code is UsageErrorCode.BAD_ARGUMENT
    unknown = DialogId("nope", "a", "b")
    uas.bye(unknown, 0.0)  # ending what is already over (or never was) is no error
    uas.reject(unknown, 486, "Busy Here")
    gone_attempts: list[Callable[[], None]] = [
        lambda: uas.answer(unknown, ANSWER, 0.0),
        lambda: uas.answer_reinvite(unknown, ANSWER, 0.0),
        lambda: uas.reject_reinvite(unknown, 488, "No"),
        lambda: uas.refer(unknown, "sip:x@y", 0.0),
    ]
    for gone in gone_attempts:
        with pytest.raises(SipUsageError) as info:
            gone()
        assert info.value.code is UsageErrorCode.DIALOG_GONE
    assert [status for status in uas.responses_sent] == [100, 200]


def test_intents_after_the_remote_end_hung_up_are_harmless() -> None:
    uas = make_uas()
    dialog = confirmed_call(uas)
    uas.receive(msg("BYE", branch="z9hG4bKbye", cseq=314160, to_tag=dialog.local_tag), PHONE, 1)
    uas.outgoing()
    uas.bye(dialog, 2.0)  # the gateway's teardown races the caller's BYE
    assert uas.outgoing() == [] and uas.take_events() == []


def test_bad_constructor_arguments() -> None:
    for kwargs in (
        {"max_dialogs": 0},
        {"t1": 0.0},
        {"t1": 5.0, "t2": 4.0},
        {"port": 0},
        {"host": "bad host"},
        {"user_agent": "a\r\nb"},
    ):
        with pytest.raises(ValueError):
            SipUas(**{"host": "192.0.2.1", "port": 5060, **kwargs})  # type: ignore[arg-type]


# --------------------------------------------------------------------------- RFC 2543 peers


def test_rfc2543_peer_without_magic_cookie() -> None:
    uas = make_uas()
    old = INVITE.replace(b"branch=z9hG4bK776asdhds", b"branch=390skdjuw")
    call = incoming(uas, old)
    assert uas.receive(old, PHONE, 0.2) == []  # retransmission matched without the cookie
    assert statuses(uas) == [100]
    uas.reject(call.dialog, 603, "Decline", now=0.3)
    assert statuses(uas) == [603]
    old_ack = msg(
        "ACK",
        branch="x",
        cseq=314159,
        to_tag=call.dialog.local_tag,
        via="SIP/2.0/UDP 10.0.0.7:5062;branch=390skdjuw;rport",
    )
    assert uas.receive(old_ack, PHONE, 0.4) == [] and uas.dropped == 0


# --------------------------------------------------------------------------- tables


def test_dialog_table_and_application_triggers() -> None:
    # every state but TERMINATED has an exit; application intents are only where listed
    states = {state for state, _ in DIALOG_TRANSITIONS}
    assert states == set(DialogState) - {DialogState.TERMINATED}
    answer_from = {s for (s, t) in DIALOG_TRANSITIONS if t is DialogTrigger.ANSWER}
    assert answer_from == {DialogState.EARLY}
    bye_from = {s for (s, t) in DIALOG_TRANSITIONS if t is DialogTrigger.BYE}
    assert DialogState.EARLY not in bye_from


# --------------------------------------------------------------------------- robustness

SEEDS = [
    INVITE,
    RECORD_ROUTED,
    cancel(),
    ack("t"),
    msg("BYE", branch="z9hG4bKb", cseq=2),
    # a Via naming another address every way a client can (issue 29)
    msg(
        "OPTIONS",
        branch="unused",
        cseq=3,
        via=f"SIP/2.0/UDP 203.0.113.9:5062;received={VICTIM};branch=z9hG4bKo;maddr={VICTIM}",
    ),
    INVITE.replace(b";rport\r\n", f";rport=9;received={VICTIM}\r\n".encode(), 1),
]


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    seed=st.sampled_from(SEEDS),
    cuts=st.lists(st.tuples(st.integers(0, 700), st.binary(max_size=6)), max_size=4),
)
def test_damaged_datagrams_never_raise(seed: bytes, cuts: list[tuple[int, bytes]]) -> None:
    uas = make_uas()
    data = bytearray(seed)
    for position, insert in cuts:
        position = min(position, len(data))
        data[position : position + len(insert)] = insert
    uas.receive(bytes(data), PHONE, 0.0)
    for payload, destination in uas.outgoing():
        # answers only, to the source, or to its IP at the Via's port when a damaged Via
        # no longer asks for rport (18.2.2)
        assert payload.startswith(b"SIP/2.0 ") and destination[0] == PHONE[0]
    fire_all(uas, 1000.0)


_HOSTILE_VALUES = st.sampled_from(
    [
        None,
        VICTIM,
        "127.0.0.9",
        "[2001:db8::9]",
        "2001:db8::9",
        "224.0.0.1",
        "victim.example.net",
        "0",
        "9",
        "65535",
        "99999",
        "-1",
        '"198.51.100.99"',
        "203.0.113.9",
    ]
)
_VIA_PARAM = st.tuples(
    st.sampled_from(["received", "rport", "maddr", "RECEIVED", "Rport", "ttl", "x"]),
    _HOSTILE_VALUES,
)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    host=st.sampled_from(["203.0.113.9", VICTIM, "10.0.0.7", "[2001:db8::9]", "pbx.example"]),
    port=st.sampled_from(["", ":5062", ":9", ":65535"]),
    params=st.lists(_VIA_PARAM, max_size=5),
    method=st.sampled_from(["INVITE", "OPTIONS", "BYE", "SUBSCRIBE", "FOO"]),
    refused=st.booleans(),
    damage=st.booleans(),
)
def test_client_supplied_via_addresses_never_steer_a_response(
    host: str,
    port: str,
    params: list[tuple[str, str | None]],
    method: str,
    refused: bool,
    damage: bool,
) -> None:
    """Whatever received/rport/maddr values a client writes, wherever in the Via: every
    response goes to the packet's source IP (with rport, or refused statelessly, to its
    port too), and its top Via carries exactly one received: the source's."""
    uas = make_uas()
    text = "".join(f";{name}" if value is None else f";{name}={value}" for name, value in params)
    via = f"SIP/2.0/UDP {host}{port};branch=z9hG4bKfz{text}"
    data = msg(method, branch="unused", cseq=1, via=via)
    if damage:  # a request the parser answers statelessly (400 Bad CSeq)
        data = data.replace(b"CSeq: 1 ", b"CSeq: x ")
    if refused:
        uas.refuse(data, PHONE, 403, "Forbidden")
    else:
        uas.receive(data, PHONE, 0.0)
    out = uas.outgoing()
    while (deadline := uas.next_timer()) is not None and deadline <= 1000.0:
        uas.on_timer(deadline)  # retransmissions, the 480 of an unanswered INVITE
        out += uas.outgoing()
    try:
        top: Via | None = parse_via(via)
    except SipParseError:
        top = None
    for payload, destination in out:
        assert payload.startswith(b"SIP/2.0 ")
        assert destination[0] == PHONE[0], (via, destination)
        if refused or (top is not None and top.has_param("rport")):
            assert destination == PHONE, (via, destination)
        echoed = payload.split(b"\r\nVia: ", 1)[1].split(b"\r\n", 1)[0].decode()
        echoed_top = parse_via(split_list(echoed)[0])
        received = [v for k, v in echoed_top.params if k.lower() == "received"]
        assert received == [PHONE[0]], echoed
