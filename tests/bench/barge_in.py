"""Barge-in latency: caller speech onset to ``barge_in``, native duplex sessions.

    python -m tests.bench.barge_in [--trials 20] [--background 0 50]

Starts a real gateway with its espeak engine and the Silero VAD. Each trial opens a
duplex session (``input_format`` mu-law), starts a long prompt, streams 1 s of caller
silence and then espeak speech in real time (20 ms frames), and measures from the first
speech frame sent to the ``barge_in`` event received; it also checks that no audio frame
arrived more than one frame after ``barge_in``. ``--background N`` runs N more duplex
sessions at the same time, each speaking prompts in a loop while streaming caller
silence, so the VAD batch and the pacer are busy. Onset here is the start of the speech
clip, whose first milliseconds may be quiet: the figure is an upper bound. A benchmark,
not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from telephony.codecs import g711
from tests.integration import caller_audio
from tests.integration.harness import GatewayProcess, NativeClient

MENU = "Please listen carefully, as our menu options have changed. " * 4
LEAD_IN_S = 1.0


async def _stream(client: NativeClient, pcm: np.ndarray, stop: asyncio.Event | None) -> float:
    start = time.monotonic()
    for i, frame in enumerate(caller_audio.frames(pcm)):
        if client.ws.closed:
            break
        await client.ws.send_bytes(g711.ulaw_encode(frame))
        await asyncio.sleep(max(0.0, start + (i + 1) * 0.02 - time.monotonic()))
        if client.got.of_type("barge_in") or (stop is not None and stop.is_set()):
            break
    return start


async def one_trial(gw: GatewayProcess, speech: np.ndarray) -> tuple[float, int]:
    """(onset -> barge_in seconds, frames that arrived more than 20 ms after it)."""
    client = await NativeClient.connect(gw.ws_url, gw.token())
    try:
        await client.start("en-us", "mulaw_8000", input_format="mulaw_8000")
        await client.send(type="speak", text=MENU, utterance_id="menu")
        await client.wait_event("utterance_started", timeout=10)
        pcm = np.concatenate([caller_audio.silence(LEAD_IN_S), speech])
        start = await _stream(client, pcm, None)
        barge = await client.wait_event("barge_in", timeout=5)
        barge_at = next(t for t, e in client.got.events if e is barge)
        await asyncio.sleep(0.2)
        late = sum(1 for t, _ in client.got.frames if t > barge_at + 0.020)
        return barge_at - (start + LEAD_IN_S), late
    finally:
        await client.aclose()


async def background_call(gw: GatewayProcess, stop: asyncio.Event) -> None:
    client = await NativeClient.connect(gw.ws_url, gw.token(max_streams=1000))
    try:
        await client.start("en-us", "mulaw_8000", input_format="mulaw_8000")
        silence = caller_audio.silence(600.0)
        streamer = asyncio.create_task(_stream(client, silence, stop))
        i = 0
        while not stop.is_set():
            i += 1
            await client.send(type="speak", text="Please hold the line.", utterance_id=f"b{i}")
            with contextlib.suppress(TimeoutError):
                await client.wait_event("utterance_done", timeout=30, utterance_id=f"b{i}")
            await asyncio.sleep(0.5)
        await streamer
    finally:
        await client.aclose()


async def run_level(gw: GatewayProcess, trials: int, background: int) -> dict[str, float]:
    speech = caller_audio.espeak_speech()
    stop = asyncio.Event()
    others = [asyncio.create_task(background_call(gw, stop)) for _ in range(background)]
    try:
        await asyncio.sleep(2.0 if background else 0.0)  # the background calls settle
        latencies, late = [], 0
        for n in range(trials):
            latency, late_frames = await one_trial(gw, speech)
            latencies.append(latency * 1000)
            late += late_frames
            print(f"  trial {n + 1}/{trials}: {latency * 1000:.0f} ms", flush=True)
    finally:
        stop.set()
        await asyncio.gather(*others, return_exceptions=True)
    arr = np.array(latencies)
    return {
        "background": background,
        "trials": trials,
        "p50_ms": float(np.percentile(arr, 50)),
        "p95_ms": float(np.percentile(arr, 95)),
        "max_ms": float(arr.max()),
        "late_frames": late,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--background", type=int, nargs="+", default=[0, 50])
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        gw = GatewayProcess(Path(tmp) / "gateway.log", LOG_LEVEL="WARNING")
        gw.start(timeout=60)
        try:
            for background in args.background:
                print(f"{args.trials} trials with {background} background duplex calls ...")
                results.append(asyncio.run(run_level(gw, args.trials, background)))
        finally:
            gw.stop()
    print(f"\nmachine: {platform.machine()}, python {sys.version.split()[0]}")
    print("| background duplex calls | trials | onset -> barge_in p50 | p95 | max | frames after |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['background']} | {r['trials']} | {r['p50_ms']:.0f} ms | {r['p95_ms']:.0f} ms"
            f" | {r['max_ms']:.0f} ms | {r['late_frames']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
