"""Composed sentences against whole ones, heard by a recognizer (issue 37).

    python -m tests.bench.composed [--out bench-results] [--prompts N] [--wavs 10]

The engine keeps the words before an amount or a code ("Your current balance is") and
synthesizes only the rest for the next caller, who hears the two joined
(docs/speech-cache.md "Cached prefixes"). This asks whether a listener hears the joined
sentence as well as the sentence synthesized whole: every prompt below is rendered both
ways by the same voice (Piper ``en-us-joe``; Kokoro's default Mandarin voice,
``zh-xiaoyi``, when its assets are installed), taken through the telephone path (8 kHz
mu-law, as the gateway serves it), and transcribed; the error rates against the
sentence's spoken form are compared (the goal: composed within 0.02 of whole).
Recognizers: Whisper base (``make bench`` installs it; tests/bench/intelligibility.py) for
both languages, PocketSphinx for English. The first ``--wavs`` pairs of each language are
written as WAV files (``en-NN-composed.wav``, ``en-NN-whole.wav``, ``en-NN-words.wav``,
8 kHz, as heard)
under ``<out>/composed/`` for a listener, with ``composed.json`` beside them.

The cut is the engine's splitter's (engine/text.py ``SegmentSplitter``,
``cut_before_personal``), asked for in both languages: each prompt is one written sentence
cut before its personal item; "whole" is that sentence as one segment. (The engine does
not cut Mandarin sentences, ``NOT_CUT_FAMILIES``, because of what this measured.)
Piper samples noise, so two renderings of one text differ a little: the comparison is
over the set, not per prompt.

English is also rendered a third way, "words": the words kept, then the rest's spoken
words each rendered alone once (a unit per word, as an IVR of recorded number prompts
plays an amount), trimmed to their speech and joined by short pauses. The engine does
not compose words (yet): this asks whether a caller would hear an amount composed from
such units as well as one synthesized, for a cold start whose amounts could then cost
no synthesis at all (docs/benchmarks.md, issue 37). Its active level beside the
synthesized rest's is reported too.
"""

from __future__ import annotations

import argparse
import json
import wave
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from engine.backends.base import Backend, BatchSynthesizer, SynthesisJob, VoiceSettings
from engine.normalize import spoken
from engine.text import SegmentSplitter
from tests.bench.intelligibility import (
    Recognizer,
    Transcriber,
    Whisper,
    edit_distance,
    han,
    telephone,
    whisper_dir,
    words,
)

PROMPTS_EN = (
    "Your current balance is $1,234.56.",
    "Your verification code is 482913.",
    "Your payment of $250.00 is due on March 15.",
    "Your last deposit was $3,020.17.",
    "Your order number is 58213447.",
    "The amount due on your account is $87.40.",
    "Your available credit is $12,500.",
    "Your one-time passcode is 730 118.",
    "Your claim number is 4471 2290.",
    "Your minimum payment is $35.",
    "Your reference number is 990 412 337.",
    "The transfer of $1,000 was completed on 2026-11-30.",
    "Your account ending in 4821 has a balance of $642.19.",
    "Your security code is 5 5 1 9 0 2.",
    "Your next statement balance is $2,318.05.",
    "We received your payment of $149.99.",
    "Your tracking number is 7731 0042 9915.",
    "Your PIN reset code is 662019.",
    "Your refund of $23.75 has been issued.",
    "Your current loan balance is $18,402.33.",
)
PROMPTS_ZH = (
    "您的账户余额是1234.56元。",
    "您的验证码是682163。",
    "您本月的还款金额是3520元。",
    "您的订单号是58213447。",
    "您的可用额度是12500元。",
    "您上次存入的金额是302.17元。",
    "您的快递单号是773100429915。",
    "您的退款23.75元已经到账。",
    "您的贷款余额是18402.33元。",
    "您的动态密码是730118。",
)


def render(backend: Backend, voice: object, text: str) -> npt.NDArray[np.int16]:
    """One segment, synthesized as the engine's worker would."""
    chunks: list[npt.NDArray[np.int16]] = []

    def collect(chunk: npt.NDArray[np.int16]) -> bool:
        chunks.append(chunk)
        return True

    if isinstance(backend, BatchSynthesizer):
        backend.synthesize_batch([SynthesisJob(text, voice)], lambda _i, c: collect(c))
    else:
        backend.synthesize(text, voice, collect)
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int16)


#: "words": the pause before and between word units, and each unit's fade at both ends.
WORD_GAP_S = 0.04
WORD_FADE_S = 0.005


def loud(pcm: npt.NDArray[np.int16]) -> npt.NDArray[np.bool_]:
    """Which samples of ``pcm`` are speech: above 3 % of its peak."""
    level = np.abs(pcm.astype(np.float64))
    return level > 0.03 * level.max()  # type: ignore[no-any-return]


def word_unit(pcm: npt.NDArray[np.int16], rate: int) -> npt.NDArray[np.int16]:
    """A word rendered alone, trimmed to its speech (:func:`loud`, with 10 ms around it)
    and faded in and out."""
    loud_at = np.nonzero(loud(pcm))[0]
    pad = int(rate * 0.01)
    unit = pcm[max(0, loud_at[0] - pad) : loud_at[-1] + pad].astype(np.float32)
    ramp = np.linspace(0.0, 1.0, int(rate * WORD_FADE_S), dtype=np.float32)
    unit[: len(ramp)] *= ramp
    unit[len(unit) - len(ramp) :] *= ramp[::-1]
    return unit.astype(np.int16)


def from_words(
    backend: Backend,
    voice: object,
    text: str,
    units: dict[str, npt.NDArray[np.int16]],
    rate: int,
) -> npt.NDArray[np.int16]:
    """``text`` (a spoken form) as its words' units, each rendered once (kept in
    ``units``), with a pause before and between them."""
    gap = np.zeros(int(rate * WORD_GAP_S), dtype=np.int16)
    parts = [gap]
    for word in words(text):
        if word not in units:
            units[word] = word_unit(render(backend, voice, word), rate)
        parts += [units[word], gap]
    return np.concatenate(parts)


def active_dbfs(pcm: npt.NDArray[np.int16]) -> float:
    """The level of ``pcm``'s speech (:func:`loud`), in dB full scale."""
    speech = pcm[loud(pcm)].astype(np.float64)
    return round(float(20 * np.log10(np.sqrt(np.mean(speech**2)) / 32768)), 1)


def cut(text: str, language: str) -> tuple[str, str, str]:
    """(the words kept, the rest synthesized, the sentence whole) as the engine cuts it."""
    splitter = SegmentSplitter(language=language, cut_before_personal=True)
    splitter.feed(text)
    splitter.flush()
    if len(splitter.wholes) != 1:
        raise ValueError(f"not cut once before a personal item: {text!r}")
    ((prefix, rest), whole) = next(iter(splitter.wholes.items()))
    return prefix, rest, whole


def errors(reference: str, heard: str, language: str) -> tuple[int, int]:
    """(edit distance, reference length): words in English, characters in Mandarin. The
    reference is the sentence's spoken form; the transcript is taken to its spoken form by
    the same normalizer (a recognizer writes "$1,234.56" and "682163" as digits)."""
    said = spoken(heard, language)
    if language.startswith("zh"):
        ref = han(reference)
        return edit_distance(ref, han(said)), len(ref)
    ref_words = words(reference)
    return edit_distance(ref_words, words(said)), len(ref_words)


def write_wav(path: Path, audio_8k: npt.NDArray[np.float32]) -> None:
    pcm = np.clip(audio_8k * 32768, -32768, 32767).astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(8000)
        out.writeframes(pcm.tobytes())


def compare(
    backend: Backend,
    voice_id: str,
    language: str,
    prompts: Sequence[str],
    recognizers: dict[str, Transcriber],
    wav_dir: Path | None,
    wavs: int,
) -> dict[str, Any]:
    voice = backend.resolve_voice(VoiceSettings(voice_id))
    rate = backend.voice_sample_rate(voice)
    kinds = ("composed", "whole", "words") if language.startswith("en") else ("composed", "whole")
    totals = {name: {kind: [0, 0] for kind in kinds} for name in recognizers}
    units: dict[str, npt.NDArray[np.int16]] = {}
    levels: list[tuple[float, float]] = []
    rows = []
    for index, text in enumerate(prompts):
        prefix, rest, whole = cut(text, language)
        prefix_pcm, rest_pcm = render(backend, voice, prefix), render(backend, voice, rest)
        heard = {
            "composed": telephone(np.concatenate([prefix_pcm, rest_pcm]), rate),
            "whole": telephone(render(backend, voice, whole), rate),
        }
        if "words" in kinds:
            words_pcm = from_words(backend, voice, rest, units, rate)
            heard["words"] = telephone(np.concatenate([prefix_pcm, words_pcm]), rate)
            levels.append((active_dbfs(words_pcm), active_dbfs(rest_pcm)))
        row: dict[str, Any] = {"prompt": text, "prefix": prefix, "rest": rest}
        for kind, audio in heard.items():
            row[f"{kind}_s"] = round(len(audio) / 8000, 2)
            for name, recognizer in recognizers.items():
                transcript = recognizer.transcribe(audio)
                e, n = errors(whole, transcript, language)
                totals[name][kind][0] += e
                totals[name][kind][1] += n
                row[f"{kind}_{name}"] = transcript
        if wav_dir is not None and index < wavs:
            tag = language.split("-")[0]
            for kind, audio in heard.items():
                write_wav(wav_dir / f"{tag}-{index + 1:02d}-{kind}.wav", audio)
        rows.append(row)
    rates: dict[str, Any] = {}
    for name, counts in totals.items():
        rate_of = {kind: round(e / max(n, 1), 3) for kind, (e, n) in counts.items()}
        composed, whole_rate = rate_of["composed"], rate_of["whole"]
        rates[name] = {**rate_of, "difference": round(composed - whole_rate, 3)}
        unit = "CER" if language.startswith("zh") else "WER"
        words_note = ""
        if "words" in rate_of:
            rates[name]["words_difference"] = round(rate_of["words"] - whole_rate, 3)
            words_note = f"; from word units {rate_of['words']}"
        print(
            f"{voice_id} {name}: {unit} composed {composed} whole {whole_rate} "
            f"(difference {composed - whole_rate:+.3f}){words_note} over {len(prompts)} prompts",
            flush=True,
        )
    result: dict[str, Any] = {"voice": voice_id, "language": language, "rates": rates}
    if levels:
        units_db, rest_db = (
            round(float(np.mean(column)), 1) for column in zip(*levels, strict=True)
        )
        result["word_units"] = {
            "units": len(units),
            "active_dbfs": units_db,
            "synthesized_rest_active_dbfs": rest_db,
        }
        print(f"word units: {len(units)}, active level {units_db} dBFS against the "
              f"synthesized rest's {rest_db}", flush=True)  # fmt: skip
    return {**result, "prompts": rows}


def main(argv: list[str] | None = None) -> int:
    from engine.backends.kokoro.backend import DEFAULT_MANDARIN_VOICE, KokoroBackend
    from engine.backends.kokoro.backend import VOICES as KOKORO_VOICES
    from engine.backends.kokoro.backend import installed as kokoro_installed
    from engine.backends.piper import BUNDLED_VOICE_ID, PiperBackend

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--prompts", type=int, default=None, help="the first N of each set")
    parser.add_argument("--wavs", type=int, default=10, help="pairs written as WAV")
    parser.add_argument("--no-pocketsphinx", action="store_true", help="Whisper only")
    args = parser.parse_args(argv)
    wav_dir = args.out / "composed"
    wav_dir.mkdir(parents=True, exist_ok=True)
    model = whisper_dir()
    english: dict[str, Transcriber] = {}
    if model is not None:
        english["whisper"] = Whisper(model, "en")
    if not args.no_pocketsphinx:
        english["pocketsphinx"] = Recognizer()
    if not english:
        raise SystemExit("no recognizer: make bench installs Whisper base")
    result: dict[str, Any] = {"recognizers": sorted(english), "sets": []}
    en = PROMPTS_EN[: args.prompts]
    result["sets"].append(
        compare(PiperBackend(), BUNDLED_VOICE_ID, "en-US", en, english, wav_dir, args.wavs)
    )
    if model is not None and kokoro_installed():
        mandarin = [v for v in KOKORO_VOICES if v.voice_id == DEFAULT_MANDARIN_VOICE]
        kokoro = KokoroBackend(voices=mandarin)
        zh = PROMPTS_ZH[: args.prompts]
        recognizers: dict[str, Transcriber] = {"whisper": Whisper(model, "zh")}
        result["sets"].append(
            compare(kokoro, DEFAULT_MANDARIN_VOICE, "zh-CN", zh, recognizers, wav_dir, args.wavs)
        )
    (args.out / "composed.json").write_text(json.dumps(result, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
