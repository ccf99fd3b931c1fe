"""An engine with a speech cache, without an engine: what the gateway's side is tested
against (the real engine is tests/integration/test_speech_cache.py's).

Segments are the text's sentences; a warmed segment is held in "memory" under everything
a real key holds that the gateway sends (its scope: the tenant's or the shared one, voice,
the voice's digest, speed, language, instruct, sample rate); ForgetVoice drops a
registered voice's segments, PurgeTenant a tenant's.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from dataclasses import dataclass

from engine.ipc.client import EngineUnavailable
from engine.ipc.schema import (
    Pong,
    PromptRequest,
    PromptState,
    SegmentState,
    SpeechCacheStats,
    TenantPurged,
)

Key = tuple[str, str, str, str, float, str, str, int]


def segments(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s]


def key(prompt: PromptRequest, segment: str) -> Key:
    scope = "shared" if prompt.shared else f"tenant:{prompt.tenant}"
    return (scope, prompt.voice, prompt.voice_digest, segment, prompt.speed,
            prompt.language or "", prompt.instruct or "", prompt.sample_rate)  # fmt: skip


@dataclass
class Prepared:
    features: bytes
    seconds: float = 0.001


class CachingEngine:
    def __init__(self, *, cache: bool = True, voices: tuple[str, ...] = ("en-us", "zh")) -> None:
        stats = SpeechCacheStats(enabled=True) if cache else None
        self.last_pong: Pong | None = Pong(
            seq=1, active_streams=0, queued_utterances=0, rss_bytes=0, speech_cache=stats
        )
        self.lost = False
        self.voices = voices
        self.held: dict[Key, tuple[str, ...]] = {}
        self.warmed: list[PromptRequest] = []
        self.forgotten: list[str] = []
        self.purged: list[str] = []
        self.checks_answer: str = ""  # a code every check answers with ("overloaded")
        self.in_flight = 0
        self.most_in_flight = 0
        self.hold: asyncio.Event | None = None
        self.fail_next: list[BaseException | str] = []  # raised, or answered as a code

    async def warm_prompt(self, prompt: PromptRequest, *, timeout: float = 120.0) -> PromptState:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.hold is not None:
                await self.hold.wait()
            if self.fail_next:
                failure = self.fail_next.pop(0)
                if isinstance(failure, BaseException):
                    raise failure
                return PromptState(request_id=0, code=failure, message=f"{failure} (stand-in)")
            if prompt.voice not in self.voices:
                return PromptState(request_id=0, code="unknown_voice", message="no such voice")
            self.warmed.append(prompt)
            for segment in segments(prompt.text):
                self.held[key(prompt, segment)] = ("memory",)
            return await self.check_prompt(prompt)
        finally:
            self.in_flight -= 1

    async def check_prompt(self, prompt: PromptRequest, *, timeout: float = 5.0) -> PromptState:
        if self.lost:
            raise EngineUnavailable("gone")
        if self.hold is not None:
            await self.hold.wait()
        if self.checks_answer:
            return PromptState(request_id=0, code=self.checks_answer, message="stand-in")
        return PromptState(
            request_id=0,
            segments=tuple(
                SegmentState(text=s, levels=self.held.get(key(prompt, s), ()))
                for s in segments(prompt.text)
            ),
        )

    def forget_voice(self, voice_digest: str, tenant: str) -> None:
        self.forgotten.append(voice_digest)
        for k in [k for k in self.held if k[2] == voice_digest]:
            del self.held[k]

    async def purge_tenant(self, tenant: str, *, timeout: float = 60.0) -> TenantPurged:
        self.purged.append(tenant)
        gone = [k for k in self.held if k[0] == f"tenant:{tenant}"]
        for k in gone:
            del self.held[k]
        return TenantPurged(request_id=0, entries=len(gone))

    async def prepare_voice(
        self, pcm16k: bytes, *, language: str | None = None, transcript: str | None = None
    ) -> Prepared:
        return Prepared(features=b"features:" + hashlib.sha256(pcm16k).digest())
