"""The acoustic features CosyVoice2's front end takes from a reference recording, computed
with torch alone (no whisper, no torchaudio, no librosa).

- :func:`whisper_log_mel`: the input of ``speech_tokenizer_v2.onnx``: Whisper's 128-bin
  log-mel spectrogram of 16 kHz audio (25 ms Hann window, 10 ms hop, centred; log10,
  clipped 8 below the maximum, scaled ``(x + 4) / 4``).
- :func:`kaldi_fbank`: the input of ``campplus.onnx``: Kaldi's 80-bin log filterbank of
  16 kHz audio with torchaudio's ``compliance.kaldi.fbank`` defaults (25 ms Povey window,
  10 ms shift, frames inside the signal only, DC removed, pre-emphasis 0.97, a 512-point
  power spectrum, triangular filters on the 1127 ln(1 + f/700) mel scale from 20 Hz).
- :func:`prompt_mel`: the flow model's prompt features: Matcha-TTS's 80-bin mel of 24 kHz
  audio (1920-point FFT and window, 480 hop, reflect-padded by 720 each side, magnitude,
  Slaney mel filters 0-8000 Hz, natural log clipped at 1e-5), frames first.

Mel filters are Slaney's (librosa's default) where Whisper and Matcha use librosa's.
Audio is float in [-1, 1], 1-D.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Final

import torch

WHISPER_RATE: Final = 16000
WHISPER_N_FFT: Final = 400
WHISPER_HOP: Final = 160
PROMPT_RATE: Final = 24000
PROMPT_N_FFT: Final = 1920
PROMPT_HOP: Final = 480
PROMPT_MELS: Final = 80
PROMPT_FMAX: Final = 8000.0
FBANK_BINS: Final = 80
FBANK_FRAME: Final = 400  # 25 ms at 16 kHz
FBANK_SHIFT: Final = 160  # 10 ms
FBANK_FFT: Final = 512
FBANK_LOW_HZ: Final = 20.0
PREEMPHASIS: Final = 0.97


def _hz_to_slaney_mel(hz: torch.Tensor) -> torch.Tensor:
    f_sp = 200.0 / 3
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = math.log(6.4) / 27.0
    linear = hz / f_sp
    log = min_log_mel + torch.log(torch.clamp(hz, min=min_log_hz) / min_log_hz) / logstep
    return torch.where(hz >= min_log_hz, log, linear)


def _slaney_mel_to_hz(mel: torch.Tensor) -> torch.Tensor:
    f_sp = 200.0 / 3
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = math.log(6.4) / 27.0
    linear = mel * f_sp
    log = min_log_hz * torch.exp(logstep * (mel - min_log_mel))
    return torch.where(mel >= min_log_mel, log, linear)


@cache
def slaney_mel_filters(
    rate: int, n_fft: int, n_mels: int, fmin: float, fmax: float
) -> torch.Tensor:
    """[n_mels, n_fft // 2 + 1] triangular filters, Slaney-normalized (librosa's
    ``filters.mel`` with ``htk=False, norm="slaney"``), float64."""
    fft_hz = torch.linspace(0, rate / 2, n_fft // 2 + 1, dtype=torch.float64)
    low, high = _hz_to_slaney_mel(torch.tensor([fmin, fmax], dtype=torch.float64))
    mel_hz = _slaney_mel_to_hz(
        torch.linspace(float(low), float(high), n_mels + 2, dtype=torch.float64)
    )
    widths = torch.diff(mel_hz)
    ramps = mel_hz[:, None] - fft_hz[None, :]
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = torch.clamp(torch.minimum(lower, upper), min=0.0)
    return weights * (2.0 / (mel_hz[2:] - mel_hz[:-2]))[:, None]


def whisper_log_mel(audio16k: torch.Tensor, n_mels: int = 128) -> torch.Tensor:
    """[1, n_mels, frames] float32: Whisper's log-mel of 16 kHz audio."""
    window = torch.hann_window(WHISPER_N_FFT)
    stft = torch.stft(
        audio16k.float(), WHISPER_N_FFT, WHISPER_HOP, window=window, return_complex=True
    )
    power = stft[..., :-1].abs() ** 2
    filters = slaney_mel_filters(WHISPER_RATE, WHISPER_N_FFT, n_mels, 0.0, WHISPER_RATE / 2)
    mel = filters.float() @ power
    log_spec = torch.clamp(mel, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).unsqueeze(0)


def _kaldi_mel(hz: torch.Tensor) -> torch.Tensor:
    return 1127.0 * torch.log1p(hz / 700.0)


@cache
def kaldi_mel_banks(bins: int, padded: int, rate: int, low_hz: float) -> torch.Tensor:
    """[bins, padded // 2 + 1] Kaldi filters (``MelBanks``): triangles on the 1127 ln(1 +
    f/700) scale between ``low_hz`` and Nyquist, unnormalized, zero at the Nyquist bin."""
    fft_bins = padded // 2
    bin_hz = rate / padded
    mel_low = _kaldi_mel(torch.tensor(low_hz, dtype=torch.float64))
    mel_high = _kaldi_mel(torch.tensor(rate / 2, dtype=torch.float64))
    delta = (mel_high - mel_low) / (bins + 1)
    index = torch.arange(bins, dtype=torch.float64)[:, None]
    left = mel_low + index * delta
    centre = left + delta
    right = centre + delta
    mel = _kaldi_mel(bin_hz * torch.arange(fft_bins, dtype=torch.float64))[None, :]
    up = (mel - left) / (centre - left)
    down = (right - mel) / (right - centre)
    weights = torch.clamp(torch.minimum(up, down), min=0.0)
    return torch.nn.functional.pad(weights, (0, 1))


def kaldi_fbank(audio16k: torch.Tensor) -> torch.Tensor:
    """[frames, 80] float32: Kaldi log filterbank energies of 16 kHz audio (torchaudio's
    ``compliance.kaldi.fbank(num_mel_bins=80, dither=0, sample_frequency=16000)``)."""
    x = audio16k.double()
    if x.numel() < FBANK_FRAME:
        return torch.zeros(0, FBANK_BINS)
    frames = x.unfold(0, FBANK_FRAME, FBANK_SHIFT)
    frames = frames - frames.mean(dim=1, keepdim=True)
    previous = torch.cat([frames[:, :1], frames[:, :-1]], dim=1)
    frames = frames - PREEMPHASIS * previous
    window = torch.hann_window(FBANK_FRAME, periodic=False, dtype=torch.float64).pow(0.85)
    frames = torch.nn.functional.pad(frames * window, (0, FBANK_FFT - FBANK_FRAME))
    power = torch.fft.rfft(frames).abs().pow(2)
    energies = power @ kaldi_mel_banks(FBANK_BINS, FBANK_FFT, WHISPER_RATE, FBANK_LOW_HZ).T
    floor = torch.finfo(torch.float32).eps
    return torch.clamp(energies, min=floor).log().float()


def prompt_mel(audio24k: torch.Tensor) -> torch.Tensor:
    """[1, frames, 80] float32: the flow model's prompt features of 24 kHz audio."""
    pad = (PROMPT_N_FFT - PROMPT_HOP) // 2
    x = torch.nn.functional.pad(audio24k.float()[None, None, :], (pad, pad), mode="reflect")[0, 0]
    window = torch.hann_window(PROMPT_N_FFT)
    stft = torch.stft(x, PROMPT_N_FFT, PROMPT_HOP, window=window, center=False, return_complex=True)
    magnitude = torch.sqrt(stft.real.pow(2) + stft.imag.pow(2) + 1e-9)
    filters = slaney_mel_filters(PROMPT_RATE, PROMPT_N_FFT, PROMPT_MELS, 0.0, PROMPT_FMAX)
    mel = torch.clamp(filters.float() @ magnitude, min=1e-5).log()
    return mel.T.unsqueeze(0)
