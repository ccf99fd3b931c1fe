"""Opus encoder/decoder wrapper: round trip through libopus, frame contract, errors."""

from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest

from telephony.codecs import opus
from telephony.codecs.opus import OpusDecoder, OpusEncoder, OpusUnavailable

pytestmark = pytest.mark.skipif(not opus.opus_available(), reason="libopus not loadable")

RATES = [16000, 24000, 48000]


def sine(rate: int, freq: float = 440.0, seconds: float = 1.0, amp: float = 10000) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return np.round(np.sin(2 * np.pi * freq * t) * amp).astype(np.int16)


def dominant_frequency(samples: np.ndarray, rate: int) -> float:
    windowed = samples.astype(np.float64) * np.hanning(len(samples))
    spectrum = np.abs(np.fft.rfft(windowed))
    return float(np.fft.rfftfreq(len(samples), 1 / rate)[int(np.argmax(spectrum))])


def encode_all(encoder: OpusEncoder, samples: np.ndarray) -> list[bytes]:
    pcm = samples.astype("<i2").tobytes()
    step = encoder.frame_bytes
    assert len(pcm) % step == 0
    return [encoder.encode(pcm[i : i + step]) for i in range(0, len(pcm), step)]


@pytest.mark.parametrize("application", ["voip", "audio"])
@pytest.mark.parametrize("rate", RATES)
def test_round_trip_through_opuslib_decoder(rate: int, application: opus.Application) -> None:
    import opuslib

    encoder = OpusEncoder(rate, frame_ms=20, application=application)
    assert encoder.frame_samples == rate // 50
    assert encoder.frame_bytes == 2 * encoder.frame_samples
    x = sine(rate)
    packets = encode_all(encoder, x)
    assert len(packets) == 50
    assert all(0 < len(p) <= 1275 for p in packets)

    reference = opuslib.Decoder(rate, 1)
    decoded_frames = [reference.decode(p, encoder.frame_samples) for p in packets]
    assert all(len(f) == encoder.frame_bytes for f in decoded_frames)
    y = np.frombuffer(b"".join(decoded_frames), dtype="<i2").astype(np.float64)

    # The decoder output lags the input by the encoder's lookahead.
    delay = encoder.lookahead
    assert encoder.pre_skip_48k == delay * 48000 // rate
    warmup = rate // 10
    aligned_out = y[delay + warmup :]
    aligned_in = x[warmup : len(x) - delay].astype(np.float64)
    corr = np.dot(aligned_out, aligned_in) / np.sqrt(
        np.dot(aligned_out, aligned_out) * np.dot(aligned_in, aligned_in)
    )
    assert corr > 0.9
    energy_ratio = np.sqrt(np.mean(aligned_out**2) / np.mean(aligned_in**2))
    assert 0.8 < energy_ratio < 1.2
    assert abs(dominant_frequency(y[delay:], rate) - 440) <= 2


@pytest.mark.parametrize("rate", [8000, 12000, *RATES])
def test_wrapper_decoder_returns_one_frame_per_packet(rate: int) -> None:
    encoder = OpusEncoder(rate, frame_ms=20, bitrate=24000)
    decoder = OpusDecoder(rate)
    x = sine(rate, freq=300, seconds=0.2)
    out = [decoder.decode(p) for p in encode_all(encoder, x)]
    assert [len(f) for f in out] == [encoder.frame_bytes] * 10


@pytest.mark.parametrize("frame_ms", [10, 20, 40, 60])
def test_frame_sizes(frame_ms: int) -> None:
    encoder = OpusEncoder(16000, frame_ms=frame_ms)
    assert encoder.frame_samples == 16 * frame_ms
    assert encoder.frame_samples_48k == 48 * frame_ms
    packet = encoder.encode(bytes(encoder.frame_bytes))
    assert len(OpusDecoder(16000).decode(packet)) == encoder.frame_bytes


def test_encode_requires_exactly_one_frame() -> None:
    encoder = OpusEncoder(16000)
    for size in (0, encoder.frame_bytes - 2, encoder.frame_bytes + 2, 2 * encoder.frame_bytes):
        with pytest.raises(ValueError, match="640 bytes"):
            encoder.encode(bytes(size))


def test_rejects_bad_configuration() -> None:
    with pytest.raises(ValueError, match="sample rate"):
        OpusEncoder(44100)
    with pytest.raises(ValueError, match="sample rate"):
        OpusDecoder(22050)
    with pytest.raises(ValueError, match="frame duration"):
        OpusEncoder(16000, frame_ms=25)
    with pytest.raises(ValueError, match="application"):
        OpusEncoder(16000, application="music")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="bitrate"):
        OpusEncoder(16000, bitrate=100)
    with pytest.raises(ValueError, match="empty"):
        OpusDecoder(16000).decode(b"")


def test_bitrate_setting_changes_packet_size() -> None:
    x = sine(48000, freq=440, seconds=0.4)
    low = sum(map(len, encode_all(OpusEncoder(48000, application="audio", bitrate=12000), x)))
    high = sum(map(len, encode_all(OpusEncoder(48000, application="audio", bitrate=96000), x)))
    assert high > 3 * low


def test_reset_makes_encoder_deterministic() -> None:
    encoder = OpusEncoder(24000)
    x = sine(24000, seconds=0.2)
    first = encode_all(encoder, x)
    encoder.reset()
    assert encode_all(encoder, x) == first


def test_missing_binding_raises_opus_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(opus, "_opuslib", None)
    monkeypatch.setitem(sys.modules, "opuslib", None)  # makes `import opuslib` fail
    with pytest.raises(OpusUnavailable, match="opuslib"):
        OpusDecoder(16000)


def test_missing_libopus_raises_opus_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(name: str) -> None:
        # What opuslib itself raises at import when ctypes cannot find libopus.
        raise Exception("Could not find Opus library. Make sure it is installed.")

    monkeypatch.setattr(opus, "_opuslib", None)
    monkeypatch.setattr(importlib, "import_module", fail)
    with pytest.raises(OpusUnavailable, match="Could not find Opus library"):
        OpusEncoder(16000)
    with pytest.raises(OpusUnavailable):
        OpusDecoder(16000)
    assert not opus.opus_available()
    assert issubclass(OpusUnavailable, RuntimeError)
