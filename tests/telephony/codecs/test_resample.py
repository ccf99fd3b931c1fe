"""StreamingResampler: chunking invariance, lengths, frequency preservation."""

from __future__ import annotations

import numpy as np
import pytest

from telephony.codecs.resample import Quality, StreamingResampler

RATE_PAIRS = [
    (22050, 8000),
    (24000, 8000),
    (16000, 8000),
    (8000, 16000),
    (8000, 48000),
    (44100, 16000),
]


def _pcm(samples: np.ndarray) -> bytes:
    return samples.astype("<i2").tobytes()


def _samples(pcm: bytes) -> np.ndarray:
    return np.frombuffer(pcm, dtype="<i2").astype(np.int16)


def _noise(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.standard_normal(n) * 6000, -32768, 32767).astype(np.int16)


def _whole(resampler: StreamingResampler, pcm: bytes) -> bytes:
    return resampler.process(pcm) + resampler.flush()


def _chunked(resampler: StreamingResampler, pcm: bytes, seed: int) -> bytes:
    """Feed ``pcm`` in random pieces: many single samples, empty chunks, larger runs."""
    rng = np.random.default_rng(seed)
    out = []
    pos = 0
    n_samples = len(pcm) // 2
    while pos < n_samples:
        kind = rng.integers(0, 4)
        size = 1 if kind == 0 else 0 if kind == 1 else int(rng.integers(2, 700))
        out.append(resampler.process(pcm[2 * pos : 2 * (pos + size)]))
        pos += size
    out.append(resampler.process(b""))
    out.append(resampler.flush())
    return b"".join(out)


@pytest.mark.parametrize(("in_rate", "out_rate"), RATE_PAIRS)
@pytest.mark.parametrize("quality", ["HQ", "VHQ", "LQ"])
def test_chunked_output_is_identical_to_whole(
    in_rate: int, out_rate: int, quality: Quality
) -> None:
    pcm = _pcm(_noise(12_000, seed=in_rate + out_rate))
    whole = _whole(StreamingResampler(in_rate, out_rate, quality), pcm)
    for seed in range(3):
        chunked = _chunked(StreamingResampler(in_rate, out_rate, quality), pcm, seed)
        # Exact equality: soxr's float32 streaming is chunking-invariant and the
        # wrapper's int16 rounding is deterministic (no dither).
        assert chunked == whole


@pytest.mark.parametrize(("in_rate", "out_rate"), RATE_PAIRS)
@pytest.mark.parametrize("n", [0, 1, 7, 160, 4410, 22050])
def test_total_length_after_flush(in_rate: int, out_rate: int, n: int) -> None:
    out = _chunked(StreamingResampler(in_rate, out_rate), _pcm(_noise(n, seed=n)), seed=1)
    assert len(out) % 2 == 0
    assert abs(len(out) // 2 - round(n * out_rate / in_rate)) <= 1


def test_flush_readies_an_independent_stream() -> None:
    first = _pcm(_noise(5000, seed=1))
    second = _pcm(_noise(3000, seed=2))
    resampler = StreamingResampler(22050, 8000)
    _whole(resampler, first)
    assert _whole(resampler, second) == _whole(StreamingResampler(22050, 8000), second)


def test_reset_discards_pending_state() -> None:
    resampler = StreamingResampler(24000, 8000)
    resampler.process(_pcm(_noise(999, seed=3)))  # left mid-stream, never flushed
    resampler.reset()
    second = _pcm(_noise(3000, seed=4))
    assert _whole(resampler, second) == _whole(StreamingResampler(24000, 8000), second)


def test_same_rate_is_passthrough() -> None:
    resampler = StreamingResampler(8000, 8000)
    assert resampler.passthrough
    pcm = _pcm(_noise(333, seed=5))
    assert resampler.process(pcm) == pcm
    assert resampler.process(memoryview(pcm)) == pcm
    assert resampler.flush() == b""
    resampler.reset()


def test_rejects_odd_byte_count_and_bad_rates() -> None:
    with pytest.raises(ValueError, match="even number"):
        StreamingResampler(16000, 8000).process(b"\x00\x00\x00")
    with pytest.raises(ValueError, match="even number"):
        StreamingResampler(8000, 8000).process(b"\x00")
    with pytest.raises(ValueError, match="positive"):
        StreamingResampler(0, 8000)


def _dominant_frequency(samples: np.ndarray, rate: int) -> float:
    windowed = samples.astype(np.float64) * np.hanning(len(samples))
    spectrum = np.abs(np.fft.rfft(windowed))
    return float(np.fft.rfftfreq(len(samples), 1 / rate)[int(np.argmax(spectrum))])


def test_sine_keeps_its_frequency_22050_to_8000() -> None:
    in_rate, out_rate = 22050, 8000
    t = np.arange(in_rate) / in_rate  # 1 s
    sine = np.round(np.sin(2 * np.pi * 1000 * t) * 16000).astype(np.int16)
    out = _samples(_chunked(StreamingResampler(in_rate, out_rate), _pcm(sine), seed=9))
    assert abs(len(out) - out_rate) <= 1
    assert abs(_dominant_frequency(out, out_rate) - 1000) <= 1.0
    steady = out[200:-200].astype(np.int32)
    crossings = np.count_nonzero(np.signbit(steady[1:]) != np.signbit(steady[:-1]))
    expected = 2 * 1000 * len(steady) / out_rate
    assert abs(crossings - expected) <= 2
    # Amplitude preserved (the passband is flat): RMS of a 16000-peak sine is ~11314.
    assert abs(np.sqrt(np.mean(steady.astype(np.float64) ** 2)) - 16000 / np.sqrt(2)) < 200


def test_full_scale_input_saturates_instead_of_wrapping() -> None:
    square = np.tile(np.array([32767] * 20 + [-32768] * 20, dtype=np.int16), 200)
    out = _samples(_whole(StreamingResampler(8000, 16000), _pcm(square)))
    # Gibbs overshoot would exceed int16; saturation keeps every sign right.
    assert out.max() == 32767
    assert out.min() == -32768
    steady = out[100:-100]
    assert not np.any((steady[1:].astype(np.int32) - steady[:-1]) > 40000)
