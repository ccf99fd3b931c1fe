"""The speech endpoint's containers, encoded from a tone and decoded back."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
import soundfile  # type: ignore[import-untyped]

from gateway.speech_formats import SPEECH_FORMATS
from telephony.codecs import opus


def tone(rate: int, seconds: float = 1.0) -> list[bytes]:
    t = np.arange(int(rate * seconds)) / rate
    pcm = np.round(np.sin(2 * np.pi * 440 * t) * 8000).astype("<i2").tobytes()
    frame = rate // 50 * 2
    return [pcm[i : i + frame] for i in range(0, len(pcm), frame)]


def encode(name: str, seconds: float = 1.0) -> bytes:
    fmt = SPEECH_FORMATS[name]
    encoder = fmt.encoder()
    parts = [encoder.start()]
    parts += [encoder.encode(frame) for frame in tone(fmt.engine_format.sample_rate, seconds)]
    parts.append(encoder.end())
    return b"".join(parts)


def test_pcm_is_the_frames_and_wav_puts_a_streaming_header_before_them() -> None:
    assert encode("pcm") == b"".join(tone(24000))
    wav = encode("wav")
    assert wav[:4] == b"RIFF" and wav[8:12] == b"WAVE" and wav[36:40] == b"data"
    assert struct.unpack("<I", wav[40:44])[0] == 0xFFFFFFFF  # length unknown while streaming
    assert struct.unpack("<HHIIHH", wav[20:36]) == (1, 1, 24000, 48000, 2, 16)
    assert wav[44:] == b"".join(tone(24000))


def test_mp3_decodes_to_the_tone() -> None:
    audio, rate = soundfile.read(io.BytesIO(encode("mp3", 2.0)), dtype="int16")
    assert rate == 24000
    assert abs(len(audio) - 2 * 24000) <= 2 * 1152  # encoder delay and last-frame padding
    spectrum = np.abs(np.fft.rfft(audio[4800:28800] * np.hanning(24000)))
    assert abs(float(np.argmax(spectrum)) - 440) <= 2  # 1 Hz bins


@pytest.mark.skipif(not opus.opus_available(), reason="libopus not loadable")
def test_opus_is_an_ogg_stream_with_one_page_per_packet() -> None:
    ogg = encode("opus")
    pages = ogg.count(b"OggS")
    assert ogg[28:36] == b"OpusHead"
    assert pages == 2 + 50 + 1  # headers, one page per 20 ms packet, the end page
