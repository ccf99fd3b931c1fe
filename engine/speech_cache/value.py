"""The value of a cached segment (PCM and word timings) and its bounded byte encoding.

Encoding: a 20-byte header (magic ``SPCH``, format version, PCM length, words length,
CRC-32 of both payloads), the PCM bytes, then the words as msgpack. :meth:`decode`
rejects anything truncated, oversized or corrupt with :class:`ValueError`, so a torn or
damaged file or Redis value is a miss, never wrong audio.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import msgspec

MAGIC = b"SPCH"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<4sBxxxIII")  # magic, version, pcm length, words length, crc32
HEADER_BYTES = _HEADER.size

#: A segment is at most ~30 s of 48 kHz int16 mono audio; larger ones are not cached.
MAX_PCM_BYTES = 30 * 48_000 * 2
MAX_WORDS = 4096
MAX_WORDS_BYTES = 256 * 1024
MAX_ENCODED_BYTES = HEADER_BYTES + MAX_PCM_BYTES + MAX_WORDS_BYTES

Words = tuple[tuple[str, int, int], ...]

_words_encoder = msgspec.msgpack.Encoder()
_words_decoder = msgspec.msgpack.Decoder(list[tuple[str, int, int]])


@dataclass(frozen=True, slots=True)
class CachedSegment:
    """A segment's audio exactly as written to the ring, and its word timings.

    ``pcm``: int16 LE mono at the key's sample rate. ``words``: (word, start_ms, end_ms)
    from the segment's start.
    """

    pcm: bytes
    words: Words = ()

    def check(self) -> None:
        """Raise :class:`ValueError` when the segment is too large or malformed to cache."""
        if len(self.pcm) > MAX_PCM_BYTES:
            raise ValueError(f"segment of {len(self.pcm)} PCM bytes exceeds {MAX_PCM_BYTES}")
        if len(self.pcm) % 2:
            raise ValueError("PCM of an odd number of bytes is not int16")
        if len(self.words) > MAX_WORDS:
            raise ValueError(f"segment of {len(self.words)} words exceeds {MAX_WORDS}")

    def size(self) -> int:
        """Approximate bytes the segment holds in memory (PCM, words, object overhead)."""
        return 200 + len(self.pcm) + sum(96 + len(word) for word, _, _ in self.words)

    def encode(self) -> bytes:
        self.check()
        words = _words_encoder.encode([list(w) for w in self.words])
        if len(words) > MAX_WORDS_BYTES:
            raise ValueError(f"words of {len(words)} bytes exceed {MAX_WORDS_BYTES}")
        crc = zlib.crc32(words, zlib.crc32(self.pcm))
        header = _HEADER.pack(MAGIC, FORMAT_VERSION, len(self.pcm), len(words), crc)
        return b"".join((header, self.pcm, words))

    @classmethod
    def decode(cls, data: bytes) -> CachedSegment:
        if len(data) < HEADER_BYTES:
            raise ValueError(f"truncated segment: {len(data)} bytes")
        if len(data) > MAX_ENCODED_BYTES:
            raise ValueError(f"segment of {len(data)} bytes exceeds {MAX_ENCODED_BYTES}")
        magic, version, pcm_len, words_len, crc = _HEADER.unpack_from(data)
        if magic != MAGIC:
            raise ValueError("not a cached segment (bad magic)")
        if version != FORMAT_VERSION:
            raise ValueError(f"cached segment format {version}, expected {FORMAT_VERSION}")
        if pcm_len > MAX_PCM_BYTES or pcm_len % 2 or words_len > MAX_WORDS_BYTES:
            raise ValueError("cached segment header out of bounds")
        if len(data) != HEADER_BYTES + pcm_len + words_len:
            raise ValueError(
                f"cached segment of {len(data)} bytes, header says "
                f"{HEADER_BYTES + pcm_len + words_len}"
            )
        view = memoryview(data)
        pcm = bytes(view[HEADER_BYTES : HEADER_BYTES + pcm_len])
        words_raw = view[HEADER_BYTES + pcm_len :]
        if zlib.crc32(words_raw, zlib.crc32(pcm)) != crc:
            raise ValueError("cached segment checksum mismatch")
        try:
            words = _words_decoder.decode(words_raw)
        except msgspec.DecodeError as exc:
            raise ValueError(f"cached segment words: {exc}") from None
        if len(words) > MAX_WORDS:
            raise ValueError("cached segment has too many words")
        return cls(pcm=pcm, words=tuple((w, int(s), int(e)) for w, s, e in words))
