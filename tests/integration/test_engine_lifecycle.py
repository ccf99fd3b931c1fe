"""Engine supervision end to end: crash recovery, attach mode, slot exhaustion."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.integration.harness import (
    ROOT,
    GatewayProcess,
    NativeClient,
    engine_pid_of,
    metric_reaches,
)


@pytest.fixture
def fresh_gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    gw = GatewayProcess(tmp_path / "gateway.log")
    gw.start()
    yield gw
    gw.stop()


async def speak_ok(gw: GatewayProcess, text: str = "Hello again.", voice: str = "en-us") -> None:
    client = await NativeClient.connect(gw.ws_url, gw.token())
    try:
        await client.start(voice)
        await client.send(type="speak", text=text)
        done = await client.wait_event("utterance_done")
        assert done["audio_ms"] > 300
    finally:
        await client.aclose()


@pytest.mark.realtime  # a new engine ready within 5 s: runs alone
async def test_engine_crash_errors_streams_and_recovers(fresh_gateway: GatewayProcess) -> None:
    gw = fresh_gateway
    old_pid = gw.engine_pid()
    client = await NativeClient.connect(gw.ws_url, gw.token())
    try:
        await client.start()
        await client.send(type="speak", text="Please hold. " * 20)
        await client.wait_event("utterance_started")
        os.kill(old_pid, signal.SIGKILL)
        killed_at = time.monotonic()
        error = await client.wait_event("error", timeout=5)
        assert error["code"] == "engine_unavailable"
        assert await client.wait_closed() == 1011
    finally:
        await client.aclose()
    # Not ready until the new engine is up, then ready within a few seconds.
    status, body = gw.readyz()
    assert status == 503 or gw.engine_pid() != old_pid
    assert set(body) == {"ready", "draining", "vad_ready"}  # nothing internal
    gw.wait_ready(timeout=10, vad=False)
    assert time.monotonic() - killed_at < 5
    assert gw.engine_pid() != old_pid
    await speak_ok(gw)
    async with aiohttp.ClientSession() as http:
        metrics = await (await http.get(gw.base + "/metrics")).text()
    assert 'gateway_errors_total{code="engine_unavailable"} 1.0' in metrics
    assert "gateway_engine_restarts_total 1.0" in metrics


SHARED_TEXT = (
    "Thank you for waiting. All of our agents are still helping other callers. "
    "Your call will be answered in the order it was received. "
    "Please stay on the line, and have your account number ready when we answer."
)


async def test_an_engine_crash_during_a_shared_synthesis_reaches_every_listener(
    tmp_path: Path,
) -> None:
    """Three calls speak one new text at once with the speech cache on: one synthesis,
    the others join it (engine/scheduler/flights.py). The engine is killed while they
    listen: every one of them gets engine_unavailable and is closed, none hangs, and the
    restarted engine speaks its first sentence for the next caller."""
    gw = GatewayProcess(
        tmp_path / "gateway.log",
        ENGINE_BACKEND="piper,espeak",
        ENGINE_VAD="0",
        ENGINE_SPEECH_CACHE="1",
        ENGINE_SPEECH_CACHE_SHARED="off",
    )
    gw.start(timeout=120)
    clients: list[NativeClient] = []
    try:
        for _ in range(3):
            client = await NativeClient.connect(gw.ws_url, gw.token())
            clients.append(client)
            await client.start("en-us-joe", "pcm_16000")
        await asyncio.gather(*(c.send(type="speak", text=SHARED_TEXT) for c in clients))
        for client in clients:
            await client.wait_event("utterance_started", timeout=30)
        joins = await metric_reaches(gw, "engine_speech_cache_joins_total", 2, timeout=10)
        assert joins >= 2  # the others heard the first caller's synthesis
        os.kill(gw.engine_pid(), signal.SIGKILL)
        for client in clients:
            error = await client.wait_event("error", timeout=5)
            assert error["code"] == "engine_unavailable"
            assert await client.wait_closed() == 1011
        gw.wait_ready(timeout=30, vad=False)
        await speak_ok(gw, "Thank you for waiting.", voice="en-us-joe")
    finally:
        for client in clients:
            await client.aclose()
        gw.stop()


async def test_gateway_attaches_to_a_standalone_engine_and_reattaches(tmp_path: Path) -> None:
    # espeak without VAD, as every harness gateway: attaching is what is tested, and the
    # 15 s bounds below stay hang guards (about 1 s idle; a full engine took 19 s loaded)
    sock = str(tmp_path / "engine.sock")
    env = {**os.environ, "ENGINE_SOCKET": sock, "ENGINE_BACKEND": "espeak", "ENGINE_VAD": "0"}

    def start_engine() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "engine", "--socket", sock, "--slots", "8"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / "engine.log", "ab"),
        )

    engine = start_engine()
    gw = GatewayProcess(tmp_path / "gateway.log", ENGINE_SOCKET=sock, ENGINE_VAD="0")
    try:
        gw.start()
        await speak_ok(gw)
        engine.terminate()
        engine.wait(10)
        for _ in range(100):
            if gw.readyz()[0] == 503:
                break
            await asyncio.sleep(0.05)
        assert gw.readyz()[0] == 503
        engine = start_engine()
        gw.wait_ready(timeout=15, vad=False)
        await speak_ok(gw)
    finally:
        gw.stop()
        engine.terminate()
        engine.wait(10)


async def test_slot_pool_exhaustion_refuses_with_1013(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path / "gateway.log", ENGINE_SLOTS="2")
    gw.start()
    clients: list[NativeClient] = []
    try:
        for _ in range(2):
            client = await NativeClient.connect(gw.ws_url, gw.token())
            clients.append(client)
            await client.start()
        extra = await NativeClient.connect(gw.ws_url, gw.token())
        clients.append(extra)
        await extra.send(type="start", voice="en-us", format="mulaw_8000")
        error = await extra.wait_event("error")
        assert error["code"] == "overloaded"
        assert await extra.wait_closed() == 1013
        # The admitted sessions still work, and a freed slot is reused.
        await clients[0].send(type="speak", text="Still fine.")
        await clients[0].wait_event("utterance_done")
        await clients[1].send(type="close")
        await clients[1].wait_closed()
        again = await NativeClient.connect(gw.ws_url, gw.token())
        clients.append(again)
        await again.send(type="start", voice="en-us", format="mulaw_8000")
        assert (await again.wait_event("ready"))["type"] == "ready"
    finally:
        for client in clients:
            await client.aclose()
        gw.stop()


async def test_a_killed_engine_leaves_no_shared_memory(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    gw = GatewayProcess(tmp_path / "gateway.log", ENGINE_SHM_DIR=str(shm), ENGINE_VAD="0")
    gw.start()
    try:
        first = sorted(p.name for p in shm.iterdir())
        assert len(first) == 1 and first[0].startswith("ivr-engine-")
        for _ in range(2):  # every crash used to add one segment
            old = gw.engine_pid()
            os.kill(old, signal.SIGKILL)
            assert gw.proc is not None
            for _ in range(200):
                if gw.readyz()[0] == 200 and engine_pid_of(gw.proc.pid) not in (None, old):
                    break
                await asyncio.sleep(0.05)
            gw.wait_ready(timeout=10, vad=False)
            await speak_ok(gw)
            now = sorted(p.name for p in shm.iterdir())
            assert len(now) == 1 and now != first
            first = now
    finally:
        gw.stop()
    assert list(shm.iterdir()) == []  # and nothing after a clean stop
