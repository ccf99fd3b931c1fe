"""Several backends in one engine (``ENGINE_BACKEND=piper,espeak``): each voice belongs to
one backend, and a stream's voice decides which backend synthesizes it.

The first backend listed that has a voice id serves it (a later backend's voice with the
same id is hidden, and logged). Registered (cloned, voice-matched) voices are prepared by
the first backend that can (its capabilities' ``cloning``), and their
profiles are spoken by that backend's voices: the gateway picks their base voice among
that backend's voices (``Welcome.cloning_backend``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from engine.backends.base import (
    Backend,
    BackendError,
    GpuMemoryReporter,
    UnknownVoice,
    VoicePreparer,
    VoiceSettings,
    capabilities_of,
)
from engine.backends.table import create_backend
from engine.ipc.schema import VoiceInfo

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RoutedVoice:
    """A stream's voice: the backend that speaks it, its handle there, its language."""

    backend: Backend
    handle: object
    language: str
    sample_rate: int
    settings: VoiceSettings  # what it was resolved from (to resolve a variant of it)


class BackendSet:
    def __init__(self, backends: Sequence[Backend]) -> None:
        if not backends:
            raise ValueError("at least one backend is needed")
        self.members: tuple[Backend, ...] = tuple(backends)
        self._owner: dict[str, Backend] = {}
        self._voices: list[VoiceInfo] = []
        for backend in self.members:
            for voice in backend.voices():
                if voice.id in self._owner:
                    log.warning(
                        "voice %s of backend %s is hidden by backend %s",
                        voice.id, backend.name, self._owner[voice.id].name,
                    )  # fmt: skip
                    continue
                self._owner[voice.id] = backend
                self._voices.append(voice)
        self._languages = {v.id: v.language for v in self._voices}
        self.preparer: Backend | None = next(
            (
                b
                for b in self.members
                if capabilities_of(b).cloning and isinstance(b, VoicePreparer)
            ),
            None,
        )

    @classmethod
    def create(cls, names: Sequence[str]) -> BackendSet:
        """Instantiate the backends ``names`` (registered names; KeyError otherwise)."""
        created: list[Backend] = []
        try:
            for name in names:
                created.append(create_backend(name))
        except BaseException:
            for backend in created:
                backend.close()
            raise
        return cls(created)

    @property
    def name(self) -> str:
        return ",".join(b.name for b in self.members)

    @property
    def version(self) -> str:
        """The cloning backend's version (what voice features depend on), else all."""
        if self.preparer is not None:
            return self.preparer.version
        return ";".join(b.version for b in self.members)

    @property
    def max_text_chars(self) -> int:
        return min(b.max_text_chars for b in self.members)

    @property
    def native_sample_rate(self) -> int:
        return self.members[0].native_sample_rate

    def voices(self) -> list[VoiceInfo]:
        return list(self._voices)

    def resolve_voice(self, settings: VoiceSettings) -> RoutedVoice:
        """Route ``settings.voice_id`` to its backend and resolve it there. Raises
        ``UnknownVoice`` or the backend's ``BackendError``."""
        backend = self._owner.get(settings.voice_id)
        if backend is None:
            raise UnknownVoice(settings.voice_id)
        if settings.instruct and not capabilities_of(backend).instruct:
            raise BackendError(
                "instruct_unsupported",
                f"voice {settings.voice_id} ({backend.name}) takes no style instruction",
            )
        handle = backend.resolve_voice(settings)
        language = settings.language or self._languages.get(settings.voice_id) or "und"
        return RoutedVoice(backend, handle, language, backend.voice_sample_rate(handle), settings)

    def gpu(self) -> GpuMemoryReporter | None:
        return next(
            (
                b
                for b in self.members
                if capabilities_of(b).device == "cuda" and isinstance(b, GpuMemoryReporter)
            ),
            None,
        )

    def close(self) -> None:
        for backend in self.members:
            backend.close()
