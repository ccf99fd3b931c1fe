"""Serving Kokoro: what it costs per core and where its time goes, beside Piper; the
path before the split and the backend's ways of decoding side by side, in one run.

    python -m tests.bench.kokoro                            # 20 s per offline row
    python -m tests.bench.kokoro --seconds 5 --repeats 2    # smoke size
    python -m tests.bench.kokoro --skip-offline --repeats 5 # first audio only

The ways (:data:`WAYS`): ``exported int8`` (the model as shipped, one session, whole
segments: the path before this backend split it), then the split graphs (front and
decoder, docs/kokoro.md) ``int8``/``float``, each decoding ``whole`` or in ``pieces``.

1. Offline pace: audio seconds per CPU second (process CPU time: the figure that holds on
   a shared machine) and per wall second, 1 and 2 workers (threads on one shared session,
   one core each, as the engine runs them), on the IVR prompt sets as the engine segments
   them: Kokoro ``zh-yunxi`` on the Mandarin set, ``en-us-heart`` on the English one,
   Piper ``en-us-joe`` on the English one (:func:`tests.bench.neural_capacity.measure`).
2. Where a call's time goes: ONNX Runtime's profiler over one Mandarin opening, kernel
   time summed by the part of the graph (the int8 model as shipped).
3. First audio of new Mandarin openings on an idle engine: the first segment of each of
   the first ``--openings`` Mandarin prompts as the splitter cuts them, spoken by
   ``zh-xiaoyi``, each ``--repeats`` times: the time from the call to its first audio
   (G2P, front, the first piece or the whole segment). One thread: the job is not an
   utterance's first (``leading`` False), so it runs on the shared one-thread session;
   two threads: ``leading`` on an idle backend, which decodes it on its two-thread
   session. Reported: p50 and p95 over the openings of each opening's median and of each
   opening's best run, and of the process CPU time to first audio (on one thread: the
   first audio of an idle machine, whatever else this one was running).
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

# (name, KokoroBackend keyword arguments)
WAYS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("exported int8, whole", {"graph": "int8", "split": False}),
    ("int8, whole", {"graph": "int8", "pieces": "off"}),
    ("int8, pieces", {"graph": "int8", "pieces": "on"}),
    ("float, whole", {"graph": "float", "pieces": "off"}),
    ("float, pieces", {"graph": "float", "pieces": "on"}),
)
OPENING_VOICE = "zh-xiaoyi"

OPENINGS = {"zh-yunxi": ("您好，欢迎致电客服中心，您的订单已发货，请注意查收。",)}  # profiled


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


def openings(count: int) -> list[str]:
    """The first segment of each of the first ``count`` Mandarin prompts."""
    return [segmented((text,), "zh-CN")[0] for text in PROMPTS_ZH[:count]]


def first_audio(backend: Any, texts: list[str], repeats: int, threads: int) -> dict[str, Any]:
    """First audio of each of ``texts`` on an idle backend, ``repeats`` times each, on
    one thread (not leading) or two (leading: the backend's idle session)."""
    voice = backend.resolve_voice(VoiceSettings(OPENING_VOICE))
    medians, bests, cpus, audio_s = [], [], [], []
    for text in texts:
        runs, cpu = [], []
        for _ in range(repeats):
            stamps: list[float] = []
            samples = [0]
            start, start_cpu = time.perf_counter(), time.process_time()

            def emit(
                _i: int,
                chunk: Any,
                stamps: list[float] = stamps,
                n: list[int] = samples,
                start: float = start,
                start_cpu: float = start_cpu,
            ) -> bool:
                if not stamps:
                    stamps += [time.perf_counter() - start, time.process_time() - start_cpu]
                n[0] += len(chunk)
                return True

            backend.synthesize_batch([SynthesisJob(text, voice, leading=threads > 1)], emit)
            runs.append(stamps[0])
            cpu.append(stamps[1])
        medians.append(statistics.median(runs))
        bests.append(min(runs))
        cpus.append(statistics.median(cpu))
        audio_s.append(samples[0] / backend.voice_sample_rate(voice))

    def pct(values: list[float], q: float) -> int:
        return round(float(np.percentile(values, q)) * 1000)

    return {
        "threads": threads,
        "openings": len(texts),
        "repeats": repeats,
        "audio_s": [round(min(audio_s), 2), round(max(audio_s), 2)],
        "first_audio_p50_ms": pct(medians, 50),
        "first_audio_p95_ms": pct(medians, 95),
        "best_p50_ms": pct(bests, 50),
        "best_p95_ms": pct(bests, 95),
        "cpu_p50_ms": pct(cpus, 50),  # CPU time to first audio (all threads)
        "cpu_p95_ms": pct(cpus, 95),
    }


def rss_mb() -> int:
    """This process's resident memory (MB), from /proc."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    return 0


def main(argv: list[str] | None = None) -> int:
    import gc

    from engine.backends.kokoro.backend import KokoroBackend
    from engine.backends.piper import BUNDLED_VOICE_ID, PiperBackend

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--openings", type=int, default=12)
    parser.add_argument("--ways", nargs="+", default=None, help="names of WAYS to run")
    parser.add_argument("--skip-offline", action="store_true")
    parser.add_argument("--skip-piper", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    zh, en = segmented(PROMPTS_ZH, "zh-CN"), segmented(BENCH_PROMPTS_EN, "en-US")
    texts = openings(args.openings)
    body: dict[str, Any] = {"offline": [], "stages": {}, "first_audio": [], "memory": []}
    for name, kwargs in WAYS:
        if args.ways and name not in args.ways:
            continue
        before = rss_mb()
        backend = KokoroBackend(threads=max(2, *args.workers), **kwargs)
        body["memory"].append({"way": name, "rss_mb_added": rss_mb() - before})
        print(json.dumps(body["memory"][-1]), flush=True)
        for workers in [] if args.skip_offline else args.workers:
            for voice, prompts in (("zh-yunxi", zh), ("en-us-heart", en)):
                row = measure(
                    backend, voice, workers=workers, batch=1, seconds=args.seconds, texts=prompts
                )
                row["way"] = name
                body["offline"].append(row)
                print(json.dumps(row), flush=True)
        for threads in (1, 2):
            row = {"way": name, **first_audio(backend, texts, args.repeats, threads)}
            body["first_audio"].append(row)
            print(json.dumps(row, ensure_ascii=False), flush=True)
        backend.close()
        del backend
        gc.collect()
    if not args.skip_offline and not args.skip_piper:
        piper = PiperBackend(threads=max(args.workers))
        for workers in args.workers:
            row = measure(
                piper, BUNDLED_VOICE_ID, workers=workers, batch=1, seconds=args.seconds, texts=en
            )
            body["offline"].append(row)
            print(json.dumps(row), flush=True)
        body["stages"] = stage_shares(OPENINGS["zh-yunxi"][-1])
        print(json.dumps({"stages": body["stages"]}, ensure_ascii=False), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(body, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
