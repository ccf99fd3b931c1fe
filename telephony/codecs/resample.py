"""Streaming sample-rate conversion of 16-bit mono PCM, built on libsoxr.

``StreamingResampler`` keeps the filter state between calls, so a signal fed in
arbitrary pieces (down to single samples, or empty chunks) produces exactly the
same samples as the signal fed in one piece: there are no clicks at chunk
boundaries.

Design note: libsoxr applies TPDF dither when it writes 16-bit integer output, and
the dither sequence depends on how the stream was chunked (chunked and one-shot
int16 output differ by up to 2 LSB). To make the result independent of chunking,
the stream runs soxr in float32 and rounds to int16 here, without dither. With
float32 I/O soxr's streaming output is bit-identical for any chunking, and so is
this class's.
"""

from __future__ import annotations

from typing import Final, Literal

import numpy as np
import numpy.typing as npt
import soxr

__all__ = ["Quality", "StreamingResampler"]

Quality = Literal["QQ", "LQ", "MQ", "HQ", "VHQ"]

_LE_INT16: Final = np.dtype("<i2")
_SCALE: Final = 32768.0
_EMPTY: Final = np.zeros(0, dtype=np.float32)


class StreamingResampler:
    """Convert a stream of 16-bit signed little-endian mono PCM between sample rates.

    Contract:

    * ``process(pcm)`` accepts any whole number of samples (an even byte count,
      possibly zero) and returns the output that is ready so far; soxr holds back a
      short tail (its filter delay) until ``flush``.
    * ``flush()`` returns that tail and ends the stream. The concatenation of every
      ``process`` result and the ``flush`` result is identical whatever the input
      chunking, and has ``round(n * out_rate / in_rate)`` samples for ``n`` input
      samples (as soxr computes it). After ``flush`` the resampler is ready for a new,
      independent stream.
    * ``reset()`` discards any pending state without output and readies the
      resampler for a new, independent stream.
    * When ``in_rate == out_rate`` the resampler is a pass-through: ``process``
      returns its input unchanged and ``flush`` returns ``b""``.
    * Output is rounded to the nearest integer and saturated to the int16 range.
    """

    def __init__(self, in_rate: int, out_rate: int, quality: Quality = "HQ") -> None:
        if in_rate <= 0 or out_rate <= 0:
            raise ValueError(f"sample rates must be positive, got {in_rate} -> {out_rate}")
        self._in_rate: Final = in_rate
        self._out_rate: Final = out_rate
        self._quality: Final = quality
        self._stream: soxr.ResampleStream | None = None
        if in_rate != out_rate:
            self._stream = soxr.ResampleStream(
                in_rate, out_rate, 1, dtype="float32", quality=quality
            )

    @property
    def in_rate(self) -> int:
        """Input sample rate in Hz."""
        return self._in_rate

    @property
    def out_rate(self) -> int:
        """Output sample rate in Hz."""
        return self._out_rate

    @property
    def passthrough(self) -> bool:
        """True when input and output rates are equal and samples are not touched."""
        return self._stream is None

    def process(self, pcm: bytes | bytearray | memoryview) -> bytes:
        """Resample the next chunk of the stream; returns the output ready so far.

        Raises ValueError if ``pcm`` has an odd number of bytes.
        """
        if len(pcm) % 2:
            raise ValueError(f"16-bit PCM must have an even number of bytes, got {len(pcm)}")
        if self._stream is None:
            return bytes(pcm)
        if not pcm:
            return b""
        samples = np.frombuffer(pcm, dtype=_LE_INT16).astype(np.float32) / np.float32(_SCALE)
        return _to_pcm(self._stream.resample_chunk(samples))

    def flush(self) -> bytes:
        """Return the held-back tail, end the stream and get ready for a new one."""
        if self._stream is None:
            return b""
        tail = _to_pcm(self._stream.resample_chunk(_EMPTY, last=True))
        self._stream.clear()
        return tail

    def reset(self) -> None:
        """Drop any pending state; the next ``process`` starts an independent stream."""
        if self._stream is not None:
            self._stream.clear()


def _to_pcm(samples: npt.NDArray[np.float32]) -> bytes:
    """Round float samples in [-1, 1) to saturated 16-bit little-endian PCM."""
    if samples.size == 0:
        return b""
    scaled = np.rint(samples.astype(np.float64) * _SCALE)
    return np.clip(scaled, -32768, 32767).astype(_LE_INT16).tobytes()
