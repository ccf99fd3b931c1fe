"""FreeSWITCH ``mod_audio_stream`` leg (``GET /v1/freeswitch``) end to end: a simulated
module (``audio_fork_peers.FreeSwitchPeer``, playing ``streamAudio`` in real time as the
voxcom-us fork does), the real gateway and engine, an attached IVR app."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import numpy as np
import pytest

from tests.integration import caller_audio
from tests.integration.audio_fork_peers import L16_RATE, FreeSwitchPeer, fork_url
from tests.integration.conftest import Connect
from tests.integration.harness import GatewayProcess, NativeClient, metric
from tests.integration.telephony_peers import attach, event_time, max_run_ahead_ms

PROMPT = "Thank you for calling. Your call is important to us. Please stay on the line."
MENU = "Please listen carefully, as our menu options have changed. " * 4
CHUNK_MS = 100

FreeSwitchConnect = Callable[..., Awaitable[FreeSwitchPeer]]


@pytest.fixture
async def freeswitch(gateway: GatewayProcess) -> AsyncIterator[FreeSwitchConnect]:
    peers: list[FreeSwitchPeer] = []

    async def _connect(*, call_id: bool = True, **query: str) -> FreeSwitchPeer:
        uuid = FreeSwitchPeer.new_uuid()
        params = {"access_token": gateway.token(), "sample_rate": str(L16_RATE), **query}
        if call_id:
            params["call_id"] = uuid  # the dialplan's ${uuid}
        peer = await FreeSwitchPeer.connect(fork_url(gateway, "freeswitch"), uuid, query=params)
        peers.append(peer)
        return peer

    yield _connect
    for peer in peers:
        await peer.aclose()
    assert [p.violations for p in peers if p.violations] == []


async def started(
    freeswitch: FreeSwitchConnect, connect: Connect, gateway: GatewayProcess
) -> tuple[FreeSwitchPeer, NativeClient]:
    peer = await freeswitch()
    await peer.stream_l16(caller_audio.silence(0.1))  # the module starts with audio
    app = await attach(lambda token="": connect(gateway.token()), peer.uuid)
    return peer, app


@pytest.mark.realtime  # frame timing: runs alone (Makefile)
async def test_a_prompt_streams_as_paced_stream_audio_chunks(
    freeswitch: FreeSwitchConnect, connect: Connect, gateway: GatewayProcess
) -> None:
    peer, app = await started(freeswitch, connect, gateway)
    call = await app.wait_event("call_started")
    assert call["call_id"] == peer.uuid and call["protocol"] == "freeswitch"
    await app.send(type="speak", text=PROMPT, utterance_id="p")
    await app.send(type="mark", name="after")
    done = await app.wait_event("utterance_done", utterance_id="p", timeout=20)
    mark = await app.wait_event("mark", timeout=5)
    await peer.wait_played()
    pcm = peer.pcm()
    assert abs(len(pcm) / 8 - done["audio_ms"]) <= 40
    assert caller_audio.level_dbfs(pcm) > -35
    sizes = [size for _t, size in peer.messages]
    assert all(size == CHUNK_MS * 16 for size in sizes[:-1])  # 100 ms per message
    chunks = [(t, size) for t, size in peer.messages]
    assert max_run_ahead_ms(chunks, 16000) <= CHUNK_MS + 80  # paced, not a burst
    assert mark["name"] == "after" and event_time(app, mark) >= peer.messages[-1][0] - 0.05


@pytest.mark.realtime  # barge-in timing: runs alone (Makefile)
async def test_caller_speech_barges_in_and_the_prompt_stops(
    freeswitch: FreeSwitchConnect, connect: Connect, gateway: GatewayProcess
) -> None:
    peer, app = await started(freeswitch, connect, gateway)
    await app.send(type="speak", text=MENU, utterance_id="menu")
    await app.wait_event("utterance_started", utterance_id="menu")
    await asyncio.sleep(0.5)
    lead_in = 1.0
    speech = np.concatenate([caller_audio.silence(lead_in), caller_audio.espeak_speech()])
    sending = asyncio.ensure_future(peer.stream_l16(speech))
    barge = await app.wait_event("barge_in", timeout=8)
    start = await sending
    assert event_time(app, barge) - (start + lead_in) <= 0.300
    after = [t for t, _ in peer.messages if t > event_time(app, barge) + 0.05]
    assert after == []  # nothing more was sent once the caller spoke


async def test_json_metadata_names_the_call(
    freeswitch: FreeSwitchConnect, connect: Connect, gateway: GatewayProcess
) -> None:
    peer = await freeswitch(call_id=False, metadata="json")
    await peer.stream_l16(caller_audio.silence(0.1))  # audio first: held for the metadata
    await peer.send_metadata(json.dumps({"callId": peer.uuid, "sampleRate": L16_RATE}))
    app = await attach(lambda token="": connect(gateway.token()), peer.uuid)
    assert (await app.wait_event("call_started"))["call_id"] == peer.uuid


async def test_hangup_closes_the_socket_and_a_closed_socket_ends_the_call(
    freeswitch: FreeSwitchConnect, connect: Connect, gateway: GatewayProcess
) -> None:
    peer, app = await started(freeswitch, connect, gateway)
    await app.send(type="hangup")
    assert await peer.wait_closed() == 1000
    other, other_app = await started(freeswitch, connect, gateway)
    await other.ws.close()
    assert (await other_app.wait_event("call_ended", timeout=10))["call_id"] == other.uuid
    for _ in range(100):
        if await metric(gateway, "gateway_sessions_active", protocol="freeswitch") == 0:
            break
        await asyncio.sleep(0.05)
    assert await metric(gateway, "gateway_sessions_active", protocol="freeswitch") == 0


@pytest.mark.parametrize(
    ("call_id", "query", "code"),
    [
        (False, {}, "freeswitch_call_id_missing"),
        (True, {"sample_rate": "11025"}, "freeswitch_invalid_argument"),
        (True, {"playback": "wav"}, "freeswitch_invalid_argument"),
    ],
)
async def test_a_bad_url_closes_the_leg_with_a_code(
    freeswitch: FreeSwitchConnect,
    gateway: GatewayProcess,
    call_id: bool,
    query: dict[str, str],
    code: str,
) -> None:
    peer = await freeswitch(call_id=call_id, **query)
    await peer.stream_l16(caller_audio.silence(0.04))
    assert await peer.wait_closed() == 1008
    for _ in range(50):
        if code in gateway.log_text():
            break
        await asyncio.sleep(0.05)
    assert code in gateway.log_text()
