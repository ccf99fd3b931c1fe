"""The gateway on ``ENGINE_BACKEND=cosyvoice2`` with the tiny model directory: the real
upstream loading and inference code in a real engine process, end to end."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from engine.backends.cosyvoice2 import upstream
from telephony.codecs import g711
from telephony.codecs.opus import OpusDecoder
from tests.engine.cosyvoice2.tiny_model import write_tiny_model
from tests.integration.caller_audio import espeak_reference, wav_bytes
from tests.integration.harness import GatewayProcess, NativeClient, RedisServer, voices_of
from tests.integration.test_voices import metrics, register

pytestmark = [
    pytest.mark.skipif(
        bool(upstream.missing_packages()), reason="the cosyvoice2 extra is not installed"
    ),
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server"),
]

TEXT = "Hi there."
FRAME_BYTES = {"mulaw_8000": 160, "alaw_8000": 160, "pcm_16000": 640, "pcm_24000": 960}


@pytest.fixture(scope="module")
def gateway(
    redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    model = write_tiny_model(tmp_path_factory.mktemp("cosyvoice2") / "CosyVoice2-tiny")
    gw = GatewayProcess(
        tmp_path_factory.mktemp("gateway") / "gateway.log",
        ENGINE_BACKEND="cosyvoice2,espeak",  # as docs/cosyvoice2.md runs it
        COSYVOICE2_MODEL_DIR=str(model),
        ENGINE_WORKERS="1",
        ENGINE_VAD="0",
        GATEWAY_REDIS_URL=redis.url,
    )
    gw.start(timeout=120)
    yield gw
    gw.stop()


async def speak(
    gw: GatewayProcess, voice: str, fmt: str, text: str = TEXT, tenant: str = "acme"
) -> tuple[NativeClient, dict[str, Any]]:
    client = await NativeClient.connect(gw.ws_url, gw.token(tenant=tenant))
    await client.start(voice, fmt, pacing="burst")
    await client.send(type="speak", text=text, utterance_id="u")
    done = await client.wait_event("utterance_done", timeout=60)
    return client, done


def level_dbfs(pcm: np.ndarray) -> float:
    return float(20 * np.log10(np.sqrt(np.mean((pcm.astype(np.float64) / 32768) ** 2)) + 1e-12))


async def test_the_model_s_voice_is_listed_with_its_backend(gateway: GatewayProcess) -> None:
    voices = await voices_of(gateway)
    assert voices["cosyvoice2"]["backend"] == "cosyvoice2"
    assert voices["cosyvoice2"]["language"] == "mul"
    assert voices["en-us"]["backend"] == "espeak"


async def test_frames_arrive_in_every_format_from_streams_batched_together(
    gateway: GatewayProcess,
) -> None:
    formats = [*FRAME_BYTES, "opus_48000"]
    results = await asyncio.gather(*(speak(gateway, "cosyvoice2", fmt) for fmt in formats))
    try:
        for fmt, (client, done) in zip(formats, results, strict=True):
            frames = [f for _, f in client.got.frames]
            assert abs(len(frames) * 20 - done["audio_ms"]) <= 20, fmt
            assert done["audio_ms"] >= 1000  # at least the first 25-token chunk
            if fmt in FRAME_BYTES:
                assert all(len(f) == FRAME_BYTES[fmt] for f in frames), fmt
            if fmt.startswith("pcm"):
                pcm = np.frombuffer(b"".join(frames), dtype="<i2")
            elif fmt == "mulaw_8000":
                pcm = g711.ulaw_decode(b"".join(frames))
            elif fmt == "alaw_8000":
                pcm = g711.alaw_decode(b"".join(frames))
            else:
                decoder = OpusDecoder(48000)
                pcm = np.frombuffer(b"".join(decoder.decode(f) for f in frames), dtype="<i2")
            assert level_dbfs(pcm) > -45, fmt
    finally:
        for client, _ in results:
            await client.aclose()


async def test_clear_stops_a_stream_and_the_session_speaks_again(gateway: GatewayProcess) -> None:
    client = await NativeClient.connect(gateway.ws_url, gateway.token())
    try:
        await client.start("cosyvoice2", "pcm_24000", pacing="realtime")
        await client.send(
            type="speak", text="Thank you for calling the billing line today.", utterance_id="long"
        )
        async with asyncio.timeout(60):
            while not client.got.frames:  # noqa: ASYNC110 - frames, not an event
                await asyncio.sleep(0.02)
        await client.send(type="clear")
        await client.wait_event("cleared", timeout=10)
        await client.send(type="speak", text=TEXT, utterance_id="next")
        done = await client.wait_event("utterance_done", timeout=60, utterance_id="next")
        assert done["audio_ms"] >= 1000
    finally:
        await client.aclose()


async def test_a_registered_voice_stores_its_features_and_reuses_them(
    gateway: GatewayProcess,
) -> None:
    pcm, rate = espeak_reference("en-us+f3", pitch=60)
    audio = wav_bytes(pcm, rate)
    status, body = await register(gateway, audio, language="en-US")
    assert status == 400 and body["error"]["code"] == "transcript_required"
    status, body = await register(
        gateway, audio, language="en-US", transcript="Hello, this is my voice."
    )
    assert status == 201, body
    voice_id = body["id"]
    # Cloned by the first backend that clones (cosyvoice2), so based on its voice, not on
    # espeak's en-us although the language is en-US.
    assert body["base_voice"] == "cosyvoice2"
    before = await metrics(gateway)
    lengths = []
    for _ in range(2):
        client, done = await speak(gateway, voice_id, "pcm_24000")
        await client.aclose()
        lengths.append(done["audio_ms"])
    # The tiny model's weights are random and its LLM samples, seeded by the segment and
    # the voice (whose key is its features' digest, new with each registration): how long
    # it speaks before its end token is chance (840 ms in one fresh run, over 1 s in the
    # others), but the same voice says the same text the same way both times.
    assert lengths[0] > 0 and lengths[0] == lengths[1], lengths
    after = await metrics(gateway)
    hits = "gateway_voice_cache_hits_total{level=l1}"
    assert after.get(hits, 0) - before.get(hits, 0) >= 2  # no extraction at session start
    extractions = "gateway_voice_extraction_seconds_count"
    assert after.get(extractions, 0) == before.get(extractions, 0)


async def test_instructions_in_start_and_in_speak(gateway: GatewayProcess) -> None:
    client = await NativeClient.connect(gateway.ws_url, gateway.token())
    try:
        await client.start("cosyvoice2", "pcm_24000", pacing="burst", instruct="用粤语说这句话")
        await client.send(type="speak", text="你好。", utterance_id="session-style")
        await client.send(type="speak", text="再见。", utterance_id="own-style", instruct="开心")
        for utterance_id in ("session-style", "own-style"):
            done = await client.wait_event("utterance_done", timeout=60, utterance_id=utterance_id)
            assert done["audio_ms"] >= 1000
        assert not client.got.of_type("error")
    finally:
        await client.aclose()
