"""Intelligibility of each built-in voice over the telephone, measured, not assumed.

    python -m tests.bench.intelligibility [--out result.json]

English voices: every prompt of a fixed IVR set is synthesized by the engine's backend,
taken through the telephone path the gateway serves (resampled to 8 kHz, G.711 mu-law
encoded and decoded) and transcribed by an automatic speech recognizer whose model ships
in its PyPI package (CMU PocketSphinx 5, US English acoustic and language model); the
word error rate against the prompt's spoken form is reported per voice. PocketSphinx is
an old recognizer: the figures compare voices with each other, they are not absolute.

Chinese voices (no recognizer with bundled Chinese weights is installable here): a
spectral and level check of the same path: speech level (dBFS), the share of energy in
the telephone band (300-3400 Hz), and the share of 20 ms frames that are silent.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import soxr

from engine.backends.base import Backend, BatchSynthesizer, SynthesisJob, VoiceSettings
from engine.text import SegmentSplitter
from telephony.codecs import g711

PROMPTS_EN = (
    "Thank you for calling Acme Bank.",
    "For account balances, press one.",
    "To report a lost or stolen card, press two.",
    "To speak with an agent, press zero.",
    "Please hold while I transfer your call to the next available agent.",
    "Your call is important to us.",
    "Please enter your account number followed by the pound key.",
    "Your payment was received, thank you.",
    "The office is open Monday to Friday from nine to five.",
    "Please say yes or no.",
    "I did not understand that, please try again.",
    "Goodbye, and have a nice day.",
)
PROMPTS_ZH = ("您好，欢迎致电客服中心。", "请按一号键查询账户余额。", "感谢您的耐心等待。")


def synthesize(backend: Backend, voice_id: str, text: str, language: str) -> npt.NDArray[np.int16]:
    """The utterance as the engine makes it: segmented and normalized, then synthesized."""
    voice = backend.resolve_voice(VoiceSettings(voice_id))
    splitter = SegmentSplitter(language=language)
    chunks: list[npt.NDArray[np.int16]] = []

    def collect(chunk: npt.NDArray[np.int16]) -> bool:
        chunks.append(chunk)
        return True

    for segment in splitter.feed(text) + splitter.flush():
        if isinstance(backend, BatchSynthesizer):
            backend.synthesize_batch([SynthesisJob(segment, voice)], lambda _i, c: collect(c))
        else:
            backend.synthesize(segment, voice, collect)
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int16)


def telephone(pcm: npt.NDArray[np.int16], rate: int) -> npt.NDArray[np.float32]:
    """``pcm`` through the gateway's mu_law path, as float at 8 kHz."""
    narrow = soxr.resample(pcm.astype(np.float32) / 32768, rate, 8000)
    coded = g711.ulaw_encode(np.clip(narrow * 32768, -32768, 32767).astype(np.int16))
    decoded = np.asarray(g711.ulaw_decode(coded), dtype=np.float32)
    return (decoded / np.float32(32768)).astype(np.float32)


def words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(Levenshtein distance in words, reference length)."""
    ref, hyp = words(reference), words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        new = [i]
        for j, h in enumerate(hyp, 1):
            new.append(min(row[j] + 1, new[j - 1] + 1, row[j - 1] + (r != h)))
        row = new
    return row[-1], len(ref)


class Recognizer:
    """PocketSphinx with its bundled US English model, at 16 kHz."""

    def __init__(self) -> None:
        from pocketsphinx import Decoder  # type: ignore[import-untyped]

        self._decoder = Decoder(samprate=16000, loglevel="FATAL")

    def transcribe(self, audio_8k: npt.NDArray[np.float32]) -> str:
        wide = soxr.resample(audio_8k, 8000, 16000)
        pcm = np.clip(wide * 32768, -32768, 32767).astype("<i2").tobytes()
        self._decoder.start_utt()
        self._decoder.process_raw(pcm, full_utt=True)
        self._decoder.end_utt()
        hyp = self._decoder.hyp()
        return hyp.hypstr if hyp is not None else ""


def word_error_rate(
    backend: Backend, voice_id: str, recognizer: Recognizer, prompts: Sequence[str] = PROMPTS_EN
) -> dict[str, Any]:
    errors = total = 0
    heard = []
    for text in prompts:  # written without digits: the text is its own spoken form
        voice = backend.resolve_voice(VoiceSettings(voice_id))
        audio = telephone(
            synthesize(backend, voice_id, text, "en-US"), backend.voice_sample_rate(voice)
        )
        hypothesis = recognizer.transcribe(audio)
        e, n = word_errors(text, hypothesis)
        errors, total = errors + e, total + n
        heard.append({"prompt": text, "heard": hypothesis})
    return {"voice": voice_id, "wer": round(errors / total, 3), "words": total, "heard": heard}


def spectral_check(backend: Backend, voice_id: str, prompts: Sequence[str]) -> dict[str, Any]:
    voice = backend.resolve_voice(VoiceSettings(voice_id))
    rate = backend.voice_sample_rate(voice)
    audio = np.concatenate(
        [telephone(synthesize(backend, voice_id, t, "zh-CN"), rate) for t in prompts]
    )
    frames = audio[: len(audio) // 160 * 160].reshape(-1, 160)
    frame_db = 20 * np.log10(np.sqrt(np.mean(frames**2, axis=1)) + 1e-9)
    speech = frame_db > -45
    spectrum = np.abs(np.fft.rfft(audio)) ** 2
    freqs = np.fft.rfftfreq(len(audio), 1 / 8000)
    band = spectrum[(freqs >= 300) & (freqs <= 3400)].sum() / max(spectrum.sum(), 1e-12)
    level = 20 * np.log10(np.sqrt(np.mean(frames[speech] ** 2)) + 1e-9)
    return {
        "voice": voice_id,
        "speech_level_dbfs": round(float(level), 1),
        "telephone_band_energy": round(float(band), 3),
        "silent_frames": round(float(1 - speech.mean()), 3),
    }


def main(argv: list[str] | None = None) -> int:
    from engine.backends.espeak import EspeakBackend
    from engine.backends.piper import BUNDLED_VOICE_ID, PiperBackend, bundled_voice_installed

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    recognizer = Recognizer()
    espeak = EspeakBackend()
    english: list[tuple[Backend, str]] = [(espeak, v) for v in ("en-us", "en-us-f", "en-gb")]
    if bundled_voice_installed():
        english.insert(0, (PiperBackend(), BUNDLED_VOICE_ID))
    result: dict[str, Any] = {
        "recognizer": "pocketsphinx (bundled en-us model)",
        "english": [word_error_rate(b, v, recognizer) for b, v in english],
        "chinese": [spectral_check(espeak, v, PROMPTS_ZH) for v in ("zh", "zh-f", "yue")],
    }
    for row in result["english"]:
        print(f"{row['voice']}: WER {row['wer']} over {row['words']} words")
    for row in result["chinese"]:
        print(row)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
