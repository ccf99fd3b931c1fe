"""A minimal Pipecat pipeline whose TTS is the gateway: text in, a WAV file out.

    python -m examples.pipecat.bot --url ws://127.0.0.1:8080/v1/stream --token "$TOKEN" \\
        --out out.wav "Hello, thank you for calling." "How can I help you today?"

The texts go in as one LLM reply (``LLMFullResponseStartFrame``, ``TextFrame``\\s,
``LLMFullResponseEndFrame``), as an LLM service would push them; ``VoiceGatewayTTSService``
speaks them and :class:`WavFileSink` writes the audio it produces. No other service,
transport or API key is involved.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import wave
from pathlib import Path

from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    Frame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    TextFrame,
    TTSAudioRawFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.workers.runner import WorkerRunner

from examples.pipecat.gateway_tts import VoiceGatewayTTSService

DEFAULT_TEXT = "Thank you for calling. Your call is important to us. Please hold."


class WavFileSink(FrameProcessor):
    """Collects the TTS audio that reaches it and writes it as a WAV file at the end."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.sample_rate = 0
        self.audio = bytearray()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame):
            self.sample_rate = frame.sample_rate
            self.audio += frame.audio
        elif isinstance(frame, EndFrame):
            self.write()
        await self.push_frame(frame, direction)

    def write(self) -> None:
        with wave.open(str(self.path), "wb") as wav:
            wav.setnchannels(1)
            wav.setsampwidth(2)
            wav.setframerate(self.sample_rate or 16000)
            wav.writeframes(bytes(self.audio))


async def speak_to_wav(
    url: str, token: str, texts: list[str], out: Path, *, voice: str, sample_rate: int
) -> list[ErrorFrame]:
    """Speak ``texts`` through the gateway into ``out``; returns the errors reported."""
    tts = VoiceGatewayTTSService(url=url, token=token, voice=voice, sample_rate=sample_rate)
    sink = WavFileSink(out)
    worker = PipelineWorker(
        Pipeline([tts, sink]),
        params=PipelineParams(audio_out_sample_rate=sample_rate),
        enable_rtvi=False,
        idle_timeout_secs=None,
    )
    errors: list[ErrorFrame] = []

    async def on_pipeline_started(_worker: PipelineWorker, _frame: Frame) -> None:
        frames: list[Frame] = [LLMFullResponseStartFrame()]
        frames += [TextFrame(text if text.endswith(" ") else text + " ") for text in texts]
        frames += [LLMFullResponseEndFrame(), EndFrame()]  # EndFrame: finish, then stop
        await worker.queue_frames(frames)

    async def on_pipeline_error(_worker: PipelineWorker, frame: ErrorFrame) -> None:
        errors.append(frame)

    worker.add_event_handler("on_pipeline_started", on_pipeline_started)
    worker.add_event_handler("on_pipeline_error", on_pipeline_error)

    runner = WorkerRunner(handle_sigint=True)
    await runner.add_workers(worker)
    await runner.run()
    return errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="ws://127.0.0.1:8080/v1/stream")
    parser.add_argument(
        "--token",
        default=os.environ.get("GATEWAY_TOKEN"),
        help="gateway JWT with scope tts:stream (default: $GATEWAY_TOKEN)",
    )
    parser.add_argument("--voice", default="en-us")
    parser.add_argument("--sample-rate", type=int, default=16000, choices=(16000, 24000))
    parser.add_argument("--out", type=Path, default=Path("out.wav"))
    parser.add_argument("text", nargs="*", default=[DEFAULT_TEXT])
    args = parser.parse_args(argv)
    if not args.token:
        parser.error("--token (or GATEWAY_TOKEN) is required")
    errors = asyncio.run(
        speak_to_wav(
            args.url,
            args.token,
            args.text,
            args.out,
            voice=args.voice,
            sample_rate=args.sample_rate,
        )
    )
    for error in errors:
        print(f"error: {error.error}", file=sys.stderr)
    with wave.open(str(args.out), "rb") as wav:
        seconds = wav.getnframes() / wav.getframerate()
    print(f"wrote {args.out}: {seconds:.2f} s at {args.sample_rate} Hz")
    return 1 if errors or seconds == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
