"""The front end's features, computed with torch alone, against what they must be.

Checked once against the references themselves (not installable here as dependencies):
Slaney filters against Whisper's ``mel_filters.npz`` (max difference 2.3e-9), Kaldi fbank
against torchaudio 2.11.1's ``compliance/kaldi.py`` (max 4.2e-4 in log energy, float32
against float64 arithmetic), Whisper log-mel through those filters (1.2e-7); see
docs/cosyvoice2.md. These tests pin the properties that comparison rests on.
"""

from __future__ import annotations

import math

import torch

from engine.backends.cosyvoice2 import features


def tone(hz: float, seconds: float, rate: int, level: float = 0.5) -> torch.Tensor:
    t = torch.arange(int(seconds * rate), dtype=torch.float64) / rate
    return (level * torch.sin(2 * math.pi * hz * t)).float()


def test_slaney_filters_are_area_normalized_triangles_in_their_band() -> None:
    filters = features.slaney_mel_filters(16000, 400, 128, 0.0, 8000.0)
    assert filters.shape == (128, 201)
    assert (filters >= 0).all()
    hz_per_bin = 16000 / 400
    wide = [row for row in filters if int((row > 0).sum()) >= 3]
    assert len(wide) > 50
    for row in wide:
        # Slaney normalization: each triangle's area in Hz is 1 (where the FFT bins sample
        # it finely enough to tell).
        assert 0.85 < float(row.sum()) * hz_per_bin < 1.15
    centres = filters.argmax(dim=1)
    assert (centres[1:] >= centres[:-1]).all()  # ascending


def test_whisper_log_mel_shape_range_and_the_tone_s_band() -> None:
    mel = features.whisper_log_mel(tone(1000.0, 2.0, 16000))
    assert mel.shape == (1, 128, 200)  # 10 ms hop, centred, last frame dropped
    assert float(mel.max() - mel.min()) <= 2.0 + 1e-6  # clipped 8 decades below, / 4
    loudest = int(mel[0, :, 100].argmax())
    filters = features.slaney_mel_filters(16000, 400, 128, 0.0, 8000.0)
    assert filters[loudest, 25] > 0  # 1000 Hz is FFT bin 25


def test_kaldi_fbank_frames_and_the_tone_s_bin() -> None:
    fbank = features.kaldi_fbank(tone(1000.0, 1.0, 16000))
    assert fbank.shape == (98, 80)  # 1 + (16000 - 400) // 160, edges snipped
    loudest = int(fbank[50].argmax())
    banks = features.kaldi_mel_banks(80, 512, 16000, 20.0)
    assert banks[loudest, 32] > 0  # 1000 Hz is bin 32 of a 512-point FFT
    assert features.kaldi_fbank(torch.zeros(100)).shape == (0, 80)


def test_prompt_mel_is_50_frames_a_second_frames_first() -> None:
    mel = features.prompt_mel(tone(440.0, 2.0, 24000))
    assert mel.shape == (1, 100, 80)
    assert float(mel.min()) >= math.log(1e-5) - 1e-4
    silent = features.prompt_mel(torch.zeros(24000))
    assert torch.allclose(silent, torch.full_like(silent, math.log(1e-5)), atol=1e-3)
