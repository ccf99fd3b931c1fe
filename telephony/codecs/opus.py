"""Mono Opus (RFC 6716) encoder and decoder, a thin wrapper over ``opuslib``/libopus.

``opuslib`` is imported lazily, on the first encoder or decoder construction, so that
importing this module never fails; if libopus cannot be found or loaded,
construction raises ``OpusUnavailable``.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any, Final, Literal

from telephony.codecs.formats import OPUS_RATES

__all__ = [
    "SUPPORTED_RATES",
    "Application",
    "OpusDecoder",
    "OpusEncoder",
    "OpusUnavailable",
    "opus_available",
]

SUPPORTED_RATES: Final = OPUS_RATES
"""Sample rates libopus accepts for encoding and decoding, in Hz (telephony/codecs/formats.py)."""

_FRAME_MS: Final = frozenset({10, 20, 40, 60})
_MAX_FRAME_MS: Final = 120  # longest duration one Opus packet can carry (RFC 6716 3.2.5)

Application = Literal["voip", "audio"]

_opuslib: ModuleType | None = None


class OpusUnavailable(RuntimeError):
    """libopus (or the ``opuslib`` binding) cannot be imported or loaded."""


def _load() -> ModuleType:
    """Import ``opuslib`` once, translating any loader failure into OpusUnavailable."""
    global _opuslib
    if _opuslib is None:
        try:
            _opuslib = importlib.import_module("opuslib")
        except Exception as exc:  # opuslib raises a bare Exception when libopus is missing
            raise OpusUnavailable(f"Opus codec unavailable: {exc}") from exc
    return _opuslib


def opus_available() -> bool:
    """True if libopus can be loaded in this process."""
    try:
        _load()
    except OpusUnavailable:
        return False
    return True


def _check_rate(sample_rate: int) -> None:
    if sample_rate not in SUPPORTED_RATES:
        raise ValueError(
            f"unsupported Opus sample rate {sample_rate}; use one of {sorted(SUPPORTED_RATES)}"
        )


class OpusEncoder:
    """Encode fixed-size frames of 16-bit little-endian mono PCM to Opus packets.

    ``frame_ms`` is one of 10, 20, 40 or 60. ``application`` selects libopus's
    ``OPUS_APPLICATION_VOIP`` (speech-tuned) or ``OPUS_APPLICATION_AUDIO``. ``bitrate``
    in bits per second, or ``None`` for the libopus default.
    """

    def __init__(
        self,
        sample_rate: int,
        frame_ms: int = 20,
        application: Application = "voip",
        bitrate: int | None = None,
    ) -> None:
        _check_rate(sample_rate)
        if frame_ms not in _FRAME_MS:
            raise ValueError(f"unsupported Opus frame duration {frame_ms} ms")
        if application not in ("voip", "audio"):
            raise ValueError(f"application must be 'voip' or 'audio', got {application!r}")
        opuslib = _load()
        self._sample_rate: Final = sample_rate
        self._frame_ms: Final = frame_ms
        self._frame_samples: Final = sample_rate * frame_ms // 1000
        self._encoder: Any = opuslib.Encoder(sample_rate, 1, application)
        if bitrate is not None:
            if not 500 <= bitrate <= 512_000:
                raise ValueError(f"Opus bitrate must be 500..512000 bit/s, got {bitrate}")
            self._encoder.bitrate = bitrate

    @property
    def sample_rate(self) -> int:
        """Input sample rate in Hz."""
        return self._sample_rate

    @property
    def frame_ms(self) -> int:
        """Frame duration in milliseconds."""
        return self._frame_ms

    @property
    def frame_samples(self) -> int:
        """Samples per frame at the input rate."""
        return self._frame_samples

    @property
    def frame_bytes(self) -> int:
        """Bytes of 16-bit mono PCM per frame; ``encode`` requires exactly this many."""
        return self._frame_samples * 2

    @property
    def frame_samples_48k(self) -> int:
        """Frame duration in 48 kHz samples (the unit of Ogg Opus granule positions)."""
        return 48 * self._frame_ms

    @property
    def lookahead(self) -> int:
        """Encoder delay in samples at the input rate (``OPUS_GET_LOOKAHEAD``)."""
        return int(self._encoder.lookahead)

    @property
    def pre_skip_48k(self) -> int:
        """Encoder delay in 48 kHz samples: the Ogg Opus pre-skip for this encoder."""
        return self.lookahead * (48000 // self._sample_rate)

    def encode(self, pcm_frame: bytes | bytearray | memoryview) -> bytes:
        """Encode exactly one frame (``frame_bytes`` bytes) and return one Opus packet.

        Raises ValueError if the frame has the wrong size.
        """
        if len(pcm_frame) != self.frame_bytes:
            raise ValueError(
                f"Opus frame must be {self.frame_bytes} bytes "
                f"({self._frame_ms} ms at {self._sample_rate} Hz), got {len(pcm_frame)}"
            )
        packet: bytes = self._encoder.encode(bytes(pcm_frame), self._frame_samples)
        return packet

    def reset(self) -> None:
        """Return the encoder to its freshly initialised state (``OPUS_RESET_STATE``)."""
        self._encoder.reset_state()


class OpusDecoder:
    """Decode Opus packets to 16-bit little-endian mono PCM at ``sample_rate``."""

    def __init__(self, sample_rate: int) -> None:
        _check_rate(sample_rate)
        opuslib = _load()
        self._sample_rate: Final = sample_rate
        self._max_samples: Final = sample_rate * _MAX_FRAME_MS // 1000
        self._decoder: Any = opuslib.Decoder(sample_rate, 1)

    @property
    def sample_rate(self) -> int:
        """Output sample rate in Hz."""
        return self._sample_rate

    def decode(self, packet: bytes | bytearray | memoryview) -> bytes:
        """Decode one packet; returns all the PCM it carries (its own duration).

        Raises ValueError for an empty packet (packet-loss concealment is not offered
        here) and ``opuslib.OpusError`` for a corrupt one.
        """
        if not packet:
            raise ValueError("empty Opus packet")
        pcm: bytes = self._decoder.decode(bytes(packet), self._max_samples)
        return pcm

    def reset(self) -> None:
        """Return the decoder to its freshly initialised state (``OPUS_RESET_STATE``)."""
        self._decoder.reset_state()
