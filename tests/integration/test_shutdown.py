"""Graceful shutdown: on SIGTERM calls in progress finish, the rest are told to reconnect."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from tests.integration.harness import GatewayProcess, NativeClient

pytestmark = pytest.mark.timeout(120)

LONG_PROMPT = "Thank you for calling. Your call is important to us. Please stay on the line."


def _exited_within(gw: GatewayProcess, timeout: float) -> int:
    assert gw.proc is not None
    return gw.proc.wait(timeout)


async def test_sigterm_lets_a_call_in_progress_finish(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path / "gw.log", GATEWAY_DRAIN_TIMEOUT_S="30", ENGINE_VAD="0")
    gw.start()
    try:
        client = await NativeClient.connect(gw.ws_url, gw.token())
        try:
            await client.start("en-us", "mulaw_8000")
            await client.send(type="speak", text=LONG_PROMPT, utterance_id="u1")
            await client.wait_event("utterance_started", timeout=10)
            assert gw.proc is not None
            gw.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            with pytest.raises(OSError):  # the listener is closed: no new sessions here
                await NativeClient.connect(gw.ws_url, gw.token())
            done = await client.wait_event("utterance_done", timeout=20, utterance_id="u1")
            assert done["audio_ms"] > 2000
            frames = len(client.got.frames)
            assert frames * 20 >= done["audio_ms"] - 20  # every frame arrived
            await client.send(type="close")
            assert await client.wait_closed(10) == 1000
            assert client.got.of_type("error") == []
        finally:
            await client.aclose()
        started = time.monotonic()
        assert await asyncio.to_thread(_exited_within, gw, 15) == 0
        assert time.monotonic() - started < 10  # it did not wait out the drain timeout
    finally:
        gw.stop()


async def test_sessions_still_open_after_the_drain_timeout_are_told_to_reconnect(
    tmp_path: Path,
) -> None:
    gw = GatewayProcess(tmp_path / "gw.log", GATEWAY_DRAIN_TIMEOUT_S="1", ENGINE_VAD="0")
    gw.start()
    try:
        client = await NativeClient.connect(gw.ws_url, gw.token())
        try:
            await client.start("en-us", "mulaw_8000")  # and then stays open, silent
            assert gw.proc is not None
            sent = time.monotonic()
            gw.proc.send_signal(signal.SIGTERM)
            error = await client.wait_event("error", timeout=10)
            assert error["code"] == "shutting_down"
            assert await client.wait_closed(10) == 1013
            assert 0.8 < time.monotonic() - sent < 6
        finally:
            await client.aclose()
        assert await asyncio.to_thread(_exited_within, gw, 15) == 0
    finally:
        gw.stop()


@pytest.mark.realtime  # told within 2 s: runs alone (Makefile)
async def test_a_connection_that_never_started_is_told_at_once(tmp_path: Path) -> None:
    gw = GatewayProcess(tmp_path / "gw.log", GATEWAY_DRAIN_TIMEOUT_S="30", ENGINE_VAD="0")
    gw.start()
    try:
        idle = await NativeClient.connect(gw.ws_url, gw.token())  # no start yet
        busy = await NativeClient.connect(gw.ws_url, gw.token())
        try:
            await busy.start("en-us", "mulaw_8000")
            await busy.send(type="speak", text=LONG_PROMPT, utterance_id="u1")
            await busy.wait_event("utterance_started", timeout=10)
            assert gw.proc is not None
            sent = time.monotonic()
            gw.proc.send_signal(signal.SIGTERM)
            error = await idle.wait_event("error", timeout=5)
            assert error["code"] == "shutting_down"
            assert await idle.wait_closed(5) == 1013
            assert time.monotonic() - sent < 2
            # The call in progress is not cut short by it.
            await busy.wait_event("utterance_done", timeout=20, utterance_id="u1")
            await busy.send(type="close")
            assert await busy.wait_closed(10) == 1000
        finally:
            await idle.aclose()
            await busy.aclose()
        assert await asyncio.to_thread(_exited_within, gw, 15) == 0
    finally:
        gw.stop()


def test_the_engine_is_outside_the_gateways_process_group(tmp_path: Path) -> None:
    """Ctrl-C in a terminal (or systemd's control-group kill) signals the whole process
    group: the engine must not stop under a gateway that is draining its calls."""
    gw = GatewayProcess(tmp_path / "gw.log", ENGINE_VAD="0")
    gw.start()
    try:
        assert gw.proc is not None
        engine = gw.engine_pid()
        assert os.getpgid(engine) != os.getpgid(gw.proc.pid)
        assert os.getsid(engine) == engine  # a session of its own
    finally:
        gw.stop()
