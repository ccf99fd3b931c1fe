"""CosyVoice2 conformance at any size: the speech tokens this engine's step loop decodes
against upstream's ``Qwen2LM.inference`` on the same weights, the same inputs and the same
random draws (the reference: tests/engine/cosyvoice2/upstream_reference.py), and
optionally the streamed waveform against upstream's ``CosyVoice2Model.tts(stream=True)``
on upstream's hop schedule.

``make test`` runs this at tiny sizes (tests/engine/cosyvoice2/test_conformance.py); this
command runs it on a model directory of any size, the official one included (random
weights written by the capacity benchmark's builder), on the CPU or a GPU:

    python -m tests.bench.cosyvoice2_conformance --dims official --device cpu
    python -m tests.bench.cosyvoice2_conformance --dims official --device cuda --waveform

Random weights rarely choose EOS, so both sides stop at ``--max-ratio`` speech tokens
per text token (upstream's ``max_token_text_ratio``, passed to both). Cases: the
directory's ``spk2info.pt`` speaker (English), the unprompted voice (Chinese), a
zero-shot voice from ``prepare_voice`` (mixed), an instruction, and all four again as
streams joining one running batch at different steps.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.backends.base import SynthesisJob, VoiceSettings
from engine.backends.cosyvoice2.backend import (
    BASE_VOICE,
    CosyVoice2Backend,
    CosyVoice2Settings,
    CosyVoice2Voice,
)
from engine.backends.cosyvoice2.streaming import HopSchedule
from engine.normalize import spoken
from engine.text import normalize
from tests.bench import report
from tests.engine.cosyvoice2 import upstream_reference as ref
from tests.engine.cosyvoice2.tiny_model import OFFICIAL, SPEAKER, TINY, reference_audio, write_model

TEXTS = {
    "speaker": "Your balance is due on Friday.",
    "base": "您好，请稍候。",
    "cloned": "请按1号键, or press two.",
    "instruct": "Thank you for calling.",
}
UPSTREAM_HOPS = HopSchedule(min_first=25, growth=(1,))
DOCS = Path(__file__).resolve().parents[2] / "docs" / "cosyvoice2.md"
MARKERS = ("<!-- cosyvoice2-conformance:begin -->", "<!-- cosyvoice2-conformance:end -->")


@dataclass
class Run:
    text: str
    voice: CosyVoice2Voice
    join_after: int = 0
    seed: int = 0
    tokens: list[int] = field(default_factory=list)
    chunks: list[np.ndarray] = field(default_factory=list)


def voices(backend: CosyVoice2Backend) -> dict[str, CosyVoice2Voice]:
    pcm = (reference_audio(2.3, pitch_hz=120.0).numpy() * 32767).astype("<i2").tobytes()
    blob = backend.prepare_voice(pcm, None, "This is my voice.")
    speaker = f"{BASE_VOICE}-{SPEAKER}"
    return {
        "speaker": backend.resolve_voice(VoiceSettings(speaker)),
        "base": backend.resolve_voice(VoiceSettings(BASE_VOICE)),
        "cloned": backend.resolve_voice(VoiceSettings(BASE_VOICE, profile=blob)),
        "instruct": backend.resolve_voice(VoiceSettings(speaker, instruct="用开心的语气说")),
    }


def run_engine(backend: CosyVoice2Backend, runs: list[Run], *, audio: bool) -> None:
    """Each run as its own ``synthesize_batch`` call on its own thread, joining the
    loop after ``join_after`` steps; fills in the seeds, tokens and chunks."""
    opened: dict[str, Any] = {}
    real_open, real_audio = backend._open, backend.vocoder.chunks_audio

    def spy(job: SynthesisJob, emit: Any) -> Any:
        opened[job.text] = stream = real_open(job, emit)
        return stream

    backend._open = spy  # type: ignore[method-assign]
    if not audio:  # tokens do not depend on the audio; the loop runs as it does
        backend.vocoder.chunks_audio = no_audio  # type: ignore[method-assign]
    start = backend._loop.steps
    errors: list[BaseException] = []

    def one(run: Run) -> None:
        while backend._loop.steps - start < run.join_after:
            time.sleep(0.0005)
        try:
            backend.synthesize_batch(
                [SynthesisJob(segment(run.text), run.voice, leading=True)],
                lambda _i, pcm: keep(run.chunks, pcm),
            )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(run,)) for run in runs]
    try:
        with ref.zero_source_noise():
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    finally:
        del backend._open
        if not audio:
            backend.vocoder.chunks_audio = real_audio  # type: ignore[method-assign]
    if errors:
        raise errors[0]
    for run in runs:
        state = opened[segment(run.text)].llm
        run.seed, run.tokens = state.generator.initial_seed(), list(state.tokens)


def no_audio(requests: Any) -> list[np.ndarray]:
    return [np.zeros(0, np.int16) for _ in requests]


def keep(chunks: list[np.ndarray], pcm: np.ndarray) -> bool:
    if len(pcm):  # an empty one asks whether the stream is still wanted
        chunks.append(pcm)
    return True


def segment(text: str) -> str:
    return spoken(normalize(text), "mul")


def first_difference(ours: list[int], theirs: list[int]) -> int | None:
    for index, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if a != b:
            return index
    return None if len(ours) == len(theirs) else min(len(ours), len(theirs))


def compare_tokens(
    backend: CosyVoice2Backend, frontend: Any, run: Run, case: str, max_ratio: float
) -> dict[str, Any]:
    inputs = ref.model_input(frontend, run.text, run.voice.features, instruct=run.voice.instruct)
    started = time.perf_counter()
    theirs = ref.upstream_tokens(backend.model, inputs, run.seed, max_token_text_ratio=max_ratio)
    return {
        "case": case,
        "text": run.text,
        "tokens": len(run.tokens),
        "upstream_tokens": len(theirs),
        "equal": run.tokens == theirs,
        "first_difference": first_difference(run.tokens, theirs),
        "upstream_s": round(time.perf_counter() - started, 2),
    }


def compare_waveform(
    backend: CosyVoice2Backend, frontend: Any, voice: CosyVoice2Voice, max_ratio: float
) -> dict[str, Any]:
    backend.hop_schedule, own = UPSTREAM_HOPS, backend.hop_schedule
    try:
        run = Run(TEXTS["speaker"], voice)
        run_engine(backend, [run], audio=True)
    finally:
        backend.hop_schedule = own
    inputs = ref.model_input(frontend, run.text, voice.features)
    pieces = ref.upstream_speech(backend.model, inputs, run.seed, stream=True, max_ratio=max_ratio)
    theirs = np.concatenate([pcm16(p) for p in pieces]).astype(int)
    ours = np.concatenate(run.chunks).astype(int)
    same_length = len(ours) == len(theirs)
    return {
        "chunks": [len(c) for c in run.chunks],
        "upstream_chunks": [len(p) for p in pieces],
        "max_abs_difference_int16": int(np.abs(ours - theirs).max()) if same_length else None,
    }


def pcm16(speech: np.ndarray) -> np.ndarray:
    return np.clip(np.round(speech * 32767.0), -32768, 32767).astype(np.int16)


def conformance(backend: CosyVoice2Backend, *, max_ratio: float, waveform: bool) -> dict[str, Any]:
    backend.decoder.max_token_text_ratio = max_ratio
    frontend = ref.upstream_frontend(backend.model)
    by_name = voices(backend)
    results: list[dict[str, Any]] = []
    for name, text in TEXTS.items():
        run = Run(text, by_name[name])
        started = time.perf_counter()
        run_engine(backend, [run], audio=False)
        engine_s = time.perf_counter() - started
        result = compare_tokens(backend, frontend, run, f"{name} alone", max_ratio)
        results.append({**result, "engine_s": round(engine_s, 2)})
        print(results[-1], flush=True)
    joining = [Run(text, by_name[name], 4 * i) for i, (name, text) in enumerate(TEXTS.items())]
    started = time.perf_counter()
    run_engine(backend, joining, audio=False)
    engine_s = time.perf_counter() - started
    for name, run in zip(TEXTS, joining, strict=True):
        case = f"{name} joining at step {run.join_after}"
        results.append({**compare_tokens(backend, frontend, run, case, max_ratio)})
        print(results[-1], flush=True)
    body: dict[str, Any] = {"tokens": results, "joining_engine_s": round(engine_s, 2)}
    if waveform:
        body["waveform"] = compare_waveform(backend, frontend, by_name["speaker"], max_ratio)
        print(body["waveform"], flush=True)
    body["all_equal"] = all(r["equal"] for r in results) and (
        not waveform or (body["waveform"]["max_abs_difference_int16"] or 99) <= 2
    )
    return body


def table(body: dict[str, Any]) -> list[str]:
    lines = [
        "| case | engine tokens | upstream tokens | equal | first difference |",
        "|---|---:|---:|---|---:|",
    ]
    for r in body["tokens"]:
        first = "" if r["first_difference"] is None else str(r["first_difference"])
        lines.append(
            f"| {r['case']} | {r['tokens']} | {r['upstream_tokens']} | "
            f"{'yes' if r['equal'] else '**no**'} | {first} |"
        )
    if "waveform" in body:
        w = body["waveform"]
        lines += [
            "",
            f"Waveform on upstream's hops against `tts(stream=True)`: chunks {w['chunks']} "
            f"(upstream {w['upstream_chunks']}), largest difference "
            f"{w['max_abs_difference_int16']} int16 steps.",
        ]
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dims", choices=("tiny", "official"), default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model-dir", type=Path, help="reuse a written model directory")
    parser.add_argument("--max-ratio", type=float, default=3.0)
    parser.add_argument("--waveform", action="store_true", help="also compare the waveform")
    parser.add_argument("--out", type=Path, default=Path("artifacts/cosyvoice2_conformance"))
    parser.add_argument("--update-docs", action="store_true", help="write into docs/cosyvoice2.md")
    args = parser.parse_args(argv)
    body: dict[str, Any] = report.provenance("tests.bench.cosyvoice2_conformance", argv)
    with tempfile.TemporaryDirectory(prefix="cosyvoice2-conformance-") as scratch:
        directory = args.model_dir or Path(scratch) / "model"
        if not (directory / "cosyvoice2.yaml").exists():
            started = time.perf_counter()
            write_model(directory, OFFICIAL if args.dims == "official" else TINY)
            print(
                f"wrote a random-weight {args.dims} model in {time.perf_counter() - started:.0f} s"
            )
        started = time.perf_counter()
        backend = CosyVoice2Backend(
            CosyVoice2Settings(model_dir=directory, device=args.device, dtype="float32")
        )
        print(f"loaded in {time.perf_counter() - started:.0f} s", flush=True)
        body.update(dims=args.dims, device=args.device, max_ratio=args.max_ratio)
        body.update(conformance(backend, max_ratio=args.max_ratio, waveform=args.waveform))
        backend.close()
    verdict = "all equal" if body["all_equal"] else "**MISMATCH**"
    lines = [
        report.generated_line(body),
        "",
        *report.provenance_lines(body),
        f"- Model: random weights, **{args.dims}** dimensions, device {args.device}, float32; "
        f"at most {args.max_ratio:g} speech tokens per text token; {verdict}",
        "",
        *table(body),
    ]
    report.publish(
        args.out,
        "cosyvoice2_conformance.json",
        body,
        "\n".join(lines) + "\n",
        docs=DOCS,
        markers=MARKERS,
        update_docs=args.update_docs,
    )
    if not body["all_equal"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
