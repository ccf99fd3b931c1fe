"""Tests for the real espeak-ng backend (one instance per process: see conftest.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pytest

from engine.backends.base import BackendError, UnknownVoice, VoiceSettings, create_backend
from engine.backends.espeak import BUILTIN_VOICES, EspeakBackend, EspeakVoice
from engine.text import normalize

LONG_TEXT = " ".join(
    f"This is sentence number {i} of a rather long announcement for the caller." for i in range(8)
)


@dataclass
class Recorder:
    """An ``emit`` callback that records chunks and when they arrived."""

    stop_after: int | None = None
    chunks: list[npt.NDArray[np.int16]] = field(default_factory=list)
    times: list[float] = field(default_factory=list)

    def __call__(self, chunk: npt.NDArray[np.int16]) -> bool:
        self.chunks.append(chunk)
        self.times.append(time.perf_counter())
        return self.stop_after is None or len(self.chunks) < self.stop_after

    @property
    def pcm(self) -> npt.NDArray[np.int16]:
        if not self.chunks:
            return np.zeros(0, dtype=np.int16)
        return np.concatenate(self.chunks)


def synthesize(
    backend: EspeakBackend, text: str, voice: str = "en-us", speed: float = 1.0
) -> npt.NDArray[np.int16]:
    recorder = Recorder()
    backend.synthesize(text, backend.resolve_voice(VoiceSettings(voice, speed)), recorder)
    return recorder.pcm


SAMPLE_TEXT = {
    "en-us": "Hello, welcome to Acme Bank.",
    "en-us-f": "Hello, welcome to Acme Bank.",
    "en-gb": "Hello, welcome to Acme Bank.",
    "zh": "你好，欢迎致电。",
    "zh-f": "你好，欢迎致电。",
    "yue": "你好，歡迎致電。",
    "es": "Hola, bienvenido.",
    "fr": "Bonjour, bienvenue.",
    "de": "Hallo, willkommen.",
}


def test_backend_properties(espeak_backend):
    assert espeak_backend.name == "espeak"
    assert espeak_backend.native_sample_rate == 22050
    assert espeak_backend.max_text_chars > 0


def test_voices(espeak_backend):
    voices = {v.id: v for v in espeak_backend.voices()}
    assert {"en-us", "zh", "yue"} <= set(voices)
    assert set(voices) == set(BUILTIN_VOICES)
    assert voices["en-us"].language == "en-US"
    assert voices["zh"].language == "zh-CN"
    assert voices["yue"].language == "zh-HK"
    assert all(v.backend == "espeak" for v in voices.values())


def test_every_voice_has_sample_text():
    assert set(SAMPLE_TEXT) == set(BUILTIN_VOICES)


@pytest.mark.parametrize("voice", list(BUILTIN_VOICES))
def test_voice_synthesizes_non_silent_audio(espeak_backend, voice):
    pcm = synthesize(espeak_backend, SAMPLE_TEXT[voice], voice)
    assert pcm.dtype == np.int16
    seconds = len(pcm) / espeak_backend.native_sample_rate
    assert 0.3 < seconds < 5.0
    assert int(np.abs(pcm.astype(np.int32)).max()) > 2000
    rms = float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2)))
    assert rms > 300


def test_switching_voices_back_and_forth(espeak_backend):
    first = synthesize(espeak_backend, "One two three.", "en-us")
    synthesize(espeak_backend, "你好。", "zh")
    again = synthesize(espeak_backend, "One two three.", "en-us")
    assert abs(len(again) - len(first)) <= 0.05 * len(first)


@pytest.mark.realtime  # first chunk within a quarter of the wall time: runs alone
def test_streaming_first_chunk_long_before_the_end(espeak_backend):
    recorder = Recorder()
    voice = espeak_backend.resolve_voice(VoiceSettings("en-us"))
    started = time.perf_counter()
    # Four times the long text: about 0.1 s of synthesis here, so that a first chunk's few
    # ms of scheduling jitter are not a quarter of it (the text once: 26 ms in all, and a
    # 7.5 ms first chunk failed the bound).
    espeak_backend.synthesize(" ".join([LONG_TEXT] * 4), voice, recorder)
    finished = time.perf_counter()
    assert len(recorder.chunks) > 80
    first = recorder.times[0] - started
    total = finished - started
    assert first < 0.25 * total
    # Chunks are about BUFFER_MS long; none carries the whole text.
    longest = max(len(c) for c in recorder.chunks)
    assert longest < 0.1 * len(recorder.pcm)


def test_faster_speed_gives_shorter_audio(espeak_backend):
    text = LONG_TEXT[:200]
    normal = synthesize(espeak_backend, text, speed=1.0)
    fast = synthesize(espeak_backend, text, speed=2.0)
    slow = synthesize(espeak_backend, text, speed=0.5)
    assert len(fast) / len(normal) < 0.7
    assert len(slow) > len(normal)


@pytest.mark.parametrize(
    ("speed", "rate"), [(1.0, 175), (2.0, 350), (0.25, 80), (4.0, 450), (0.5, 88)]
)
def test_resolve_voice_rate(espeak_backend, speed, rate):
    voice = espeak_backend.resolve_voice(VoiceSettings("en-us", speed))
    assert voice == EspeakVoice(name="en-us", rate_wpm=rate)


@pytest.mark.parametrize("speed", [0.0, 0.2, 4.5, -1.0])
def test_invalid_speed(espeak_backend, speed):
    with pytest.raises(BackendError) as info:
        espeak_backend.resolve_voice(VoiceSettings("en-us", speed))
    assert info.value.code == "invalid_speed"


def test_full_width_punctuation_is_not_read_aloud(espeak_backend):
    with_mark = synthesize(espeak_backend, normalize("你好！"), "zh")
    without = synthesize(espeak_backend, normalize("你好"), "zh")
    assert len(without) > 0
    assert abs(len(with_mark) - len(without)) <= 0.05 * len(without)


def test_emit_returning_false_stops_synthesis(espeak_backend):
    voice = espeak_backend.resolve_voice(VoiceSettings("en-us"))
    full = Recorder()
    espeak_backend.synthesize(LONG_TEXT, voice, full)
    stopped = Recorder(stop_after=3)
    espeak_backend.synthesize(LONG_TEXT, voice, stopped)
    assert len(stopped.chunks) == 3  # no emit after the one that returned False
    assert len(stopped.pcm) < 0.2 * len(full.pcm)
    # The backend is usable again afterwards.
    again = Recorder()
    espeak_backend.synthesize("Hello again.", voice, again)
    assert len(again.pcm) > 0.3 * espeak_backend.native_sample_rate


def test_unknown_voice(espeak_backend):
    with pytest.raises(UnknownVoice) as info:
        espeak_backend.resolve_voice(VoiceSettings("klingon"))
    assert info.value.code == "unknown_voice"
    assert "klingon" in info.value.message


def test_synthesize_needs_a_resolved_voice(espeak_backend):
    with pytest.raises(TypeError):
        espeak_backend.synthesize("Hello.", "en-us", Recorder())


def test_text_over_the_limit(espeak_backend):
    voice = espeak_backend.resolve_voice(VoiceSettings("en-us"))
    with pytest.raises(BackendError) as info:
        espeak_backend.synthesize("a" * (espeak_backend.max_text_chars + 1), voice, Recorder())
    assert info.value.code == "text_too_long"


def test_only_one_instance_per_process(espeak_backend):
    with pytest.raises(RuntimeError, match="one backend instance"):
        EspeakBackend()
    with pytest.raises(RuntimeError, match="one backend instance"):
        create_backend("espeak")
