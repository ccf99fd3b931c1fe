"""The warmer: bounded concurrency, retries when the engine went away, refusals logged
with where the prompt came from, and nothing left running after stop."""

from __future__ import annotations

import asyncio
import logging

import pytest

from engine.ipc.client import EngineUnavailable
from engine.ipc.schema import PromptRequest, PromptState
from gateway.speech_cache.catalog import Catalog, Entry
from gateway.speech_cache.prompts import PromptError, PromptSpec
from gateway.speech_cache.warmer import SpeechCacheOff, Warmer
from tests.gateway.speech_cache.stand_in import CachingEngine


class Port:
    """The CacheEngine protocol over the stand-in (what EngineCache does over the link)."""

    def __init__(self, engine: CachingEngine, *, off: bool = False) -> None:
        self.engine = engine
        self.off = off
        self.down_for = 0  # wait_usable calls that find the engine down

    async def wait_usable(self, timeout: float) -> None:
        if self.off:
            raise SpeechCacheOff("off")
        if self.down_for:
            self.down_for -= 1
            raise EngineUnavailable("not ready")

    async def warm(self, request: PromptRequest, timeout: float) -> PromptState:
        return await self.engine.warm_prompt(request, timeout=timeout)


class Seen:
    def __init__(self) -> None:
        self.results: list[tuple[str, str]] = []

    def finished(self, entry: Entry, result: str) -> None:
        self.results.append((entry.id, result))

    def changed(self) -> None:
        pass


async def resolve(entry: Entry) -> PromptRequest:
    if entry.spec.voice == "nobody":
        raise PromptError("unknown_voice", "unknown voice 'nobody'", "voice")
    spec = entry.spec
    return PromptRequest(voice=spec.voice, text=spec.text, sample_rate=spec.sample_rate)


def entries(catalog: Catalog, *texts: str, voice: str = "en-us") -> list[Entry]:
    return [
        catalog.add("", PromptSpec(text=t, voice=voice), f"file:{i + 1}")[0]
        for i, t in enumerate(texts)
    ]


async def run(warmer: Warmer, items: list[Entry]) -> None:
    warmer.start()
    try:
        for entry in items:
            assert warmer.submit(entry)
        async with asyncio.timeout(5):
            await warmer.join()
    finally:
        await warmer.stop()


async def test_prompts_are_warmed_at_most_concurrency_at_a_time() -> None:
    engine = CachingEngine()
    engine.hold = asyncio.Event()
    warmer = Warmer(Port(engine), resolve, Seen(), concurrency=2)
    items = entries(Catalog(), *(f"Prompt {i}." for i in range(6)))
    task = asyncio.create_task(run(warmer, items))
    await asyncio.sleep(0.05)
    assert engine.in_flight == 2
    engine.hold.set()
    await task
    assert engine.most_in_flight == 2
    assert [e.state for e in items] == ["warm"] * 6
    assert all(e.segments and e.segments[0].levels == ("memory",) for e in items)
    assert warmer.done == 6 and warmer.failed == 0


async def test_a_prompt_whose_engine_went_away_is_tried_again() -> None:
    engine = CachingEngine()
    engine.fail_next = [EngineUnavailable("engine connection lost"), "queue_timeout"]
    port = Port(engine)
    port.down_for = 1
    seen = Seen()
    warmer = Warmer(port, resolve, seen, retry_delay_s=0.01)
    [entry] = entries(Catalog(), "Welcome.")
    await run(warmer, [entry])
    assert entry.state == "warm"
    assert entry.attempts == 4  # down, lost, busy, warm
    assert [r for _, r in seen.results] == ["retried"] * 3 + ["warm"]


async def test_attempts_are_bounded() -> None:
    engine = CachingEngine()
    engine.fail_next = [EngineUnavailable("lost")] * 3
    warmer = Warmer(Port(engine), resolve, Seen(), max_attempts=3, retry_delay_s=0.01)
    [entry] = entries(Catalog(), "Welcome.")
    await run(warmer, [entry])
    assert (entry.state, entry.code, entry.attempts) == ("failed", "engine_unavailable", 3)


async def test_refusals_fail_at_once_and_are_logged_with_their_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = CachingEngine()
    catalog = Catalog()
    unknown_here = entries(catalog, "Hello.", voice="nobody")[0]  # refused by the gateway
    unknown_there = catalog.add("", PromptSpec(text="Hi.", voice="yue"), "file:7")[0]
    good = catalog.add("", PromptSpec(text="Bye.", voice="en-us"), "file:8")[0]
    caplog.set_level(logging.INFO)
    await run(Warmer(Port(engine), resolve, Seen()), [unknown_here, unknown_there, good])
    assert (unknown_here.state, unknown_here.code) == ("failed", "unknown_voice")
    assert (unknown_there.state, unknown_there.code) == ("failed", "unknown_voice")
    assert good.state == "warm"
    assert unknown_here.attempts == unknown_there.attempts == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("file:1" in m and "nobody" in m for m in errors)
    assert any("file:7" in m for m in errors)
    assert any("warm-up: 1 warm, 2 failed, 0 pending" in r.getMessage() for r in caplog.records)


async def test_an_engine_without_a_cache_fails_the_prompt() -> None:
    [entry] = entries(Catalog(), "Welcome.")
    await run(Warmer(Port(CachingEngine(), off=True), resolve, Seen()), [entry])
    assert (entry.state, entry.code) == ("failed", "speech_cache_off")


async def test_a_full_queue_refuses_and_stop_leaves_nothing_running() -> None:
    engine = CachingEngine()
    engine.hold = asyncio.Event()
    warmer = Warmer(Port(engine), resolve, Seen(), concurrency=1, max_queue=1)
    first, second, third = entries(Catalog(), "a.", "b.", "c.")
    warmer.start()
    assert warmer.submit(first)
    await asyncio.sleep(0.02)  # taken by the task: the queue is empty again
    assert warmer.submit(second)
    assert not warmer.submit(third)
    assert (third.state, third.code) == ("failed", "queue_full")
    await warmer.stop()
    assert engine.in_flight == 0
    assert all(t.done() for t in asyncio.all_tasks() if t.get_name().startswith("speech-cache"))
