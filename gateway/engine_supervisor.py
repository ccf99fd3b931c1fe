"""Starts, watches and restarts the engine process for a gateway worker.

State machine (one transition table, every transition logged)::

    STOPPED -> STARTING -> READY -> (engine exits / heartbeat fails) -> BACKOFF -> STARTING
                   \\-> (ready timeout, spawn failure) -> BACKOFF
    any -> STOPPED (stop())

In *spawn* mode the supervisor runs ``python -m engine`` as a child (which dies with its
parent); in *attach* mode it connects to an engine started on its own (``python -m
engine``) and reconnects when that connection drops. Readiness is the control-channel
handshake (Hello/Welcome) within ``ready_timeout``; liveness is a Ping answered within
``heartbeat_timeout``. While not READY, :attr:`client` is None and the gateway refuses new
sessions with ``engine_unavailable``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.ipc.client import EngineClient, EngineUnavailable
from engine.ipc.env import shm_directory
from gateway.errors import IllegalTransition
from gateway.restart_backoff import RestartBackoff

log = logging.getLogger(__name__)


class EngineState(enum.Enum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    BACKOFF = "backoff"


_TRANSITIONS: dict[EngineState, frozenset[EngineState]] = {
    EngineState.STOPPED: frozenset({EngineState.STARTING}),
    EngineState.STARTING: frozenset({EngineState.READY, EngineState.BACKOFF, EngineState.STOPPED}),
    EngineState.READY: frozenset({EngineState.BACKOFF, EngineState.STOPPED}),
    EngineState.BACKOFF: frozenset({EngineState.STARTING, EngineState.STOPPED}),
}


@dataclass
class SupervisorSettings:
    socket_path: str | None = None  # attach to this socket; None: spawn a private engine
    backend: str = ""  # "": the engine's own default (ENGINE_BACKEND, else what is installed)
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None
    ready_timeout: float = 20.0
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 3.0
    backoff_initial: float = 0.2
    backoff_max: float = 5.0
    stable_after: float = 30.0  # a run this long resets the backoff


class EngineSupervisor:
    def __init__(
        self,
        settings: SupervisorSettings,
        *,
        on_ready: Callable[[EngineClient], None] | None = None,
        on_lost: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        self.state = EngineState.STOPPED
        self.client: EngineClient | None = None
        self.process: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self.on_ready = on_ready
        self.on_lost = on_lost
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._spawn = settings.socket_path is None
        self._shm_dir = shm_directory(os.environ if settings.env is None else settings.env)
        self._shm_path: str | None = None  # the spawned engine's segment, until removed
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        if self._spawn:
            self._tmpdir = tempfile.TemporaryDirectory(prefix="ivr-engine-")
            self.socket_path = os.path.join(self._tmpdir.name, "engine.sock")
        else:
            assert settings.socket_path is not None
            self.socket_path = settings.socket_path

    @property
    def ready(self) -> bool:
        client = self.client
        return self.state is EngineState.READY and client is not None and not client.lost

    def _transition(self, new: EngineState, reason: str) -> None:
        if new not in _TRANSITIONS[self.state]:
            raise IllegalTransition(f"engine {self.state.value} -> {new.value}")
        log.info("engine %s -> %s (%s)", self.state.value, new.value, reason)
        self.state = new

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._supervise(), name="engine-supervisor")

    async def wait_ready(self, timeout: float) -> EngineClient:
        async with asyncio.timeout(timeout):
            while True:
                await self._ready.wait()
                if self.client is not None:
                    return self.client
                await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._teardown()
        if self.state is not EngineState.STOPPED:
            self._transition(EngineState.STOPPED, "stop requested")
        if self._tmpdir is not None:
            self._tmpdir.cleanup()

    async def _supervise(self) -> None:
        backoff = RestartBackoff(
            self.settings.backoff_initial, self.settings.backoff_max, self.settings.stable_after
        )
        while True:
            self._transition(EngineState.STARTING, "starting" if not self.restarts else "restart")
            started = time.monotonic()
            reason = await self._run_once()
            ran_for = time.monotonic() - started
            self._transition(EngineState.BACKOFF, reason)
            self.restarts += 1
            await asyncio.sleep(backoff.after_exit(ran_for))

    async def _run_once(self) -> str:
        """One engine lifetime: start it, serve while healthy, return why it ended."""
        try:
            client = await self._start_engine()
        except (OSError, TimeoutError, EngineUnavailable) as exc:
            await self._teardown()
            return f"engine did not become ready: {exc!r}"
        self.client = client
        pid = client.welcome.engine_pid if client.welcome else "?"
        self._transition(EngineState.READY, f"engine pid {pid}")
        self._ready.set()
        if self.on_ready is not None:
            self.on_ready(client)
        try:
            reason = await self._watch(client)
        finally:
            self._ready.clear()
            await self._teardown()
            if self.on_lost is not None:
                self.on_lost()
        return reason

    async def _start_engine(self) -> EngineClient:
        deadline = time.monotonic() + self.settings.ready_timeout
        if self._spawn:
            # We name the engine's shared-memory segment so that we can remove it when
            # the engine dies without doing so itself (SIGKILL, OOM killer, a crash).
            shm_name = f"ivr-engine-{os.getpid()}-{self.restarts}-{secrets.token_hex(4)}"
            self._shm_path = os.path.join(self._shm_dir, shm_name)
            cmd = [
                sys.executable,
                "-m",
                "engine",
                "--socket",
                self.socket_path,
                *(["--backend", self.settings.backend] if self.settings.backend else []),
                "--parent-pid",
                str(os.getpid()),
                "--shm-dir",
                self._shm_dir,
                "--shm-name",
                shm_name,
                *self.settings.extra_args,
            ]
            if os.path.exists(self.socket_path):
                os.unlink(self.socket_path)
            # Its own session: a Ctrl-C or a signal to the gateway's process group must not
            # stop the engine under a draining gateway (the gateway stops it when it is
            # done; the engine dies with its parent by PR_SET_PDEATHSIG and --parent-pid).
            self.process = await asyncio.create_subprocess_exec(
                *cmd, env=self.settings.env, start_new_session=True
            )
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no engine handshake within {self.settings.ready_timeout}s")
            if self.process is not None and self.process.returncode is not None:
                raise EngineUnavailable(f"engine exited with {self.process.returncode}")
            if os.path.exists(self.socket_path):
                try:
                    return await EngineClient.connect(self.socket_path, timeout=min(remaining, 5.0))
                except (OSError, EngineUnavailable) as exc:
                    log.debug("engine not accepting yet: %r", exc)
            await asyncio.sleep(0.05)

    async def _watch(self, client: EngineClient) -> str:
        """Returns when the engine exits, the connection drops or a heartbeat fails."""
        waits: list[asyncio.Future[object]] = [asyncio.ensure_future(self._heartbeat(client))]
        waits.append(asyncio.ensure_future(asyncio.shield(client.closed)))
        if self.process is not None:
            waits.append(asyncio.ensure_future(self.process.wait()))
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        first = done.pop()
        if self.process is not None and self.process.returncode is not None:
            return f"engine exited with {self.process.returncode}"
        exc = None if first.cancelled() else first.exception()
        return f"engine lost: {exc!r}" if exc else "engine connection closed"

    async def _heartbeat(self, client: EngineClient) -> str:
        """Ping at once (the first pong tells the engine's state, VAD readiness included,
        without waiting an interval), then every ``heartbeat_interval``."""
        while True:
            await client.ping(self.settings.heartbeat_timeout)
            await asyncio.sleep(self.settings.heartbeat_interval)

    async def _teardown(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            client.abort()
        process, self.process = self.process, None
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 3.0)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        self._remove_segment()

    def _remove_segment(self) -> None:
        """Remove the spawned engine's shared-memory file once the engine is gone (a clean
        engine removes it itself; a killed one cannot)."""
        path, self._shm_path = self._shm_path, None
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                log.info("removed the dead engine's shared memory %s", path)
