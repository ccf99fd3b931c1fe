"""Serving Kokoro: what it costs per core and where its time goes, beside Piper.

    python -m tests.bench.kokoro                       # 20 s per offline row
    python -m tests.bench.kokoro --seconds 5 --repeats 2   # smoke size

1. Offline audio seconds per CPU second and per wall second, 1 and 2 workers (threads on
   one shared session, one core each, as the engine runs them), on the IVR prompt sets as
   the engine segments them: Kokoro ``zh-yunxi`` on the Mandarin set, Kokoro
   ``en-us-heart`` and Piper ``en-us-joe`` on the English set
   (:func:`tests.bench.neural_capacity.measure`).
2. Where a call's time goes: ONNX Runtime's profiler over one Mandarin opening, kernel
   time summed by the part of the graph (text encoder and PL-BERT, prosody predictor,
   decoder: the iSTFTNet generator and the rest of it).
3. First audio of Mandarin and English openings on an idle engine (one worker, nothing
   else running): the time from the call to its first audio, median of ``--repeats``.
Writes JSON to ``--out``; prints the rows.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from engine.backends.base import SynthesisJob, VoiceSettings
from engine.text import SegmentSplitter
from tests.bench.intelligibility import BENCH_PROMPTS_EN, PROMPTS_ZH
from tests.bench.neural_capacity import measure

OPENINGS = {
    "zh-yunxi": (
        "您好，",
        "您好，欢迎致电客服中心。",
        "您好，欢迎致电客服中心，您的订单已发货，请注意查收。",
    ),
    "en-us-heart": ("Goodbye.", "Thank you for calling the billing department today."),
}


def segmented(prompts: tuple[str, ...], language: str) -> list[str]:
    out: list[str] = []
    for text in prompts:
        splitter = SegmentSplitter(language=language)
        out += splitter.feed(text) + splitter.flush()
    return out


def stage_shares(text: str) -> dict[str, float]:
    """Kernel time by part of the graph, as shares of the call (profiled, 1 thread)."""
    import onnxruntime as ort

    from engine.backends.kokoro import assets
    from engine.backends.kokoro.g2p import MandarinG2P
    from engine.backends.kokoro.model import tokenize

    ids = tokenize(MandarinG2P()(text))[0].ids
    pack = assets.load_pack("zm_yunxi")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.enable_profiling = True
    options.profile_file_prefix = "/tmp/kokoro-profile"
    session = ort.InferenceSession(
        assets.model_bytes(), options, providers=["CPUExecutionProvider"]
    )
    feed = {
        "tokens": np.array([[0, *ids, 0]], dtype=np.int64),
        "style": pack[len(ids) - 1].reshape(1, 256),
        "speed": np.array([1.0], dtype=np.float32),
    }
    for _ in range(3):
        session.run(None, feed)
    profile = Path(session.end_profiling())
    events = json.loads(profile.read_text())
    profile.unlink(missing_ok=True)
    totals: collections.Counter[str] = collections.Counter()
    for event in events:
        name = str(event.get("name", ""))
        if event.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        if "generator" in name:
            part = "decoder: generator"
        elif "decoder" in name:
            part = "decoder: the rest"
        elif "predictor" in name:
            part = "prosody predictor"
        else:
            part = "text encoder, PL-BERT, other"
        totals[part] += int(event["dur"])
    whole = sum(totals.values()) or 1
    return {part: round(us / whole, 3) for part, us in totals.most_common()}


def first_audio(backend: Any, voice_id: str, text: str, repeats: int) -> dict[str, Any]:
    voice = backend.resolve_voice(VoiceSettings(voice_id))
    firsts, dones, audio = [], [], 0
    for _ in range(repeats):
        first: list[float] = []
        samples = [0]
        start = time.perf_counter()

        def emit(
            _i: int,
            chunk: Any,
            first: list[float] = first,
            samples: list[int] = samples,
            start: float = start,
        ) -> bool:
            if not first:
                first.append(time.perf_counter() - start)
            samples[0] += len(chunk)
            return True

        backend.synthesize_batch([SynthesisJob(text, voice, leading=True)], emit)
        dones.append(time.perf_counter() - start)
        firsts.append(first[0])
        audio = samples[0]
    return {
        "voice": voice_id,
        "opening": text,
        "audio_s": round(audio / backend.voice_sample_rate(voice), 2),
        "first_audio_ms": round(statistics.median(firsts) * 1000),
        "done_ms": round(statistics.median(dones) * 1000),
    }


def main(argv: list[str] | None = None) -> int:
    from engine.backends.kokoro.backend import KokoroBackend
    from engine.backends.piper import BUNDLED_VOICE_ID, PiperBackend

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    kokoro = KokoroBackend(threads=max(args.workers))
    piper = PiperBackend(threads=max(args.workers))
    zh, en = segmented(PROMPTS_ZH, "zh-CN"), segmented(BENCH_PROMPTS_EN, "en-US")
    body: dict[str, Any] = {"offline": [], "stages": {}, "first_audio": []}
    for workers in args.workers:
        for backend, voice, texts in (
            (kokoro, "zh-yunxi", zh),
            (kokoro, "en-us-heart", en),
            (piper, BUNDLED_VOICE_ID, en),
        ):
            row = measure(
                backend, voice, workers=workers, batch=1, seconds=args.seconds, texts=texts
            )
            body["offline"].append(row)
            print(json.dumps(row), flush=True)
    body["stages"] = stage_shares(OPENINGS["zh-yunxi"][-1])
    print(json.dumps({"stages": body["stages"]}, ensure_ascii=False), flush=True)
    for voice, openings in OPENINGS.items():
        for text in openings:
            row = first_audio(kokoro, voice, text, args.repeats)
            body["first_audio"].append(row)
            print(json.dumps(row, ensure_ascii=False), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(body, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
