"""VAD throughput: concurrent duplex streams one CPU core can serve.

    python -m tests.bench.vad_throughput [--streams 1 64 256 512 768] [--seconds 5]

For each stream count, every stream's inbound ring receives 32 ms of caller audio (8 kHz
speech-like noise) per tick and the engine's :class:`engine.vad.VadWorker` processes
it, end to end: ring reads, window assembly, one batched Silero step, state
gather/scatter, the detectors. It is compared with one model call per stream (the
unbatched design). ONNX Runtime runs on one thread. "Streams per core" is how many streams
one core keeps in real time: ``streams * 32 ms / (CPU time per tick)``. A benchmark,
not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

from engine.ipc.ring import SpscRing
from engine.vad import CONTEXT, STATE_SIZE, WINDOW, SileroVad, VadWorker


def speechlike(samples: int, rng: np.random.Generator) -> bytes:
    t = np.arange(samples) / 8000
    tone = np.sin(2 * np.pi * 180 * t) * 4000 * (1 + np.sin(2 * np.pi * 3 * t))
    pcm: bytes = (tone + rng.standard_normal(samples) * 300).astype("<i2").tobytes()
    return pcm


def batched(model: SileroVad, streams: int, seconds: float) -> float:
    """CPU seconds per 32 ms tick for ``streams`` streams through the VadWorker."""
    worker = VadWorker(lambda _o, _m: None, slots=streams, model_factory=lambda: model)
    rings = []
    for slot in range(streams):
        ring = SpscRing.create(bytearray(SpscRing.region_size(1 << 14)), 1 << 14)
        worker.add(slot=slot, stream_id=slot, owner=None, ring=ring, sample_rate=8000)
        rings.append(ring)
    rng = np.random.default_rng(1)
    chunk = speechlike(WINDOW * 64, rng)
    ticks = max(3, int(seconds / 0.032))
    cpu = 0.0
    for tick in range(ticks + 2):
        offset = (tick % 63) * WINDOW * 2
        for ring in rings:
            ring.write(chunk[offset : offset + WINDOW * 2])
        started = time.process_time()
        worker.process_available()
        if tick >= 2:  # warm-up
            cpu += time.process_time() - started
    return cpu / ticks


def unbatched(model: SileroVad, streams: int, seconds: float) -> float:
    """CPU seconds per 32 ms tick with one model call per stream (batch of 1)."""
    rng = np.random.default_rng(1)
    windows = [
        (np.frombuffer(speechlike(CONTEXT + WINDOW, rng), dtype="<i2") / 32768)
        .astype(np.float32)
        .reshape(1, -1)
        for _ in range(min(streams, 64))
    ]
    state = np.zeros((2, 1, STATE_SIZE), dtype=np.float32)
    ticks = max(3, int(seconds / 0.032 / max(1, streams // 64)))
    started = time.process_time()
    for _ in range(ticks):
        for i in range(streams):
            model.step(windows[i % len(windows)], state)
    return (time.process_time() - started) / ticks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 64, 256, 512, 768])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    model = SileroVad()
    rows = []
    for n in args.streams:
        per_tick_b = batched(model, n, args.seconds)
        per_tick_u = unbatched(model, n, args.seconds) if n <= 256 else float("nan")
        rows.append(
            {
                "streams": n,
                "batched_ms_per_tick": per_tick_b * 1000,
                "batched_streams_per_core": n * 0.032 / per_tick_b,
                "unbatched_ms_per_tick": per_tick_u * 1000,
                "unbatched_streams_per_core": n * 0.032 / per_tick_u,
            }
        )
        print(f"{n} streams done", flush=True)
    print(f"\nmachine: {platform.node()} {platform.machine()}, onnxruntime threads 1, Silero 8 kHz")
    print(
        "| streams | batched: CPU per 32 ms tick | streams/core "
        "| one call per stream | streams/core |"
    )
    print("|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['streams']} | {r['batched_ms_per_tick']:.1f} ms | "
            f"{r['batched_streams_per_core']:.0f} | {r['unbatched_ms_per_tick']:.1f} ms | "
            f"{r['unbatched_streams_per_core']:.0f} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
