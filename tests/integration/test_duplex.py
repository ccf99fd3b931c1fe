"""Duplex sessions end to end: caller audio in, barge-in out (native protocol)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from telephony.codecs import g711
from tests.integration import caller_audio
from tests.integration.conftest import Connect
from tests.integration.harness import NativeClient

MENU = "Please listen carefully, as our menu options have changed. " * 4


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    return caller_audio.espeak_speech()


async def stream_caller_audio(
    client: NativeClient, pcm: np.ndarray, *, stop_on_barge_in: bool = True
) -> float:
    """Send ``pcm`` as real-time 20 ms mu-law frames; returns the start time."""
    start = time.monotonic()
    for i, frame in enumerate(caller_audio.frames(pcm)):
        await client.ws.send_bytes(g711.ulaw_encode(frame))
        await asyncio.sleep(max(0.0, start + (i + 1) * 0.02 - time.monotonic()))
        if stop_on_barge_in and client.got.of_type("barge_in"):
            break
    return start


@pytest.mark.realtime  # barge-in timing: runs alone (Makefile)
async def test_caller_speech_interrupts_playback_within_300_ms(
    connect: Connect, speech: np.ndarray
) -> None:
    client = await connect()
    await client.start("en-us", "mulaw_8000", input_format="mulaw_8000")
    await client.send(type="speak", text=MENU, utterance_id="menu")
    await client.send(type="mark", name="after-menu")
    await client.wait_event("utterance_started")
    lead_in = 1.0
    start = await stream_caller_audio(
        client, np.concatenate([caller_audio.silence(lead_in), speech])
    )
    barge = await client.wait_event("barge_in", timeout=5)
    barge_at = next(t for t, e in client.got.events if e is barge)
    onset = start + lead_in
    assert barge_at - onset <= 0.300, barge_at - onset
    mark = await client.wait_event("mark", name="after-menu")
    assert mark["cleared"] is True
    await asyncio.sleep(0.3)
    assert [t for t, _ in client.got.frames if t > barge_at + 0.020] == []
    assert not client.got.of_type("utterance_done")
    # The session goes on: the next prompt plays in full.
    frames_before = len(client.got.frames)
    await client.send(type="speak", text="How can I help?", utterance_id="next")
    done = await client.wait_event("utterance_done", utterance_id="next")
    assert abs((len(client.got.frames) - frames_before) * 20 - done["audio_ms"]) <= 20


@pytest.mark.parametrize(
    "name,signal",
    [
        ("noise", lambda: caller_audio.white_noise(3.0, rms=1000)),
        ("dtmf", lambda: caller_audio.dtmf("123#", tone_s=0.2)),
    ],
)
async def test_noise_and_dtmf_do_not_interrupt(connect: Connect, name: str, signal) -> None:
    client = await connect()
    await client.start("en-us", "mulaw_8000", input_format="mulaw_8000")
    await client.send(type="speak", text=MENU[:120], utterance_id="p")
    await client.wait_event("utterance_started")
    await stream_caller_audio(client, signal())
    assert client.got.of_type("barge_in") == []
    await client.wait_event("utterance_done", timeout=20)


async def test_barge_in_off_keeps_playing(connect: Connect, speech: np.ndarray) -> None:
    client = await connect()
    await client.start("en-us", "mulaw_8000", input_format="mulaw_8000", barge_in=False)
    await client.send(type="speak", text=MENU[:100], utterance_id="p")
    await client.wait_event("utterance_started")
    await stream_caller_audio(client, speech[: 8000 * 2], stop_on_barge_in=False)
    done = await client.wait_event("utterance_done", timeout=20)
    assert client.got.of_type("barge_in") == []
    assert abs(len(client.got.frames) * 20 - done["audio_ms"]) <= 20


async def test_binary_without_input_format_is_refused(connect: Connect) -> None:
    client = await connect()
    await client.start("en-us", "mulaw_8000")
    await client.ws.send_bytes(bytes(160))
    error = await client.wait_event("error")
    assert error["code"] == "unexpected_binary"
