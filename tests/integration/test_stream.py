"""The native protocol end to end: real gateway, real espeak engine, real WebSocket."""

from __future__ import annotations

import asyncio
import shutil
import wave
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from telephony.codecs import g711
from telephony.codecs.ogg_opus import OggOpusWriter
from telephony.codecs.opus import OpusDecoder
from tests.integration.conftest import Connect
from tests.integration.harness import GatewayProcess, NativeClient
from tests.integration.pacing import CLIENT_ALLOWANCE_S, LEAD_S, lateness

PROMPT = "Thank you for calling. Your call is important to us."
FRAME_BYTES = {
    "mulaw_8000": 160,
    "alaw_8000": 160,
    "pcm_8000": 320,
    "pcm_16000": 640,
    "pcm_24000": 960,
    "pcm_48000": 1920,
}


async def speak_and_collect(connect: Connect, fmt: str, text: str, **start: object):
    client = await connect()
    ready = await client.start("en-us", fmt, **start)
    await client.send(type="speak", text=text, utterance_id="p1")
    await client.send(type="close")
    code = await client.wait_closed(20)
    done = client.got.of_type("utterance_done")
    return client, ready, done, code


@pytest.mark.parametrize("fmt", sorted(FRAME_BYTES))
async def test_each_pcm_and_g711_format_frames_and_duration(connect: Connect, fmt: str) -> None:
    client, ready, done, code = await speak_and_collect(connect, fmt, PROMPT)
    assert code == 1000
    assert ready["format"] == fmt and ready["frame_ms"] == 20
    frames = [f for _, f in client.got.frames]
    assert frames and all(len(f) == FRAME_BYTES[fmt] for f in frames)
    assert len(done) == 1 and done[0]["utterance_id"] == "p1"
    # Total audio equals the engine's output within one frame.
    assert abs(len(frames) * 20 - done[0]["audio_ms"]) <= 20
    assert client.got.types()[:2] == ["ready", "utterance_started"]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """This module's gateway also taps the engine's PCM (``ENGINE_PCM_TAP_DIR``)."""
    tap = tmp_path_factory.mktemp("tap")
    gw = GatewayProcess(
        tmp_path_factory.mktemp("gateway") / "gateway.log", ENGINE_PCM_TAP_DIR=str(tap)
    )
    gw.tap_dir = tap  # type: ignore[attr-defined]
    gw.start()
    yield gw
    gw.stop()


async def engine_pcm(gateway: GatewayProcess, before: set[Path], min_bytes: int) -> bytes:
    """The PCM the engine wrote for the one stream opened since ``before`` was listed."""
    tap: Path = gateway.tap_dir  # type: ignore[attr-defined]
    for _ in range(100):
        new = sorted(set(tap.iterdir()) - before)
        if len(new) == 1 and new[0].stat().st_size >= min_bytes:
            return new[0].read_bytes()
        await asyncio.sleep(0.05)
    raise AssertionError(f"no tap file of {min_bytes} bytes in {tap}")


@pytest.mark.parametrize("fmt", ["mulaw_8000", "alaw_8000"])
async def test_g711_decodes_to_the_engines_pcm_within_quantization(
    gateway: GatewayProcess, connect: Connect, fmt: str
) -> None:
    tap: Path = gateway.tap_dir  # type: ignore[attr-defined]
    before = set(tap.iterdir())
    client, _, done, _ = await speak_and_collect(connect, fmt, PROMPT)
    received = b"".join(f for _, f in client.got.frames)
    samples = done[0]["audio_ms"] * 8
    pcm = (await engine_pcm(gateway, before, (samples - 8) * 2))[: len(received) * 2]
    assert abs(len(pcm) // 2 - samples) <= 8
    received = received[: len(pcm) // 2]  # the tail frame is padded with silence
    encode, decode = (
        (g711.ulaw_encode, g711.ulaw_decode)
        if fmt == "mulaw_8000"
        else (g711.alaw_encode, g711.alaw_decode)
    )
    # The frames are exactly the G.711 encoding of the engine's PCM ...
    assert encode(pcm) == received
    # ... and decode back to it within G.711's quantization error: under 1/16 of the
    # magnitude plus the smallest step (ITU-T G.711 tables 2a/1a, 8 segments).
    reference = np.frombuffer(pcm, dtype="<i2").astype(np.int32)
    decoded = decode(received).astype(np.int32)
    error = np.abs(decoded - reference)
    assert error.max() <= 1024
    assert np.all(error <= np.abs(reference) / 16 + 16)
    assert np.abs(reference).max() > 1000  # it is speech, not silence


@pytest.mark.parametrize("fmt,rate", [("opus_48000", 48000), ("opus_16000", 16000)])
async def test_opus_packets_decode_and_ogg_stream_plays(
    connect: Connect, tmp_path: Path, fmt: str, rate: int
) -> None:
    client, ready, done, code = await speak_and_collect(connect, fmt, PROMPT)
    assert code == 1000 and ready["sample_rate"] == rate
    packets = [f for _, f in client.got.frames]
    decoder = OpusDecoder(rate)
    decoded = [decoder.decode(p) for p in packets]
    assert all(len(d) == rate // 50 * 2 for d in decoded)  # 20 ms per packet
    assert abs(len(packets) * 20 - done[0]["audio_ms"]) <= 20
    if shutil.which("opusdec") is None:
        pytest.skip("opusdec is not installed")
    writer = OggOpusWriter(rate)
    ogg = bytearray(writer.header_pages())
    for packet in packets:
        ogg += writer.packet(packet, 960)
    ogg += writer.end()
    path = tmp_path / "stream.ogg"
    path.write_bytes(bytes(ogg))
    out = tmp_path / "stream.wav"
    proc = await asyncio.create_subprocess_exec(
        "opusdec", "--quiet", "--rate", "48000", str(path), str(out)
    )
    assert await asyncio.wait_for(proc.wait(), 30) == 0
    with wave.open(str(out)) as w:
        seconds = w.getnframes() / w.getframerate()
    assert abs(seconds - len(packets) * 0.02) <= 0.02


@pytest.mark.realtime  # frame timing: runs alone (Makefile)
async def test_realtime_pacing_never_runs_ahead_by_more_than_the_lead(connect: Connect) -> None:
    client, _, _done, _ = await speak_and_collect(
        connect, "mulaw_8000", PROMPT + " " + PROMPT, pacing="realtime"
    )
    times = np.array([t for t, _ in client.got.frames])
    assert len(times) > 100
    gaps = np.diff(times)
    assert 0.0195 <= gaps.mean() <= 0.0205, gaps.mean()
    # Frame k should start playing at t0 + k*20 ms; the gateway may send it up to the lead
    # (60 ms) early. Measured at the client, with 15 ms allowance for our own clock.
    run_ahead = -lateness(times)
    assert run_ahead.max() <= LEAD_S + CLIENT_ALLOWANCE_S, run_ahead.max()
    assert np.percentile(gaps, 99) <= 0.030


@pytest.mark.realtime  # frame timing: runs alone (Makefile)
async def test_burst_pacing_runs_ahead_but_bounded(connect: Connect) -> None:
    text = " ".join([PROMPT] * 4)
    client, _, _done, _ = await speak_and_collect(connect, "pcm_16000", text, pacing="burst")
    times = np.array([t for t, _ in client.got.frames])
    audio_s = len(times) * 0.02
    assert audio_s > 6
    run_ahead = np.arange(len(times)) * 0.020 - (times - times[0])
    assert run_ahead.max() > 1.0  # much faster than real time at the start
    assert run_ahead.max() <= 2.0 + 0.05  # but never more than the burst lead


async def test_streamed_text_with_flush_false_is_one_utterance(connect: Connect) -> None:
    client = await connect()
    await client.start("en-us", "pcm_16000")
    for piece in ["Your balance ", "is twelve dollars, ", "and fifty cents."]:
        await client.send(type="speak", text=piece, utterance_id="bal", flush=False)
    await client.send(type="flush", utterance_id="bal")
    done = await client.wait_event("utterance_done", utterance_id="bal")
    assert done["audio_ms"] > 1500
    assert [e["utterance_id"] for e in client.got.of_type("utterance_started")] == ["bal"]


@pytest.mark.realtime  # clear timing: runs alone (Makefile)
async def test_clear_stops_audio_within_a_frame_and_new_speech_plays(connect: Connect) -> None:
    client = await connect()
    await client.start("en-us", "mulaw_8000")
    await client.send(type="speak", text=" ".join([PROMPT] * 5), utterance_id="long")
    await client.send(type="mark", name="after-long")
    await client.wait_event("utterance_started", utterance_id="long")
    while len(client.got.frames) < 15:
        await client.wait_event("utterance_started")  # yields to the reader
        await asyncio.sleep(0.02)
    sent_at = await client.send(type="clear")
    cleared = await client.wait_event("cleared")
    cleared_at = next(t for t, e in client.got.events if e is cleared)
    assert cleared_at - sent_at < 0.1
    mark = await client.wait_event("mark", name="after-long")
    assert mark["cleared"] is True
    await asyncio.sleep(0.3)
    late = [t for t, _ in client.got.frames if t > sent_at + 0.020]
    assert late == []
    assert not client.got.of_type("utterance_done")  # the long one never finished
    frames_before = len(client.got.frames)
    await client.send(type="speak", text="Goodbye.", utterance_id="bye")
    done = await client.wait_event("utterance_done", utterance_id="bye")
    new_frames = len(client.got.frames) - frames_before
    assert abs(new_frames * 20 - done["audio_ms"]) <= 20


async def test_marks_are_echoed_in_order_after_their_audio(connect: Connect) -> None:
    client = await connect()
    await client.start("en-us", "mulaw_8000")
    await client.send(type="mark", name="m0")
    await client.send(type="speak", text="One.", utterance_id="a")
    await client.send(type="mark", name="m1")
    await client.send(type="speak", text="Two.", utterance_id="b")
    await client.send(type="mark", name="m2")
    await client.wait_event("mark", name="m2")
    order = [
        (e["type"], e.get("name") or e.get("utterance_id"))
        for _, e in client.got.events
        if e["type"] in ("mark", "utterance_started", "utterance_done")
    ]
    assert order == [
        ("mark", "m0"),
        ("utterance_started", "a"),
        ("utterance_done", "a"),
        ("mark", "m1"),
        ("utterance_started", "b"),
        ("utterance_done", "b"),
        ("mark", "m2"),
    ]
    assert all(e["cleared"] is False for e in client.got.of_type("mark"))
    # m1 comes after every frame of "a" and before the first frame of "b".
    arrival = {(e["type"], e.get("name") or e.get("utterance_id")): t for t, e in client.got.events}
    m1 = arrival[("mark", "m1")]
    frames_a = [t for t, _ in client.got.frames if t <= arrival[("utterance_done", "a")]]
    frames_b = [t for t, _ in client.got.frames if t >= arrival[("utterance_started", "b")]]
    assert frames_a and frames_b
    assert max(frames_a) <= m1 <= min(frames_b)


async def test_close_finishes_queued_audio_then_closes_normally(connect: Connect) -> None:
    client = await connect()
    await client.start("zh", "mulaw_8000")
    await client.send(type="speak", text="你好！欢迎致电客服中心。", utterance_id="zh1")
    await client.send(type="speak", text="请稍候。", utterance_id="zh2")
    await client.send(type="close")
    assert await client.wait_closed(20) == 1000
    done = client.got.of_type("utterance_done")
    assert [d["utterance_id"] for d in done] == ["zh1", "zh2"]
    total = sum(d["audio_ms"] for d in done)
    assert abs(len(client.got.frames) * 20 - total) <= 40


async def test_cantonese_voice_and_speed(connect: Connect) -> None:
    slow, *_ = await speak_and_collect(connect, "pcm_8000", PROMPT, speed=1.0)
    fast, *_ = await speak_and_collect(connect, "pcm_8000", PROMPT, speed=2.0)
    assert len(fast.got.frames) < 0.7 * len(slow.got.frames)
    client = await connect()
    await client.start("yue", "mulaw_8000")
    await client.send(type="speak", text="你好，歡迎致電。")
    done = await client.wait_event("utterance_done")
    assert done["audio_ms"] > 500


@pytest.mark.realtime  # first audio within 0.5 s: runs alone (Makefile)
async def test_first_audio_latency_is_reported(connect: Connect) -> None:
    client = await connect()
    await client.start("en-us", "mulaw_8000")
    sent = await client.send(type="speak", text="Hello there.")
    done = await client.wait_event("utterance_done")
    first_frame = client.got.frames[0][0]
    assert 0 <= done["first_audio_ms"] <= 500
    assert first_frame - sent < 0.5


async def test_voices_health_and_metrics(gateway: GatewayProcess) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as http:
        r = await http.get(gateway.base + "/v1/voices")
        assert r.status == 401
        assert (await r.json())["error"]["code"] == "token_missing"
        r = await http.get(
            gateway.base + "/v1/voices", headers={"Authorization": f"Bearer {gateway.token()}"}
        )
        voices = {v["id"]: v for v in (await r.json())["voices"]}
        assert {"en-us", "zh", "yue"} <= set(voices)
        assert {"id", "language", "name"} <= set(voices["zh"])
        assert (await http.get(gateway.base + "/healthz")).status == 200
        assert (await http.get(gateway.base + "/readyz")).status == 200
        text = await (await http.get(gateway.base + "/metrics")).text()
    for name in (
        "gateway_sessions_active",
        "gateway_first_audio_seconds_bucket",
        "gateway_frames_sent_total",
        "gateway_underruns_total",
        "gateway_errors_total",
    ):
        assert name in text


async def test_a_long_call_keeps_speaking_after_hundreds_of_prompts(tmp_path: Path) -> None:
    """Every utterance leaves a record in the stream's bounded boundary ring (about 256):
    a long IVR call must keep getting audio well past that many prompts. (A burst lead of
    ten minutes lets 320 prompts play out in seconds.)"""
    gw = GatewayProcess(tmp_path / "gw.log", ENGINE_VAD="0", GATEWAY_BURST_LEAD_MS="600000")
    gw.start()
    client = await NativeClient.connect(gw.ws_url, gw.token())
    try:
        await client.start("en-us", "mulaw_8000", pacing="burst", speed=4.0)
        for batch in range(10):  # 32 at a time: the session's queue holds 64
            ids = [f"p{batch}-{i}" for i in range(32)]
            for utterance_id in ids:
                await client.send(type="speak", text="One.", utterance_id=utterance_id)
            await client.wait_event("utterance_done", timeout=20, utterance_id=ids[-1])
        done = client.got.of_type("utterance_done")
        assert len(done) == 320 and all(d["audio_ms"] > 0 for d in done)
        assert not client.got.of_type("error")
    finally:
        await client.aclose()
        gw.stop()
