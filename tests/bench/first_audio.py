"""First-audio latency and espeak's real-time factor (figures for the foundation issue).

    python -m tests.bench.first_audio [--sessions 1 50] [--prompts 20] [--json out.json]

Starts a real gateway with its espeak engine on a free port, then for each concurrency
level runs that many realtime mu-law sessions at once; each speaks ``--prompts``
15-character prompts (Chinese and English) with think time between them. First-audio
latency is measured at the client: from sending ``speak`` to receiving the first binary
frame. The real-time factor is measured in-process: synthesis time / audio duration.
Prints a table; this is a benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tests.integration.harness import GatewayProcess, NativeClient

# 15-character IVR prompts, by the voice that speaks them.
PROMPTS_15 = {
    "zh": [
        "您好，欢迎致电客服中心，请稍候",
        "请按一号键查询您的账户余额。",
        "我们将尽快为您转接人工服务。",
    ],
    "en-us": ["Press 1 to pay.", "Please hold on.", "Your call is 3rd"],
}


async def one_call(url: str, token: str, prompts: int, latencies: list[float]) -> None:
    client = await NativeClient.connect(url, token)
    try:
        voice = random.choice(list(PROMPTS_15))
        await client.start(voice, "mulaw_8000")
        for i in range(prompts):
            text = random.choice(PROMPTS_15[voice])
            frames_before = len(client.got.frames)
            sent = await client.send(type="speak", text=text, utterance_id=f"p{i}")
            done = await client.wait_event("utterance_done", timeout=60, utterance_id=f"p{i}")
            del done
            first = client.got.frames[frames_before][0]
            latencies.append(first - sent)
            await asyncio.sleep(random.uniform(0.2, 0.6))  # think time
        await client.send(type="close")
        await client.wait_closed(30)
    finally:
        await client.aclose()


async def run_level(gw: GatewayProcess, sessions: int, prompts: int) -> dict[str, float]:
    latencies: list[float] = []
    token = gw.token(ttl_s=3600)
    started = time.monotonic()
    await asyncio.gather(*(one_call(gw.ws_url, token, prompts, latencies) for _ in range(sessions)))
    arr = np.array(latencies) * 1000
    return {
        "sessions": sessions,
        "utterances": len(arr),
        "p50_ms": float(np.percentile(arr, 50)),
        "p99_ms": float(np.percentile(arr, 99)),
        "max_ms": float(arr.max()),
        "wall_s": time.monotonic() - started,
    }


def espeak_rtf() -> dict[str, float]:
    from engine.backends.base import VoiceSettings
    from engine.backends.espeak import EspeakBackend
    from engine.text import normalize

    backend = EspeakBackend()
    out: dict[str, float] = {}
    for voice_id in ("en-us", "zh"):
        voice = backend.resolve_voice(VoiceSettings(voice_id))
        samples = 0
        started = time.perf_counter()
        for _ in range(20):
            for prompt in PROMPTS_15[voice_id]:

                def emit(chunk: np.ndarray) -> bool:
                    nonlocal samples
                    samples += len(chunk)
                    return True

                backend.synthesize(normalize(prompt), voice, emit)
        elapsed = time.perf_counter() - started
        out[voice_id] = elapsed / (samples / backend.native_sample_rate)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 50])
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    rtf = espeak_rtf()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        gw = GatewayProcess(Path(tmp) / "gateway.log", LOG_LEVEL="WARNING")
        gw.start()
        try:
            for n in args.sessions:
                print(f"running {n} concurrent sessions x {args.prompts} prompts ...", flush=True)
                results.append(asyncio.run(run_level(gw, n, args.prompts)))
        finally:
            gw.stop()
    print(f"\nmachine: {platform.node()} {platform.machine()} python {sys.version.split()[0]}")
    print(
        "espeak real-time factor (synthesis time / audio time): "
        + ", ".join(f"{v} {r:.4f}" for v, r in rtf.items())
    )
    print("\n| sessions | utterances | first audio p50 | p99 | max |")
    print("|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['sessions']} | {r['utterances']} | {r['p50_ms']:.1f} ms | "
            f"{r['p99_ms']:.1f} ms | {r['max_ms']:.1f} ms |"
        )
    if args.json:
        args.json.write_text(json.dumps({"rtf": rtf, "levels": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
