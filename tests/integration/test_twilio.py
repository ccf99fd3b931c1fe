"""Twilio Media Streams leg (``GET /v1/twilio``) end to end: a simulated Twilio peer
(``telephony_peers.TwilioPeer``), the real gateway and engine, attached IVR applications.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import numpy as np
import numpy.typing as npt
import pytest

from gateway.auth import mint_token
from telephony.codecs import g711
from tests.integration import caller_audio
from tests.integration.conftest import Connect
from tests.integration.harness import GatewayProcess
from tests.integration.telephony_peers import (
    TwilioPeer,
    attach,
    event_time,
    first_event,
    leg_url,
    max_run_ahead_ms,
    steady_interval_ms,
)

PROMPT = "Thank you for calling. Your call is important to us. Please stay on the line."
MENU = "Please listen carefully, as our menu options have changed. " * 4
# GATEWAY_START_TIMEOUT_S for this module's gateway: short, so that the tests that wait it
# out (a leg that never starts, an application that stays quiet) take seconds, not tens.
START_TIMEOUT_S = 3
GATEWAY_ENV = {"GATEWAY_START_TIMEOUT_S": str(START_TIMEOUT_S)}  # the conftest's gateway

TwilioConnect = Callable[..., Awaitable[TwilioPeer]]


@pytest.fixture(scope="module")
def speech() -> npt.NDArray[np.int16]:
    return caller_audio.espeak_speech()


@pytest.fixture
async def twilio(gateway: GatewayProcess) -> AsyncIterator[TwilioConnect]:
    """Connects Twilio peers; every peer must end without a protocol violation."""
    peers: list[TwilioPeer] = []

    async def _connect(*, access_token: str | None = None) -> TwilioPeer:
        peer = await TwilioPeer.connect(leg_url(gateway, "twilio"), access_token=access_token)
        peers.append(peer)
        return peer

    yield _connect
    for peer in peers:
        await peer.aclose()
    assert [p.violations for p in peers if p.violations] == []


async def start_call(
    twilio: TwilioConnect, gateway: GatewayProcess, **parameters: str
) -> TwilioPeer:
    peer = await twilio()
    await peer.begin({"token": gateway.token(), **parameters})
    return peer


def media_times(peer: TwilioPeer) -> list[float]:
    return [t for t, _ in peer.media]


# --------------------------------------------------------------------------- say, pacing


@pytest.mark.realtime  # frame timing: runs alone (Makefile)
async def test_say_speaks_at_once_in_real_time(
    twilio: TwilioConnect, gateway: GatewayProcess
) -> None:
    peer = await twilio()
    started = await peer.begin({"token": gateway.token(), "say": PROMPT, "voice": "en-us"})
    await peer.wait_until(lambda: bool(peer.media), timeout=5)
    assert peer.media[0][0] - started < 1.0  # spoken at once
    await peer.wait_quiet(0.5)
    assert {len(audio) for _, audio in peer.media} == {160}  # 20 ms of mu-law each
    assert [m["event"] for _, m in peer.received] == ["media"] * len(peer.media)
    assert len(peer.media) * 20 > 3000
    arrivals = media_times(peer)
    assert abs(steady_interval_ms(arrivals) - 20.0) <= 0.5
    assert max_run_ahead_ms([(t, len(a)) for t, a in peer.media]) <= 60 + 15
    # It is speech, not silence.
    pcm = g711.ulaw_decode(bytes(peer.player.played))
    assert np.sqrt(np.mean(pcm.astype(np.float64) ** 2)) > 300
    await peer.send_stop()
    assert await peer.wait_closed() == 1000


# --------------------------------------------------------------------------- barge-in


@pytest.mark.realtime  # barge-in timing: runs alone (Makefile)
async def test_caller_speech_clears_twilio_within_300_ms(
    twilio: TwilioConnect, gateway: GatewayProcess, speech: npt.NDArray[np.int16]
) -> None:
    peer = await start_call(twilio, gateway, say=MENU)
    await peer.wait_until(lambda: bool(peer.media), timeout=5)
    lead_in = 1.0
    start = await peer.stream_audio(
        np.concatenate([caller_audio.silence(lead_in), speech]), until=lambda: bool(peer.clears)
    )
    await peer.wait_until(lambda: bool(peer.clears), timeout=5)
    clear_at = peer.clears[0]
    assert clear_at - (start + lead_in) <= 0.300, clear_at - (start + lead_in)
    assert peer.player.queued_bytes == 0  # Twilio dropped its buffer
    await asyncio.sleep(0.5)
    assert [t for t in media_times(peer) if t > clear_at + 0.020] == []
    assert len(peer.clears) == 1


@pytest.mark.realtime  # media within the last 0.2 s: runs alone (Makefile)
async def test_noise_and_dtmf_tones_do_not_clear(
    twilio: TwilioConnect, gateway: GatewayProcess
) -> None:
    async def play_over(signal: npt.NDArray[np.int16]) -> TwilioPeer:
        peer = await start_call(twilio, gateway, say=MENU[:120])
        await peer.wait_until(lambda: bool(peer.media), timeout=5)
        await peer.stream_audio(signal)
        # Playback went on throughout: no clear, and media still arriving at the end.
        assert peer.clears == []
        assert media_times(peer)[-1] > time.monotonic() - 0.2
        return peer

    noise, tones = await asyncio.gather(
        play_over(caller_audio.white_noise(3.0, rms=1000)),
        play_over(caller_audio.dtmf("123#", tone_s=0.2)),
    )
    await asyncio.sleep(0.3)
    assert noise.clears == [] and tones.clears == []


# --------------------------------------------------------------------------- auth


async def test_auth_failures_close_1008_before_any_media(
    twilio: TwilioConnect, gateway: GatewayProcess
) -> None:
    other_secret = mint_token(secret="another-secret-0123456789-abcdefghijklmnop", subject="x")

    async def refused(parameters: dict[str, str], access_token: str | None = None) -> None:
        peer = await twilio(access_token=access_token)
        await peer.begin({"say": PROMPT, **parameters})
        assert await peer.wait_closed(5) == 1008
        assert peer.received == []  # closed before any media

    async def accepted(access_token: str) -> None:
        peer = await twilio(access_token=access_token)
        await peer.begin({"say": "Hello."})
        await peer.wait_until(lambda: bool(peer.media), timeout=5)
        await peer.send_stop()
        assert await peer.wait_closed() == 1000

    await asyncio.gather(
        refused({}),  # no token anywhere
        refused({"token": "not-a-jwt"}),
        refused({"token": other_secret}),  # signed with another key
        refused({"token": gateway.token(ttl_s=-60)}),  # expired
        refused({"token": gateway.token(scopes=("tts:admin",))}),  # wrong scope
        refused({}, access_token="not-a-jwt"),  # a bad token in the query string
        refused({}, access_token=gateway.token(ttl_s=-60)),
        accepted(gateway.token()),  # a valid token in the query string
    )


# --------------------------------------------------------------------------- attached IVR app


async def test_attached_app_gets_call_started_and_drives_prompts(
    twilio: TwilioConnect, gateway: GatewayProcess, connect: Connect
) -> None:
    peer = await start_call(twilio, gateway, caller="+15550100", lang="en")
    app = await attach(connect, peer.call_sid)
    ready = app.got.of_type("ready")[0]
    assert ready["format"] == "mulaw_8000" and ready["sample_rate"] == 8000
    started = await app.wait_event("call_started")
    assert started == {
        "type": "call_started",
        "call_id": peer.call_sid,
        "protocol": "twilio",
        "custom_parameters": {"caller": "+15550100", "lang": "en"},  # not the token
    }
    await app.send(type="speak", text="Press one for sales, two for support.", utterance_id="p1")
    await app.send(type="mark", name="after-p1")
    await app.wait_event("utterance_started", utterance_id="p1")
    done = await app.wait_event("utterance_done", utterance_id="p1", timeout=15)
    mark = await app.wait_event("mark", name="after-p1")
    assert mark["cleared"] is False
    # Twilio got the prompt's audio, then the mark; the app heard of the mark only after
    # Twilio sent it back, i.e. after the prompt had played.
    assert abs(len(peer.media) * 20 - done["audio_ms"]) <= 20
    events = [m["event"] for _, m in peer.received]
    assert events == ["media"] * len(peer.media) + ["mark"]
    vendor_mark = peer.events("mark")[0][1]["mark"]["name"]
    echo_at = next(t for t, name, _ in peer.echoed if name == vendor_mark)
    assert event_time(app, mark) >= echo_at
    assert echo_at >= peer.player.played_log[-1][0] + 0.015  # after the last frame played
    assert app.got.types()[:2] == ["ready", "call_started"]
    # The application hangs up: the stream is closed, the application told.
    await app.send(type="hangup")
    assert await peer.wait_closed() == 1000
    ended = await app.wait_event("call_ended")
    assert ended["call_id"] == peer.call_sid
    assert await app.wait_closed() == 1000


async def test_app_mark_waits_for_twilio_to_play_it(
    twilio: TwilioConnect, gateway: GatewayProcess, connect: Connect
) -> None:
    peer = await start_call(twilio, gateway)
    app = await attach(connect, peer.call_sid)
    peer.player.stall(True)  # Twilio's playout is behind: the mark stays in its buffer
    await app.send(type="speak", text="One moment please.", utterance_id="wait")
    await app.send(type="mark", name="after-wait")
    await app.wait_event("utterance_done", utterance_id="wait", timeout=15)
    await peer.wait_until(lambda: bool(peer.events("mark")), timeout=5)
    await asyncio.sleep(0.3)
    assert app.got.of_type("mark") == []  # sent to Twilio, not played yet
    peer.player.stall(False)
    mark = await app.wait_event("mark", name="after-wait", timeout=5)
    assert mark["cleared"] is False
    assert event_time(app, mark) >= peer.echoed[0][0]


@pytest.mark.realtime  # barge-in timing: runs alone (Makefile)
async def test_dtmf_barge_in_and_stop_reach_the_app(
    twilio: TwilioConnect,
    gateway: GatewayProcess,
    connect: Connect,
    speech: npt.NDArray[np.int16],
) -> None:
    peer = await start_call(twilio, gateway)
    app = await attach(connect, peer.call_sid)
    await peer.send_dtmf("1")
    assert (await app.wait_event("dtmf"))["digit"] == "1"
    await peer.send_dtmf("#")
    assert (await app.wait_event("dtmf", count=2))["digit"] == "#"

    await app.send(type="speak", text=MENU, utterance_id="menu")
    await app.send(type="mark", name="after-menu")
    await app.wait_event("utterance_started", utterance_id="menu")
    lead_in = 1.0
    start = await peer.stream_audio(
        np.concatenate([caller_audio.silence(lead_in), speech]), until=lambda: bool(peer.clears)
    )
    barge = await app.wait_event("barge_in", timeout=5)
    assert event_time(app, barge) - (start + lead_in) <= 0.300
    mark = await app.wait_event("mark", name="after-menu")
    assert mark["cleared"] is True
    await peer.wait_until(lambda: bool(peer.clears), timeout=2)
    assert app.got.of_type("utterance_done") == []
    # The call goes on: the next prompt plays in full.
    await asyncio.sleep(0.3)
    before = len(peer.media)
    await app.send(type="speak", text="How can I help?", utterance_id="next")
    done = await app.wait_event("utterance_done", utterance_id="next", timeout=10)
    await peer.wait_quiet(0.3)
    assert abs((len(peer.media) - before) * 20 - done["audio_ms"]) <= 20

    await peer.send_stop()
    ended = await app.wait_event("call_ended")
    assert ended["call_id"] == peer.call_sid and ended["reason"]
    assert await app.wait_closed() == 1000
    assert await peer.wait_closed() == 1000


async def test_app_clear_reports_marks_twilio_dropped_as_cleared(
    twilio: TwilioConnect, gateway: GatewayProcess, connect: Connect
) -> None:
    peer = await start_call(twilio, gateway)
    app = await attach(connect, peer.call_sid)
    peer.player.stall(True)
    await app.send(type="speak", text="One.", utterance_id="one")
    await app.send(type="mark", name="held")
    await peer.wait_until(lambda: bool(peer.events("mark")), timeout=10)
    await app.send(type="clear")
    await app.wait_event("cleared")
    mark = await app.wait_event("mark", name="held", timeout=5)
    assert mark["cleared"] is True
    assert len(peer.clears) == 1
    assert [cleared for _, _, cleared in peer.echoed] == [True]


async def test_cleared_marks_are_reported_in_order(
    twilio: TwilioConnect, gateway: GatewayProcess, connect: Connect
) -> None:
    peer = await start_call(twilio, gateway)
    app = await attach(connect, peer.call_sid)
    peer.player.stall(True)
    await app.send(type="speak", text="One.", utterance_id="one")
    await app.send(type="mark", name="first")  # reaches Twilio
    await app.send(type="speak", text=MENU, utterance_id="menu")
    await app.send(type="mark", name="second")  # still queued in the gateway
    await peer.wait_until(lambda: bool(peer.events("mark")), timeout=10)
    await app.wait_event("utterance_started", utterance_id="menu")
    await app.send(type="clear")
    await app.wait_event("mark", name="first", timeout=5)
    await app.wait_event("mark", name="second", timeout=5)
    marks = app.got.of_type("mark")
    assert [(m["name"], m["cleared"]) for m in marks] == [("first", True), ("second", True)]


async def test_attach_to_unknown_or_foreign_call_is_refused(
    twilio: TwilioConnect, gateway: GatewayProcess, connect: Connect
) -> None:
    peer = await twilio()
    await peer.begin({"token": gateway.token(tenant="acme")})
    owner = await attach(connect, peer.call_sid, gateway.token(tenant="acme"))
    assert (await owner.wait_event("call_started"))["call_id"] == peer.call_sid

    async def refused(call_id: str, token: str) -> None:
        app = await connect(token)
        await app.send(type="start", call=call_id, voice="en-us")
        error = await first_event(app)
        # Another tenant's call looks exactly like a call that does not exist.
        assert error["type"] == "error" and error["code"] == "unknown_call", error
        assert await app.wait_closed() == 1008
        assert app.got.types() == ["error"]

    await asyncio.gather(
        refused("CA" + "f" * 32, gateway.token(tenant="acme")),
        refused(peer.call_sid, gateway.token(tenant="globex")),  # another tenant's call
        refused(peer.call_sid, gateway.token()),  # no tenant claim: tenant = subject
    )


async def test_attach_with_only_the_call_id(
    twilio: TwilioConnect, gateway: GatewayProcess, connect: Connect
) -> None:
    peer = await start_call(twilio, gateway)
    await attach(connect, peer.call_sid)  # the call is registered
    app = await connect()
    await app.send(type="start", call=peer.call_sid)
    assert (await first_event(app))["type"] == "ready"
    await app.wait_event("call_started")


# --------------------------------------------------------------------------- bad input


@pytest.mark.realtime  # frame timing: runs alone (Makefile)
async def test_bad_input_closes_only_that_leg(
    twilio: TwilioConnect, gateway: GatewayProcess, connect: Connect
) -> None:
    healthy = await start_call(twilio, gateway, say=PROMPT)
    app = await attach(connect, healthy.call_sid)
    await healthy.wait_until(lambda: bool(healthy.media), timeout=5)

    async def closes(name: str, peer: TwilioPeer) -> None:
        assert await peer.wait_closed(5) == 1008, name
        assert peer.media == [], name

    async def after_start(name: str, build: Callable[[TwilioPeer], str | bytes]) -> None:
        peer = await twilio()
        await peer.begin({"token": gateway.token()})
        await peer.send_raw(build(peer))
        await closes(name, peer)

    async def wrong_codec() -> None:
        peer = await twilio()
        await peer.send_connected()
        await peer.send_start(
            {"token": gateway.token(), "say": PROMPT},
            media_format={"encoding": "audio/x-l16", "sampleRate": 16000, "channels": 1},
        )
        await closes("wrong codec", peer)

    async def media_before_start() -> None:
        peer = await twilio()
        await peer.send_connected()
        await peer.send_media(bytes(160))
        await closes("media before start", peer)

    async def same_call_twice() -> None:
        peer = await twilio()
        peer.call_sid = healthy.call_sid
        await peer.begin({"token": gateway.token(), "say": PROMPT})
        await closes("a second stream for the same call", peer)

    def bad_base64(peer: TwilioPeer) -> str:
        media = {"track": "inbound", "chunk": "1", "timestamp": "0", "payload": "%%not*base64"}
        return json.dumps(
            {"event": "media", "sequenceNumber": "2", "streamSid": peer.stream_sid, "media": media}
        )

    def unknown_event(peer: TwilioPeer) -> str:
        return json.dumps({"event": "dance", "sequenceNumber": "2", "streamSid": peer.stream_sid})

    bad_from = time.monotonic()
    await asyncio.gather(
        after_start("malformed JSON", lambda _: '{"event": "media", '),
        after_start("not an object", lambda _: "[1, 2]"),
        after_start("unknown event", unknown_event),
        after_start("bad base64", bad_base64),
        after_start("binary frame", lambda _: bytes(160)),
        media_before_start(),
        wrong_codec(),
        same_call_twice(),
    )
    bad_until = time.monotonic() + 0.5
    done = await app.wait_event("utterance_done", utterance_id="say", timeout=15)
    await healthy.wait_quiet(0.3)
    # The healthy call played on: all of its audio, no gap while the others failed,
    # nothing cleared.
    assert abs(len(healthy.media) * 20 - done["audio_ms"]) <= 20
    arrivals = media_times(healthy)
    assert arrivals[-1] > bad_until
    window = [t for t in arrivals if bad_from - 0.1 <= t <= bad_until]
    assert max(np.diff(window)) < 0.1
    assert healthy.clears == [] and not healthy.closed.done()


async def test_leg_without_start_is_closed(twilio: TwilioConnect) -> None:
    peer = await twilio()
    await peer.send_connected()
    assert await peer.wait_closed(START_TIMEOUT_S + 3) == 1008


async def test_attached_app_may_stay_quiet(
    twilio: TwilioConnect, gateway: GatewayProcess, connect: Connect
) -> None:
    peer = await start_call(twilio, gateway)
    app = await attach(connect, peer.call_sid)
    await asyncio.sleep(START_TIMEOUT_S + 1)  # waiting for the caller to press a key
    await peer.send_dtmf("5")
    assert (await app.wait_event("dtmf", timeout=2))["digit"] == "5"
    assert app.got.of_type("error") == []
