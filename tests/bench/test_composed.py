"""The composed-sentence benchmark's word units (tests/bench/composed.py): each word of a
rest rendered once, trimmed to its sound, faded at both ends and joined by pauses; the
synthetic backend's tones stand in for words, so lengths are exact."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.base import VoiceSettings
from engine.backends.synthetic import CHAR_MS, SyntheticBackend
from tests.bench import composed


def test_a_word_unit_is_trimmed_to_its_sound_and_faded() -> None:
    rate = 16000
    t = np.arange(rate // 2) / rate
    tone = (8000 * np.sin(2 * np.pi * 220 * t)).astype(np.int16)
    silence = np.zeros(rate // 4, dtype=np.int16)
    unit = composed.word_unit(np.concatenate([silence, tone, silence]), rate)
    pad = int(rate * 0.01)
    assert abs(len(unit) - (len(tone) + 2 * pad)) <= 2  # the tone, and 10 ms each side
    assert unit[0] == 0 and unit[-1] == 0  # faded: no step at either end
    assert np.abs(unit).max() == np.abs(tone).max()  # the word itself is untouched


def test_a_rest_from_word_units_renders_each_word_once_with_pauses() -> None:
    backend = SyntheticBackend()
    voice = backend.resolve_voice(VoiceSettings("en-us"))
    rate = backend.voice_sample_rate(voice)
    units: dict[str, np.ndarray] = {}
    pcm = composed.from_words(backend, voice, "two hundred thirty-two dollars.", units, rate)
    assert sorted(units) == ["dollars", "hundred", "thirty", "two"]  # "two" rendered once
    for word, unit in units.items():  # each unit is its word's tone (60 ms a character)
        assert abs(len(unit) - len(word) * CHAR_MS * rate // 1000) <= 2
    gap = int(rate * composed.WORD_GAP_S)
    said = ["two", "hundred", "thirty", "two", "dollars"]
    assert len(pcm) == sum(len(units[w]) for w in said) + (len(said) + 1) * gap
    assert not pcm[:gap].any()  # a pause before the first word
    start = gap + len(units["two"])
    assert not pcm[start : start + gap].any()  # ... and between words
    sine_dbfs = 20 * np.log10(8000 / np.sqrt(2) / 32768)  # the pauses do not count
    assert composed.active_dbfs(pcm) == pytest.approx(sine_dbfs, abs=0.3)
