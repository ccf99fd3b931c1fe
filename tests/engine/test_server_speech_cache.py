"""The speech cache over the engine's real control socket (issue 27): an in-process
EngineServer with a real SpeechCache (its shared level a directory under tmp_path), and
EngineClient.warm_prompt / check_prompt / forget_voice, streams that hit, Pong's
statistics, and every PromptState code."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from engine.backends.base import CacheIdentity
from engine.backends.routing import BackendSet
from engine.backends.synthetic import SyntheticBackend
from engine.ipc.client import EngineClient
from engine.ipc.schema import PromptRequest, PromptState
from engine.ipc.shm import SharedRegion, SlotArena
from engine.prompts import MAX_CHECKS_PER_TENANT
from engine.server import EngineLayout, EngineServer
from engine.speech_cache import SpeechCache, SpeechCacheSettings, open_speech_cache
from engine.speech_cache.directory import DirectoryStore
from engine.speech_cache.key import registered_voice_digest
from engine.speech_cache.memory import MemoryLevel
from engine.speech_cache.shared import SharedLevel
from tests.engine.speech_cache.conftest import SEALER, TEST_SECRET
from tests.engine.test_server_client import Listener, LoudnessVad, _socket_path, open_stream, until

OUT_RING = 256 * 1024
IN_RING = 8 * 1024
GREETING = "Welcome to Acme Bank. Your call is important to us."
PROMPT_THREADS = ("engine-prompts", "engine-forget")  # engine/prompts.py's thread names


class Uncached(SyntheticBackend):
    def cache_identity(self, voice: object) -> CacheIdentity | None:
        return None


@dataclass
class Running:
    server: EngineServer
    client: EngineClient
    cache: SpeechCache


StartEngine = Callable[..., Awaitable[Running]]


@pytest.fixture
async def start_engine(tmp_path: Path) -> AsyncIterator[StartEngine]:
    started: list[tuple[Running, SharedRegion, SlotArena, str | None]] = []

    async def start(
        cache: SpeechCache | None = None, backend: SyntheticBackend | None = None
    ) -> Running:
        if cache is None:
            directory = str(tmp_path / "speech-cache")
            cache = open_speech_cache(
                SpeechCacheSettings(shared="directory", directory=directory, secret=TEST_SECRET)
            )
        name = f"test-engine-{os.getpid()}-{secrets.token_hex(4)}"
        region = SharedRegion.create(
            name, SlotArena.region_size(4, OUT_RING, IN_RING), directory=str(tmp_path)
        )
        arena = SlotArena(region, 4, OUT_RING, IN_RING)
        arena.reset_all()
        layout = EngineLayout(region, arena, 4, OUT_RING, IN_RING)
        server = EngineServer(
            BackendSet([backend or SyntheticBackend()]),
            layout,
            vad_model_factory=LoudnessVad,
            speech_cache=cache,
        )
        socket_path, short = _socket_path(tmp_path / secrets.token_hex(2))
        os.makedirs(os.path.dirname(socket_path), exist_ok=True)
        await server.start(socket_path)
        client = await EngineClient.connect(socket_path, timeout=5.0, client_name="test")
        running = Running(server, client, cache)
        started.append((running, region, arena, short))
        return running

    yield start
    for running, region, arena, short in started:
        await running.client.aclose()
        await running.server.stop()
        running.cache.close()
        await asyncio.sleep(0)
        arena.close()
        region.close()
        region.unlink()
        if short is not None:
            with contextlib.suppress(OSError):
                os.rmdir(short)
    left = [t.name for t in threading.enumerate() if t.name.startswith(PROMPT_THREADS)]
    assert left == [], f"prompt threads still running after the engines stopped: {left}"


def prompt(text: str = GREETING, **fields: object) -> PromptRequest:
    values: dict[str, object] = {"voice": "en-us", "text": text, "sample_rate": 8000}
    values.update(fields)
    return PromptRequest(**values)  # type: ignore[arg-type]


def levels(state: PromptState) -> list[tuple[str, ...]]:
    assert state.code == "", (state.code, state.message)
    return [segment.levels for segment in state.segments]


PROMPT_THREADS = ("engine-prompts", "engine-forget")


async def check_until(
    client: EngineClient, request: PromptRequest, wanted: list[tuple[str, ...]]
) -> None:
    """Check ``request`` until its levels are ``wanted`` (the shared write is queued)."""
    for _ in range(200):
        if levels(await client.check_prompt(request)) == wanted:
            return
        await asyncio.sleep(0.025)
    raise AssertionError(
        f"levels never became {wanted}: {levels(await client.check_prompt(request))}"
    )


async def test_warm_then_check_reports_memory_and_shared(start_engine):
    engine = await start_engine()
    client = engine.client
    assert levels(await client.check_prompt(prompt())) == [(), ()]
    warmed = await client.warm_prompt(prompt(), timeout=10)
    assert [s.text for s in warmed.segments] == [
        "Welcome to Acme Bank.",
        "Your call is important to us.",
    ]
    assert all("memory" in held for held in levels(warmed))
    await check_until(client, prompt(), [("memory", "shared")] * 2)
    # another rate, speed or voice is another prompt
    assert levels(await client.check_prompt(prompt(sample_rate=16000))) == [(), ()]
    assert levels(await client.check_prompt(prompt(speed=1.25))) == [(), ()]
    assert levels(await client.check_prompt(prompt(voice="zh"))) == [(), ()]


async def test_a_warmed_prompt_is_a_hit_on_a_stream_and_pong_counts_it(start_engine):
    engine = await start_engine()
    client = engine.client
    await client.warm_prompt(prompt(), timeout=10)
    listener = Listener()
    stream = await open_stream(client, listener, sample_rate=8000)
    stream.speak(1, GREETING, final=True)
    await until(lambda: listener.ends)
    assert [event.cache for event in listener.audio] == ["hit"]
    pong = await client.ping(5.0)
    assert pong.speech_cache is not None and pong.speech_cache.enabled
    memory = next(level for level in pong.speech_cache.levels if level.level == "memory")
    assert memory.hits.get("synthetic") == 2 and memory.entries == 2 and memory.bytes > 0
    assert {level.level for level in pong.speech_cache.levels} == {"memory", "shared"}
    assert pong.queued_utterances == 0


async def test_forget_voice_removes_a_registered_voice_s_segments(start_engine):
    engine = await start_engine()
    client = engine.client
    tone = (8000 * np.sin(2 * np.pi * 300 * np.arange(16000) / 16000)).astype("<i2").tobytes()
    features = SyntheticBackend().prepare_voice(tone, None)
    digest = registered_voice_digest("acme", "vc_0123456789abcdef", features)
    cloned = prompt(voice_profile=features, tenant="acme", voice_digest=digest)
    await client.warm_prompt(cloned, timeout=10)
    await client.warm_prompt(prompt(tenant="acme"), timeout=10)
    await check_until(client, cloned, [("memory", "shared")] * 2)
    client.forget_voice(digest, "acme")
    await check_until(client, cloned, [(), ()])
    await check_until(client, prompt(tenant="acme"), [("memory", "shared")] * 2)


async def test_checks_and_purges_are_the_tenants_own(start_engine):
    """A check answers the asking tenant's levels only (tenant B's check of the prompt
    tenant A warmed finds nothing); the operator's shared prompt is everyone's; a purge
    drops one tenant's entries from memory and the shared level, no one else's."""
    engine = await start_engine()
    client = engine.client
    await client.warm_prompt(prompt(tenant="acme"), timeout=10)
    await client.warm_prompt(prompt("Please hold.", shared=True), timeout=10)
    await check_until(client, prompt(tenant="acme"), [("memory", "shared")] * 2)
    assert levels(await client.check_prompt(prompt(tenant="other"))) == [(), ()]
    await check_until(client, prompt("Please hold.", shared=True), [("memory", "shared")])
    assert levels(await client.check_prompt(prompt("Please hold.", tenant="other"))) == [()]
    await client.warm_prompt(prompt(tenant="other"), timeout=10)
    purged = await client.purge_tenant("acme")
    assert (purged.code, purged.entries) == ("", 2)
    assert levels(await client.check_prompt(prompt(tenant="acme"))) == [(), ()]
    await check_until(client, prompt(tenant="other"), [("memory", "shared")] * 2)
    await check_until(client, prompt("Please hold.", shared=True), [("memory", "shared")])


async def test_one_tenants_checks_are_bounded_without_refusing_anothers(start_engine):
    engine = await start_engine()
    prompts = engine.server.prompts
    sent: list[PromptState] = []
    for i in range(MAX_CHECKS_PER_TENANT + 3):
        prompts.check(sent.append, i, prompt(tenant="flood"))
    prompts.check(sent.append, 99, prompt(tenant="acme"))
    refused = [s.request_id for s in sent if s.code == "overloaded"]
    assert refused == [MAX_CHECKS_PER_TENANT, MAX_CHECKS_PER_TENANT + 1,
                       MAX_CHECKS_PER_TENANT + 2]  # fmt: skip
    for _ in range(100):
        if len(sent) == MAX_CHECKS_PER_TENANT + 4:
            break
        await asyncio.sleep(0.02)
    assert next(s for s in sent if s.request_id == 99).code == ""


@pytest.mark.parametrize(
    ("request_fields", "code"),
    [
        ({"voice": "nobody"}, "unknown_voice"),
        ({"text": "x" * 6000}, "text_too_long"),
        ({"sample_rate": 11025}, "unsupported_format"),
        ({"speed": 9.0}, "invalid_speed"),
    ],
)
async def test_prompt_errors_are_codes(start_engine, request_fields, code):
    engine = await start_engine()
    for ask in (engine.client.check_prompt, engine.client.warm_prompt):
        state = await ask(prompt(**request_fields))
        assert (state.code, state.segments) == (code, ())


async def test_cache_off_and_uncached_voices_are_codes(start_engine):
    off = await start_engine(cache=SpeechCache.disabled())
    state = await off.client.warm_prompt(prompt())
    assert state.code == "speech_cache_off"
    assert (await off.client.ping(5.0)).speech_cache is None
    listener = Listener()
    stream = await open_stream(off.client, listener, sample_rate=8000)
    stream.speak(1, GREETING, final=True)
    await until(lambda: listener.ends)
    assert [event.cache for event in listener.audio] == [""]
    uncached = await start_engine(backend=Uncached())
    assert (await uncached.client.check_prompt(prompt())).code == "not_cacheable"


@pytest.mark.realtime  # refused within 0.3 s: runs alone (Makefile)
async def test_warm_prompts_in_progress_are_bounded(start_engine, monkeypatch):
    """WarmPrompt requests beyond the service's bound are answered ``overloaded`` at once
    (not queued as tasks without end)."""
    monkeypatch.setenv("ENGINE_SYNTHETIC_FIRST_CHUNK_MS", "400")
    engine = await start_engine()
    engine.server.prompts._max_pending_warms = 1
    client = engine.client
    first = asyncio.create_task(client.warm_prompt(prompt("One slow prompt."), timeout=10))
    await asyncio.sleep(0.05)
    second = await client.warm_prompt(prompt("Another prompt."), timeout=0.3)
    assert second.code == "overloaded"
    assert (await first).code == ""
    assert (await client.warm_prompt(prompt("Another prompt."), timeout=10)).code == ""


class SlowForgetStore(DirectoryStore):
    """A directory whose forget_voice hangs until ``go`` is set (a Redis SCAN of a big
    keyspace, a slow disk)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, budget_bytes=1 << 30, ttl_s=3600)
        self.go = threading.Event()

    def forget_voice(self, scope: str, voice: str) -> int:
        self.go.wait(10)
        return super().forget_voice(scope, voice)


@pytest.mark.realtime  # a check answered within 2 s: runs alone (Makefile)
async def test_slow_forgets_do_not_hold_up_prompt_checks(start_engine, tmp_path):
    store = SlowForgetStore(tmp_path / "slow")
    shared = SharedLevel(store, SEALER, timeout_s=0.05)
    cache = SpeechCache(MemoryLevel(1 << 20), shared, enabled=True)
    engine = await start_engine(cache=cache)
    client = engine.client
    try:
        for i in range(6):
            client.forget_voice(f"{i:02d}" * 32, "acme")
        await asyncio.sleep(0.1)
        state = await client.check_prompt(prompt(), timeout=2.0)
        assert levels(state) == [(), ()]
    finally:
        store.go.set()
