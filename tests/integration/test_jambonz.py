"""jambonz ``listen`` leg (``GET /v1/jambonz``) end to end: a simulated jambonz audio fork
(``audio_fork_peers.JambonzPeer``), the real gateway and engine, an attached IVR app."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import numpy as np
import pytest

from tests.integration import caller_audio
from tests.integration.audio_fork_peers import JambonzPeer, fork_url
from tests.integration.conftest import Connect
from tests.integration.harness import GatewayProcess, NativeClient, metric
from tests.integration.telephony_peers import attach, event_time, max_run_ahead_ms

PROMPT = "Thank you for calling. Your call is important to us. Please stay on the line."
MENU = "Please listen carefully, as our menu options have changed. " * 4
TAIL_MS = 160  # the silence the leg adds after each utterance (jambonz's pre-buffer)

JambonzConnect = Callable[..., Awaitable[JambonzPeer]]


@pytest.fixture
async def jambonz(gateway: GatewayProcess) -> AsyncIterator[JambonzConnect]:
    peers: list[JambonzPeer] = []

    async def _connect(token: str | None = None, **query: str) -> JambonzPeer:
        params = {"access_token": token or gateway.token(), **query}
        peer = await JambonzPeer.connect(fork_url(gateway, "jambonz"), query=params)
        peers.append(peer)
        return peer

    yield _connect
    for peer in peers:
        await peer.aclose()
    assert [p.violations for p in peers if p.violations] == []


async def started(
    jambonz: JambonzConnect, connect: Connect, gateway: GatewayProcess
) -> tuple[JambonzPeer, NativeClient]:
    peer = await jambonz()
    await peer.send_metadata(customField="x")
    app = await attach(lambda token="": connect(gateway.token()), peer.call_sid)
    return peer, app


async def test_the_subprotocol_is_accepted_and_the_call_carries_jambonz_attributes(
    jambonz: JambonzConnect, connect: Connect, gateway: GatewayProcess
) -> None:
    peer, app = await started(jambonz, connect, gateway)
    assert peer.ws.protocol == "audio.jambonz.org"
    call = await app.wait_event("call_started")
    assert call["call_id"] == peer.call_sid and call["protocol"] == "jambonz"
    assert call["custom_parameters"] == {"from": "+15551234567", "to": "+15557654321"}


@pytest.mark.realtime  # frame timing: runs alone (Makefile)
async def test_a_prompt_plays_in_full_paced_and_its_mark_waits_for_playout(
    jambonz: JambonzConnect, connect: Connect, gateway: GatewayProcess
) -> None:
    peer, app = await started(jambonz, connect, gateway)
    await app.send(type="speak", text=PROMPT, utterance_id="p")
    await app.send(type="mark", name="after")
    done = await app.wait_event("utterance_done", utterance_id="p", timeout=20)
    mark = await app.wait_event("mark", timeout=20)
    await peer.wait_played()
    pcm = peer.pcm()
    assert abs(len(pcm) / 8 - (done["audio_ms"] + TAIL_MS)) <= 40
    assert caller_audio.level_dbfs(pcm[: done["audio_ms"] * 8]) > -35
    chunks = [(t, len(data)) for t, data in peer.media]
    prompt_chunks = chunks[: -(TAIL_MS // 20)]  # the tail silence goes out at once
    assert max_run_ahead_ms(prompt_chunks, 16000) <= 100  # paced, not a burst
    assert mark["name"] == "after" and mark["cleared"] is False
    ((reported_at, _vendor_name, event),) = peer.marks_reported  # the leg's own mark id
    assert event == "playout"
    assert event_time(app, mark) >= reported_at  # reached only once jambonz played it


async def test_without_streaming_the_prompt_goes_back_as_play_audio_files(
    jambonz: JambonzConnect, connect: Connect, gateway: GatewayProcess
) -> None:
    peer = await jambonz(audio="playaudio", chunk_ms="500")
    await peer.send_metadata()
    app = await attach(lambda token="": connect(gateway.token()), peer.call_sid)
    await app.send(type="speak", text=PROMPT, utterance_id="p")
    await app.send(type="mark", name="after")
    done = await app.wait_event("utterance_done", utterance_id="p", timeout=20)
    mark = await app.wait_event("mark", timeout=5)
    await peer.wait_played()
    assert peer.ws.protocol == "audio.jambonz.org"
    sizes = [size for _t, size in peer.plays]
    assert sizes[:-1] and all(size == 8000 for size in sizes[:-1])  # 500 ms per file
    assert abs(sum(sizes) / 16 - done["audio_ms"]) <= 40  # no tail silence on files
    assert caller_audio.level_dbfs(peer.pcm()) > -35
    assert mark == {"type": "mark", "name": "after", "cleared": False}
    assert peer.marks_reported == []  # no jambonz marks on files


async def test_dtmf_reaches_the_application(
    jambonz: JambonzConnect, connect: Connect, gateway: GatewayProcess
) -> None:
    peer, app = await started(jambonz, connect, gateway)
    await peer.send_dtmf("7")
    assert (await app.wait_event("dtmf", timeout=5))["digit"] == "7"


@pytest.mark.realtime  # barge-in timing: runs alone (Makefile)
async def test_caller_speech_kills_the_prompt_within_300_ms(
    jambonz: JambonzConnect, connect: Connect, gateway: GatewayProcess
) -> None:
    peer, app = await started(jambonz, connect, gateway)
    await app.send(type="speak", text=MENU, utterance_id="menu")
    await app.send(type="mark", name="end-of-menu")
    await app.wait_event("utterance_started", utterance_id="menu")
    await asyncio.sleep(0.5)
    lead_in = 1.0
    speech = np.concatenate([caller_audio.silence(lead_in), caller_audio.espeak_speech()])
    start = await peer.stream_l16(speech, until=lambda: bool(peer.kills))
    barge = await app.wait_event("barge_in", timeout=5)
    assert event_time(app, barge) - (start + lead_in) <= 0.300
    assert peer.kills and peer.kills[0] - (start + lead_in) <= 0.300
    cleared = await app.wait_event("mark", timeout=5)
    assert cleared == {"type": "mark", "name": "end-of-menu", "cleared": True}
    after = [t for t, _ in peer.media if t > peer.kills[0] + 0.1]
    assert len(after) <= 3  # the prompt stopped


async def test_hangup_disconnects_and_a_closed_socket_ends_the_call(
    jambonz: JambonzConnect, connect: Connect, gateway: GatewayProcess
) -> None:
    peer, app = await started(jambonz, connect, gateway)
    await app.send(type="hangup")
    await peer.wait_until(lambda: bool(peer.disconnects))
    await peer.ws.close()  # jambonz ends the verb: the socket closes
    ended = await app.wait_event("call_ended", timeout=10)
    assert ended["call_id"] == peer.call_sid
    for _ in range(100):
        if await metric(gateway, "gateway_sessions_active", protocol="jambonz") == 0:
            break
        await asyncio.sleep(0.05)
    assert await metric(gateway, "gateway_sessions_active", protocol="jambonz") == 0


@pytest.mark.parametrize(
    ("first", "code"),
    [
        (b"\x00\x00", "jambonz_audio_before_metadata"),
        ('{"sampleRate": 8000, "mixType": "stereo", "callSid": "abc"}', "stereo_unsupported"),
        ('{"sampleRate": 11025, "mixType": "mono", "callSid": "abc"}', "unsupported_sample"),
        ("not json", "jambonz_invalid_json"),
    ],
)
async def test_bad_input_closes_the_leg_with_a_code(
    jambonz: JambonzConnect, gateway: GatewayProcess, first: str | bytes, code: str
) -> None:
    peer = await jambonz()
    await peer.send_raw(first)
    assert await peer.wait_closed() == 1008
    assert peer.media == []
    for _ in range(50):  # the leg logs why it closed
        if code in gateway.log_text():
            break
        await asyncio.sleep(0.05)
    assert code in gateway.log_text()


async def test_a_bad_token_is_refused_at_the_upgrade(jambonz: JambonzConnect) -> None:
    peer = await jambonz(token="not-a-jwt")
    assert await peer.wait_closed() == 1008
