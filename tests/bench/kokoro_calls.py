"""Kokoro under the standard call mix in Mandarin (``make bench``): how many calls one
engine on this machine keeps within first audio p95 <= 500 ms and p99 <= 800 ms (issue
26's bounds for the expensive voice) with no underrun and no error.

    python -m tests.bench.kokoro_calls                       # levels 2..12, 30 s each
    python -m tests.bench.kokoro_calls --levels 4 8 --duration 20 --offline-seconds 10

The mix is :mod:`tests.bench.prompts`' Mandarin prompts (about 15 characters, 2.5-3.5 s
of speech each; think 0.5-2 s; mu-law realtime) spoken by one Kokoro voice on a fresh
gateway per level (``ENGINE_BACKEND=kokoro,espeak``, both engine workers). Efficiency:
the audio served per second at the best level over Kokoro's offline ceiling on the same
prompts with two workers (:func:`tests.bench.neural_capacity.measure`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tests.bench import report
from tests.bench.loadgen import LoadOptions, default_out_dir, stop_on_signals
from tests.bench.neural import realtime, summary
from tests.bench.prompts import PROMPTS

VOICE = "zh-xiaoyi"
BOUNDS_MS = (500.0, 800.0)


def offline_ceiling(voice: str, seconds: float) -> dict[str, Any]:
    """Kokoro's audio seconds per wall second on the mix's prompts, two workers."""
    from engine.backends.kokoro.backend import KokoroBackend
    from tests.bench.neural_capacity import measure

    backend = KokoroBackend(threads=2)
    try:
        return measure(backend, voice, workers=2, batch=1, seconds=seconds, texts=PROMPTS["zh"])
    finally:
        backend.close()


def render(body: dict[str, Any]) -> str:
    lines = [
        f"Kokoro `{body['voice']}`, the standard call mix in Mandarin, bounds first audio "
        f"p95 <= {BOUNDS_MS[0]:.0f} ms, p99 <= {BOUNDS_MS[1]:.0f} ms:",
        "",
        "| calls | first audio p50 / p95 / p99 (ms) | underruns | errors | served audio-s/s "
        "| meets |",
        "|---:|---|---:|---:|---:|---|",
    ]
    for row in body["realtime"]:
        lines.append(
            f"| {row['sessions']} | {row['first_audio_p50_ms']} / {row['first_audio_p95_ms']}"
            f" / {row['first_audio_p99_ms']} | "
            f"{row['underruns']} | {row['errors']} | {row['served_audio_per_s']} | "
            f"{'yes' if row['meets'] else 'no'} |"
        )
    if "ceiling" in body:
        lines += ["", f"Offline ceiling (2 workers, the same prompts): {body['ceiling']}."]
    if "best" in body:
        lines.append(
            f"Best level within the bounds: {body['best']['sessions']} calls"
            + (f", efficiency {body['efficiency']}." if "efficiency" in body else ".")
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[2, 4, 6, 8, 10, 12])
    parser.add_argument("--voice", default=VOICE)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--offline-seconds", type=float, default=15.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    stop_on_signals()
    out = args.out or default_out_dir()
    body: dict[str, Any] = report.provenance("tests.bench.kokoro_calls", argv)
    body["voice"] = args.voice
    if args.offline_seconds > 0:
        offline = offline_ceiling(args.voice, args.offline_seconds)
        body["offline"] = offline
        body["ceiling"] = offline["audio_per_wall_s"]
    opts = LoadOptions(duration_s=args.duration, voices=(args.voice,), ramp_per_s=20.0)
    levels = [
        realtime(n, opts, out / "work", backend="kokoro,espeak", bounds_ms=BOUNDS_MS)
        for n in args.levels
    ]
    body["realtime"] = [summary(lv) for lv in levels]
    passing = [row for row in body["realtime"] if row["meets"]]
    if passing:
        body["best"] = max(passing, key=lambda row: row["sessions"])
        if body.get("ceiling"):
            body["efficiency"] = round(body["best"]["served_audio_per_s"] / body["ceiling"], 2)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kokoro_calls.json").write_text(json.dumps(body, indent=2))
    print(render(body), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
