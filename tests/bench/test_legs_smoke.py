"""The telephony-leg drivers of the load generator work against a real gateway: two calls
over each of chan_websocket, jambonz, FreeSWITCH and AudioSocket at once, two short
prompts each with caller audio streaming, a few seconds in all; then one level through
the load generator's worker processes and the legs benchmark's row and table.

This tests the instrument, not the gateway's performance. The jambonz tail and the
FreeSWITCH remainder, which may arrive before or after the application's
``utterance_done``, are checked without a gateway in both orders.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.bench import legs, stats
from tests.bench.calls import (
    DRIVERS,
    L16_SILENCE,
    CallDriver,
    CallSpec,
    FreeSwitchCall,
    JambonzCall,
)
from tests.bench.loadgen import LoadOptions, run_level
from tests.bench.recorder import Recorder
from tests.bench.script import Behaviour, converse, open_call
from tests.bench.targets import GatewayTarget

pytestmark = [pytest.mark.timeout(120), pytest.mark.realtime]

Leg = TypeVar("Leg", JambonzCall, FreeSwitchCall)
NEW_LEGS = ("asterisk", "jambonz", "freeswitch", "audiosocket")
CALLS = 2
PROMPTS = 2


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayTarget]:
    gw = GatewayTarget(
        tmp_path_factory.mktemp("legs-gateway"),
        env={"GATEWAY_TENANT_MAX_STREAMS": "50", "GATEWAY_AUDIOSOCKET_VOICE": "en-us"},
    )
    gw.start()
    yield gw
    gw.stop()


async def _run_calls(target: GatewayTarget) -> dict[str, tuple[Recorder, list[CallDriver]]]:
    """``CALLS`` calls per new leg, all at once, in this process."""
    token = target.token(max_streams=50)
    spec = CallSpec(
        url=target.ws_url,
        token=token,
        voice="en-us",
        caller_audio=True,
        audiosocket_target=target.audiosocket_target,
    )
    runs: dict[str, tuple[Recorder, list[CallDriver]]] = {}
    for protocol in NEW_LEGS:
        recorder = Recorder()
        runs[protocol] = (recorder, [DRIVERS[protocol](spec, recorder) for _ in range(CALLS)])
    everyone = [d for _, drivers in runs.values() for d in drivers]
    opened = await asyncio.gather(*(open_call(d, 0.0) for d in everyone))
    assert all(opened), {p: dict(r.errors) for p, (r, _) in runs.items()}

    async def caller_audio() -> None:
        next_at = time.monotonic()
        while True:
            for d in everyone:
                d.send_caller_audio()
            next_at += 0.020
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    pump = asyncio.create_task(caller_audio())
    behaviour = Behaviour(think_min_s=0.05, think_max_s=0.2, max_prompts=PROMPTS)
    end = time.monotonic() + 30.0
    try:
        await asyncio.gather(
            *(converse(d, behaviour, end, random.Random(i)) for i, d in enumerate(everyone))
        )
    finally:
        pump.cancel()
    for recorder, drivers in runs.values():
        recorder.calls_completed = sum(1 for d in drivers if d.completed)
    await asyncio.gather(*(d.close() for d in everyone))
    return runs


@pytest.fixture(scope="module")
def results(target: GatewayTarget) -> dict[str, dict[str, Any]]:
    runs = asyncio.run(_run_calls(target))
    return {
        protocol: stats.summarize_client(stats.merge_exports([recorder.export()]))
        for protocol, (recorder, _) in runs.items()
    }


@pytest.mark.parametrize("protocol", NEW_LEGS)
def test_every_call_spoke_its_prompts(results: dict[str, dict[str, Any]], protocol: str) -> None:
    client = results[protocol]
    n = CALLS * PROMPTS
    assert client["sessions_ready"] == CALLS and client["sessions_failed"] == 0
    assert client["calls_completed"] == CALLS
    assert client["utterances"] == {"speaks": n, "completed": n, "unfinished": 0, "no_audio": 0}
    assert client["errors"] == {}
    assert client["stray_frames"] == 0
    assert client["setup_ms"]["p50"] is not None  # the leg's connect


@pytest.mark.parametrize("protocol", NEW_LEGS)
def test_audio_is_paced_and_plausible(results: dict[str, dict[str, Any]], protocol: str) -> None:
    client = results[protocol]
    n = CALLS * PROMPTS
    message_ms = 100 if protocol == "freeswitch" else 20
    assert client["bad_size_frames"] == 0  # FreeSWITCH's short remainder is counted apart
    assert 0.5 * message_ms < client["gap_ms"]["p50"] < 1.5 * message_ms
    assert client["frames"] * message_ms > n * 500  # a prompt is longer than half a second
    assert 0 <= client["run_ahead_ms"]["max"] <= 60 + 40  # the gateway's lead, plus slack
    assert 0 < client["first_audio_ms"]["p50"] < 2000
    if protocol == "jambonz":  # every utterance's 160 ms of silence, set apart
        assert client["tail_frames"] == n * JambonzCall.TAIL_FRAMES
    elif protocol == "freeswitch":  # at most one short remainder per utterance
        assert client["tail_frames"] <= n
    else:
        assert client["tail_frames"] == 0


def test_a_level_through_the_worker_processes_makes_a_row(
    target: GatewayTarget, tmp_path: Path
) -> None:
    """The FreeSWITCH leg (the odd one: 100 ms messages) through run_level, then the legs
    benchmark's row and table."""
    opts = LoadOptions(
        duration_s=20.0,
        protocol="freeswitch",
        think_min_s=0.05,
        think_max_s=0.2,
        max_prompts=1,
        caller_audio=True,
        voices=("en-us",),
        settle_s=0.2,
        sample_s=0.5,
        progress_s=60.0,
        drain_s=5.0,
    )
    level = run_level(target, 1, opts, log=lambda _line: None)
    row = legs.summary("freeswitch", level)
    assert row["ready"] == row["completed"] == 1
    assert row["frame_ms"] == 100 and 50 < row["interval_p50_ms"] < 150
    assert row["server_cpu_pct"] > 0 and isinstance(row["underruns"], int)
    sent = level["server"]["frames_sent"]  # 20 ms frames; the leg got 100 ms messages
    client = level["client"]
    assert client["frames"] * 5 <= sent <= client["frames"] * 5 + 4 * client["tail_frames"]
    twilio = {**row, "protocol": "twilio", "frame_ms": 20}
    rows = [twilio, row, {"protocol": "sip", "calls": 1, "failed": "RuntimeError('x')"}]
    legs.add_ratios(rows)
    assert rows[1]["cpu_per_call_vs_twilio"] == 1.0
    body = {
        "module": "tests.bench.legs",
        "command": "smoke",
        "machine": "m",
        "revision": "r",
        "started": "now",
        "calls": 1,
        "duration_s": 20.0,
        "rows": rows,
    }
    text = legs.render(body)
    assert text.startswith("<!-- generated by python -m tests.bench.legs:")
    assert "**Smoke run**" in text and "| freeswitch (per 100 ms) | 1 | 1 / 1 |" in text
    assert "| sip | 1 | failed:" in text


# --- the tail race, without a gateway ---------------------------------------------------


def _attached(cls: type[Leg]) -> tuple[Leg, Recorder]:
    recorder = Recorder()
    spec = CallSpec(url="ws://127.0.0.1:1/v1/stream", token=None, voice="en-us")
    driver = cls(spec, recorder)
    recorder.frame_s, recorder.frame_bytes = driver.frame_s, driver.frame_bytes
    return driver, recorder


SPEECH = b"\x01\x00" * 160


@pytest.mark.parametrize("before_done", [0, 1, 5, 8])
def test_the_jambonz_tail_is_set_apart_whichever_socket_is_read_first(
    before_done: int,
) -> None:
    """``before_done`` of the tail's frames are read before the application's
    ``utterance_done``, right behind the prompt's last (silent) frame; the rest after it."""
    driver, recorder = _attached(JambonzCall)
    driver._probe = recorder.probe("u0", 0.0)
    frames = [SPEECH, SPEECH, L16_SILENCE, L16_SILENCE, SPEECH, L16_SILENCE, L16_SILENCE]
    for i, payload in enumerate(frames):  # a prompt ending in its own silence
        driver.on_binary(1.0 + i * 0.02, payload)
    tail_at = 1.0 + (len(frames) - 1) * 0.02 + 0.0001  # written in the same tick
    reads = [tail_at + (0.0005 if k >= 3 else 0.0) for k in range(JambonzCall.TAIL_FRAMES)]
    for t in reads[:before_done]:
        driver.on_binary(t, L16_SILENCE)
    driver._utterance_done("u0", None)
    assert driver._done is None and recorder.completed == 0  # (no speak() here)
    for t in reads[before_done:]:
        driver.on_binary(t, L16_SILENCE)
    driver._end_utterance()  # the next prompt
    assert recorder.completed == 1 and recorder.frames == len(frames)
    assert recorder.tail_frames == JambonzCall.TAIL_FRAMES and recorder.stray_frames == 0
    assert list(recorder.gaps) == pytest.approx([0.02] * (len(frames) - 1))
    driver.on_binary(tail_at + 1, L16_SILENCE)  # outside any utterance: stray
    assert recorder.stray_frames == 1


@pytest.mark.parametrize("remainder_first", [False, True])
def test_the_freeswitch_remainder_is_set_apart_whichever_socket_is_read_first(
    remainder_first: bool,
) -> None:
    driver, recorder = _attached(FreeSwitchCall)

    def message(pcm_bytes: int) -> str:
        audio = base64.b64encode(bytes(pcm_bytes)).decode("ascii")
        data = {"audioDataType": "raw", "sampleRate": 8000, "audioData": audio}
        return json.dumps({"type": "streamAudio", "data": data})

    driver._probe = recorder.probe("u0", 0.0)
    for i in range(3):
        driver.on_text(1.0 + i * 0.1, message(1600))
    if remainder_first:
        driver.on_text(1.25, message(639))
    driver._utterance_done("u0", None)
    if not remainder_first:
        driver.on_text(1.25, message(639))
    assert recorder.frames == 3 and recorder.tail_frames == 1 and recorder.stray_frames == 0
    assert recorder.bad_size_frames == 0
    assert list(recorder.gaps) == pytest.approx([0.1, 0.1])
