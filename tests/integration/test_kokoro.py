"""The gateway on its default engine with Kokoro installed (``make run`` with no
configuration): the Kokoro voices beside Piper and espeak, a streamed Kokoro utterance in
telephone and Opus formats, end to end with a real engine process."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from engine.backends.kokoro.backend import installed
from engine.backends.piper import bundled_voice_installed
from telephony.codecs import g711
from telephony.codecs.opus import OpusDecoder
from tests.integration.harness import GatewayProcess, NativeClient, voices_of

pytestmark = pytest.mark.skipif(
    not (installed() and bundled_voice_installed()),
    reason="kokoro assets or the Piper voice not installed (make kokoro-voices)",
)

TEXTS = {
    "zh-yunxi": "您好，欢迎致电客服中心，您的订单已发货。",
    "en-us-heart": "Thank you for calling. Your order has shipped.",
}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """ENGINE_BACKEND unset: the engine picks its default (piper,kokoro,espeak)."""
    gw = GatewayProcess(
        tmp_path_factory.mktemp("kokoro") / "gateway.log",
        ENGINE_BACKEND="",
        ENGINE_VAD="0",
        ENGINE_WORKERS="2",
    )
    gw.start(timeout=120)
    yield gw
    gw.stop()


def level_dbfs(pcm: np.ndarray) -> float:
    return float(20 * np.log10(np.sqrt(np.mean((pcm.astype(np.float64) / 32768) ** 2)) + 1e-12))


async def test_kokoro_voices_are_listed_beside_piper_and_espeak(gateway: GatewayProcess) -> None:
    voices = await voices_of(gateway)
    yunxi = voices["zh-yunxi"]
    assert (yunxi["backend"], yunxi["language"], yunxi["gender"]) == ("kokoro", "zh-CN", "male")
    assert voices["en-us-heart"]["backend"] == "kokoro"
    assert voices["en-gb-george"]["language"] == "en-GB"
    assert "zh-xiaoni" not in voices  # measured badly: not offered by default
    assert voices["en-us-joe"]["backend"] == "piper"
    assert voices["zh"]["backend"] == "espeak" and voices["en-us"]["backend"] == "espeak"


async def speak(gw: GatewayProcess, voice: str, fmt: str) -> tuple[NativeClient, dict[str, Any]]:
    client = await NativeClient.connect(gw.ws_url, gw.token())
    await client.start(voice, fmt, pacing="burst")
    await client.send(type="speak", text=TEXTS[voice], utterance_id="u")
    done = await client.wait_event("utterance_done", timeout=120)
    return client, done


@pytest.mark.parametrize("voice", sorted(TEXTS))
async def test_a_kokoro_utterance_streams_in_mulaw_and_opus(
    gateway: GatewayProcess, voice: str
) -> None:
    formats = ("mulaw_8000", "opus_48000")
    # one call after the other: two Mandarin calls at once on a loaded machine may rightly
    # be one call and one refusal (queue_timeout: the lane cannot pace both), and this
    # test is about the formats, not the lane's capacity (tests/engine/scheduler has that)
    results = [await speak(gateway, voice, fmt) for fmt in formats]
    try:
        for fmt, (client, done) in zip(formats, results, strict=True):
            frames = [f for _, f in client.got.frames]
            assert abs(len(frames) * 20 - done["audio_ms"]) <= 20, fmt
            assert 2000 < done["audio_ms"] < 9000, (fmt, done["audio_ms"])
            if fmt == "mulaw_8000":
                assert all(len(f) == 160 for f in frames)
                pcm = g711.ulaw_decode(b"".join(frames))
            else:
                decoder = OpusDecoder(48000)
                pcm = np.frombuffer(b"".join(decoder.decode(f) for f in frames), dtype="<i2")
            assert level_dbfs(pcm) > -35, (fmt, level_dbfs(pcm))
    finally:
        for client, _ in results:
            await client.aclose()
