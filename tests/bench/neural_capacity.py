"""Offline synthesis capacity of this machine, per backend: the ceiling every realtime
figure is held against.

    python -m tests.bench.neural_capacity                 # batches 1..16, 1 and 2 workers
    python -m tests.bench.neural_capacity --batches 1 4 --workers 1 --seconds 10

For each backend, worker count and batch size, ``workers`` threads synthesize the IVR
prompt set (the load generator's English prompts and a few longer ones, normalized and
segmented as the engine does) back to back for ``--seconds``, each call taking ``batch``
segments. At batch 1 Piper also runs on the load generator's prompts alone (``prompts:
load generator``: the pace of the standard call mix), and with its graph as shipped
(``graph: shipped``: 1-D convolutions, not the engine's 2-D rewrite,
:mod:`engine.backends.onnx_conv2d`). Reported: audio seconds per wall second (the
throughput of that many workers), per CPU second (process CPU time, every thread), and
per worker. espeak runs one segment per call on one thread (it is not thread-safe), its
figure is the same table's first row.
Writes JSON to stdout or ``--out``.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.backends.base import Backend, BatchSynthesizer, SynthesisJob, VoiceSettings
from engine.text import SegmentSplitter
from tests.bench.prompts import PROMPTS

LONGER = (
    "Thank you for calling Acme Bank. Your call is important to us.",
    "Your current balance is $1,234.56, and your next payment is due on December 15.",
    "Please hold while I transfer you to the next available agent.",
    "To hear these options again, press star. To return to the main menu, press pound.",
)


def segments(language: str = "en-US", *, longer: bool = True) -> list[str]:
    """The IVR prompt set as the engine segments it (without :data:`LONGER`: the load
    generator's prompts only)."""
    out: list[str] = []
    for text in (*PROMPTS["en-us"], *(LONGER if longer else ())):
        splitter = SegmentSplitter(language=language)
        out += splitter.feed(text) + splitter.flush()
    return out


def measure(
    backend: Backend,
    voice_id: str,
    *,
    workers: int,
    batch: int,
    seconds: float,
    longer: bool = True,
    texts: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Run ``workers`` threads synthesizing batches of ``batch`` for ``seconds`` (of the
    load generator's prompts only when not ``longer``; of ``texts``, segments, if given)."""
    voice = backend.resolve_voice(VoiceSettings(voice_id))
    rate = backend.voice_sample_rate(voice)
    texts = list(texts) if texts is not None else segments(longer=longer)
    samples = [0] * workers
    calls = [0] * workers
    stop_at = time.monotonic() + seconds

    def run(worker: int) -> None:
        index = worker
        while time.monotonic() < stop_at:
            jobs = [SynthesisJob(texts[(index + k) % len(texts)], voice) for k in range(batch)]
            index += batch

            def emit(_i: int, chunk: Any, worker: int = worker) -> bool:
                samples[worker] += len(chunk)
                return True

            if isinstance(backend, BatchSynthesizer):
                backend.synthesize_batch(jobs, emit)
            else:
                for job in jobs:
                    backend.synthesize(job.text, job.voice, lambda c: emit(0, c))
            calls[worker] += 1

    cpu0, wall0 = time.process_time(), time.monotonic()
    threads = [threading.Thread(target=run, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
    audio_s = sum(samples) / rate
    return {
        "backend": backend.name,
        "graph": "shipped" if getattr(backend, "conv2d", True) is False else "engine",
        "prompts": "ivr" if longer else "load generator",
        "voice": voice_id,
        "workers": workers,
        "batch": batch,
        "calls": sum(calls),
        "audio_s": round(audio_s, 2),
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "audio_per_wall_s": round(audio_s / wall, 2),
        "audio_per_cpu_s": round(audio_s / cpu, 2) if cpu else None,
    }


# Openings of growing length, each one first segment as the splitter cuts it.
OPENINGS = (
    "Goodbye.",
    "Your balance is due.",
    "Thank you for calling the billing department today",
    "Thank you for calling the billing department of the city water company",
)


def first_piece(repeats: int = 7) -> list[dict[str, Any]]:
    """Time to the first audio of an utterance's opening segment on an idle worker,
    decoded whole against in two pieces (``leading``), median of ``repeats`` each."""
    import statistics

    from engine.backends.piper import BUNDLED_VOICE_ID, PiperBackend, bundled_voice_installed

    if not bundled_voice_installed():
        return []
    piper = PiperBackend(split_openings=True)
    voice = piper.resolve_voice(VoiceSettings(BUNDLED_VOICE_ID))
    rate = piper.voice_sample_rate(voice)
    rows = []
    for text in OPENINGS:
        row: dict[str, Any] = {"text": text}
        runs: dict[bool, tuple[list[float], list[float]]] = {False: ([], []), True: ([], [])}
        for leading in (False, True, False, True):  # interleaved: drift hits both
            stamps: list[float] = []
            firsts, totals = runs[leading]
            for _ in range(repeats):
                samples = 0
                started = time.perf_counter()

                def emit(
                    _i: int, chunk: Any, started: float = started, stamps: list[float] = stamps
                ) -> bool:
                    nonlocal samples
                    samples += len(chunk)
                    stamps.append(time.perf_counter() - started)
                    return True

                stamps.clear()
                piper.synthesize_batch([SynthesisJob(text, voice, leading)], emit)
                firsts.append(stamps[0])
                totals.append(time.perf_counter() - started)
                row["audio_s"] = round(samples / rate, 2)
        for leading, key in ((False, "whole"), (True, "pieces")):
            firsts, totals = runs[leading]
            row[f"{key}_first_ms"] = round(statistics.median(firsts) * 1000, 1)
            row[f"{key}_total_ms"] = round(statistics.median(totals) * 1000, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    piper.close()
    return rows


def run_all(batches: Sequence[int], workers: Sequence[int], seconds: float) -> list[dict[str, Any]]:
    from engine.backends.espeak import EspeakBackend
    from engine.backends.piper import BUNDLED_VOICE_ID, PiperBackend, bundled_voice_installed

    rows = [measure(EspeakBackend(), "en-us", workers=1, batch=1, seconds=seconds)]
    print(json.dumps(rows[-1]), flush=True)
    if bundled_voice_installed():
        piper = PiperBackend(max_batch=max(batches), threads=max(workers))
        # The graph as the voice ships it (1-D convolutions), measured right after the
        # engine's rewritten one at batch 1, so that their ratio is side by side.
        shipped = PiperBackend(threads=max(workers), conv2d=False)
        for w in workers:
            for b in batches:
                rows.append(measure(piper, BUNDLED_VOICE_ID, workers=w, batch=b, seconds=seconds))
                print(json.dumps(rows[-1]), flush=True)
                if b == 1:
                    rows.append(
                        measure(shipped, BUNDLED_VOICE_ID, workers=w, batch=1, seconds=seconds)
                    )
                    print(json.dumps(rows[-1]), flush=True)
                    # the pace of the standard call mix's short prompts (the ideal model's)
                    rows.append(
                        measure(
                            piper, BUNDLED_VOICE_ID, workers=w, batch=1, seconds=seconds / 3,
                            longer=False,
                        )
                    )  # fmt: skip
                    print(json.dumps(rows[-1]), flush=True)
        shipped.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    rows = run_all(args.batches, args.workers, args.seconds)
    body = json.dumps({"rows": rows}, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
