"""The trunk gate: who gets in from outside the trusted networks, by digest."""

from __future__ import annotations

import re
from collections.abc import Sequence

import pytest

from gateway.legs.sip import trunks
from gateway.legs.sip.routes import Trunk
from gateway.legs.sip.trunks import FAILURE_WINDOW_S, LINGER_S, MAX_FAILURES, TrunkGate, Verdict
from telephony.sip.digest import DigestAlgorithm, digest_response

HOST = "203.0.113.7"
URI = "sip:ivr@gw.example.com:5060"
TRUNKS = {"acme": Trunk(name="carrier", username="acme", password="pw", tenant="acme")}


def request(
    method: str = "INVITE",
    *,
    call_id: str = "c1@x",
    authorization: str | None = None,
    to_tag: str | None = None,
) -> bytes:
    if to_tag is None and method in ("ACK", "BYE"):
        to_tag = "gw"  # in the dialog
    lines = [
        f"{method} {URI} SIP/2.0",
        "Via: SIP/2.0/UDP 203.0.113.7:5060;branch=z9hG4bK-1",
        "From: <sip:+15551234@carrier.example>;tag=a",
        "To: <sip:ivr@gw.example.com>" + (f";tag={to_tag}" if to_tag else ""),
        f"Call-ID: {call_id}",
        f"CSeq: 1 {method}",
        "Max-Forwards: 70",
    ]
    if authorization is not None:
        lines.append(f"Authorization: {authorization}")
    return ("\r\n".join(lines) + "\r\nContent-Length: 0\r\n\r\n").encode()


def answer(
    challenge: str,
    *,
    password: str = "pw",
    username: str = "acme",
    uri: str = URI,
    method: str = "INVITE",
) -> str:
    """What a UAC sends back: qop=auth, the challenge's nonce and algorithm."""
    nonce = re.search(r'nonce="([^"]+)"', challenge)
    algorithm = re.search(r"algorithm=([A-Z0-9-]+)", challenge)
    assert nonce and algorithm
    alg = DigestAlgorithm(algorithm.group(1))
    response = digest_response(
        algorithm=alg,
        username=username,
        realm="voice-gateway",
        password=password,
        method=method,
        uri=uri,
        nonce=nonce.group(1),
        qop="auth",
        cnonce="abc",
        nc="00000001",
    )
    return (
        f'Digest username="{username}", realm="voice-gateway", nonce="{nonce.group(1)}", '
        f'uri="{uri}", response="{response}", algorithm={alg.value}, qop=auth, '
        f'cnonce="abc", nc=00000001'
    )


def gate(algorithms: Sequence[str] = ("MD5",), max_calls_per_host: int = 4) -> TrunkGate:
    return TrunkGate(
        TRUNKS,
        realm="voice-gateway",
        max_calls=4,
        max_calls_per_host=max_calls_per_host,
        algorithms=algorithms,
    )


def challenge_of(g: TrunkGate, data: bytes, wall: float = 1000.0) -> str:
    admission = g.admit(data, HOST, now=0.0, wall=wall)
    assert admission.verdict is Verdict.CHALLENGE and admission.reason == "challenged"
    ((name, value),) = admission.headers
    assert name == "WWW-Authenticate"
    return value


def test_without_trunks_everything_outside_is_forbidden() -> None:
    g = TrunkGate({}, realm="voice-gateway", max_calls=4)
    assert not g.enabled
    admission = g.admit(request(), HOST, now=0.0, wall=0.0)
    assert (admission.verdict, admission.reason) == (Verdict.FORBID, "untrusted")


@pytest.mark.parametrize("algorithm", ["MD5", "SHA-256"])
def test_an_answered_challenge_lets_the_call_and_its_dialog_in(algorithm: str) -> None:
    g = gate(algorithms=[algorithm])
    challenge = challenge_of(g, request())
    assert f"algorithm={algorithm}" in challenge and 'realm="voice-gateway"' in challenge
    # the ACK of our 401 is dropped quietly (not counted as hostile)
    assert g.admit(request("ACK"), HOST, now=0.5, wall=1000.5).verdict is Verdict.DROP
    admitted = g.admit(request(authorization=answer(challenge)), HOST, now=1.0, wall=1001.0)
    assert (admitted.verdict, admitted.tenant) == (Verdict.ACCEPT, "acme")
    assert g.tenant("c1@x", HOST) == "acme"
    # the rest of the call carries no credentials: in by its Call-ID, from its host only
    for method, tag in (("ACK", None), ("BYE", None), ("CANCEL", None), ("INVITE", "gw")):
        data = request(method, to_tag=tag)
        assert g.admit(data, HOST, now=2.0, wall=1002.0).verdict is Verdict.ACCEPT, method
    assert g.admit(request("BYE"), "198.51.100.1", now=2.0, wall=1002.0).verdict is Verdict.FORBID
    assert g.tenant("c1@x", "198.51.100.1") is None
    response = b"SIP/2.0 200 OK\r\n" + request("BYE").split(b"\r\n", 1)[1]
    assert g.admit(response, HOST, now=2.0, wall=1002.0).verdict is Verdict.ACCEPT


def test_a_known_call_id_does_not_let_a_new_invite_in_without_credentials() -> None:
    g = gate()
    challenge = challenge_of(g, request())
    g.admit(request(authorization=answer(challenge)), HOST, now=0.0, wall=1000.0)
    g.call_started("c1@x", HOST)
    # a new INVITE (no To tag) with the same Call-ID is challenged like any other
    assert g.admit(request(), HOST, now=1.0, wall=1001.0).verdict is Verdict.CHALLENGE
    # its retransmission with the credentials goes in again (same call)
    again = g.admit(request(authorization=answer(challenge)), HOST, now=1.0, wall=1001.0)
    assert again.verdict is Verdict.ACCEPT


def test_calls_are_kept_apart_by_source_host() -> None:
    g = gate()
    challenge = challenge_of(g, request())
    g.admit(request(authorization=answer(challenge)), HOST, now=0.0, wall=1000.0)
    g.call_started("c1@x", HOST)
    other = "198.51.100.1"
    theirs = g.admit(request(), other, now=0.0, wall=1000.0)
    assert theirs.verdict is Verdict.CHALLENGE
    nonce_for_other = theirs.headers[0][1]
    data = request(authorization=answer(nonce_for_other))
    assert g.admit(data, other, now=0.0, wall=1000.0).verdict is Verdict.ACCEPT
    g.call_started("c1@x", other)
    g.call_ended("c1@x", other, now=0.0)  # their call ends: ours lives on
    assert g.admit(request("BYE"), HOST, now=3600.0, wall=0).verdict is Verdict.ACCEPT
    assert g.admit(request("BYE"), other, now=3600.0, wall=0).verdict is Verdict.FORBID


def test_an_authenticated_options_probe_is_answered_and_forgotten() -> None:
    g = gate()
    challenge = challenge_of(g, request("OPTIONS"))
    authorization = answer(challenge, method="OPTIONS")
    admitted = g.admit(request("OPTIONS", authorization=authorization), HOST, now=0, wall=1000)
    assert (admitted.verdict, admitted.tenant) == (Verdict.ACCEPT, "acme")
    assert g.known_calls == 0


def test_guessing_is_cut_off_after_a_few_failures() -> None:
    g = gate()
    challenge = challenge_of(g, request())
    for _ in range(MAX_FAILURES):
        wrong = request(authorization=answer(challenge, password="guess"))
        assert g.admit(wrong, HOST, now=1.0, wall=1001.0).verdict is Verdict.FORBID
    right = request(authorization=answer(challenge))
    blocked = g.admit(right, HOST, now=2.0, wall=1002.0)
    assert (blocked.verdict, blocked.reason) == (Verdict.FORBID, "bad_credentials")
    assert g.admit(right, "198.51.100.1", now=2.0, wall=1002.0).verdict is Verdict.CHALLENGE
    later = g.admit(
        request(authorization=answer(challenge_of(g, request(), wall=1100.0))),
        HOST,
        now=2.0 + FAILURE_WINDOW_S + 1,
        wall=1100.0,
    )
    assert later.verdict is Verdict.ACCEPT


def test_both_algorithms_are_offered_in_the_configured_order() -> None:
    g = gate(algorithms=["SHA-256", "MD5"])
    admission = g.admit(request(), HOST, now=0.0, wall=1000.0)
    assert [v.split("algorithm=")[1][:3] for _n, v in admission.headers] == ["SHA", "MD5"]


def test_a_call_id_lives_while_its_call_does_then_lingers() -> None:
    g = gate()
    challenge = challenge_of(g, request())
    g.admit(request(authorization=answer(challenge)), HOST, now=0.0, wall=1000.0)
    # no call came of it (a 404, a lost ACK): forgotten after LINGER_S
    assert g.admit(request("BYE"), HOST, now=LINGER_S + 1, wall=0).verdict is Verdict.FORBID
    g.admit(request(authorization=answer(challenge)), HOST, now=0.0, wall=1000.0)
    g.call_started("c1@x", HOST)
    assert g.admit(request("BYE"), HOST, now=36000.0, wall=0).verdict is Verdict.ACCEPT
    g.call_ended("c1@x", HOST, now=36000.0)
    assert g.admit(request("BYE"), HOST, now=36000 + LINGER_S - 1, wall=0).verdict is (
        Verdict.ACCEPT
    )
    assert g.admit(request("BYE"), HOST, now=36000 + LINGER_S + 1, wall=0).verdict is (
        Verdict.FORBID
    )


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"password": "wrong"}, "bad_credentials"),
        ({"username": "mallory"}, "bad_credentials"),
        ({"uri": "sip:other@gw.example.com:5060"}, "bad_credentials"),
        ({"uri": "sip:evil.example.com"}, "bad_credentials"),
    ],
)
def test_wrong_credentials_are_forbidden(change: dict[str, str], reason: str) -> None:
    g = gate()
    challenge = challenge_of(g, request())
    admission = g.admit(
        request(authorization=answer(challenge, **change)), HOST, now=0.0, wall=1000.0
    )
    assert (admission.verdict, admission.reason) == (Verdict.FORBID, reason)
    assert g.tenant("c1@x", HOST) is None and g.known_calls == 0


def test_the_domain_uri_that_sipp_hashes_is_accepted() -> None:
    g = gate()
    challenge = challenge_of(g, request())
    authorization = answer(challenge, uri="sip:gw.example.com:5060")
    admission = g.admit(request(authorization=authorization), HOST, now=0.0, wall=1000.0)
    assert admission.verdict is Verdict.ACCEPT


def test_a_nonce_is_good_for_its_host_only_and_goes_stale() -> None:
    g = gate()
    challenge = challenge_of(g, request())
    elsewhere = g.admit(
        request(authorization=answer(challenge)), "198.51.100.1", now=0.0, wall=1000.0
    )
    assert elsewhere.verdict is Verdict.CHALLENGE  # not ours for that host: asked again
    assert g.known_calls == 0
    stale = g.admit(request(authorization=answer(challenge)), HOST, now=0.0, wall=1000.0 + 3600)
    assert stale.verdict is Verdict.CHALLENGE
    assert "stale=true" in stale.headers[0][1]


def test_a_malformed_authorization_is_a_bad_request_and_other_methods_are_forbidden() -> None:
    g = gate()
    bad = g.admit(request(authorization="Digest nonsense"), HOST, now=0.0, wall=1000.0)
    assert (bad.verdict, bad.reason) == (Verdict.BAD_REQUEST, "bad_credentials")
    assert challenge_of(g, request("OPTIONS"))  # keepalive probes are challenged too
    for method in ("BYE", "REGISTER", "SUBSCRIBE"):
        assert g.admit(request(method), HOST, now=0.0, wall=1000.0).verdict is Verdict.FORBID
    assert g.admit(b"garbage", HOST, now=0.0, wall=1000.0).verdict is Verdict.FORBID


def test_remembered_calls_are_bounded() -> None:
    g = gate()  # max_calls=4
    challenge = challenge_of(g, request())
    for n in range(4):
        data = request(call_id=f"c{n}@x", authorization=answer(challenge))
        assert g.admit(data, HOST, now=0.0, wall=1000.0).verdict is Verdict.ACCEPT
        g.call_started(f"c{n}@x", HOST)
    full = g.admit(
        request(call_id="c9@x", authorization=answer(challenge)), HOST, now=0.0, wall=1000.0
    )
    assert (full.verdict, full.reason) == (Verdict.BUSY, "trunk_calls")
    g.call_ended("c0@x", HOST, now=0.0)  # a call ended: its slot frees after the linger
    later = g.admit(
        request(call_id="c9@x", authorization=answer(challenge)),
        HOST,
        now=LINGER_S + 1,
        wall=1010.0,
    )
    assert later.verdict is Verdict.ACCEPT and g.known_calls == 4


def test_one_host_cannot_take_every_remembered_call() -> None:
    g = gate(max_calls_per_host=2)  # and 4 in all
    for host in (HOST, HOST, "198.51.100.1"):
        challenge = challenge_of_host(g, host)
        data = request(call_id=f"{host}-{g.known_calls}", authorization=answer(challenge))
        assert g.admit(data, host, now=0.0, wall=1000.0).verdict is Verdict.ACCEPT
    challenge = challenge_of_host(g, HOST)
    third = g.admit(request(call_id="c9", authorization=answer(challenge)), HOST, now=0, wall=1000)
    assert (third.verdict, third.reason) == (Verdict.BUSY, "trunk_calls")


def challenge_of_host(g: TrunkGate, host: str) -> str:
    admission = g.admit(request(), host, now=0.0, wall=1000.0)
    assert admission.verdict is Verdict.CHALLENGE
    return admission.headers[0][1]


# --------------------------------------------------------------------------- lockout (issue 29)


def forged_authorizations(g: TrunkGate) -> list[str]:
    """What a forger sends in the trunk's name (from HOST) without seeing its 401s."""
    elsewhere = challenge_of_host(g, "198.51.100.66")  # a nonce of ours, for another host
    other_gateway = TrunkGate(TRUNKS, realm="voice-gateway", max_calls=4, algorithms=["MD5"])
    foreign = challenge_of_host(other_gateway, HOST)  # for HOST, from another secret
    wrong_realm = answer(challenge_of_host(g, "198.51.100.67"), password="x").replace(
        'realm="voice-gateway"', 'realm="evil"'
    )
    return [
        # the found cases: a wrong realm and a malformed Authorization
        f'Digest username="acme", realm="evil", nonce="x", uri="{URI}", response="{"0" * 32}"',
        "Digest nonsense",
        'Digest username="acme", realm="voice-gateway"',
        wrong_realm,
        # nonces that are not ours for HOST: made up, another host's, another gateway's
        answer(f'nonce="{"A" * 54}", algorithm=MD5', password="guess"),
        answer(elsewhere, password="guess"),
        answer(foreign, password="guess"),
    ]


def test_five_forged_invites_do_not_lock_the_real_trunk_out() -> None:
    """The found lockout: five INVITEs from the trunk's address with a wrong realm or a
    malformed Authorization locked the trunk out for a minute. Now nothing a forger can
    send without the trunk's challenges counts, however many."""
    g = gate()
    forged = forged_authorizations(g)
    verdicts = set()
    for n in range(4 * MAX_FAILURES):
        data = request(call_id=f"forged{n}", authorization=forged[n % len(forged)])
        verdicts.add(g.admit(data, HOST, now=1.0 + n / 100, wall=1001.0).verdict)
    assert verdicts == {Verdict.BAD_REQUEST, Verdict.CHALLENGE}  # a 400, or asked again
    assert g.failure_entries == 0
    challenge = challenge_of(g, request(), wall=1002.0)
    real = g.admit(request(authorization=answer(challenge)), HOST, now=2.0, wall=1002.0)
    assert (real.verdict, real.tenant) == (Verdict.ACCEPT, "acme")


def test_a_guess_on_an_expired_nonce_counts_nothing_and_says_nothing() -> None:
    g = gate()
    challenge = challenge_of(g, request(), wall=1000.0)
    for password in ["guess"] * (2 * MAX_FAILURES) + ["pw"]:
        old = request(authorization=answer(challenge, password=password))
        stale = g.admit(old, HOST, now=1.0, wall=1000.0 + 301)
        assert stale.verdict is Verdict.CHALLENGE  # right or wrong: the same answer
        assert "stale=true" in stale.headers[0][1]
    assert g.failure_entries == 0


TWO_TRUNKS = {
    **TRUNKS,
    "beta": Trunk(name="beta", username="beta", password="pw2", tenant="beta"),
}


def test_lockout_is_per_username_and_source() -> None:
    g = TrunkGate(TWO_TRUNKS, realm="voice-gateway", max_calls=8, algorithms=["MD5"])
    # an attacker at its own address guessing every name it can think of
    attacker = "198.51.100.1"
    mine = challenge_of_host(g, attacker)
    for user in ("acme", "mallory", "root"):
        for _ in range(MAX_FAILURES):
            guess = request(authorization=answer(mine, username=user, password="guess"))
            assert g.admit(guess, attacker, now=1.0, wall=1001.0).verdict is Verdict.FORBID
    right = request(call_id="a1", authorization=answer(mine))
    locked = g.admit(right, attacker, now=1.5, wall=1001.0)
    assert (locked.verdict, locked.reason) == (Verdict.FORBID, "bad_credentials")
    # the same username from the trunk's own address is not touched
    theirs = challenge_of_host(g, HOST)
    real = g.admit(request(call_id="r1", authorization=answer(theirs)), HOST, now=2, wall=1002)
    assert (real.verdict, real.tenant) == (Verdict.ACCEPT, "acme")
    # nor is another credential from the locked-out address
    beta = answer(mine, username="beta", password="pw2")
    other = g.admit(request(call_id="b1", authorization=beta), attacker, now=2, wall=1002)
    assert (other.verdict, other.tenant) == (Verdict.ACCEPT, "beta")
    # once the window is over, the pair is checked again
    later = challenge_of_host(g, attacker)
    again = request(call_id="a2", authorization=answer(later))
    after = g.admit(again, attacker, now=1.0 + FAILURE_WINDOW_S + 1, wall=1001.0)
    assert after.verdict is Verdict.ACCEPT


def test_a_right_password_clears_the_count() -> None:
    g = gate()
    challenge = challenge_of(g, request())
    wrong = request(authorization=answer(challenge, password="guess"))
    for round_ in range(3):
        for _ in range(MAX_FAILURES - 1):
            assert g.admit(wrong, HOST, now=1.0, wall=1001.0).verdict is Verdict.FORBID
        right = request(call_id=f"ok{round_}", authorization=answer(challenge))
        assert g.admit(right, HOST, now=1.0, wall=1001.0).verdict is Verdict.ACCEPT


def test_the_failure_table_is_bounded_and_flooding_it_frees_no_lockout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(trunks, "MAX_FAILURE_ENTRIES", 4)
    g = TrunkGate(TRUNKS, realm="voice-gateway", max_calls=64, algorithms=["MD5"])
    mine = challenge_of(g, request())
    for _ in range(MAX_FAILURES):
        g.admit(request(authorization=answer(mine, password="guess")), HOST, now=1, wall=1001)
    for n in range(20):  # a new username per guess, to push the locked pair out
        flood = request(authorization=answer(mine, username=f"u{n}", password="guess"))
        assert g.admit(flood, HOST, now=1.0 + n / 100, wall=1001.0).verdict is Verdict.FORBID
        assert g.failure_entries <= 4
    right = g.admit(request(call_id="x", authorization=answer(mine)), HOST, now=2, wall=1002)
    assert (right.verdict, right.reason) == (Verdict.FORBID, "bad_credentials")
