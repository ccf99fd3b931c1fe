"""Speech-cache keys for a stream's (or a prompt's) segments: everything the key holds
but the segment's text, fixed once per voice, utterance instruction, output rate and
scope (engine/speech_cache, docs/speech-cache.md "Scheduling").

A call's segment is keyed in its tenant's scope, unless the operator declared that very
segment (the prompts file, the SIP flows): then it is the shared scope's, heard by every
tenant (public by declaration). A warm prompt is keyed in the scope it was declared in.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, replace

from engine.backends.base import cache_identity_of
from engine.backends.routing import RoutedVoice
from engine.speech_cache import SHARED_SCOPE, SegmentKey
from engine.text import stream_splitter


def _never(_key: SegmentKey) -> bool:
    return False


@dataclass(frozen=True, slots=True)
class KeyMaker:
    """The key of every segment spoken with one voice, instruction, rate and scope."""

    template: SegmentKey  # with text ""
    # Whether the shared scope's key of a text was declared by the operator (then it is
    # the key: SpeechCache.is_declared). Unused when the template is the shared scope's.
    declared: Callable[[SegmentKey], bool] = _never

    def key(self, text: str) -> SegmentKey:
        own = replace(self.template, text=text)
        if own.scope != SHARED_SCOPE:
            shared = replace(own, scope=SHARED_SCOPE)
            if self.declared(shared):
                return shared
        return own


def profile_digest(profile: bytes | None) -> str:
    """sha256 hex of a registered voice's features ("" for a built-in voice): its digest
    when the gateway did not give one (engine/speech_cache/key.py
    ``registered_voice_digest`` is what the gateway gives)."""
    return hashlib.sha256(profile).hexdigest() if profile is not None else ""


def key_maker(
    voice: RoutedVoice,
    handle: object,
    instruct: str | None,
    sample_rate: int,
    *,
    scope: str,
    voice_digest: str = "",
    declared: Callable[[SegmentKey], bool] = _never,
) -> KeyMaker | None:
    """Keys for ``voice`` spoken through ``handle`` (the stream's, or an utterance's own
    with a style instruction ``instruct``) at ``sample_rate`` in ``scope``; None when its
    backend does not let that voice's audio be cached. ``voice_digest``: a registered
    voice's (from the gateway), else derived from its features."""
    identity = cache_identity_of(voice.backend, handle)
    if identity is None:
        return None
    settings = voice.settings
    if settings.profile is None:
        voice_digest = ""
    elif not voice_digest:
        voice_digest = profile_digest(settings.profile)
    return KeyMaker(
        SegmentKey(
            backend=voice.backend.name,
            model_digest=identity.model_digest,
            voice=settings.voice_id,
            voice_digest=voice_digest,
            text="",
            sample_rate=sample_rate,
            speed=settings.speed,
            instruct=instruct or settings.instruct or "",
            language=voice.language,
            extra=tuple(sorted(identity.extra)),
            scope=scope,
        ),
        declared,
    )


def prompt_segments(text: str, language: str) -> tuple[list[str], set[str]]:
    """The segments a stream in ``language`` synthesizes for ``text`` sent as one final
    utterance (the same splitter and normalizer, so the keys match), and those of them
    that carry personal data."""
    splitter = stream_splitter(language)
    return splitter.feed(text) + splitter.flush(), splitter.personal
