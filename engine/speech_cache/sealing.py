"""What the shared stores see of an entry: a keyed name and a sealed value.

A directory or a Redis keyspace can be read (and in Redis's case written) by more than
the engines: so no name there may give its text away, and no value may be read, changed
or moved to another name without the deployment's secret
(``ENGINE_SPEECH_CACHE_SECRET``, or the file of ``ENGINE_SPEECH_CACHE_SECRET_FILE``).

- **Names** are HMAC-SHA256 of the key's canonical encoding under a key derived from the
  secret: without it, guessing texts ("Your code is 000000" ... "999999") and hashing them
  finds nothing. Scope and voice folders are named the same way (:meth:`Sealer.label`).
- **Values** are sealed with AES-256-GCM (a key derived from the secret, a random 96-bit
  nonce), authenticated together with the entry's name and the time it was written: a
  value changed, truncated, or copied under another name fails to open
  (:class:`ValueError`: a miss, and the entry is deleted); the audio and the words are
  never stored in clear; the write time cannot be moved, so the TTL holds whatever the
  file's mtime or the key's EXPIRE say.

Layout: ``magic (4) | written_at (uint64 LE, unix seconds) | nonce (12) | ciphertext+tag``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
import time
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from engine.speech_cache.key import SegmentKey

MAGIC: Final = b"SPS2"
_HEADER = struct.Struct("<4sQ12s")
HEADER_BYTES: Final = _HEADER.size
TAG_BYTES: Final = 16
#: What sealing adds to an encoded segment.
OVERHEAD_BYTES: Final = HEADER_BYTES + TAG_BYTES
BUILT_IN_VOICE_LABEL: Final = "_"


def _derive(secret: bytes, purpose: str) -> bytes:
    return hmac.new(secret, f"ivr-gateway speech cache v2: {purpose}".encode(), "sha256").digest()


class Sealer:
    """Names and seals entries under one secret (at least 32 bytes). Thread-safe."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 32:
            raise ValueError("the speech cache secret must be at least 32 bytes")
        self._names = _derive(secret, "names")
        self._aead = AESGCM(_derive(secret, "values"))

    def name(self, key: SegmentKey) -> str:
        """The entry's name in a shared store (64 hex)."""
        return hmac.new(self._names, b"entry\0" + key.canonical(), hashlib.sha256).hexdigest()

    def label(self, kind: str, value: str) -> str:
        """A folder's name for a scope or a voice (32 hex); built-in voices ("") are
        :data:`BUILT_IN_VOICE_LABEL`."""
        if kind == "voice" and not value:
            return BUILT_IN_VOICE_LABEL
        raw = f"{kind}\0{value}".encode("utf-8", "surrogatepass")
        return hmac.new(self._names, raw, hashlib.sha256).hexdigest()[:32]

    def seal(self, name: str, payload: bytes, written_at: float | None = None) -> bytes:
        when = int(time.time() if written_at is None else written_at)
        nonce = os.urandom(12)
        header = _HEADER.pack(MAGIC, when, nonce)
        return header + self._aead.encrypt(nonce, payload, header + name.encode("ascii"))

    def open(self, name: str, sealed: bytes) -> tuple[int, bytes]:
        """(written_at, payload) of a value sealed under ``name``; :class:`ValueError`
        when it is not one (another secret, a change, another name, truncated)."""
        if len(sealed) < OVERHEAD_BYTES:
            raise ValueError(f"sealed entry of {len(sealed)} bytes is truncated")
        magic, written_at, nonce = _HEADER.unpack_from(sealed)
        if magic != MAGIC:
            raise ValueError("not a sealed speech cache entry (bad magic)")
        header = bytes(sealed[:HEADER_BYTES])
        try:
            payload = self._aead.decrypt(nonce, bytes(sealed[HEADER_BYTES:]),
                                         header + name.encode("ascii"))  # fmt: skip
        except InvalidTag:
            raise ValueError("sealed speech cache entry failed authentication") from None
        return int(written_at), payload
