"""``POST /v1/audio/speech`` with the official ``openai`` package, pointed at a real
gateway by ``base_url``: each response format decodes to the length the same text has
on a native stream, errors come back as the SDK's exceptions, and the body streams."""

from __future__ import annotations

import asyncio
import io
import shutil
import time
import wave
from pathlib import Path
from typing import Literal

import numpy as np
import openai
import pytest
import soundfile  # type: ignore[import-untyped]

from tests.integration import caller_audio
from tests.integration.conftest import Connect
from tests.integration.harness import GatewayProcess, metric

TEXT = "Thank you for calling. Your call is important to us. Please stay on the line."


def client(gw: GatewayProcess, token: str | None = None) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=gw.base + "/v1", api_key=token or gw.token(), max_retries=0, timeout=60
    )


async def native_ms(connect: Connect, text: str, fmt: str = "pcm_24000") -> int:
    """How long ``text`` plays when a native session speaks it (the reference)."""
    session = await connect()
    await session.start(fmt=fmt, pacing="burst")
    await session.send(type="speak", text=text, utterance_id="u")
    done = await session.wait_event("utterance_done", utterance_id="u", timeout=30)
    await session.aclose()
    return int(done["audio_ms"])


Format = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]


async def speech(gw: GatewayProcess, response_format: Format, text: str = TEXT) -> bytes:
    async with (
        client(gw) as api,
        api.audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input=text, response_format=response_format
        ) as response,
    ):
        assert response.status_code == 200
        return await response.read()


async def test_pcm_and_wav_hold_the_whole_utterance(
    gateway: GatewayProcess, connect: Connect
) -> None:
    expected_ms = await native_ms(connect, TEXT)
    pcm = np.frombuffer(await speech(gateway, "pcm"), dtype="<i2")
    assert abs(len(pcm) / 24 - expected_ms) <= 40
    assert caller_audio.level_dbfs(pcm) > -35  # speech, not silence
    wav_bytes = await speech(gateway, "wav")
    header = wav_bytes[:44]
    assert header[:4] == b"RIFF" and header[8:16] == b"WAVEfmt "
    with wave.open(io.BytesIO(wav_bytes[:44])) as probe:  # the header parses
        assert (probe.getframerate(), probe.getnchannels(), probe.getsampwidth()) == (24000, 1, 2)
    assert abs((len(wav_bytes) - 44) / 48 - expected_ms) <= 40


async def test_mp3_decodes_to_the_utterance(gateway: GatewayProcess, connect: Connect) -> None:
    expected_ms = await native_ms(connect, TEXT)
    audio, rate = soundfile.read(io.BytesIO(await speech(gateway, "mp3")), dtype="int16")
    assert rate == 24000
    # an MP3 decoder adds the encoder's delay and pads the last frame (1152 samples)
    assert -40 <= len(audio) / 24 - expected_ms <= 40 + 2 * 1152 / 24
    assert caller_audio.level_dbfs(np.asarray(audio)) > -35


async def test_opus_is_ogg_that_opusdec_decodes(
    gateway: GatewayProcess, connect: Connect, tmp_path: Path
) -> None:
    if shutil.which("opusdec") is None:
        pytest.skip("opusdec (opus-tools) is not installed")
    expected_ms = await native_ms(connect, TEXT, "pcm_48000")
    ogg = tmp_path / "speech.ogg"
    ogg.write_bytes(await speech(gateway, "opus"))
    out = tmp_path / "speech.wav"
    decoder = await asyncio.create_subprocess_exec(
        "opusdec", "--quiet", "--rate", "48000", "--force-wav", str(ogg), str(out),
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, stderr = await asyncio.wait_for(decoder.communicate(), 60)
    assert decoder.returncode == 0, stderr.decode(errors="replace")
    with wave.open(str(out)) as decoded:
        frames = decoded.readframes(decoded.getnframes())
        assert decoded.getframerate() == 48000
    pcm = np.frombuffer(frames, dtype="<i2")
    assert abs(len(pcm) / 48 - expected_ms) <= 40
    assert caller_audio.level_dbfs(pcm) > -35


@pytest.mark.realtime  # first bytes within 1 s: runs alone (Makefile)
async def test_the_body_streams_as_it_is_synthesized(gateway: GatewayProcess) -> None:
    text = " ".join([TEXT] * 25)  # about 2,000 characters, several utterances
    arrivals: list[tuple[float, int]] = []
    start = time.monotonic()
    async with (
        client(gateway) as api,
        api.audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input=text, response_format="pcm"
        ) as response,
    ):
        async for chunk in response.iter_bytes():
            arrivals.append((time.monotonic() - start, len(chunk)))
            await asyncio.sleep(0)
    total = sum(n for _t, n in arrivals)
    first_at, last_at = arrivals[0][0], arrivals[-1][0]
    audio_s = total / 48_000
    assert audio_s > 60  # over a minute of speech
    assert len(arrivals) > 10  # in pieces, as it came
    assert first_at < 1.0, first_at
    assert last_at < audio_s / 4, (last_at, audio_s)  # not held back to real time
    for _ in range(100):  # the handler closes its session just after the last byte
        if await metric(gateway, "gateway_sessions_active", protocol="openai") == 0:
            break
        await asyncio.sleep(0.02)
    assert await metric(gateway, "gateway_sessions_active", protocol="openai") == 0


@pytest.mark.parametrize(
    ("kwargs", "exception", "param"),
    [
        ({"voice": "no-such-voice"}, openai.BadRequestError, "voice"),
        ({"response_format": "aac"}, openai.BadRequestError, "response_format"),
        ({"instructions": "Speak cheerfully."}, openai.BadRequestError, "instructions"),
        ({"speed": 9.0}, openai.BadRequestError, "speed"),
        ({"input": "x" * 5000}, openai.BadRequestError, "input"),
    ],
)
async def test_bad_requests_are_the_sdks_errors(
    gateway: GatewayProcess, kwargs: dict[str, object], exception: type[Exception], param: str
) -> None:
    arguments: dict[str, object] = {
        "model": "tts-1",
        "voice": "alloy",
        "input": "Hello.",
        "response_format": "pcm",
        **kwargs,
    }
    async with client(gateway) as api:
        with pytest.raises(exception) as caught:
            await api.audio.speech.create(**arguments)  # type: ignore[arg-type]
    body = caught.value.body  # type: ignore[attr-defined]
    assert isinstance(body, dict) and body.get("param") == param, body


async def test_a_bad_key_is_an_authentication_error(gateway: GatewayProcess) -> None:
    async with client(gateway, token="not-a-jwt") as api:
        with pytest.raises(openai.AuthenticationError):
            await api.audio.speech.create(
                model="tts-1", voice="alloy", input="Hello.", response_format="pcm"
            )
