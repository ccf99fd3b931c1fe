"""Start-up warm-up: the prompts file and the legs' prompts are warmed in the background
once the engine says it caches (start never waits), each worker of a host once; the
engine's cache counters and first audio by hit/miss reach /metrics."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from engine.ipc.client import EngineUnavailable
from engine.ipc.schema import CacheLevelStats, SpeechCacheStats
from gateway.engine_link import EngineLink
from gateway.engine_supervisor import EngineSupervisor, SupervisorSettings
from gateway.metrics import GatewayMetrics
from gateway.speech_cache.prompts import DeclaredPrompt, PromptLimits, PromptSpec
from gateway.speech_cache.service import SpeechCacheService, SpeechCacheSettings
from tests.gateway.speech_cache.stand_in import CachingEngine


class Link(EngineLink):
    def __init__(self, tmp_path: Path, metrics: GatewayMetrics) -> None:
        super().__init__(EngineSupervisor(SupervisorSettings(socket_path=str(tmp_path / "x"))),
                         metrics)  # fmt: skip
        self.engine: CachingEngine | None = None

    def client(self) -> CachingEngine:  # type: ignore[override]
        if self.engine is None:
            raise EngineUnavailable("the engine is not ready")
        return self.engine


async def resolve(tenant: str, voice: str) -> tuple[str, bytes | None, str]:
    return voice, None, ""


def prompts_file(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text(
        "\n".join(
            json.dumps(p)
            for p in (
                {"text": "Welcome to Acme Bank.", "voice": "en-us"},
                {"text": "Please hold.", "voice": "en-us", "format": "pcm_16000"},
                {"text": "Hello.", "voice": "klingon"},
            )
        )
    )
    return path


async def test_start_up_prompts_are_warmed_in_the_background_once_the_engine_is_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    metrics = GatewayMetrics()
    link = Link(tmp_path, metrics)
    told: list[tuple[str, PromptSpec]] = []  # the warmed prompts: the gate's likely hits
    service = SpeechCacheService(
        SpeechCacheSettings(prompts_path=prompts_file(tmp_path), limits=PromptLimits()),
        link=link,
        resolve_voice=resolve,
        metrics=metrics,
        declared=[DeclaredPrompt(source="sip flow demo, step bye", text="Goodbye.")],
        on_warm=lambda tenant, spec: told.append((tenant, spec)),
    )
    async with asyncio.timeout(1):
        await service.start()  # returns at once: the engine is not even there
    await asyncio.sleep(0.3)
    assert not service.startup_queued.is_set()
    engine = CachingEngine()
    link.engine = engine
    try:
        async with asyncio.timeout(5):
            await service.startup_queued.wait()
            await service.warmer.join()
    finally:
        await service.stop()
    warmed = {(r.text, r.voice, r.sample_rate) for r in engine.warmed}
    assert warmed == {
        ("Welcome to Acme Bank.", "en-us", 8000),
        ("Please hold.", "en-us", 16000),
        ("Goodbye.", link.default_voice, 8000),
    }
    assert sorted((tenant, spec.text) for tenant, spec in told) == [
        ("", "Goodbye."),  # the operator's: shared by every tenant
        ("", "Please hold."),
        ("", "Welcome to Acme Bank."),
    ]
    assert all(r.shared and r.tenant == "" for r in engine.warmed)
    states = {e.source: e.state for e in service.catalog}
    assert states == {"file:1": "warm", "file:2": "warm", "file:3": "failed",
                      "sip flow demo, step bye": "warm"}  # fmt: skip
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("file:3" in m and "klingon" in m for m in errors)
    text = generate_latest(metrics.registry).decode()
    assert 'gateway_speech_cache_warmups_total{result="warm"} 3.0' in text
    assert 'gateway_speech_cache_prompts{state="failed"} 1.0' in text


async def test_other_workers_of_a_host_leave_the_warm_up_to_the_first(tmp_path: Path) -> None:
    metrics = GatewayMetrics()
    link = Link(tmp_path, metrics)
    link.engine = CachingEngine()
    service = SpeechCacheService(
        SpeechCacheSettings(prompts_path=prompts_file(tmp_path)),
        link=link, resolve_voice=resolve, metrics=metrics, warm_at_start=False,
    )  # fmt: skip
    await service.start()
    try:
        async with asyncio.timeout(5):
            await service.startup_queued.wait()
    finally:
        await service.stop()
    assert link.engine.warmed == [] and service.catalog.count() == 0


async def test_an_engine_without_a_cache_gets_no_cache_messages(tmp_path: Path) -> None:
    metrics = GatewayMetrics()
    link = Link(tmp_path, metrics)
    link.engine = CachingEngine(cache=False)
    service = SpeechCacheService(
        SpeechCacheSettings(prompts_path=prompts_file(tmp_path)),
        link=link, resolve_voice=resolve, metrics=metrics,
    )  # fmt: skip
    await service.start()
    try:
        async with asyncio.timeout(5):
            await service.startup_queued.wait()
        service.forget_voice("vc_0123456789abcdef", "ab" * 32, "acme")
    finally:
        await service.stop()
    assert link.engine.warmed == [] and link.engine.forgotten == []


def test_the_engine_counters_and_first_audio_by_cache_are_exposed() -> None:
    metrics = GatewayMetrics()
    metrics.engine_speech_cache = SpeechCacheStats(
        enabled=True,
        levels=(
            CacheLevelStats(level="memory", store="memory", hits={"piper": 9},
                            misses={"piper": 3}, entries=5, bytes=480_000, evictions=2),
            CacheLevelStats(level="shared", store="redis", hits={"piper": 1},
                            misses={"piper": 2}, entries=7, bytes=900_000, errors=4,
                            rejected=3),
        ),
        joined_segments=29, joined_audio_seconds=87.5, prefix_hits=12,
        prefix_audio_seconds=14.25,
    )  # fmt: skip
    metrics.speech_cache_first_audio.labels(cache="hit").observe(0.004)
    text = generate_latest(metrics.registry).decode()
    for line in (
        "engine_speech_cache_enabled 1.0",
        'engine_speech_cache_hits_total{backend="piper",level="memory"} 9.0',
        'engine_speech_cache_misses_total{backend="piper",level="shared"} 2.0',
        'engine_speech_cache_entries{level="shared",store="redis"} 7.0',
        'engine_speech_cache_bytes{level="memory",store="memory"} 480000.0',
        'engine_speech_cache_evictions_total{level="memory"} 2.0',
        'engine_speech_cache_errors_total{level="shared"} 4.0',
        'engine_speech_cache_rejected_total{level="shared"} 3.0',
        "engine_speech_cache_joins_total 29.0",
        "engine_speech_cache_joined_audio_seconds_total 87.5",
        "engine_speech_cache_prefix_hits_total 12.0",
        "engine_speech_cache_prefix_audio_seconds_total 14.25",
        'gateway_speech_cache_first_audio_seconds_bucket{cache="hit",le="0.005"} 1.0',
        'gateway_speech_cache_first_audio_seconds_count{cache="miss"} 0.0',
        'gateway_speech_cache_first_audio_seconds_count{cache="join"} 0.0',
    ):
        assert line in text, line
    metrics.engine_speech_cache = None  # the engine is down: no engine samples
    assert "engine_speech_cache_hits_total{" not in generate_latest(metrics.registry).decode()
