"""SegmentKey digests and CachedSegment's encoding."""

from __future__ import annotations

import struct
from dataclasses import fields, replace

import pytest

from engine.speech_cache import (
    MAX_PCM_BYTES,
    SHARED_SCOPE,
    CachedSegment,
    SegmentKey,
    tenant_scope,
)
from engine.speech_cache.key import registered_voice_digest, speed_text
from engine.speech_cache.value import HEADER_BYTES
from tests.engine.speech_cache.conftest import make_key, make_segment

CHANGED: dict[str, object] = {
    "backend": "piper",
    "model_digest": "n" * 64,
    "voice": "en-us-other",
    "voice_digest": "ab" * 32,
    "text": "Welcome to Acme Bank!",
    "sample_rate": 8000,
    "speed": 1.1,
    "instruct": "cheerful",
    "language": "en",
    "extra": (("noise_scale", "0.667"),),
    "scope": "tenant:other",
}


def test_every_field_changes_the_digest() -> None:
    base = make_key()
    assert {f.name for f in fields(SegmentKey)} == set(CHANGED)
    digests = {base.digest()}
    for name, value in CHANGED.items():
        digest = replace(base, **{name: value}).digest()  # type: ignore[arg-type]
        assert digest not in digests, name
        digests.add(digest)
    assert len(digests) == len(CHANGED) + 1


def test_digest_is_stable_and_canonical() -> None:
    key = make_key(extra=(("b", "2"), ("a", "1")))
    assert key.digest() == make_key(extra=(("a", "1"), ("b", "2"))).digest()
    assert len(key.digest()) == 64 and key.digest() == key.digest()
    assert b'"version":"v2"' in key.canonical()
    # The scope: a tenant's key is never another's, nor the operator's shared one's.
    assert make_key(scope=tenant_scope("a")).digest() != make_key(scope=SHARED_SCOPE).digest()
    assert tenant_scope("shared") != SHARED_SCOPE
    # Speed: the same to 4 places is the same key; a 5th-place difference is not a new one.
    assert make_key(speed=1).digest() == make_key(speed=1.00001).digest()
    assert make_key(speed=1.0).digest() != make_key(speed=1.0001).digest()
    assert speed_text(1) == "1.0000" and speed_text(-0.0) == "0.0000"
    # Fields cannot run into each other (an encoding, not a concatenation).
    assert make_key(voice="a", text="bc").digest() != make_key(voice="ab", text="c").digest()


def test_round_trip() -> None:
    segment = make_segment(3.0)
    data = segment.encode()
    assert data[HEADER_BYTES : HEADER_BYTES + len(segment.pcm)] == segment.pcm
    assert CachedSegment.decode(data) == segment
    empty = CachedSegment(pcm=b"", words=())
    assert CachedSegment.decode(empty.encode()) == empty
    unicode_words = CachedSegment(pcm=b"\x01\x00" * 10, words=(("您好", 0, 250),))
    assert CachedSegment.decode(unicode_words.encode()) == unicode_words


def test_corrupt_and_truncated_data_is_rejected() -> None:
    data = make_segment(0.2).encode()
    for bad in (
        b"",
        data[:10],
        data[: HEADER_BYTES + 5],
        data[:-1],
        data + b"\x00",
        b"XXXX" + data[4:],
        data[:4] + b"\x09" + data[5:],  # unknown format version
        data[:100] + bytes([data[100] ^ 0xFF]) + data[101:],  # a flipped PCM byte
        data[:-2] + b"\xff\xff",  # words damaged
    ):
        with pytest.raises(ValueError):
            CachedSegment.decode(bad)


def test_size_is_bounded() -> None:
    too_long = CachedSegment(pcm=b"\x00\x00" * (MAX_PCM_BYTES // 2 + 1))
    with pytest.raises(ValueError):
        too_long.encode()
    with pytest.raises(ValueError):
        CachedSegment(pcm=b"\x00").encode()  # not int16
    # A header that claims more than the bound is refused before anything is read.
    header = struct.pack("<4sBxxxIII", b"SPCH", 1, MAX_PCM_BYTES + 2, 0, 0)
    with pytest.raises(ValueError):
        CachedSegment.decode(header + b"\x00" * 64)
    longest = CachedSegment(pcm=b"\x00\x00" * (MAX_PCM_BYTES // 2))
    assert CachedSegment.decode(longest.encode()) == longest


def test_registered_voice_digest_names_tenant_and_voice() -> None:
    """Two tenants, or one tenant's two voices, made from the same reference audio never
    share a digest (nor cached speech, nor a deletion)."""
    features = b"features" * 10
    digests = {
        registered_voice_digest("acme", "vc_1", features),
        registered_voice_digest("other", "vc_1", features),
        registered_voice_digest("acme", "vc_2", features),
        registered_voice_digest("acme", "vc_1", features + b"!"),
    }
    assert len(digests) == 4 and all(len(d) == 64 for d in digests)
