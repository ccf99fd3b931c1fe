"""CosyVoice2 capacity: concurrent streams within first-chunk p95 <= 500 ms and no stream
slower than real time, this engine's step loop against the official per-request path, on
the same weights in the same run.

A **cost model**, not speech: the model directory is written with random weights, at the
official CosyVoice2-0.5B sizes (``--dims official``: the Qwen2.5-0.5B body, the flow model
and HiFT as the published cosyvoice2.yaml sizes them) or tiny ones (``--dims tiny``: to
prove the benchmark runs, on a CPU). Random weights rarely end early: they decode as many
tokens as the text allows, so both paths here cap that at ``--max-ratio`` speech tokens
per text token (default 3; upstream allows 20, its minimum is 2): with this directory's
byte-level tokenizer, about 5 s of audio for a 50-character prompt, as real speech.

For each level N, N streams get the same kind of prompt at the same instant:

- ``engine``: this backend (:class:`CosyVoice2Backend`): N ``synthesize_batch`` calls on N
  threads, as the engine's scheduler makes them; their streams share the step loop.
- ``official``: upstream's ``CosyVoice2Model.tts(stream=True)`` (batch 1, one thread per
  request plus its LLM thread, the hop on the shared model object), on the same modules.

Per stream: the first chunk's latency from submission, and whether its audio would have
played without a gap (playback starting at the first chunk; each later chunk due when the
audio before it has played). A level **meets** the goal when first-chunk p95 <= 500 ms and
no stream has a gap.

    python -m tests.bench.cosyvoice2_capacity --dims tiny --levels 1 2 4 8
    python -m tests.bench.cosyvoice2_capacity --dims official --device cuda --levels 50 100 200 400
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.backends.base import SynthesisJob, VoiceSettings
from engine.backends.cosyvoice2.backend import BASE_VOICE, CosyVoice2Backend, CosyVoice2Settings
from tests.bench import report
from tests.engine.cosyvoice2.tiny_model import OFFICIAL, TINY, write_model

SAMPLE_RATE = 24000
FIRST_CHUNK_P95_GOAL_S = 0.5
PROMPTS = (
    "Thank you for calling. Your balance is due on Friday.",
    "Press one for billing, two for support.",
    "Please hold while we connect you to an agent.",
    "Your order has shipped and will arrive tomorrow.",
)
DOCS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"
MARKERS = ("<!-- cosyvoice2:begin -->", "<!-- cosyvoice2:end -->")


@dataclass
class StreamRecord:
    submitted: float
    chunks: list[tuple[float, int]] = field(default_factory=list)  # (arrival, samples)
    error: str | None = None

    def first_chunk_s(self) -> float | None:
        return self.chunks[0][0] - self.submitted if self.chunks else None

    def gaps(self) -> int:
        """Chunks that arrive after the audio before them has played out."""
        if not self.chunks:
            return 0
        start = self.chunks[0][0]
        played = 0
        late = 0
        for arrival, samples in self.chunks:
            if arrival > start + played / SAMPLE_RATE + 1e-3:
                late += 1
                start = arrival - played / SAMPLE_RATE  # playback resumes when it arrives
            played += samples
        return late

    def audio_s(self) -> float:
        return sum(samples for _, samples in self.chunks) / SAMPLE_RATE


def run_engine(backend: CosyVoice2Backend, n: int) -> list[StreamRecord]:
    voice = backend.resolve_voice(VoiceSettings(BASE_VOICE))
    records = [StreamRecord(0.0) for _ in range(n)]
    barrier = threading.Barrier(n)

    def one(index: int) -> None:
        record = records[index]

        def emit(_job: int, pcm: np.ndarray) -> bool:
            if len(pcm):  # empty: the backend asking whether the stream is still wanted
                record.chunks.append((time.perf_counter(), len(pcm)))
            return True

        barrier.wait()
        record.submitted = time.perf_counter()
        try:
            backend.synthesize_batch([SynthesisJob(PROMPTS[index % len(PROMPTS)], voice)], emit)
        except Exception as exc:
            record.error = repr(exc)

    _in_threads(n, one)
    return records


def run_official(backend: CosyVoice2Backend, n: int) -> list[StreamRecord]:
    """Upstream's per-request streaming path on the backend's modules."""
    from cosyvoice.cli.model import CosyVoice2Model

    model = backend.model
    official = CosyVoice2Model(model.llm, model.flow, model.hift, fp16=model.dtype == torch.float16)
    official.llm = _Capped(model.llm, backend.decoder.max_token_text_ratio)  # unset in __init__
    official.device = model.device
    records = [StreamRecord(0.0) for _ in range(n)]
    barrier = threading.Barrier(n)
    empty = torch.zeros(1, 0, dtype=torch.int32)

    def one(index: int) -> None:
        record = records[index]
        text = backend.front_end.text_tokens(PROMPTS[index % len(PROMPTS)])
        barrier.wait()
        record.submitted = time.perf_counter()
        try:
            for out in official.tts(
                text=text,
                flow_embedding=torch.zeros(1, 192),
                llm_embedding=torch.zeros(1, 192),
                prompt_text=empty,
                llm_prompt_speech_token=empty,
                flow_prompt_speech_token=empty,
                prompt_speech_feat=torch.zeros(1, 0, 80),
                stream=True,
            ):
                record.chunks.append((time.perf_counter(), int(out["tts_speech"].shape[1])))
        except Exception as exc:
            record.error = repr(exc)

    _in_threads(n, one)
    return records


class _Capped:
    """Upstream's LLM with the benchmark's length cap passed to its ``inference``."""

    def __init__(self, llm: Any, max_ratio: float) -> None:
        self._llm = llm
        self._max_ratio = max_ratio

    def inference(self, **kwargs: Any) -> Any:
        return self._llm.inference(**kwargs, max_token_text_ratio=self._max_ratio)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llm, name)


async def feature_lookups(
    backend: CosyVoice2Backend, redis_url: str, lookups: int, reference_s: float
) -> dict[str, Any]:
    """A registered voice's features at session start, through the gateway's
    :class:`VoiceRegistry`: an L1 hit (memory) and an L2 hit (Redis, L1 off), each timed
    over ``lookups`` awaits of ``registry.features``; the blob is what
    ``prepare_voice`` makes of a ``reference_s`` reference (its size does not depend on
    the model's weights: 80 mel bins and 25 tokens a second, a 192-value embedding)."""
    import secrets

    import redis.asyncio as aioredis

    from gateway.metrics import GatewayMetrics
    from gateway.voices.registry import BackendInfo, VoiceRegistry, transcript_tag
    from gateway.voices.store import RedisVoiceStore
    from tests.engine.cosyvoice2.tiny_model import reference_audio

    pcm = (reference_audio(reference_s).numpy() * 32767).astype("<i2").tobytes()
    started = time.perf_counter()
    transcript = "This is the reference recording of the voice."
    blob = backend.prepare_voice(pcm, None, transcript)
    extraction_ms = (time.perf_counter() - started) * 1000
    info = BackendInfo(backend.name, backend.version, True, {BASE_VOICE: "mul"})
    client = aioredis.from_url(redis_url, socket_timeout=1.0, socket_connect_timeout=1.0)
    prefix = f"bench-cv2-{secrets.token_hex(4)}"
    sha, language = secrets.token_hex(32), "en-us"
    key = f"{info.name}:{info.version}:{language}:{transcript_tag(transcript)}{sha}"
    store = RedisVoiceStore(client, prefix=prefix)
    result: dict[str, Any] = {
        "blob_kib": round(len(blob) / 1024, 1),
        "extraction_ms": round(extraction_ms, 1),
    }
    try:
        await store.save_features(key, blob, 600)
        for level, l1_size in (("l1", 8), ("l2", 0)):
            registry = VoiceRegistry(
                store,
                engine=lambda: None,  # type: ignore[arg-type,return-value]
                backend=lambda: info,
                metrics=GatewayMetrics(),
                l1_size=l1_size,
            )
            await registry.features(sha, language, transcript=transcript)  # warm
            times = []
            for _ in range(lookups):
                t0 = time.perf_counter_ns()
                got = await registry.features(sha, language, transcript=transcript)
                times.append((time.perf_counter_ns() - t0) / 1e3)
                assert got == blob
            p50, p99 = np.percentile(times, [50, 99]).tolist()
            result[f"{level}_p50_us"], result[f"{level}_p99_us"] = round(p50, 1), round(p99, 1)
    finally:
        keys = [k async for k in client.scan_iter(match=f"*{prefix}*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()
    return result


def _in_threads(n: int, target: Callable[[int], None]) -> None:
    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def summarize(path: str, n: int, records: list[StreamRecord], wall_s: float) -> dict[str, Any]:
    firsts = [r.first_chunk_s() for r in records]
    valid = [f for f in firsts if f is not None]
    errors = sum(1 for r in records if r.error is not None or not r.chunks)
    p50, p95 = np.percentile(valid, [50, 95]).tolist() if valid else [None, None]
    gapped = sum(1 for r in records if r.gaps())
    audio = sum(r.audio_s() for r in records)
    return {
        "path": path,
        "streams": n,
        "first_chunk_p50_ms": None if p50 is None else round(p50 * 1000, 1),
        "first_chunk_p95_ms": None if p95 is None else round(p95 * 1000, 1),
        "streams_with_gaps": gapped,
        "errors": errors,
        "audio_s": round(audio, 2),
        "wall_s": round(wall_s, 2),
        "audio_per_wall_s": round(audio / wall_s, 2) if wall_s else None,
        "meets": bool(
            p95 is not None and p95 <= FIRST_CHUNK_P95_GOAL_S and gapped == 0 and errors == 0
        ),
    }


def table(levels: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| path | streams | first chunk p50 / p95 (ms) | streams with gaps | errors "
        "| audio s / wall s | meets |",
        "|---|---:|---|---:|---:|---:|---|",
    ]
    for level in levels:
        lines.append(
            f"| {level['path']} | {level['streams']} | {level['first_chunk_p50_ms']} / "
            f"{level['first_chunk_p95_ms']} | {level['streams_with_gaps']} | {level['errors']} | "
            f"{level['audio_per_wall_s']} | {'yes' if level['meets'] else 'no'} |"
        )
    return lines


def largest(levels: list[dict[str, Any]], path: str) -> int:
    return max((lv["streams"] for lv in levels if lv["path"] == path and lv["meets"]), default=0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dims", choices=("tiny", "official"), default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="", help="COSYVOICE2_DTYPE (default per device)")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--paths", nargs="+", default=["engine", "official"])
    parser.add_argument("--model-dir", type=Path, help="reuse a written model directory")
    parser.add_argument(
        "--max-ratio", type=float, default=3.0, help="speech tokens per text token, at most"
    )
    parser.add_argument(
        "--cache-lookups", type=int, default=0, help="time this many L1 and L2 feature hits"
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--out", type=Path, default=Path("artifacts/cosyvoice2_capacity"))
    parser.add_argument("--no-docs", action="store_true", help="leave docs/benchmarks.md alone")
    args = parser.parse_args(argv)
    body: dict[str, Any] = report.provenance("tests.bench.cosyvoice2_capacity", argv)
    with tempfile.TemporaryDirectory(prefix="cosyvoice2-bench-") as scratch:
        directory = args.model_dir or Path(scratch) / "model"
        if not (directory / "cosyvoice2.yaml").exists():
            started = time.perf_counter()
            write_model(directory, OFFICIAL if args.dims == "official" else TINY)
            print(
                f"wrote a random-weight {args.dims} model in {time.perf_counter() - started:.0f} s"
            )
        settings = CosyVoice2Settings(
            model_dir=directory, device=args.device, dtype=args.dtype, max_streams=max(args.levels)
        )
        backend = CosyVoice2Backend(settings)
        backend.decoder.max_token_text_ratio = args.max_ratio
        run_engine(backend, 1)  # warm-up: first calls allocate
        levels: list[dict[str, Any]] = []
        for n in args.levels:
            for path in args.paths:
                started = time.perf_counter()
                records = run_engine(backend, n) if path == "engine" else run_official(backend, n)
                level = summarize(path, n, records, time.perf_counter() - started)
                levels.append(level)
                print(level, flush=True)
        cache = None
        if args.cache_lookups:
            cache = asyncio.run(feature_lookups(backend, args.redis_url, args.cache_lookups, 10.0))
            print(cache, flush=True)
        backend.close()
    body.update(dims=args.dims, device=args.device, levels=levels, feature_cache=cache)
    engine_best, official_best = largest(levels, "engine"), largest(levels, "official")
    lines = [
        report.generated_line(body),
        "",
        *report.provenance_lines(body),
        f"- Model: **random weights, {args.dims} dimensions** (a cost model, not speech); "
        f"device {args.device}; at most {args.max_ratio:g} speech tokens per text token",
        "",
        *table(levels),
        "",
        f"Most streams meeting first-chunk p95 <= 500 ms with no gap: engine **{engine_best}**, "
        f"official per-request path **{official_best}**.",
    ]
    if cache is not None:
        lines += [
            "",
            f"A registered voice's features at session start (a 10 s reference: a "
            f"{cache['blob_kib']} KiB blob, extracted in {cache['extraction_ms']} ms), "
            f"{args.cache_lookups} lookups through the gateway's voice registry: L1 hit "
            f"p50 {cache['l1_p50_us']} / p99 {cache['l1_p99_us']} us; L2 hit (Redis, L1 off) "
            f"p50 {cache['l2_p50_us']} / p99 {cache['l2_p99_us']} us.",
        ]
    report.publish(
        args.out,
        "cosyvoice2_capacity.json",
        body,
        "\n".join(lines) + "\n",
        docs=DOCS,
        markers=MARKERS,
        update_docs=not args.no_docs,
    )


if __name__ == "__main__":
    main()
