"""Finer control of a native session, end to end: ``cancel`` one utterance, ``flush`` with
a ``flush_id`` answered by ``flushed``, ``keepalive`` and the idle timeout."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from tests.integration.conftest import Connect
from tests.integration.harness import GatewayProcess, NativeClient

IDLE_S = 2
LONG = "Please listen carefully, as our menu options have changed recently. " * 3
SHORT = "Thank you."


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    log = tmp_path_factory.mktemp("gateway") / "gateway.log"
    gw = GatewayProcess(log, GATEWAY_IDLE_TIMEOUT_S=str(IDLE_S), ENGINE_VAD="0")
    gw.start()
    yield gw
    gw.stop()


@pytest.fixture
async def session(connect: Connect) -> AsyncIterator[NativeClient]:
    client = await connect()
    await client.start(fmt="mulaw_8000")  # real-time pacing
    yield client


def frames_between(client: NativeClient, start: float, end: float) -> int:
    return sum(1 for t, _ in client.got.frames if start <= t <= end)


async def test_cancelling_a_queued_utterance_leaves_the_others(session: NativeClient) -> None:
    for uid, text in (("a", SHORT), ("b", LONG), ("c", SHORT)):
        await session.send(type="speak", text=text, utterance_id=uid)
    await session.send(type="cancel", utterance_id="b")
    cancelled = await session.wait_event("utterance_done", utterance_id="b")
    assert cancelled["cancelled"] is True and cancelled["audio_ms"] == 0
    a = await session.wait_event("utterance_done", utterance_id="a", timeout=20)
    c = await session.wait_event("utterance_done", utterance_id="c", timeout=20)
    assert "cancelled" not in a and "cancelled" not in c
    await asyncio.sleep(0.2)
    # every frame sent belongs to a or c, in full
    assert abs(len(session.got.frames) * 20 - (a["audio_ms"] + c["audio_ms"])) <= 40
    started = [e["utterance_id"] for e in session.got.of_type("utterance_started")]
    assert started == ["a", "c"]


@pytest.mark.realtime  # cancel timing: runs alone (Makefile)
async def test_cancelling_the_playing_utterance_stops_it_and_the_next_follows(
    session: NativeClient,
) -> None:
    await session.send(type="speak", text=LONG, utterance_id="long")
    await session.send(type="speak", text=SHORT, utterance_id="next")
    await session.wait_event("utterance_started", utterance_id="long")
    await asyncio.sleep(0.6)
    sent_at = await session.send(type="cancel", utterance_id="long")
    cancelled = await session.wait_event("utterance_done", utterance_id="long")
    assert cancelled["cancelled"] is True
    assert 400 <= cancelled["audio_ms"] <= 1000  # what had been sent of it
    nxt = await session.wait_event("utterance_started", utterance_id="next", timeout=10)
    started_at = next(t for t, e in session.got.events if e is nxt)
    assert started_at - sent_at < 1.0  # the rest of the long prompt was skipped
    done = await session.wait_event("utterance_done", utterance_id="next", timeout=10)
    await asyncio.sleep(0.2)
    total_ms = len(session.got.frames) * 20
    assert abs(total_ms - (cancelled["audio_ms"] + done["audio_ms"])) <= 60


async def test_an_unknown_utterance_cannot_be_cancelled(session: NativeClient) -> None:
    await session.send(type="cancel", utterance_id="nope")
    error = await session.wait_event("error")
    assert error["code"] == "unknown_utterance" and error["utterance_id"] == "nope"
    await session.send(type="speak", text=SHORT, utterance_id="ok")  # the session goes on
    await session.wait_event("utterance_done", utterance_id="ok", timeout=10)


async def test_flush_is_answered_by_flushed_after_the_audio_before_it(
    session: NativeClient,
) -> None:
    await session.send(type="speak", text="Your balance is", utterance_id="s", flush=False)
    await session.send(type="speak", text=" twelve dollars.", utterance_id="s", flush=False)
    await session.send(type="flush", flush_id="f-1")
    flushed = await session.wait_event("flushed", timeout=15)
    assert flushed == {"type": "flushed", "flush_id": "f-1"}
    types = session.got.types()
    assert types.index("utterance_done") < types.index("flushed")
    done = session.got.of_type("utterance_done")[0]
    assert abs(len(session.got.frames) * 20 - done["audio_ms"]) <= 20
    await session.send(type="flush")
    assert (await session.wait_event("flushed", count=2))["flush_id"] is None


async def test_an_idle_session_is_closed_and_keepalive_or_playing_audio_keep_it(
    connect: Connect,
) -> None:
    idle, kept, speaking = await connect(), await connect(), await connect()
    for client in (idle, kept, speaking):
        await client.start(fmt="mulaw_8000")
    start = time.monotonic()
    await speaking.send(type="speak", text=LONG, utterance_id="long")  # over IDLE_S of audio

    async def keep_alive() -> None:
        for _ in range(4):
            await asyncio.sleep(IDLE_S / 2)
            await kept.send(type="keepalive")

    await asyncio.gather(keep_alive(), idle.wait_closed(IDLE_S + 3))
    assert idle.closed.result() == 1000
    error = idle.got.of_type("error")[0]
    assert error["code"] == "idle_timeout"
    assert time.monotonic() - start >= IDLE_S - 0.2
    assert not kept.closed.done()
    done = await speaking.wait_event("utterance_done", utterance_id="long", timeout=20)
    assert done["audio_ms"] > IDLE_S * 1000 and not speaking.closed.done()
    await speaking.wait_closed(IDLE_S + 3)  # idle once the prompt ended
    assert speaking.got.of_type("error")[0]["code"] == "idle_timeout"


@pytest.mark.realtime  # released within 1.5 s: runs alone
async def test_streamed_text_waits_for_a_clause_at_most_max_buffer_delay_ms(
    connect: Connect,
) -> None:
    quick, patient = await connect(), await connect()
    await quick.start(fmt="mulaw_8000", max_buffer_delay_ms=300)
    await patient.start(fmt="mulaw_8000", max_buffer_delay_ms=5000)
    sent = {}
    for client in (quick, patient):  # LLM tokens that stall mid-clause
        for token in ("Your ", "order ", "number ", "is ", "four ", "two"):
            sent[id(client)] = await client.send(type="speak", text=token, flush=False)
    started = await quick.wait_event("utterance_started", timeout=5)
    delay = next(t for t, e in quick.got.events if e is started) - sent[id(quick)]
    assert 0.25 <= delay <= 1.5, delay  # released after 300 ms, not at the clause end
    await asyncio.sleep(1.5)
    assert patient.got.of_type("utterance_started") == []  # still waiting for a clause
    for client in (quick, patient):
        await client.send(type="speak", text=" seven.", flush=True)
    for client in (quick, patient):
        done = await client.wait_event("utterance_done", timeout=15)
        assert done["audio_ms"] > 1000
    too_long = await connect()
    await too_long.send(type="start", voice="en-us", format="mulaw_8000", max_buffer_delay_ms=9000)
    assert (await too_long.wait_event("error"))["code"] == "invalid_message"
    assert await too_long.wait_closed() == 1008


async def test_an_instruction_to_a_voice_that_takes_none_is_refused(connect: Connect) -> None:
    client = await connect()
    await client.send(type="start", voice="en-us", format="pcm_16000", instruct="开心")
    assert await client.wait_closed(10) == 1008
    assert client.got.of_type("error")[0]["code"] == "instruct_unsupported"
    client = await connect()
    await client.start("en-us", "pcm_16000", pacing="burst")
    await client.send(type="speak", text="Hello.", utterance_id="styled", instruct="开心")
    error = await client.wait_event("error", timeout=10)
    assert error["code"] == "instruct_unsupported" and error["utterance_id"] == "styled"
    await client.send(type="speak", text="Hello.", utterance_id="plain")
    done = await client.wait_event("utterance_done", timeout=10, utterance_id="plain")
    assert done["audio_ms"] > 0
