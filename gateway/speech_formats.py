"""The containers of ``POST /v1/audio/speech`` (:mod:`gateway.speech_api`): streamable
encoders that turn the session's 20 ms PCM frames into the bytes of one HTTP response.

OpenAI's ``response_format`` names, what each is here, and the engine output it takes:

- ``pcm``: raw 16-bit little-endian mono at 24 kHz, as OpenAI sends it;
- ``wav``: the same behind a RIFF header written before the length is known (sizes
  0xFFFFFFFF, what streaming WAV writers do; players read to the end);
- ``opus``: Ogg Opus (RFC 7845), 48 kHz, one 20 ms packet per page so that every chunk
  of the response is playable as it arrives;
- ``mp3``: MPEG-1/2 layer III from LAME (the ``lameenc`` package, LGPL-3.0-or-later,
  a binding of the maintained LAME encoder), 24 kHz mono, 64 kbit/s.

``aac`` and ``flac`` have no maintained streaming encoder among this project's
dependencies: they are refused with ``unsupported_format``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gateway.formats import AudioFormat, format_of
from telephony.codecs.formats import pcm
from telephony.codecs.ogg_opus import OggOpusWriter
from telephony.codecs.opus import OpusEncoder

__all__ = ["SPEECH_FORMATS", "SpeechEncoder", "SpeechFormat"]

MP3_BITRATE_KBPS = 64


class SpeechEncoder(Protocol):
    def start(self) -> bytes:
        """What precedes the audio (a header; may be empty)."""
        ...

    def encode(self, pcm_frame: bytes) -> bytes:
        """One 20 ms frame of the session's PCM; the bytes ready to send (may be empty)."""
        ...

    def end(self) -> bytes:
        """What closes the stream (a final page, the encoder's tail)."""
        ...


class _RawPcm:
    def start(self) -> bytes:
        return b""

    def encode(self, pcm_frame: bytes) -> bytes:
        return pcm_frame

    def end(self) -> bytes:
        return b""


class _StreamingWav(_RawPcm):
    def __init__(self, sample_rate: int) -> None:
        self._rate = sample_rate

    def start(self) -> bytes:
        unknown = 0xFFFFFFFF
        fmt = struct.pack("<HHIIHH", 1, 1, self._rate, self._rate * 2, 2, 16)
        return (
            b"RIFF"
            + struct.pack("<I", unknown)
            + b"WAVEfmt "
            + struct.pack("<I", len(fmt))
            + fmt
            + b"data"
            + struct.pack("<I", unknown)
        )


class _OggOpus:
    def __init__(self, sample_rate: int) -> None:
        self._encoder = OpusEncoder(sample_rate, frame_ms=20, application="audio")
        self._writer = OggOpusWriter(sample_rate, pre_skip=self._encoder.pre_skip_48k)

    def start(self) -> bytes:
        return self._writer.header_pages()

    def encode(self, pcm_frame: bytes) -> bytes:
        packet = self._encoder.encode(pcm_frame)
        return self._writer.packet(packet, self._encoder.frame_samples_48k)

    def end(self) -> bytes:
        return self._writer.end()


class _Mp3:
    def __init__(self, sample_rate: int) -> None:
        import lameenc

        encoder = lameenc.Encoder()
        encoder.set_bit_rate(MP3_BITRATE_KBPS)
        encoder.set_in_sample_rate(sample_rate)
        encoder.set_channels(1)
        encoder.set_quality(5)  # LAME's default speed/quality trade-off
        self._encoder = encoder

    def start(self) -> bytes:
        return b""

    def encode(self, pcm_frame: bytes) -> bytes:
        return bytes(self._encoder.encode(pcm_frame))

    def end(self) -> bytes:
        return bytes(self._encoder.flush())


@dataclass(frozen=True)
class SpeechFormat:
    name: str
    content_type: str
    engine_format: AudioFormat  # what the session asks the engine for (PCM)
    make: Callable[[int], SpeechEncoder]

    def encoder(self) -> SpeechEncoder:
        return self.make(self.engine_format.sample_rate)


SPEECH_FORMATS: dict[str, SpeechFormat] = {
    f.name: f
    for f in (
        SpeechFormat("pcm", "audio/pcm", format_of(pcm(24000)), lambda _rate: _RawPcm()),
        SpeechFormat("wav", "audio/wav", format_of(pcm(24000)), _StreamingWav),
        SpeechFormat("opus", "audio/ogg", format_of(pcm(48000)), _OggOpus),
        SpeechFormat("mp3", "audio/mpeg", format_of(pcm(24000)), _Mp3),
    )
}
