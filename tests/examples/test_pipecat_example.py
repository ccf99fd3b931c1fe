"""The Pipecat example (examples/pipecat) against a real gateway: ``VoiceGatewayTTSService``
inside a real Pipecat pipeline (``PipelineWorker`` + ``WorkerRunner``, Pipecat 1.14's
``PipelineTask`` + ``PipelineRunner``), text frames in, a sink collecting what comes out.

Checked: the audio's length against the gateway's ``utterance_done.audio_ms`` at 16 and
24 kHz, its level, ``TTSStartedFrame``/``TTSStoppedFrame`` around it, an interruption
mid-utterance (``clear``; the gateway's frames stop), keepalive, reconnection after the
gateway closes an idle session, gateway errors as ``ErrorFrame``\\s, and the example bot.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import subprocess
import sys
import time
import wave
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

pytest.importorskip(
    "pipecat.services.tts_service",
    reason="pipecat-ai is not installed: pip install -c constraints.txt -e '.[examples]'",
)

from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    Frame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    StartFrame,
    TextFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.utils.errors import ErrorCategory
from pipecat.workers.runner import WorkerRunner

from examples.pipecat.gateway_tts import VoiceGatewayTTSService
from tests.integration.harness import ROOT, GatewayProcess

pytestmark = pytest.mark.slow

F = TypeVar("F", bound=Frame)

IDLE_S = 2  # the gateway's idle timeout here, so that the idle tests take seconds
SENTENCES = [
    "Thank you for calling the service desk. ",
    "Your call is important to us, so please stay on the line. ",
]
# two sentences of about 10 s each
LONG = (
    "Please listen carefully, as our menu options have changed recently, and choose the "
    "option that best describes the reason for your call today, so that we can connect you "
    "with the right team without any delay. "
) * 2


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    log = tmp_path_factory.mktemp("gateway") / "gateway.log"
    gw = GatewayProcess(log, GATEWAY_IDLE_TIMEOUT_S=str(IDLE_S), ENGINE_VAD="0")
    gw.start()
    yield gw
    gw.stop()


class RecordingTTS(VoiceGatewayTTSService):
    """The service, recording what crosses its WebSocket and when."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.audio_in: list[tuple[float, int]] = []  # (arrival, bytes) per binary frame
        self.events_in: list[tuple[float, dict[str, Any]]] = []
        self.sent: list[tuple[float, dict[str, Any]]] = []
        self.sessions: list[str | None] = []

    async def _on_audio(self, audio: bytes) -> None:
        self.audio_in.append((time.monotonic(), len(audio)))
        await super()._on_audio(audio)

    async def _on_event(self, event: dict[str, Any]) -> None:
        self.events_in.append((time.monotonic(), event))
        await super()._on_event(event)

    async def _send(self, message: dict[str, Any]) -> None:
        self.sent.append((time.monotonic(), message))
        await super()._send(message)

    async def _connect_websocket(self) -> None:
        await super()._connect_websocket()
        if self._websocket is not None and self.session_id not in self.sessions:
            self.sessions.append(self.session_id)

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [e for _, e in self.events_in if e.get("type") == kind]

    def sent_of(self, kind: str) -> list[tuple[float, dict[str, Any]]]:
        return [(t, m) for t, m in self.sent if m.get("type") == kind]


class CollectingSink(FrameProcessor):
    """Every frame that reaches the end of the pipeline, with its arrival time."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[tuple[float, Frame]] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction is FrameDirection.DOWNSTREAM and not isinstance(frame, StartFrame):
            self.frames.append((time.monotonic(), frame))
        await self.push_frame(frame, direction)

    def of(self, kind: type[F]) -> list[F]:
        return [f for _, f in self.frames if isinstance(f, kind)]

    def audio(self) -> list[TTSAudioRawFrame]:
        return [f for _, f in self.frames if isinstance(f, TTSAudioRawFrame)]

    def audio_seconds(self) -> float:
        return sum(f.num_frames / f.sample_rate for f in self.audio())


@dataclass
class Running:
    worker: PipelineWorker
    tts: RecordingTTS
    sink: CollectingSink
    run: asyncio.Task[None]
    errors: list[ErrorFrame] = field(default_factory=list)

    async def say(self, *texts: str) -> None:
        """The texts as one LLM reply."""
        frames: list[Frame] = [LLMFullResponseStartFrame()]
        frames += [TextFrame(text) for text in texts]
        frames.append(LLMFullResponseEndFrame())
        await self.worker.queue_frames(frames)

    async def finish(self, timeout: float = 30.0) -> None:
        await self.worker.queue_frame(EndFrame())
        await asyncio.wait_for(asyncio.shield(self.run), timeout)


@contextlib.asynccontextmanager
async def pipeline(
    gw: GatewayProcess, sample_rate: int = 16000, **tts_kwargs: Any
) -> AsyncIterator[Running]:
    tts_kwargs.setdefault("keepalive_interval_s", 0.5)  # under the gateway's idle timeout
    tts = RecordingTTS(url=gw.ws_url, token=gw.token(), sample_rate=sample_rate, **tts_kwargs)
    sink = CollectingSink()
    worker = PipelineWorker(
        Pipeline([tts, sink]),
        params=PipelineParams(audio_out_sample_rate=sample_rate),
        enable_rtvi=False,
        idle_timeout_secs=None,
    )
    started = asyncio.Event()
    errors: list[ErrorFrame] = []

    async def on_started(_worker: PipelineWorker, _frame: Frame) -> None:
        started.set()

    async def on_error(_worker: PipelineWorker, frame: ErrorFrame) -> None:
        errors.append(frame)

    worker.add_event_handler("on_pipeline_started", on_started)
    worker.add_event_handler("on_pipeline_error", on_error)

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    run = asyncio.create_task(runner.run())
    try:
        await asyncio.wait_for(started.wait(), 15)
        yield Running(worker, tts, sink, run, errors)
    finally:
        if not run.done():
            await worker.cancel()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(run, 10)


async def until(condition: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout} s")
        await asyncio.sleep(0.01)


def dbfs(frames: list[TTSAudioRawFrame]) -> float:
    pcm = np.frombuffer(b"".join(f.audio for f in frames), dtype="<i2").astype(np.float64)
    rms = float(np.sqrt(np.mean((pcm / 32768.0) ** 2)))
    return 20 * math.log10(max(rms, 1e-9))


@pytest.mark.parametrize("sample_rate", [16000, 24000])
async def test_a_reply_is_spoken_at_the_reported_length_and_level(
    gateway: GatewayProcess, sample_rate: int
) -> None:
    async with pipeline(gateway, sample_rate) as p:
        await p.say(*SENTENCES)
        await p.finish()

    assert p.errors == []
    speaks = [m for _, m in p.tts.sent_of("speak")]
    assert [m["text"].strip() for m in speaks] == [s.strip() for s in SENTENCES]
    done = p.tts.events("utterance_done")
    assert [d["utterance_id"] for d in done] == [m["utterance_id"] for m in speaks]

    audio = p.sink.audio()
    assert audio and {f.sample_rate for f in audio} == {sample_rate}
    assert {f.num_channels for f in audio} == {1}
    # nothing lost or added between the WebSocket and the end of the pipeline
    assert sum(len(f.audio) for f in audio) == sum(n for _, n in p.tts.audio_in)
    reported_ms = sum(d["audio_ms"] for d in done)
    # the last frame of each utterance is padded to 20 ms
    assert abs(p.sink.audio_seconds() * 1000 - reported_ms) <= 40, (reported_ms, len(audio))
    assert reported_ms > 2000
    assert dbfs(audio) > -35

    # one audio context for the reply: TTSStartedFrame, its audio, TTSStoppedFrame
    started, stopped = p.sink.of(TTSStartedFrame), p.sink.of(TTSStoppedFrame)
    assert len(started) == 1 and len(stopped) == 1
    kinds = [f for _, f in p.sink.frames]
    first_audio = next(i for i, f in enumerate(kinds) if isinstance(f, TTSAudioRawFrame))
    last_audio = max(i for i, f in enumerate(kinds) if isinstance(f, TTSAudioRawFrame))
    assert kinds.index(started[0]) < first_audio and last_audio < kinds.index(stopped[0])
    context_ids = {f.context_id for f in audio}
    assert context_ids == {started[0].context_id} == {stopped[0].context_id}


@pytest.mark.realtime  # clear timing: runs alone
async def test_an_interruption_mid_utterance_sends_clear_and_stops_the_audio(
    gateway: GatewayProcess,
) -> None:
    async with pipeline(gateway) as p:
        await p.say(LONG)
        # burst pacing sends 2 s ahead, then in real time: be well into the first sentence
        await until(lambda: p.sink.audio_seconds() > 3.0)
        assert not p.tts.events("utterance_done")
        await p.worker.queue_frame(InterruptionFrame())
        await until(lambda: p.tts.sent_of("clear") and p.tts.events("cleared"))
        cleared_at = p.tts.sent_of("clear")[0][0]
        await asyncio.sleep(0.6)
        received_after = [t - cleared_at for t, _ in p.tts.audio_in if t > cleared_at]
        assert not received_after or max(received_after) < 0.1, received_after
        # nothing of the interrupted reply gets past the service after the interruption
        interrupted_at = next(t for t, f in p.sink.frames if isinstance(f, InterruptionFrame))
        late = [
            t for t, f in p.sink.frames if isinstance(f, TTSAudioRawFrame) and t > interrupted_at
        ]
        assert not late
        spoken_s = p.sink.audio_seconds()
        assert 3.0 < spoken_s < 5.0  # of a reply of about 21 s

        # the session goes on: the next reply is spoken in full
        await p.say(SENTENCES[0])
        await p.finish()

    assert p.errors == []
    assert len(p.tts.sessions) == 1
    done = p.tts.events("utterance_done")
    assert len(done) == 1 and not done[0].get("cancelled")
    after = [f for t, f in p.sink.frames if t > interrupted_at and isinstance(f, TTSAudioRawFrame)]
    assert abs(sum(f.num_frames for f in after) / 16 - done[0]["audio_ms"]) <= 20
    assert len(p.sink.of(TTSStartedFrame)) == 2 and len(p.sink.of(TTSStoppedFrame)) == 1


async def test_an_interruption_spares_uninterruptible_speech(gateway: GatewayProcess) -> None:
    async with pipeline(gateway) as p:
        await p.say(LONG)
        notice = TTSSpeakFrame(SENTENCES[0])
        notice.interruptible = False
        await p.worker.queue_frame(notice)
        await until(lambda: p.sink.audio_seconds() > 3.0)
        await p.worker.queue_frame(InterruptionFrame())
        await until(lambda: p.sink.of(TTSStoppedFrame))
        await p.finish()

    assert p.errors == []
    # not clear, which would drop the notice too, but cancel for each sentence of the reply
    assert not p.tts.sent_of("clear")
    speaks = [m["utterance_id"] for _, m in p.tts.sent_of("speak")]
    assert {m["utterance_id"] for _, m in p.tts.sent_of("cancel")} == set(speaks[:-1])
    done = {d["utterance_id"]: d for d in p.tts.events("utterance_done")}
    assert not done[speaks[-1]].get("cancelled")
    stopped = p.sink.of(TTSStoppedFrame)
    assert len(stopped) == 1
    notice_audio = [f for f in p.sink.audio() if f.context_id == stopped[0].context_id]
    notice_ms = sum(f.num_frames for f in notice_audio) / 16
    assert notice_ms > 1000 and abs(notice_ms - done[speaks[-1]]["audio_ms"]) <= 20


async def test_keepalive_holds_an_idle_session(gateway: GatewayProcess) -> None:
    async with pipeline(gateway, keepalive_interval_s=0.5) as p:
        await asyncio.sleep(IDLE_S + 1.5)
        await p.say(SENTENCES[0])
        await p.finish()
    assert p.errors == []
    assert len(p.tts.sessions) == 1
    assert len(p.tts.sent_of("keepalive")) >= 4
    assert len(p.tts.events("utterance_done")) == 1 and p.sink.audio_seconds() > 1


async def test_a_session_the_gateway_closes_is_reconnected(gateway: GatewayProcess) -> None:
    async with pipeline(gateway, keepalive_interval_s=None) as p:
        await until(lambda: len(p.tts.sessions) == 2, timeout=IDLE_S + 8)  # idle_timeout
        await p.say(SENTENCES[0])
        await p.finish()
    assert p.errors == []  # an idle timeout is not an error: the service reconnects
    assert len(set(p.tts.sessions)) == 2
    assert len(p.tts.events("utterance_done")) == 1 and p.sink.audio_seconds() > 1


async def test_gateway_errors_become_error_frames(gateway: GatewayProcess) -> None:
    async with pipeline(gateway, voice="no-such-voice") as p:
        await until(lambda: p.errors)
        await p.finish()
    assert "unknown_voice" in p.errors[0].error
    assert p.errors[0].category is ErrorCategory.INVALID_REQUEST
    assert not p.tts.is_usable  # a voice the gateway does not have stays unknown


def test_the_example_bot_writes_a_wav(gateway: GatewayProcess, tmp_path: Path) -> None:
    out = tmp_path / "out.wav"
    result = subprocess.run(
        [sys.executable, "-m", "examples.pipecat.bot", "--url", gateway.ws_url,
         "--token", gateway.token(), "--sample-rate", "24000", "--out", str(out), *SENTENCES],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    with wave.open(str(out), "rb") as wav:
        assert wav.getframerate() == 24000 and wav.getnchannels() == 1
        assert wav.getnframes() / 24000 > 2.0
