"""A deliberately naive TTS server: the design this project replaces, as a yardstick.

    python -m tests.bench.baseline_server [--host 127.0.0.1] [--port 8090]

It speaks the subset of the native protocol (docs/protocol.md) the load generator
uses: ``start`` -> ``ready``, ``speak`` -> ``utterance_started``, binary mu-law frames,
``utterance_done``, ``close`` -> close 1000, ``error`` ``unexpected_binary`` /
``unknown_type`` / ``invalid_message`` / ``unsupported_format`` / ``backend_error``.
Only ``mulaw_8000`` output. **No authentication**: any token, or none, is accepted
(it is a benchmark yardstick, bound to 127.0.0.1 by default; never expose it).

Naive on purpose, the way the replaced design did it:

- a new thread per ``speak`` request, which synthesizes the *whole* utterance before any
  audio goes out (no streaming, so first audio waits for the last sample);
- one espeak-ng instance per process (espeak keeps global state and is not thread-safe),
  so the threads take turns on one lock: requests queue behind each other;
- the whole utterance is resampled to 8 kHz and mu-law encoded in one go;
- one asyncio task per stream sends the frames with
  ``await ws.send_bytes(frame); await asyncio.sleep(0.02)``: a sleep per frame per
  stream, so every frame adds the sleep's overshoot and the send time, and the stream
  drifts behind the wall clock (no absolute deadlines, no lead).

It runs on uvloop when installed, like the gateway, so that a comparison measures the
design and not the event loop. ``/readyz`` answers 200 once espeak is loaded; there is
no ``/metrics``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from aiohttp import WSMsgType, web

from engine.backends.base import BackendError, PcmChunk, VoiceSettings
from engine.backends.espeak import EspeakBackend
from engine.text import normalize
from telephony.codecs.g711 import ulaw_encode
from telephony.codecs.resample import StreamingResampler

log = logging.getLogger("baseline")
FRAME_BYTES = 160  # 20 ms of mu-law at 8 kHz
FRAME_S = 0.020
MULAW_SILENCE = 0xFF


class NaiveSynthesizer:
    """Whole-utterance synthesis, one request at a time (a lock around espeak)."""

    def __init__(self) -> None:
        self._backend = EspeakBackend()
        self._lock = threading.Lock()

    def voice_ids(self) -> set[str]:
        return {v.id for v in self._backend.voices()}

    def mulaw(self, text: str, voice_id: str) -> bytes:
        """The whole utterance as mu-law 8 kHz, padded with silence to whole frames."""
        chunks: list[PcmChunk] = []

        def collect(chunk: PcmChunk) -> bool:
            chunks.append(chunk)
            return True

        with self._lock:
            voice = self._backend.resolve_voice(VoiceSettings(voice_id))
            self._backend.synthesize(normalize(text), voice, collect)
        pcm = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int16)
        resampler = StreamingResampler(self._backend.native_sample_rate, 8000)
        audio = ulaw_encode(resampler.process(pcm.astype("<i2").tobytes()) + resampler.flush())
        pad = -len(audio) % FRAME_BYTES
        return audio + bytes([MULAW_SILENCE]) * pad


@dataclass
class Utterance:
    utterance_id: str
    requested_at: float
    audio: asyncio.Future[bytes]


SYNTH_KEY = web.AppKey("synth", NaiveSynthesizer)


def synthesize_in_thread(
    synth: NaiveSynthesizer, text: str, voice: str, result: asyncio.Future[bytes]
) -> None:
    """Start a thread for one request; it hands the audio back to the event loop."""
    loop = result.get_loop()

    def deliver(audio: bytes | None, exc: BaseException | None) -> None:
        if result.done():
            return
        if exc is not None:
            result.set_exception(exc)
        else:
            assert audio is not None
            result.set_result(audio)

    def work() -> None:
        try:
            audio = synth.mulaw(text, voice)
        except Exception as exc:
            with contextlib.suppress(RuntimeError):  # loop already closed
                loop.call_soon_threadsafe(deliver, None, exc)
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(deliver, audio, None)

    threading.Thread(target=work, name="synth", daemon=True).start()


async def send_utterances(
    ws: web.WebSocketResponse, queue: asyncio.Queue[Utterance | None]
) -> None:
    """The stream's task: each utterance in turn, a sleep after every frame."""
    while True:
        item = await queue.get()
        if item is None:
            await ws.close(code=1000)
            return
        try:
            audio = await item.audio
        except BackendError as exc:
            await _send(ws, type="error", code="backend_error", message=exc.message)
            audio = b""
        await _send(ws, type="utterance_started", utterance_id=item.utterance_id)
        first_frame_at = time.monotonic()
        for i in range(0, len(audio), FRAME_BYTES):
            await ws.send_bytes(audio[i : i + FRAME_BYTES])
            await asyncio.sleep(FRAME_S)
        await _send(
            ws,
            type="utterance_done",
            utterance_id=item.utterance_id,
            audio_ms=len(audio) // 8,
            first_audio_ms=round((first_frame_at - item.requested_at) * 1000),
        )


async def _send(ws: web.WebSocketResponse, **message: Any) -> None:
    await ws.send_str(json.dumps(message, ensure_ascii=False))


async def stream(request: web.Request) -> web.StreamResponse:
    synth = request.app[SYNTH_KEY]
    ws = web.WebSocketResponse(max_msg_size=65536)
    await ws.prepare(request)
    queue: asyncio.Queue[Utterance | None] = asyncio.Queue()
    sender: asyncio.Task[None] | None = None
    voice: str | None = None
    input_format: str | None = None
    counter = 0
    closing = False
    loop = asyncio.get_running_loop()
    try:
        async for msg in ws:
            if msg.type is WSMsgType.BINARY:
                if input_format is None:
                    await _send(ws, type="error", code="unexpected_binary", message="no input")
                continue
            if msg.type is not WSMsgType.TEXT:
                break
            try:
                message = json.loads(msg.data)
                kind = message["type"]
            except (ValueError, KeyError, TypeError):
                await _send(ws, type="error", code="invalid_message", message="bad message")
                continue
            if kind == "start" and voice is None:
                if message.get("format") != "mulaw_8000" or message.get("voice") not in (
                    synth.voice_ids()
                ):
                    await _send(ws, type="error", code="unsupported_format", message="no")
                    await ws.close(code=1008)
                    break
                voice = str(message["voice"])
                input_format = message.get("input_format")
                sender = asyncio.create_task(send_utterances(ws, queue))
                await _send(
                    ws, type="ready", session_id=f"b{id(ws):x}", format="mulaw_8000",
                    sample_rate=8000, frame_ms=20,
                )  # fmt: skip
            elif kind == "speak" and voice is not None:
                counter += 1
                uid = str(message.get("utterance_id") or f"u{counter}")
                item = Utterance(uid, time.monotonic(), loop.create_future())
                synthesize_in_thread(synth, str(message.get("text", "")), voice, item.audio)
                queue.put_nowait(item)
            elif kind == "close" and voice is not None:
                closing = True
                queue.put_nowait(None)
            else:
                await _send(ws, type="error", code="unknown_type", message=str(kind))
        if sender is not None and closing:  # the sender is closing the socket: let it
            with contextlib.suppress(TimeoutError, ConnectionError):
                async with asyncio.timeout(5.0):
                    await asyncio.shield(sender)
    finally:
        if sender is not None:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await sender
    return ws


async def readyz(_request: web.Request) -> web.Response:
    return web.json_response({"ready": True, "engine_pid": None})


def create_app() -> web.Application:
    app = web.Application()
    app[SYNTH_KEY] = NaiveSynthesizer()
    app.router.add_get("/v1/stream", stream)
    app.router.add_get("/readyz", readyz)
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    web.run_app(create_app(), host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
