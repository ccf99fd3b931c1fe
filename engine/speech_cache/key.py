"""The key of a cached segment: everything that changes the audio of one text segment."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

#: Bumped when the canonical encoding (or the meaning of a field) changes: every old entry
#: becomes unreachable instead of being read with a new meaning.
KEY_VERSION = "v1"


def speed_text(speed: float) -> str:
    """The speed as the key spells it: rounded to 4 places, fixed format (1 -> "1.0000")."""
    rounded = round(float(speed), 4)
    return f"{rounded + 0.0:.4f}"  # + 0.0 turns -0.0 into 0.0


@dataclass(frozen=True, slots=True)
class SegmentKey:
    """One text segment as one backend renders it for one stream format.

    ``voice_digest`` is "" for built-in voices and the sha256 hex of a registered voice's
    feature bytes otherwise (a re-registered voice gets a new digest, so it never plays
    stale audio). ``model_digest`` is the backend's digest of its model files for the voice
    (a model change makes old entries unreachable).
    """

    backend: str
    model_digest: str
    voice: str
    voice_digest: str
    text: str
    sample_rate: int
    speed: float
    instruct: str = ""
    language: str = ""
    extra: tuple[tuple[str, str], ...] = ()

    def canonical(self) -> bytes:
        """The versioned, canonical encoding the digest is taken over."""
        fields = {
            "version": KEY_VERSION,
            "backend": self.backend,
            "model_digest": self.model_digest,
            "voice": self.voice,
            "voice_digest": self.voice_digest,
            "text": self.text,
            "sample_rate": int(self.sample_rate),
            "speed": speed_text(self.speed),
            "instruct": self.instruct,
            "language": self.language,
            "extra": sorted([str(k), str(v)] for k, v in self.extra),
        }
        text = json.dumps(fields, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        return text.encode("utf-8")

    def digest(self) -> str:
        """sha256 hex of :meth:`canonical`: the entry's name in every level."""
        return hashlib.sha256(self.canonical()).hexdigest()


_HEX = frozenset("0123456789abcdef")


def voice_label(voice_digest: str) -> str:
    """The voice's name in the shared stores: "_" for built-in voices, the digest itself
    when it is lowercase hex (the contract), else its sha256 (never a path or a pattern)."""
    if not voice_digest:
        return "_"
    if len(voice_digest) <= 128 and set(voice_digest) <= _HEX:
        return voice_digest
    return hashlib.sha256(voice_digest.encode("utf-8")).hexdigest()
