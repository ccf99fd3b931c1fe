"""Audio formats on the wire (names fixed by the design brief) and their frame codecs.

Which formats exist, as codec and rate, is the table in ``telephony/codecs/formats.py``;
this module gives each its encoder (a table by codec) and input decoder (another).
Every output format is framed in 20 ms: 160 bytes of mu-law or A-law per frame, 640
bytes of ``pcm_16000``, one Opus packet per frame. The engine produces 16-bit PCM at the
format's sample rate; a :class:`FrameEncoder` turns exactly one frame of it into one
WebSocket binary message. Input formats (caller audio) are decoded back to PCM.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from telephony.codecs import g711
from telephony.codecs.formats import WIRE_FORMATS, AudioSpec

FRAME_MS = 20


_Codec = Callable[[bytes], bytes]


def _fast_g711() -> tuple[_Codec, _Codec, _Codec, _Codec] | None:
    """The stdlib's C G.711 encoders (``audioop``: Python 3.11-3.12, or the
    ``audioop-lts`` package later), about 5x faster per 20 ms frame than the numpy
    tables of :mod:`telephony.codecs.g711`, and bit-identical to them (tested). None if absent."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import audioop
    except ImportError:
        return None
    return (
        lambda pcm: audioop.lin2ulaw(pcm, 2),
        lambda pcm: audioop.lin2alaw(pcm, 2),
        lambda data: audioop.ulaw2lin(data, 2),
        lambda data: audioop.alaw2lin(data, 2),
    )


_FAST = _fast_g711()
_ULAW_DECODE: _Codec = _FAST[2] if _FAST else g711.ulaw_decode_bytes
_ALAW_DECODE: _Codec = _FAST[3] if _FAST else g711.alaw_decode_bytes


class FrameEncoder(Protocol):
    def encode(self, pcm_frame: bytes) -> bytes:
        """Encode exactly one frame of 16-bit little-endian mono PCM."""
        ...


class _Pcm:
    def encode(self, pcm_frame: bytes) -> bytes:
        return pcm_frame


class _Mulaw:
    encode = staticmethod(_FAST[0] if _FAST else g711.ulaw_encode)


class _Alaw:
    encode = staticmethod(_FAST[1] if _FAST else g711.alaw_encode)


def _opus_encoder(sample_rate: int) -> FrameEncoder:
    from telephony.codecs.opus import OpusEncoder

    return OpusEncoder(sample_rate, frame_ms=FRAME_MS, application="voip")


@dataclass(frozen=True)
class AudioFormat:
    name: str
    codec: str  # "mulaw" | "alaw" | "pcm" | "opus"
    sample_rate: int
    frame_ms: int = FRAME_MS

    @property
    def frame_samples(self) -> int:
        return self.sample_rate * self.frame_ms // 1000

    @property
    def pcm_frame_bytes(self) -> int:
        """Bytes of engine PCM (16-bit) that make one frame."""
        return self.frame_samples * 2

    def encoder(self) -> FrameEncoder:
        return _ENCODERS[self.codec](self.sample_rate)

    def decode_input(self, data: bytes) -> bytes:
        """Caller audio in this format -> 16-bit little-endian PCM at ``sample_rate``."""
        decode = _DECODERS.get(self.codec)
        if decode is None:
            raise ValueError(f"{self.name} is not accepted as caller audio")
        return decode(data)


def _pcm_input(data: bytes) -> bytes:
    if len(data) % 2:
        raise ValueError("16-bit PCM needs an even number of bytes")
    return data


#: Caller audio decoders by codec (Opus is not accepted as caller audio).
_DECODERS: dict[str, _Codec] = {"mulaw": _ULAW_DECODE, "alaw": _ALAW_DECODE, "pcm": _pcm_input}


_ENCODERS: dict[str, Callable[[int], FrameEncoder]] = {
    "pcm": lambda _rate: _Pcm(),
    "mulaw": lambda _rate: _Mulaw(),
    "alaw": lambda _rate: _Alaw(),
    "opus": _opus_encoder,
}

FORMATS: dict[str, AudioFormat] = {
    spec.name: AudioFormat(spec.name, spec.codec.value, spec.sample_rate) for spec in WIRE_FORMATS
}
INPUT_FORMATS = frozenset(name for name, f in FORMATS.items() if f.codec in _DECODERS)


def format_of(spec: AudioSpec) -> AudioFormat:
    """The wire format of ``spec`` (KeyError: the gateway has none for it)."""
    return FORMATS[spec.name]
