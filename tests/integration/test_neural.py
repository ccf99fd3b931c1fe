"""The gateway on its default engine: the neural English voice (Piper, en-us-joe) next to
espeak, end to end with a real engine process."""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import pytest

from engine.backends.piper import bundled_voice_installed
from telephony.codecs import g711
from tests.integration.harness import GatewayProcess, NativeClient, voices_of
from tests.integration.telephony_peers import TwilioPeer, leg_url

pytestmark = pytest.mark.skipif(not bundled_voice_installed(), reason="no bundled Piper voice")

PROMPT = "Thank you for calling. Your call is important to us."


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """ENGINE_BACKEND unset: the engine picks its default (piper,espeak when installed)."""
    gw = GatewayProcess(
        tmp_path_factory.mktemp("neural") / "gateway.log", ENGINE_BACKEND="", ENGINE_VAD="0"
    )
    gw.start(timeout=60)
    yield gw
    gw.stop()


async def test_the_neural_voice_is_listed_with_its_backend(gateway: GatewayProcess) -> None:
    voices = await voices_of(gateway)
    assert voices["en-us-joe"]["backend"] == "piper"
    assert voices["en-us-joe"]["language"] == "en-US"
    assert voices["en-us"]["backend"] == "espeak" and voices["zh"]["backend"] == "espeak"


@pytest.mark.realtime  # first audio of a CPU model within a bound: runs alone (Makefile)
async def test_a_session_speaks_with_the_neural_voice(gateway: GatewayProcess) -> None:
    client = await NativeClient.connect(gateway.ws_url, gateway.token())
    try:
        await client.start("en-us-joe", "pcm_16000")
        await client.send(type="speak", text=PROMPT, utterance_id="p")
        done = await client.wait_event("utterance_done", timeout=20)
        pcm = np.frombuffer(b"".join(f for _, f in client.got.frames), dtype="<i2")
        assert 2000 < done["audio_ms"] < 6000
        assert abs(len(pcm) / 16 - done["audio_ms"]) <= 20
        rms = np.sqrt(np.mean(pcm.astype(np.float64) ** 2))
        assert rms > 500  # speech
        assert done["first_audio_ms"] < 1500
    finally:
        await client.aclose()


async def test_a_call_without_a_voice_hears_the_neural_voice(gateway: GatewayProcess) -> None:
    peer = await TwilioPeer.connect(leg_url(gateway, "twilio"))
    try:
        await peer.begin({"token": gateway.token(), "say": PROMPT})
        await peer.wait_until(lambda: len(peer.media) * 20 > 2000, timeout=20)
        pcm = g711.ulaw_decode(b"".join(a for _, a in peer.media))
        assert np.sqrt(np.mean(pcm.astype(np.float64) ** 2)) > 300
    finally:
        await peer.aclose()
    started = re.findall(r"awaiting_start -> starting \(voice=(\S+)", gateway.log_text())
    assert "en-us-joe" in started
