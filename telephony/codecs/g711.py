"""G.711 mu-law and A-law companding (ITU-T Recommendation G.711, 11/1988).

Encoding and decoding are single numpy table look-ups:

* encode: a 65536-entry ``uint8`` table indexed by the 16-bit linear sample viewed as
  ``uint16`` (so ``-1`` is index ``0xFFFF``);
* decode: a 256-entry ``int16`` table indexed by the code byte.

The tables are computed once at import time from the G.711 segment/quantisation
rules, in the integer formulation of the widely used Sun Microsystems reference
implementation (``g711.c``), which is also what CPython's ``audioop`` uses. The
result is bit-exact with ``audioop.lin2ulaw``/``ulaw2lin``/``lin2alaw``/``alaw2lin``
at width 2 for every input:

* mu-law (G.711 Table 2a): the 16-bit sample is reduced to 14 bits by an arithmetic
  shift, its magnitude is clipped to 8159, biased by 33, and placed in one of eight
  segments; the code word is ``sign | segment << 4 | 4-bit step`` with all bits
  inverted (G.711 transmits mu-law characters inverted).
* A-law (G.711 Table 1a): the sample is reduced to 13 bits, negative values map to
  ``-x - 1``, the magnitude is placed in one of eight segments, and the code word has
  its even bits inverted (XOR ``0x55``); the sign bit is 1 for positive samples.

PCM is 16-bit signed little-endian mono throughout (``bytes``), or an integer numpy
array of samples in the int16 range.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

__all__ = [
    "alaw_decode",
    "alaw_decode_bytes",
    "alaw_encode",
    "ulaw_decode",
    "ulaw_decode_bytes",
    "ulaw_encode",
]

_ULAW_BIAS: Final = 0x84  # 132: bias of the 16-bit formulation (33 in 14-bit units)
_ULAW_CLIP: Final = 8159  # largest 14-bit magnitude before biasing
_SEG_ULAW_END: Final = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF])
_SEG_ALAW_END: Final = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF])

_LE_INT16: Final = np.dtype("<i2")


def _all_int16_by_uint16_index() -> npt.NDArray[np.int32]:
    """Every int16 value, ordered so that element ``i`` is ``np.uint16(i)`` as int16."""
    return np.arange(65536, dtype=np.uint16).view(np.int16).astype(np.int32)


def _segment(
    magnitude: npt.NDArray[np.int32], seg_end: npt.NDArray[np.int64]
) -> npt.NDArray[np.int32]:
    """Index of the first segment whose end is >= magnitude (8 when beyond the last)."""
    return np.searchsorted(seg_end, magnitude, side="left").astype(np.int32)


def _build_ulaw_encode_table() -> npt.NDArray[np.uint8]:
    """G.711 mu-law encoder (Table 2a) for all 65536 linear inputs."""
    pcm14 = _all_int16_by_uint16_index() >> 2  # 16-bit to 14-bit, arithmetic shift
    negative = pcm14 < 0
    mask = np.where(negative, 0x7F, 0xFF)
    magnitude = np.minimum(np.abs(pcm14), _ULAW_CLIP) + (_ULAW_BIAS >> 2)
    seg = _segment(magnitude, _SEG_ULAW_END)
    step = (np.minimum(seg, 7) << 4) | ((magnitude >> (seg + 1)) & 0x0F)
    # Beyond the last segment (clipped magnitude 8159 + 33 = 0x2000): the maximum code.
    code = np.where(seg >= 8, 0x7F, step) ^ mask
    return code.astype(np.uint8)


def _build_ulaw_decode_table() -> npt.NDArray[np.int16]:
    """G.711 mu-law decoder (Table 2a) for all 256 code words."""
    u = ~np.arange(256, dtype=np.int32) & 0xFF  # undo the transmission inversion
    t = (((u & 0x0F) << 3) + _ULAW_BIAS) << ((u & 0x70) >> 4)
    linear = np.where(u & 0x80, _ULAW_BIAS - t, t - _ULAW_BIAS)
    return linear.astype(np.int16)


def _build_alaw_encode_table() -> npt.NDArray[np.uint8]:
    """G.711 A-law encoder (Table 1a) for all 65536 linear inputs."""
    pcm13 = _all_int16_by_uint16_index() >> 3  # 16-bit to 13-bit, arithmetic shift
    negative = pcm13 < 0
    mask = np.where(negative, 0x55, 0xD5)  # sign bit set for positive, even bits inverted
    magnitude = np.where(negative, -pcm13 - 1, pcm13)
    seg = _segment(magnitude, _SEG_ALAW_END)
    shift = np.where(seg < 2, 1, seg)
    step = (np.minimum(seg, 7) << 4) | ((magnitude >> shift) & 0x0F)
    # Beyond the last segment: the maximum code (cannot happen for 13-bit input, kept
    # so the table follows the reference algorithm for any magnitude).
    code = np.where(seg >= 8, 0x7F, step) ^ mask
    return code.astype(np.uint8)


def _build_alaw_decode_table() -> npt.NDArray[np.int16]:
    """G.711 A-law decoder (Table 1a) for all 256 code words."""
    a = np.arange(256, dtype=np.int32) ^ 0x55
    seg = (a & 0x70) >> 4
    t = (a & 0x0F) << 4
    t = np.where(seg == 0, t + 8, (t + 0x108) << np.maximum(seg - 1, 0))
    linear = np.where(a & 0x80, t, -t)
    return linear.astype(np.int16)


_ULAW_ENCODE: Final = _build_ulaw_encode_table()
_ULAW_DECODE: Final = _build_ulaw_decode_table()
_ALAW_ENCODE: Final = _build_alaw_encode_table()
_ALAW_DECODE: Final = _build_alaw_decode_table()


def _pcm_as_uint16(
    pcm: bytes | bytearray | memoryview | npt.NDArray[np.integer],
) -> npt.NDArray[np.uint16]:
    """Interpret PCM as int16 samples and return them viewed as uint16 table indices.

    ``bytes``-like input is 16-bit signed little-endian and must have an even length.
    Array input must be an integer array with values in the int16 range.
    """
    if isinstance(pcm, np.ndarray):
        if not np.issubdtype(pcm.dtype, np.integer):
            raise TypeError(f"PCM array must be integer-typed, got {pcm.dtype}")
        if pcm.dtype != np.int16:
            if pcm.size and (pcm.min() < -32768 or pcm.max() > 32767):
                raise ValueError("PCM array values must be in the int16 range")
            pcm = pcm.astype(np.int16)
        return np.ascontiguousarray(pcm, dtype=np.int16).reshape(-1).view(np.uint16)
    if len(pcm) % 2:
        raise ValueError(f"16-bit PCM must have an even number of bytes, got {len(pcm)}")
    samples = np.frombuffer(pcm, dtype=_LE_INT16).astype(np.int16, copy=False)
    return samples.view(np.uint16)


def _codes(data: bytes | bytearray | memoryview) -> npt.NDArray[np.uint8]:
    return np.frombuffer(data, dtype=np.uint8)


def ulaw_encode(pcm: bytes | bytearray | memoryview | npt.NDArray[np.integer]) -> bytes:
    """Encode 16-bit linear PCM to G.711 mu-law, one code byte per sample.

    Equivalent to ``audioop.lin2ulaw(pcm, 2)``.
    """
    return _ULAW_ENCODE[_pcm_as_uint16(pcm)].tobytes()


def ulaw_decode(data: bytes | bytearray | memoryview) -> npt.NDArray[np.int16]:
    """Decode G.711 mu-law code bytes to an int16 array (one sample per byte)."""
    return _ULAW_DECODE[_codes(data)]


def ulaw_decode_bytes(data: bytes | bytearray | memoryview) -> bytes:
    """Decode G.711 mu-law to 16-bit little-endian PCM bytes.

    Equivalent to ``audioop.ulaw2lin(data, 2)`` on a little-endian host.
    """
    return ulaw_decode(data).astype(_LE_INT16, copy=False).tobytes()


def alaw_encode(pcm: bytes | bytearray | memoryview | npt.NDArray[np.integer]) -> bytes:
    """Encode 16-bit linear PCM to G.711 A-law, one code byte per sample.

    Equivalent to ``audioop.lin2alaw(pcm, 2)``.
    """
    return _ALAW_ENCODE[_pcm_as_uint16(pcm)].tobytes()


def alaw_decode(data: bytes | bytearray | memoryview) -> npt.NDArray[np.int16]:
    """Decode G.711 A-law code bytes to an int16 array (one sample per byte)."""
    return _ALAW_DECODE[_codes(data)]


def alaw_decode_bytes(data: bytes | bytearray | memoryview) -> bytes:
    """Decode G.711 A-law to 16-bit little-endian PCM bytes.

    Equivalent to ``audioop.alaw2lin(data, 2)`` on a little-endian host.
    """
    return alaw_decode(data).astype(_LE_INT16, copy=False).tobytes()
