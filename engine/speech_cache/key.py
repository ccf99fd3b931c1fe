"""The key of a cached segment: everything that changes the audio of one text segment,
and whose it is (its scope: one tenant's, or shared because an operator declared it)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Final

#: Bumped when the canonical encoding (or the meaning of a field) changes: every old entry
#: becomes unreachable instead of being read with a new meaning. v2: the scope.
KEY_VERSION: Final = "v2"

#: The scope of what an operator declared (the prompts file, the SIP flows): public by
#: declaration, heard by every tenant. Every other scope is one tenant's
#: (:func:`tenant_scope`); the two can never be spelled alike.
SHARED_SCOPE: Final = "shared"


def tenant_scope(tenant: str) -> str:
    """The scope of everything cached from ``tenant``'s calls and prompts."""
    return f"tenant:{tenant}"


def speed_text(speed: float) -> str:
    """The speed as the key spells it: rounded to 4 places, fixed format (1 -> "1.0000")."""
    rounded = round(float(speed), 4)
    return f"{rounded + 0.0:.4f}"  # + 0.0 turns -0.0 into 0.0


def registered_voice_digest(tenant: str, voice_id: str, features: bytes) -> str:
    """The ``voice_digest`` of a registered voice: its tenant, its id in the voices
    registry and its features, so that two voices never share cached speech (two tenants,
    or one tenant's two voices, made from the same reference audio) and deleting one
    forgets only its own. Computed by the gateway (it knows the tenant and the id) and
    sent with the voice's features."""
    hashed = hashlib.sha256(features).hexdigest()
    return hashlib.sha256(f"voice\0{tenant}\0{voice_id}\0{hashed}".encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class SegmentKey:
    """One text segment as one backend renders it for one stream format, in one scope.

    ``scope`` is :data:`SHARED_SCOPE` for operator-declared prompts and
    :func:`tenant_scope` otherwise: a tenant's key never equals another's, so no tenant
    can hit, check, time or evict what another's callers heard. ``voice_digest`` is "" for
    built-in voices and :func:`registered_voice_digest` for registered ones.
    ``model_digest`` is the backend's digest of its model files for the voice (a model
    change makes old entries unreachable).
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
    scope: str = "tenant:"  # tenant_scope(""): a key made without one is nobody's

    def canonical(self) -> bytes:
        """The versioned, canonical encoding the entry's names are derived from."""
        fields = {
            "version": KEY_VERSION,
            "scope": self.scope,
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
        return text.encode("utf-8", "surrogatepass")

    def digest(self) -> str:
        """sha256 hex of :meth:`canonical`: the entry's name in the in-process level
        (the shared stores name it with a keyed hash instead: sealing.py)."""
        return hashlib.sha256(self.canonical()).hexdigest()
