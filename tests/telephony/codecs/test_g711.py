"""G.711 tables against CPython's ``audioop`` (an independent implementation)."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from types import ModuleType

import numpy as np
import pytest

from telephony.codecs import g711

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    audioop: ModuleType = pytest.importorskip("audioop")

ALL_PCM = np.arange(-32768, 32768, dtype=np.int16)
ALL_PCM_BYTES = ALL_PCM.astype("<i2").tobytes()
ALL_CODES = bytes(range(256))

needs_le = pytest.mark.skipif(sys.byteorder != "little", reason="audioop uses native order")


def _audioop(name: str) -> Callable[..., bytes]:
    fn: Callable[..., bytes] = getattr(audioop, name)

    def call(*args: object) -> bytes:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return fn(*args)

    return call


@needs_le
@pytest.mark.parametrize(
    ("ours", "reference"),
    [(g711.ulaw_encode, "lin2ulaw"), (g711.alaw_encode, "lin2alaw")],
    ids=["ulaw", "alaw"],
)
def test_encode_bit_exact_for_every_int16(ours: Callable[[bytes], bytes], reference: str) -> None:
    expected = _audioop(reference)(ALL_PCM_BYTES, 2)
    got = ours(ALL_PCM_BYTES)
    assert len(got) == 65536
    mismatches = np.flatnonzero(np.frombuffer(got, np.uint8) != np.frombuffer(expected, np.uint8))
    assert mismatches.size == 0, f"first mismatching inputs: {ALL_PCM[mismatches[:8]]}"


@needs_le
@pytest.mark.parametrize(
    ("ours", "ours_bytes", "reference"),
    [
        (g711.ulaw_decode, g711.ulaw_decode_bytes, "ulaw2lin"),
        (g711.alaw_decode, g711.alaw_decode_bytes, "alaw2lin"),
    ],
    ids=["ulaw", "alaw"],
)
def test_decode_bit_exact_for_every_code(
    ours: Callable[[bytes], np.ndarray],
    ours_bytes: Callable[[bytes], bytes],
    reference: str,
) -> None:
    expected = _audioop(reference)(ALL_CODES, 2)
    assert ours_bytes(ALL_CODES) == expected
    decoded = ours(ALL_CODES)
    assert decoded.dtype == np.int16
    assert decoded.shape == (256,)
    assert decoded.astype("<i2").tobytes() == expected


@pytest.mark.parametrize(
    ("encode", "decode"),
    [(g711.ulaw_encode, g711.ulaw_decode), (g711.alaw_encode, g711.alaw_decode)],
    ids=["ulaw", "alaw"],
)
def test_decode_then_encode_is_identity_on_codes(
    encode: Callable[[bytes | np.ndarray], bytes],
    decode: Callable[[bytes], np.ndarray],
) -> None:
    # Every code's reconstruction level encodes back to that code, except mu-law's
    # "negative zero" 0x7F, which decodes to 0 and so encodes as positive zero 0xFF.
    round_trip = encode(decode(ALL_CODES))
    diffs = [c for c in range(256) if round_trip[c] != c]
    assert diffs in ([], [0x7F])


@pytest.mark.parametrize("encode", [g711.ulaw_encode, g711.alaw_encode], ids=["ulaw", "alaw"])
def test_array_and_bytes_inputs_agree(encode: Callable[[bytes | np.ndarray], bytes]) -> None:
    rng = np.random.default_rng(7)
    samples = rng.integers(-32768, 32768, size=1000).astype(np.int16)
    as_bytes = encode(samples.astype("<i2").tobytes())
    assert encode(samples) == as_bytes
    assert encode(samples.astype(np.int32)) == as_bytes
    assert encode(samples[::-1][::-1]) == as_bytes  # non-trivial strides
    assert encode(b"") == b""


def test_rejects_bad_pcm() -> None:
    with pytest.raises(ValueError, match="even number"):
        g711.ulaw_encode(b"\x00\x01\x02")
    with pytest.raises(ValueError, match="int16 range"):
        g711.alaw_encode(np.array([40000], dtype=np.int32))
    with pytest.raises(TypeError):
        g711.ulaw_encode(np.array([0.5]))


def test_silence_and_extremes() -> None:
    assert g711.ulaw_encode(np.zeros(4, np.int16)) == b"\xff" * 4
    assert g711.alaw_encode(np.zeros(4, np.int16)) == b"\xd5" * 4
    assert g711.ulaw_decode(b"\x80\x00").tolist() == [32124, -32124]
    assert g711.alaw_decode(b"\xaa\x2a").tolist() == [32256, -32256]
