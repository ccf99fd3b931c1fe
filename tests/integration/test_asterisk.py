"""Asterisk chan_websocket leg (``GET /v1/asterisk``) end to end: a simulated Asterisk
peer (``telephony_peers.AsteriskPeer``), the real gateway and engine, attached IVR apps.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from telephony.codecs import g711
from tests.integration import caller_audio
from tests.integration.conftest import Connect
from tests.integration.harness import GatewayProcess
from tests.integration.telephony_peers import (
    ASTERISK_MAX_MESSAGE_BYTES,
    AsteriskPeer,
    ControlFormat,
    attach,
    event_time,
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

AsteriskConnect = Callable[..., Awaitable[AsteriskPeer]]


@pytest.fixture(scope="module")
def speech() -> npt.NDArray[np.int16]:
    return caller_audio.espeak_speech()


@pytest.fixture
async def asterisk(gateway: GatewayProcess) -> AsyncIterator[AsteriskConnect]:
    """Connects Asterisk peers; every peer must end without a protocol violation (no
    message over 65,500 bytes, media in whole frames, only known commands)."""
    peers: list[AsteriskPeer] = []

    async def _connect(
        *,
        query: dict[str, str] | None = None,
        basic_auth: tuple[str, str] | None = None,
        control_format: ControlFormat = "plain-text",
    ) -> AsteriskPeer:
        peer = await AsteriskPeer.connect(
            leg_url(gateway, "asterisk"),
            query=query,
            basic_auth=basic_auth,
            control_format=control_format,
        )
        peers.append(peer)
        return peer

    yield _connect
    for peer in peers:
        await peer.aclose()
    assert [p.violations for p in peers if p.violations] == []


async def start_leg(
    asterisk: AsteriskConnect,
    gateway: GatewayProcess,
    *,
    control_format: ControlFormat = "plain-text",
    **query: str,
) -> AsteriskPeer:
    """A leg past ``MEDIA_START`` and ``ANSWER``."""
    peer = await asterisk(
        query={"access_token": gateway.token(), **query}, control_format=control_format
    )
    await peer.send_media_start()
    await peer.wait_until(lambda: peer.first("ANSWER") is not None, timeout=5)
    return peer


def media_times(peer: AsteriskPeer) -> list[float]:
    return [t for t, _ in peer.media]


def rms(pcm: npt.NDArray[np.int16]) -> float:
    return float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2)))


# --------------------------------------------------------------------------- answer, say


@pytest.mark.realtime  # frame timing: runs alone (Makefile)
async def test_media_start_is_answered_and_say_streams_ulaw(
    asterisk: AsteriskConnect, gateway: GatewayProcess, connect: Connect
) -> None:
    peer = await asterisk(query={"access_token": gateway.token(), "say": PROMPT})
    started = await peer.send_media_start()
    await peer.wait_until(lambda: bool(peer.media), timeout=5)
    assert peer.command_names()[0] == "ANSWER"
    answered = peer.first("ANSWER")
    assert answered is not None and answered[0] <= peer.media[0][0]
    assert peer.media[0][0] - started < 1.0  # spoken at once
    app = await attach(connect, peer.channel_id)
    done = await app.wait_event("utterance_done", utterance_id="say", timeout=15)
    await peer.wait_quiet(0.3)
    await peer.wait_played()
    sizes = [len(m) for _, m in peer.media]
    assert all(s % 160 == 0 and 0 < s <= ASTERISK_MAX_MESSAGE_BYTES for s in sizes), set(sizes)
    assert abs(peer.player.played_ms - done["audio_ms"]) <= 20
    assert done["audio_ms"] > 3000
    assert abs(steady_interval_ms(media_times(peer)) - 20.0) <= 0.5
    assert max_run_ahead_ms([(t, len(m)) for t, m in peer.media]) <= 60 + 15
    assert rms(g711.ulaw_decode(bytes(peer.player.played))) > 300
    assert peer.command_names() == ["ANSWER"]


@pytest.mark.parametrize(
    "codec,frame_bytes,rate",
    [("ulaw", 160, 8000), ("alaw", 160, 8000), ("slin", 320, 8000), ("slin16", 640, 16000)],
)
async def test_each_codec_frames_in_its_optimal_size(
    asterisk: AsteriskConnect, gateway: GatewayProcess, codec: str, frame_bytes: int, rate: int
) -> None:
    peer = await asterisk(query={"access_token": gateway.token(), "say": "Hello there."})
    peer.player.bytes_per_second = rate * (1 if codec in ("ulaw", "alaw") else 2)
    await peer.send_media_start(codec=codec, optimal_frame_size=frame_bytes)
    await peer.wait_until(lambda: bool(peer.media), timeout=5)
    await peer.wait_quiet(0.3)
    assert {len(m) % frame_bytes for _, m in peer.media} == {0}
    audio = b"".join(m for _, m in peer.media)
    if codec == "ulaw":
        pcm = g711.ulaw_decode(audio)
    elif codec == "alaw":
        pcm = g711.alaw_decode(audio)
    else:
        pcm = np.frombuffer(audio, dtype="<i2")
    assert rms(pcm) > 300
    assert 500 < len(pcm) * 1000 / rate < 3000


async def test_prompts_end_in_full_with_another_ptime(
    asterisk: AsteriskConnect, gateway: GatewayProcess, connect: Connect
) -> None:
    peer = await asterisk(query={"access_token": gateway.token()})
    await peer.send_media_start(optimal_frame_size=480, ptime=60)  # 60 ms of ulaw
    app = await attach(connect, peer.channel_id)
    expected = 0
    for n, text in enumerate(["Hello.", "Goodbye.", "Press one."]):
        await app.send(type="speak", text=text, utterance_id=f"p{n}")
        done = await app.wait_event("utterance_done", utterance_id=f"p{n}", timeout=10)
        expected += math.ceil(done["audio_ms"] / 20) * 160
        await peer.wait_quiet(0.3)
        # All of the prompt reached Asterisk (the last frame padded with silence).
        assert sum(len(m) for _, m in peer.media) >= expected, text


# --------------------------------------------------------------------------- barge-in


@pytest.mark.realtime  # barge-in timing: runs alone (Makefile)
async def test_caller_speech_flushes_within_300_ms(
    asterisk: AsteriskConnect,
    gateway: GatewayProcess,
    connect: Connect,
    speech: npt.NDArray[np.int16],
) -> None:
    peer = await start_leg(asterisk, gateway, say=MENU)
    app = await attach(connect, peer.channel_id)
    await app.send(type="mark", name="after-say")
    await peer.wait_until(lambda: bool(peer.media), timeout=5)
    lead_in = 1.0
    start = await peer.stream_audio(
        np.concatenate([caller_audio.silence(lead_in), speech]), until=lambda: bool(peer.flushes)
    )
    await peer.wait_until(lambda: bool(peer.flushes), timeout=5)
    flush_at = peer.flushes[0]
    assert flush_at - (start + lead_in) <= 0.300, flush_at - (start + lead_in)
    assert peer.player.queued_bytes == 0
    await app.wait_event("barge_in", timeout=2)
    mark = await app.wait_event("mark", name="after-say")
    assert mark["cleared"] is True
    await asyncio.sleep(0.5)
    assert [t for t in media_times(peer) if t > flush_at + 0.020] == []
    assert peer.command_names().count("FLUSH_MEDIA") == 1
    assert app.got.of_type("utterance_done") == []


@pytest.mark.realtime  # media within the last 0.2 s: runs alone (Makefile)
async def test_noise_does_not_flush(asterisk: AsteriskConnect, gateway: GatewayProcess) -> None:
    peer = await start_leg(asterisk, gateway, say=MENU[:120])
    await peer.wait_until(lambda: bool(peer.media), timeout=5)
    await peer.stream_audio(
        np.concatenate([caller_audio.white_noise(2.0, rms=1000), caller_audio.dtmf("90*")])
    )
    assert peer.flushes == []
    assert media_times(peer)[-1] > time.monotonic() - 0.2  # still playing


# --------------------------------------------------------------------------- flow control


@pytest.mark.realtime  # frame timing: runs alone (Makefile)
async def test_xoff_pauses_and_xon_resumes_without_losing_audio(
    asterisk: AsteriskConnect, gateway: GatewayProcess, connect: Connect
) -> None:
    peer = await start_leg(asterisk, gateway, say=PROMPT)
    app = await attach(connect, peer.channel_id)
    await peer.wait_until(lambda: len(peer.media) >= 25, timeout=5)  # 0.5 s played
    xoff_at = await peer.send_xoff()
    await asyncio.sleep(1.0)
    paused = [t for t in media_times(peer) if t > xoff_at + 0.050]
    xon_at = await peer.send_xon()
    assert paused == []  # nothing sent while paused
    await peer.wait_until(lambda: media_times(peer)[-1] > xon_at, timeout=2)
    resumed_at = next(t for t in media_times(peer) if t > xon_at)
    assert resumed_at - xon_at < 0.2
    done = await app.wait_event("utterance_done", utterance_id="say", timeout=15)
    await peer.wait_quiet(0.3)
    await peer.wait_played()
    # Nothing was lost: Asterisk played the whole utterance.
    assert abs(peer.player.played_ms - done["audio_ms"]) <= 20
    assert done["audio_ms"] > 3000
    # And after XON the stream was paced again, not burst to catch up.
    after = [(t, len(m)) for t, m in peer.media if t > xon_at]
    assert max_run_ahead_ms(after) <= 60 + 15


# --------------------------------------------------------------------------- attached IVR app


@pytest.mark.parametrize("control_format", ["plain-text", "json"])
async def test_app_drives_the_call(
    asterisk: AsteriskConnect,
    gateway: GatewayProcess,
    connect: Connect,
    control_format: ControlFormat,
) -> None:
    peer = await start_leg(asterisk, gateway, control_format=control_format)
    app = await attach(connect, peer.channel_id)
    assert app.got.of_type("ready")[0]["format"] == "mulaw_8000"
    started = await app.wait_event("call_started")
    assert started["call_id"] == peer.channel_id
    assert started["protocol"] == "asterisk"
    assert "access_token" not in started["custom_parameters"]

    await peer.send_dtmf_end("5")
    assert (await app.wait_event("dtmf"))["digit"] == "5"

    await app.send(type="speak", text="Press one for sales.", utterance_id="p1")
    await app.send(type="mark", name="after-p1")
    done = await app.wait_event("utterance_done", utterance_id="p1", timeout=15)
    mark = await app.wait_event("mark", name="after-p1", timeout=5)
    assert mark["cleared"] is False
    marks = [(t, p) for t, n, p in peer.commands if n == "MARK_MEDIA"]
    assert len(marks) == 1
    correlation_id = marks[0][1]["correlation_id"]
    assert correlation_id and marks[0][0] >= peer.media[-1][0]  # after the prompt's audio
    processed_at = next(t for t, name in peer.marks_processed if name == correlation_id)
    assert event_time(app, mark) >= processed_at  # reported once Asterisk processed it
    await peer.wait_played()
    assert abs(peer.player.played_ms - done["audio_ms"]) <= 20

    await app.send(type="hangup")
    await peer.wait_until(lambda: peer.first("HANGUP") is not None, timeout=5)
    assert await peer.wait_closed() == 1000
    ended = await app.wait_event("call_ended")
    assert ended["call_id"] == peer.channel_id
    assert await app.wait_closed() == 1000
    assert peer.command_names() == ["ANSWER", "MARK_MEDIA", "HANGUP"]


async def test_json_media_start_with_channel_variables(
    asterisk: AsteriskConnect, gateway: GatewayProcess
) -> None:
    peer = await asterisk(
        query={"access_token": gateway.token(), "say": "Hello."}, control_format="json"
    )
    await peer.send_event(
        "MEDIA_START",
        connection_id=peer.connection_id,
        channel=peer.channel,
        channel_id=peer.channel_id,
        format="ulaw",
        optimal_frame_size=160,
        ptime=20,
        channel_variables={"CALLERID(num)": "5550100", "MEDIA_WEBSOCKET_CONNECTION_ID": "x"},
    )
    await peer.wait_until(lambda: bool(peer.media), timeout=5)
    assert peer.command_names()[0] == "ANSWER"


async def test_app_mark_waits_until_asterisk_processed_it(
    asterisk: AsteriskConnect, gateway: GatewayProcess, connect: Connect
) -> None:
    peer = await start_leg(asterisk, gateway)
    app = await attach(connect, peer.channel_id)
    peer.player.stall(True)  # the driver's queue is not moving
    await app.send(type="speak", text="One moment please.", utterance_id="wait")
    await app.send(type="mark", name="after-wait")
    await app.wait_event("utterance_done", utterance_id="wait", timeout=15)
    await peer.wait_until(lambda: peer.first("MARK_MEDIA") is not None, timeout=5)
    await asyncio.sleep(0.3)
    assert app.got.of_type("mark") == []
    peer.player.stall(False)
    mark = await app.wait_event("mark", name="after-wait", timeout=5)
    assert mark["cleared"] is False
    assert event_time(app, mark) >= peer.marks_processed[0][0]


async def test_flush_reports_marks_asterisk_dropped_as_cleared(
    asterisk: AsteriskConnect, gateway: GatewayProcess, connect: Connect
) -> None:
    peer = await start_leg(asterisk, gateway)
    app = await attach(connect, peer.channel_id)
    peer.player.stall(True)
    await app.send(type="speak", text="One.", utterance_id="one")
    await app.send(type="mark", name="held")
    await peer.wait_until(lambda: peer.first("MARK_MEDIA") is not None, timeout=10)
    await app.send(type="clear")
    await app.wait_event("cleared")
    mark = await app.wait_event("mark", name="held", timeout=5)
    assert mark["cleared"] is True
    assert peer.command_names() == ["ANSWER", "MARK_MEDIA", "FLUSH_MEDIA"]
    assert len(peer.marks_flushed) == 1 and peer.marks_processed == []
    # The call goes on: the next prompt and its mark play normally.
    peer.player.stall(False)
    await app.send(type="speak", text="How can I help?", utterance_id="next")
    await app.send(type="mark", name="after-next")
    assert (await app.wait_event("mark", name="after-next", timeout=15))["cleared"] is False


async def test_cleared_marks_are_reported_in_order(
    asterisk: AsteriskConnect, gateway: GatewayProcess, connect: Connect
) -> None:
    peer = await start_leg(asterisk, gateway)
    app = await attach(connect, peer.channel_id)
    peer.player.stall(True)
    await app.send(type="speak", text="One.", utterance_id="one")
    await app.send(type="mark", name="first")  # reaches Asterisk
    await app.send(type="speak", text=MENU, utterance_id="menu")
    await app.send(type="mark", name="second")  # still queued in the gateway
    await peer.wait_until(lambda: peer.first("MARK_MEDIA") is not None, timeout=10)
    await app.wait_event("utterance_started", utterance_id="menu")
    await app.send(type="clear")
    await app.wait_event("mark", name="first", timeout=5)
    await app.wait_event("mark", name="second", timeout=5)
    marks = app.got.of_type("mark")
    assert [(m["name"], m["cleared"]) for m in marks] == [("first", True), ("second", True)]


# --------------------------------------------------------------------------- auth


async def test_auth(asterisk: AsteriskConnect, gateway: GatewayProcess) -> None:
    async def accepted(**kw: Any) -> None:
        peer = await asterisk(**kw)
        await peer.send_media_start()
        await peer.wait_until(lambda: bool(peer.media), timeout=5)
        assert peer.command_names()[0] == "ANSWER"

    async def refused(**kw: Any) -> None:
        peer = await asterisk(**kw)
        assert await peer.wait_closed(5) == 1008
        assert peer.commands == [] and peer.media == []  # before anything else

    token, say = gateway.token(), {"say": "Hello."}
    await asyncio.gather(
        accepted(basic_auth=("asterisk", token), query=say),
        accepted(basic_auth=("any-user", token), query=say),
        accepted(query={"access_token": token, **say}),
        refused(query=say),  # no token
        refused(basic_auth=("asterisk", "not-a-jwt"), query=say),
        refused(basic_auth=("asterisk", gateway.token(ttl_s=-60)), query=say),
        refused(query={"access_token": "not-a-jwt", **say}),
    )


async def test_malformed_basic_header_is_refused(gateway: GatewayProcess) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as http:
        for header in ("Basic !!!not-base64!!!", "Basic " + "bm8tY29sb24=", "Bearer x"):
            ws = await http.ws_connect(
                leg_url(gateway, "asterisk"), headers={"Authorization": header}
            )
            msg = await ws.receive(timeout=5)
            assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
            assert ws.close_code == 1008, header
            await ws.close()


# --------------------------------------------------------------------------- bad input


@pytest.mark.realtime  # frame timing: runs alone (Makefile)
async def test_bad_input_closes_only_that_leg(
    asterisk: AsteriskConnect, gateway: GatewayProcess, connect: Connect
) -> None:
    healthy = await start_leg(asterisk, gateway, say=PROMPT)
    app = await attach(connect, healthy.channel_id)
    await healthy.wait_until(lambda: bool(healthy.media), timeout=5)
    token = gateway.token()

    async def closes(name: str, peer: AsteriskPeer) -> None:
        assert await peer.wait_closed(5) == 1008, name
        assert peer.media == [], name

    async def after_start(
        name: str, message: str | bytes, control_format: ControlFormat = "plain-text"
    ) -> None:
        peer = await start_leg(asterisk, gateway, control_format=control_format)
        await peer.send_raw(message)
        await closes(name, peer)

    async def before_start(name: str, message: str | bytes) -> None:
        peer = await asterisk(query={"access_token": token, "say": PROMPT})
        await peer.send_raw(message)
        await closes(name, peer)
        assert peer.commands == [], name  # never answered

    async def unsupported(codec: str) -> None:
        peer = await asterisk(query={"access_token": token, "say": PROMPT})
        await peer.send_media_start(codec=codec)
        await closes(codec, peer)
        assert peer.commands == [], codec

    dtmf_json = json.dumps({"event": "DTMF_END", "digit": "5"})
    bad_from = time.monotonic()
    await asyncio.gather(
        after_start("not key:value", "DTMF_END digit"),
        after_start("two lines", "MEDIA_XOFF\nMEDIA_XON"),
        after_start("empty", ""),
        after_start("unknown event", "HELLO_WORLD channel_id:1"),
        after_start("json on a plain-text leg", dtmf_json),
        after_start("unknown mark", "MEDIA_MARK_PROCESSED never-sent"),
        after_start("second MEDIA_START", "MEDIA_START connection_id:x channel:y format:ulaw"),
        after_start("invalid JSON", "{not json", "json"),
        after_start("unknown JSON event", json.dumps({"event": "NOPE"}), "json"),
        before_start("media before MEDIA_START", bytes(160)),
        before_start("DTMF before MEDIA_START", "DTMF_END digit:1"),
        unsupported("g722"),
        unsupported("opus"),
    )
    bad_until = time.monotonic() + 0.5
    done = await app.wait_event("utterance_done", utterance_id="say", timeout=15)
    await healthy.wait_quiet(0.3)
    await healthy.wait_played()
    # The healthy call played on: all of its audio, no gap while the others failed,
    # nothing flushed.
    assert abs(healthy.player.played_ms - done["audio_ms"]) <= 20
    arrivals = media_times(healthy)
    assert arrivals[-1] > bad_until
    window = [t for t in arrivals if bad_from - 0.1 <= t <= bad_until]
    assert max(np.diff(window)) < 0.1
    assert healthy.flushes == [] and not healthy.closed.done()


async def test_leg_without_media_start_is_closed(
    asterisk: AsteriskConnect, gateway: GatewayProcess
) -> None:
    peer = await asterisk(query={"access_token": gateway.token()})
    assert await peer.wait_closed(START_TIMEOUT_S + 3) == 1008
