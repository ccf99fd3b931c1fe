"""Kokoro decoded in pieces against whole: which instance-norm statistics (docs/kokoro.md).

    python -m tests.bench.kokoro_joins                        # 24 zh + 24 en prompts, float
    python -m tests.bench.kokoro_joins --prompts 4 --no-asr   # smoke size
    python -m tests.bench.kokoro_joins --asr-python /other/venv/bin/python

Every prompt (the intelligibility sets, segmented as the engine does) is decoded whole
(the reference: one decoder run over the segment, the leading pad cut as the backend cuts
it) and in the backend's pieces (:func:`engine.backends.kokoro.pieces.schedule`), its
statistics each of:

- ``trim``: one decoder run (no pieces) from :data:`~engine.backends.kokoro.pieces.LEFT_CONTEXT`
  frames before the leading-silence cut, not from the segment's start (the pad not
  decoded, its frames out of the statistics);
- ``whole``: every piece normalized with the whole segment's statistics (known only
  after decoding the whole segment: no earlier first audio; the upper bound);
- ``first``: the first piece's own statistics reused by every later piece;
- ``own``: each piece its own statistics, levels matched at each join (the backend's);
- ``own-raw``: each piece its own statistics, no level match.

Reported per option, over all segments: non-finite renderings, waveform SNR, spectral
SNR and log-spectral distance against whole (:mod:`tests.bench.joins`), the level against
whole, the level step at each join and clicks at joins (the same detector at the same
places in the whole decode: what the speech has there anyway), and, with Whisper base
(in this venv, or ``--asr-python``: a Python with the ``bench`` extra running
:mod:`tests.bench.asr_worker`), the character (zh) and word (en) error rates against the
prompts, and of each option's transcript against the whole decode's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from engine.backends.kokoro import pieces
from engine.backends.kokoro.model import SplitModel
from engine.text import SegmentSplitter
from tests.bench import joins
from tests.bench.intelligibility import BENCH_PROMPTS_EN, PROMPTS_ZH, edit_distance, han, words

OPTIONS = ("trim", "whole", "first", "own", "own-raw")
VOICES = {"zh": "zm_yunxi", "en": "af_heart"}


def segments(count: int | None) -> list[tuple[str, str, str]]:
    """(language, prompt, segment) of the first ``count`` prompts of each set."""
    out: list[tuple[str, str, str]] = []
    for language, prompts, tag in (("zh", PROMPTS_ZH, "zh-CN"), ("en", BENCH_PROMPTS_EN, "en-US")):
        for prompt in prompts[:count]:
            splitter = SegmentSplitter(language=tag)
            out += [(language, prompt, s) for s in splitter.feed(prompt) + splitter.flush()]
    return out


def render(
    model: SplitModel, phonemize: Callable[[str, str], Any], language: str, text: str,
    *, first: int, pace: float, context: int, snap: bool,
) -> tuple[dict[str, npt.NDArray[np.float32]], list[int]]:  # fmt: skip
    """Each option's audio of one segment, and the joins (samples into it)."""
    from engine.backends.kokoro import assets
    from engine.backends.kokoro.backend import leading_cut
    from engine.backends.kokoro.model import tokenize

    call = tokenize(phonemize(language, text))[0]
    style = assets.load_pack(VOICES[language])[min(len(call.ids), assets.PACK_ROWS) - 1]
    frames, features = model.front(call.ids, style, 1.0)
    begin = leading_cut(frames)
    whole, whole_stats = model.decode(features, 0, features.frames, None)
    plan = pieces.schedule(
        features.frames, begin, first, pace, left=context, right=context,
        quiet=pieces.boundary_loudness(features.energy) if snap else None,
    )  # fmt: skip
    hop = model.hop
    out = {"reference": whole[begin * hop :]}
    trimmed, _ = model.decode(features, max(0, begin - context), features.frames, None)
    out["trim"] = trimmed[(begin - max(0, begin - context)) * hop :]
    for option in OPTIONS[1:]:

        def decoder(
            lo: int, hi: int, given: Any, option: str = option
        ) -> tuple[npt.NDArray[np.float32], Any]:
            if option == "whole":
                given = whole_stats
            elif option == "own-raw":
                given = None
            return model.decode(features, lo, hi, given)

        stats: pieces.Stats = "first" if option in ("whole", "first", "own-raw") else "own"
        out[option] = np.concatenate(list(pieces.decode(plan, decoder, hop, stats)))
    return out, [(p.start - begin) * hop for p in plan[1:]]


def transcribe(clips: dict[str, npt.NDArray[np.int16]], asr_python: str | None) -> dict[str, str]:
    """Whisper base transcripts of ``clips`` (keys ``<language>|...``), or {} without it."""
    if asr_python:
        with tempfile.TemporaryDirectory() as tmp:
            source, target = Path(tmp) / "clips.npz", Path(tmp) / "out.json"
            np.savez(source, **clips)  # type: ignore[arg-type]
            worker = Path(__file__).with_name("asr_worker.py")
            subprocess.run([asr_python, str(worker), str(source), str(target)], check=True)
            result: dict[str, str] = json.loads(target.read_text())
            return result
    from tests.bench.intelligibility import Whisper, whisper_dir

    model = whisper_dir()
    if model is None:
        return {}
    from tests.bench.intelligibility import telephone

    recognizers = {lang: Whisper(model, lang) for lang in ("zh", "en")}
    return {
        key: recognizers[key.split("|", 1)[0]].transcribe(telephone(pcm, 24000))
        for key, pcm in clips.items()
    }


def error_rate(language: str, reference: str, heard: str) -> tuple[int, int]:
    """(edits, reference length) in characters (zh) or words (en)."""
    if language == "zh":
        ref, hyp = han(reference), han(heard)
    else:
        ref, hyp = words(reference), words(heard)
    return edit_distance(ref, hyp), len(ref)


def main(argv: list[str] | None = None) -> int:
    import onnx

    from engine.backends.kokoro import assets
    from engine.backends.kokoro.g2p import MandarinG2P, english
    from engine.normalize import spoken

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--graph", choices=("float", "int8"), default="float")
    parser.add_argument("--prompts", type=int, default=None, help="the first N of each set")
    parser.add_argument("--first", type=int, default=pieces.FIRST_PIECE)
    parser.add_argument("--pace", type=float, default=pieces.PLAN_PACE)
    parser.add_argument("--context", type=int, default=pieces.LEFT_CONTEXT)
    parser.add_argument("--no-snap", action="store_true", help="joins where the pace puts them")
    parser.add_argument("--no-asr", action="store_true")
    parser.add_argument("--asr-python", default=None, help="a Python with faster-whisper")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    data = assets.float_bytes() if args.graph == "float" else assets.model_bytes()
    model = SplitModel(onnx.load_from_string(data))
    del data
    mandarin = MandarinG2P()
    mandarin.load()

    def phonemize(language: str, text: str) -> Any:
        return mandarin(text) if language == "zh" else english(text)

    rows: dict[str, dict[str, Any]] = {
        o: {"snr": [], "spectral": [], "lsd": [], "level": [], "steps": [], "clicks": 0,
            "nonfinite": 0}
        for o in OPTIONS
    }  # fmt: skip
    whole_clicks = joins_total = 0
    clips: dict[str, npt.NDArray[np.int16]] = {}
    texts: dict[str, tuple[str, str]] = {}
    items = segments(args.prompts)
    for index, (language, prompt, text) in enumerate(items):
        audio, places = render(
            model, phonemize, language, text, first=args.first, pace=args.pace,
            context=args.context, snap=not args.no_snap,
        )  # fmt: skip
        reference = audio["reference"]
        whole_clicks += joins.clicks(reference, places)
        joins_total += len(places)
        clips[f"{language}|{index}|reference"] = _pcm(reference)
        texts[f"{language}|{index}"] = (prompt, text)
        for option in OPTIONS:
            rendering, row = audio[option], rows[option]
            if not np.isfinite(rendering).all():
                row["nonfinite"] += 1
                continue
            row["snr"].append(joins.snr_db(rendering, reference))
            row["spectral"].append(joins.spectral_snr_db(rendering, reference))
            row["lsd"].append(joins.log_spectral_distance_db(rendering, reference))
            power = float(np.mean(np.square(rendering, dtype=np.float64)))
            base = float(np.mean(np.square(reference, dtype=np.float64)))
            row["level"].append(abs(10 * np.log10(max(power, 1e-12) / max(base, 1e-12))))
            row["steps"] += [joins.level_step_db(rendering, reference, at) for at in places]
            row["clicks"] += joins.clicks(rendering, places)
            clips[f"{language}|{index}|{option}"] = _pcm(rendering)
    heard = {} if args.no_asr else transcribe(clips, args.asr_python)
    body: dict[str, Any] = {
        "graph": args.graph,
        "segments": len(items),
        "joins": joins_total,
        "schedule": {"first": args.first, "pace": args.pace, "context": args.context,
                     "snap": not args.no_snap},
        "clicks_whole_at_joins": whole_clicks,
        "asr": "whisper base" if heard else "none (no faster-whisper)",
        "options": {},
    }  # fmt: skip
    for option in ("reference", *OPTIONS):
        row = rows.get(option, {})
        summary: dict[str, Any] = {}
        if row:
            summary = {
                "nonfinite": row["nonfinite"],
                "snr_db_median": _median(row["snr"]),
                "snr_db_min": _round(min(row["snr"], default=None)),
                "spectral_snr_db_median": _median(row["spectral"]),
                "lsd_db_median": _median(row["lsd"]),
                "level_diff_db_median": _median(row["level"]),
                "level_diff_db_max": _round(max(row["level"], default=None)),
                "step_db_mean": _round(statistics.fmean(row["steps"]) if row["steps"] else None),
                "step_db_p95": _round(
                    float(np.percentile(row["steps"], 95)) if row["steps"] else None
                ),
                "step_db_max": _round(max(row["steps"], default=None)),
                "clicks_at_joins": row["clicks"],
            }
        if heard:
            summary.update(_asr_rates(option, texts, heard, spoken))
        body["options"][option] = summary
        print(json.dumps({option: summary}, ensure_ascii=False), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(body, indent=1, ensure_ascii=False))
    return 0


def _asr_rates(
    option: str, texts: dict[str, tuple[str, str]], heard: dict[str, str], spoken: Any
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for language in ("zh", "en"):
        errors = total = agree_errors = agree_total = 0
        for key, (_prompt, text) in texts.items():
            if not key.startswith(language) or f"{key}|{option}" not in heard:
                continue
            said = spoken(text, "zh-CN" if language == "zh" else "en-US")
            e, n = error_rate(language, said, heard[f"{key}|{option}"])
            errors, total = errors + e, total + n
            e, n = error_rate(language, heard[f"{key}|reference"], heard[f"{key}|{option}"])
            agree_errors, agree_total = agree_errors + e, agree_total + n
        if total:
            name = "cer" if language == "zh" else "wer"
            out[f"{name}_vs_text"] = round(errors / total, 3)
            out[f"{name}_vs_whole_transcript"] = round(agree_errors / max(agree_total, 1), 3)
    return out


def _pcm(audio: npt.NDArray[np.float32]) -> npt.NDArray[np.int16]:
    return np.asarray(np.clip(audio * 32767, -32768, 32767), dtype=np.int16)


def _round(value: float | None) -> float | None:
    return None if value is None else round(float(value), 2)


def _median(values: list[float]) -> float | None:
    return round(float(statistics.median(values)), 2) if values else None


if __name__ == "__main__":
    sys.exit(main())
