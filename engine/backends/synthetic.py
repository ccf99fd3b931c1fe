"""A deterministic test backend: tones instead of speech, with adjustable slowness.

Every character of a segment becomes ``CHAR_MS`` of a sine tone whose frequency depends
on the voice. It exists so that tests and benchmarks can control the engine's timing
exactly (``ENGINE_SYNTHETIC_FIRST_CHUNK_MS``: delay before the first chunk of each
segment; ``ENGINE_SYNTHETIC_RTF``: seconds of compute per second of audio), which the
real backends cannot, and ``ENGINE_SYNTHETIC_BALLAST_MB`` makes each open stream hold
memory (admission tests). Select it with ``ENGINE_BACKEND=synthetic``.

Speech cache: its "model" is ``ENGINE_SYNTHETIC_MODEL`` (default ``synthetic-1``, read
when the backend is made), so a test can change the model and see old entries missed.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.backends.base import (
    BackendError,
    BatchSynthesizer,
    CacheIdentity,
    EmitFn,
    UnknownVoice,
    VoiceSettings,
    WordTimer,
    text_sha256,
)
from engine.ipc.schema import Capabilities, VoiceInfo

CHAR_MS = 60
CHUNK_MS = 40
DEFAULT_MODEL = "synthetic-1"
_VOICES = {"en-us": 220.0, "zh": 330.0, "yue": 440.0, "tone": 1000.0}


@dataclass(frozen=True)
class ToneVoice:
    frequency: float
    speed: float
    # ENGINE_SYNTHETIC_BALLAST_MB: memory held per open stream, to stand in for the
    # per-stream device memory of a real model in admission tests.
    ballast: bytes = b""


class SyntheticBackend:
    name = "synthetic"
    version = "synthetic/profile-1"
    native_sample_rate = 16000
    max_text_chars = 5000
    # Tests subclass these tones into the shapes of other backends (a batch backend whose
    # calls are independent, one that takes instructions, one on a GPU): set these, or
    # implement BatchSynthesizer or WordTimer, and ``capabilities`` says so.
    independent_calls = False
    follows_instructions = False
    on_gpu = False

    def __init__(self) -> None:
        self.first_chunk_s = float(os.environ.get("ENGINE_SYNTHETIC_FIRST_CHUNK_MS", "0")) / 1000
        self.rtf = float(os.environ.get("ENGINE_SYNTHETIC_RTF", "0"))
        self.ballast_bytes = int(float(os.environ.get("ENGINE_SYNTHETIC_BALLAST_MB", "0")) * 2**20)
        self.model = os.environ.get("ENGINE_SYNTHETIC_MODEL") or DEFAULT_MODEL
        self.model_digest = text_sha256("synthetic", self.model)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            independent_calls=self.independent_calls,
            batch=isinstance(self, BatchSynthesizer),
            word_timings=isinstance(self, WordTimer),
            cloning=True,
            instruct=self.follows_instructions,
            device="cuda" if self.on_gpu else "cpu",
        )

    def voices(self) -> Sequence[VoiceInfo]:
        return [
            VoiceInfo(id=vid, language="und", name=f"Tone {freq:.0f} Hz", backend=self.name)
            for vid, freq in _VOICES.items()
        ]

    def prepare_voice(
        self, pcm16k: bytes, language: str | None, transcript: str | None = None
    ) -> bytes:
        """A custom tone voice: the reference's zero-crossing frequency (test stand-in)."""
        if os.environ.get("ENGINE_SYNTHETIC_PREPARE_MS"):
            time.sleep(float(os.environ["ENGINE_SYNTHETIC_PREPARE_MS"]) / 1000)
        pcm = np.frombuffer(pcm16k, dtype="<i2").astype(np.float64)
        if len(pcm) < 2:
            raise BackendError("invalid_audio", "reference too short")
        crossings = np.count_nonzero(np.diff(np.signbit(pcm)))
        frequency = crossings / 2 / (len(pcm) / 16000)
        return json.dumps({"v": 1, "f": round(frequency, 1)}).encode()

    def resolve_voice(self, settings: VoiceSettings) -> ToneVoice:
        if settings.profile is not None:
            try:
                frequency = float(json.loads(settings.profile)["f"])
            except (ValueError, KeyError, TypeError):
                raise BackendError("invalid_voice_profile", "bad synthetic profile") from None
            return ToneVoice(frequency, settings.speed)
        if settings.voice_id not in _VOICES:
            raise UnknownVoice(settings.voice_id)
        if not 0.25 <= settings.speed <= 4.0:
            raise BackendError("invalid_speed", "speed must be between 0.25 and 4.0")
        ballast = b"\x01" * self.ballast_bytes  # touched pages: counted in RSS
        return ToneVoice(_VOICES[settings.voice_id], settings.speed, ballast)

    def synthesize(self, text: str, voice: object, emit: EmitFn) -> None:
        assert isinstance(voice, ToneVoice)
        rate = self.native_sample_rate
        total = int(len(text) * CHAR_MS / 1000 / voice.speed * rate)
        chunk = CHUNK_MS * rate // 1000
        if self.first_chunk_s:
            time.sleep(self.first_chunk_s)
        for start in range(0, total, chunk):
            n = min(chunk, total - start)
            t = (np.arange(start, start + n) / rate).astype(np.float64)
            pcm = (8000 * np.sin(2 * np.pi * voice.frequency * t)).astype(np.int16)
            if self.rtf:
                time.sleep(self.rtf * n / rate)
            if not emit(pcm):
                return

    def voice_sample_rate(self, voice: object) -> int:
        return self.native_sample_rate

    def cache_identity(self, voice: object) -> CacheIdentity | None:
        """The model setting's digest; the tone's frequency (a registered voice's comes
        from its features, which the key holds too). Deterministic."""
        assert isinstance(voice, ToneVoice)
        return CacheIdentity(self.model_digest, (("frequency", repr(voice.frequency)),))

    def close(self) -> None:
        pass
