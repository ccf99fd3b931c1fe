"""Speech-cache keys for a stream's (or a prompt's) segments: everything the key holds
but the segment's text, fixed once per voice, utterance instruction and output rate
(engine/speech_cache, docs/speech-cache.md "Scheduling")."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

from engine.backends.base import cache_identity_of
from engine.backends.routing import RoutedVoice
from engine.speech_cache import SegmentKey
from engine.text import SegmentSplitter


@dataclass(frozen=True, slots=True)
class KeyMaker:
    """The key of every segment spoken with one voice, instruction and output rate."""

    template: SegmentKey  # with text ""

    def key(self, text: str) -> SegmentKey:
        return replace(self.template, text=text)


def voice_digest(profile: bytes | None) -> str:
    """sha256 hex of a registered voice's features ("" for a built-in voice)."""
    return hashlib.sha256(profile).hexdigest() if profile is not None else ""


def key_maker(
    voice: RoutedVoice, handle: object, instruct: str | None, sample_rate: int
) -> KeyMaker | None:
    """Keys for ``voice`` spoken through ``handle`` (the stream's, or an utterance's own
    with a style instruction ``instruct``) at ``sample_rate``; None when its backend does
    not let that voice's audio be cached."""
    identity = cache_identity_of(voice.backend, handle)
    if identity is None:
        return None
    settings = voice.settings
    return KeyMaker(
        SegmentKey(
            backend=voice.backend.name,
            model_digest=identity.model_digest,
            voice=settings.voice_id,
            voice_digest=voice_digest(settings.profile),
            text="",
            sample_rate=sample_rate,
            speed=settings.speed,
            instruct=instruct or settings.instruct or "",
            language=voice.language,
            extra=tuple(sorted(identity.extra)),
        )
    )


def prompt_segments(text: str, language: str) -> list[str]:
    """The segments a stream in ``language`` synthesizes for ``text`` sent as one final
    utterance (the same splitter and normalizer, so the keys match)."""
    splitter = SegmentSplitter(language=language)
    return splitter.feed(text) + splitter.flush()
