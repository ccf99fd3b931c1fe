"""Tests for gateway.formats: the format registry, frame sizes, encoders, caller audio."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.formats import FORMATS, FRAME_MS, INPUT_FORMATS, AudioFormat
from telephony.codecs import opus

BRIEF_FORMATS = {
    "mulaw_8000": ("mulaw", 8000),
    "alaw_8000": ("alaw", 8000),
    "pcm_8000": ("pcm", 8000),
    "pcm_16000": ("pcm", 16000),
    "pcm_24000": ("pcm", 24000),
    "pcm_48000": ("pcm", 48000),
    "opus_48000": ("opus", 48000),
    "opus_16000": ("opus", 16000),
    "opus_24000": ("opus", 24000),
}
needs_opus = pytest.mark.skipif(not opus.opus_available(), reason="libopus not loadable")


def sine_frame(fmt: AudioFormat, freq: float = 440.0) -> bytes:
    t = np.arange(fmt.frame_samples) / fmt.sample_rate
    samples = np.round(np.sin(2 * np.pi * freq * t) * 8000).astype("<i2")
    return samples.tobytes()


@pytest.mark.parametrize("name", sorted(BRIEF_FORMATS))
def test_every_format_of_the_brief_exists(name: str):
    fmt = FORMATS.get(name)
    assert fmt is not None
    assert fmt is FORMATS[name]
    assert fmt.name == name
    assert (fmt.codec, fmt.sample_rate) == BRIEF_FORMATS[name]
    assert fmt.frame_ms == FRAME_MS == 20


def test_registry_has_exactly_the_brief_formats():
    assert set(FORMATS) == set(BRIEF_FORMATS)
    assert FORMATS.get("mp3_44100") is None
    assert FORMATS.get("MULAW_8000") is None


def test_input_formats_are_the_non_opus_ones():
    assert {n for n, (codec, _) in BRIEF_FORMATS.items() if codec != "opus"} == INPUT_FORMATS


@pytest.mark.parametrize(
    ("name", "samples", "pcm_bytes"),
    [
        ("mulaw_8000", 160, 320),
        ("alaw_8000", 160, 320),
        ("pcm_8000", 160, 320),
        ("pcm_16000", 320, 640),
        ("pcm_24000", 480, 960),
        ("pcm_48000", 960, 1920),
        ("opus_16000", 320, 640),
        ("opus_24000", 480, 960),
        ("opus_48000", 960, 1920),
    ],
)
def test_frame_sizes(name: str, samples: int, pcm_bytes: int):
    fmt = FORMATS[name]
    assert fmt.frame_samples == samples
    assert fmt.pcm_frame_bytes == pcm_bytes


@pytest.mark.parametrize("name", ["mulaw_8000", "alaw_8000"])
def test_g711_encoder_makes_160_bytes_per_20_ms(name: str):
    fmt = FORMATS[name]
    frame = fmt.encoder().encode(sine_frame(fmt))
    assert len(frame) == 160


def test_mulaw_encoder_known_codes():
    enc = FORMATS["mulaw_8000"].encoder()
    assert enc.encode(bytes(320)) == b"\xff" * 160  # silence is 0xFF in mu-law
    loud = np.full(160, 32767, dtype="<i2").tobytes()
    assert enc.encode(loud) == b"\x80" * 160
    quiet_neg = np.full(160, -32768, dtype="<i2").tobytes()
    assert enc.encode(quiet_neg) == b"\x00" * 160


def test_alaw_encoder_silence():
    assert FORMATS["alaw_8000"].encoder().encode(bytes(320)) == b"\xd5" * 160


@pytest.mark.parametrize("name", ["pcm_8000", "pcm_16000", "pcm_24000", "pcm_48000"])
def test_pcm_encoder_is_identity(name: str):
    fmt = FORMATS[name]
    frame = sine_frame(fmt)
    assert fmt.encoder().encode(frame) == frame
    assert len(frame) == fmt.pcm_frame_bytes


@needs_opus
@pytest.mark.parametrize("name", ["opus_16000", "opus_24000", "opus_48000"])
def test_opus_encoder_returns_one_packet_per_frame(name: str):
    fmt = FORMATS[name]
    encoder = fmt.encoder()
    for _ in range(5):
        packet = encoder.encode(sine_frame(fmt))
        assert isinstance(packet, bytes)
        assert 0 < len(packet) < fmt.pcm_frame_bytes


@needs_opus
def test_opus_packet_decodes_to_one_frame():
    from telephony.codecs.opus import OpusDecoder

    fmt = FORMATS["opus_48000"]
    packet = fmt.encoder().encode(sine_frame(fmt))
    assert len(OpusDecoder(fmt.sample_rate).decode(packet)) == fmt.pcm_frame_bytes


@needs_opus
def test_opus_encoder_rejects_a_partial_frame():
    fmt = FORMATS["opus_16000"]
    with pytest.raises(ValueError):
        fmt.encoder().encode(bytes(fmt.pcm_frame_bytes - 2))


def test_each_encoder_call_gives_a_fresh_encoder():
    fmt = FORMATS["mulaw_8000"]
    assert fmt.encoder() is not fmt.encoder()


# --------------------------------------------------------------------- caller audio


def test_decode_input_mulaw():
    fmt = FORMATS["mulaw_8000"]
    pcm = fmt.decode_input(b"\xff" * 160)
    assert pcm == bytes(320)
    original = sine_frame(fmt)
    decoded = np.frombuffer(fmt.decode_input(fmt.encoder().encode(original)), "<i2")
    error = np.abs(decoded.astype(np.int32) - np.frombuffer(original, "<i2"))
    assert len(decoded) == 160
    assert int(error.max()) < 300  # mu-law step size near 8000 is 256


def test_decode_input_alaw():
    fmt = FORMATS["alaw_8000"]
    assert np.all(np.frombuffer(fmt.decode_input(b"\xd5" * 160), "<i2") == 8)
    original = sine_frame(fmt)
    decoded = np.frombuffer(fmt.decode_input(fmt.encoder().encode(original)), "<i2")
    error = np.abs(decoded.astype(np.int32) - np.frombuffer(original, "<i2"))
    assert len(decoded) == 160
    assert int(error.max()) < 300


@pytest.mark.parametrize("name", ["pcm_8000", "pcm_16000", "pcm_24000", "pcm_48000"])
def test_decode_input_pcm_is_passthrough(name: str):
    data = bytes(range(200))
    assert FORMATS[name].decode_input(data) == data
    assert FORMATS[name].decode_input(b"") == b""


def test_decode_input_pcm_needs_whole_samples():
    with pytest.raises(ValueError):
        FORMATS["pcm_16000"].decode_input(b"\x00\x01\x02")


@pytest.mark.parametrize("name", ["opus_16000", "opus_24000", "opus_48000"])
def test_decode_input_refuses_opus(name: str):
    with pytest.raises(ValueError):
        FORMATS[name].decode_input(b"\x00" * 10)


def test_frame_encoders_are_bit_identical_to_the_g711_tables():
    """The hot path may use the C encoders (audioop); they must match telephony.codecs.g711."""
    from telephony.codecs import g711

    rng = np.random.default_rng(3)
    for _ in range(50):
        frame = (rng.standard_normal(160) * 9000).clip(-32768, 32767).astype("<i2").tobytes()
        assert FORMATS["mulaw_8000"].encoder().encode(frame) == g711.ulaw_encode(frame)
        assert FORMATS["alaw_8000"].encoder().encode(frame) == g711.alaw_encode(frame)
    every = np.arange(-32768, 32768, dtype="<i2").tobytes()
    assert FORMATS["mulaw_8000"].encoder().encode(every) == g711.ulaw_encode(every)
    assert FORMATS["alaw_8000"].encoder().encode(every) == g711.alaw_encode(every)
    codes = bytes(range(256))
    assert FORMATS["mulaw_8000"].decode_input(codes) == g711.ulaw_decode_bytes(codes)
    assert FORMATS["alaw_8000"].decode_input(codes) == g711.alaw_decode_bytes(codes)
