"""Test harness: a real gateway (and its real engine) in a subprocess, and a real client.

:class:`GatewayProcess` runs ``python -m gateway serve`` on a free port with its own
secret and waits for ``/readyz``. :class:`NativeClient` speaks the native protocol over a
real WebSocket and records every frame and event with its arrival time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import WORKER_HEADER
from gateway.auth import mint_token

ROOT = Path(__file__).resolve().parents[2]
SECRET = "integration-test-secret-0123456789-abcdefghijkl"
HOST_START_S = 90.0  # a host starts an engine and its workers: generous on a loaded box


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _children(pid: int) -> list[int]:
    """The processes ``pid`` started (any of its threads), from /proc."""
    children: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                children += [int(p) for p in (task / "children").read_text().split()]
    return children


def engine_pid_of(gateway_pid: int) -> int | None:
    """The pid of the ``python -m engine`` child of ``gateway_pid``, if it has one."""
    for child in _children(gateway_pid):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            if argv[1:3] == [b"-m", b"engine"]:
                return child
    return None


def _process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += _children(current)
    return found


def listens_on(pid: int, port: int) -> bool:
    """Whether ``pid`` (or a process below it: a host's workers) holds the listening TCP
    socket of ``port``. Two tests that drew the same free port would otherwise find the
    other's gateway answering their readiness probe, and test it."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as rows:
            next(rows, None)
            for row in rows:
                fields = row.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")
    for member in _process_tree(pid):
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{member}/fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in inodes:
                        return True
    return False


def worker_of(ws: aiohttp.ClientWebSocketResponse) -> str:
    """The worker that answered the upgrade (aiohttp keeps the response privately)."""
    return str(ws._response.headers.get(WORKER_HEADER, ""))


def worker_pids(supervisor_pid: int) -> dict[str, int]:
    """{worker index: pid} of the supervisor's ``gateway worker`` children."""
    found: dict[str, int] = {}
    for task in Path(f"/proc/{supervisor_pid}/task").iterdir():
        with contextlib.suppress(OSError):
            for pid in (task / "children").read_text().split():
                with contextlib.suppress(OSError):
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                    if argv[1:4] != [b"-m", b"gateway", b"worker"]:
                        continue
                    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                    for item in env:
                        if item.startswith(b"GATEWAY_WORKER_INDEX="):
                            found[item.split(b"=", 1)[1].decode()] = int(pid)
    return found


def wait_workers(gw: GatewayProcess, count: int, timeout: float = HOST_START_S) -> None:
    """Until ``count`` distinct workers have answered /readyz with 200."""
    import urllib.request

    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    while len(seen) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only workers {seen} answered: {gw.log_tail()}")
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(gw.base + "/readyz", timeout=2) as r,
        ):
            if r.status == 200:
                seen.add(r.headers.get(WORKER_HEADER, ""))
        time.sleep(0.02)


class GatewayProcess:
    def __init__(self, log_path: Path, **env: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/v1/stream"
        self.log_path = log_path
        self.env = {
            **os.environ,
            "GATEWAY_HOST": "127.0.0.1",
            "GATEWAY_PORT": str(self.port),
            "GATEWAY_JWT_SECRET": SECRET,
            "LOG_LEVEL": "INFO",
            "PYTHONUNBUFFERED": "1",
            "GATEWAY_VOICE_DIR": str(log_path.parent / "voices"),
            "GATEWAY_DRAIN_TIMEOUT_S": "1",  # tests stop gateways with sessions still open
            # espeak unless a test asks for another backend: fast, deterministic timing
            # (the neural voice has tests of its own, tests/integration/test_neural.py)
            "ENGINE_BACKEND": "espeak",
            # no speech cache unless a test turns it on (with its own directory): a test
            # (or a benchmark) must not hear another's cached audio (tests/conftest.py)
            "ENGINE_SPEECH_CACHE": "0",
            **env,
        }
        self.env.pop("GATEWAY_JWT_PUBLIC_KEY", None)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> None:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        for attempt in range(3):
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gateway", "serve"],
                cwd=ROOT,
                env=self.env,
                stdout=self._log,
                stderr=subprocess.STDOUT,
            )
            try:
                self.wait_ready(timeout)
                return
            except RuntimeError:
                # Another test's process took the port between free_port() and the bind:
                # draw another (only for that; any other exit is the test's to see).
                if attempt == 2 or "address already in use" not in self.log_tail().lower():
                    self.stop()
                    raise
            except BaseException:
                # Not ready in time (or interrupted): the fixture that called us never
                # reaches its teardown, so the gateway and its engine must not outlive us
                # (a leaked pair kept restarting engines through the rest of the run).
                self.stop()
                raise
            self._move_to(free_port())

    def _move_to(self, port: int) -> None:
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        self.ws_url = f"ws://127.0.0.1:{port}/v1/stream"
        self.env["GATEWAY_PORT"] = str(port)

    def readyz(self) -> tuple[int, dict[str, Any]]:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(self.base + "/readyz", timeout=2) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def wait_ready(self, timeout: float = 30.0, *, vad: bool | None = None) -> float:
        """Seconds until ``/readyz`` answered 200 (and, for ``vad``, reported the VAD
        model loaded; by default when the engine runs VAD: barge-in tests need it)."""
        if vad is None:
            vad = self.env.get("ENGINE_VAD") != "0"
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.proc.returncode}: {self.log_tail()}")
            with contextlib.suppress(OSError):
                status, body = self.readyz()
                if (
                    status == 200
                    and (not vad or body.get("vad_ready"))
                    and (self.proc is None or listens_on(self.proc.pid, self.port))
                ):
                    return time.monotonic() - start
            time.sleep(0.05)
        raise TimeoutError(f"gateway not ready within {timeout}s: {self.log_tail()}")

    def engine_pid(self) -> int:
        """The pid of the engine this gateway runs (found in /proc: probes do not say)."""
        assert self.proc is not None
        pid = engine_pid_of(self.proc.pid)
        if pid is None:
            raise LookupError(f"gateway {self.proc.pid} runs no engine")
        return pid

    def token(self, **kw: Any) -> str:
        kw.setdefault("subject", "test")
        return mint_token(secret=SECRET, **kw)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        with contextlib.suppress(Exception):
            self._log.close()


class RedisServer:
    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self._workdir)],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        for _ in range(100):
            probe = subprocess.run(
                ["redis-cli", "-p", str(self.port), "ping"], capture_output=True, check=False
            )
            if probe.stdout.strip() == b"PONG":
                return
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None

    def keys(self, pattern: str) -> list[str]:
        out = subprocess.run(
            ["redis-cli", "-p", str(self.port), "--scan", "--pattern", pattern],
            capture_output=True,
            check=True,
        ).stdout
        return [k for k in out.decode().split("\n") if k]


@contextlib.contextmanager
def running_redis(workdir: Path) -> Iterator[RedisServer]:
    """A real redis-server on a free port for the block (skips the test without one)."""
    if shutil.which("redis-server") is None:
        pytest.skip("no redis-server")
    server = RedisServer(workdir)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class Received:
    frames: list[tuple[float, bytes]] = field(default_factory=list)
    events: list[tuple[float, dict[str, Any]]] = field(default_factory=list)

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e for _, e in self.events if e.get("type") == kind]

    def types(self) -> list[str]:
        return [str(e.get("type")) for _, e in self.events]


class NativeClient:
    """A native-protocol client that records everything it receives."""

    def __init__(self, session: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.http = session
        self.ws = ws
        self.got = Received()
        self._changed = asyncio.Event()
        self._reader = asyncio.create_task(self._read())
        self.closed = asyncio.get_running_loop().create_future()

    @classmethod
    async def connect(
        cls, url: str, token: str | None, *, query_token: bool = False
    ) -> NativeClient:
        http = aiohttp.ClientSession()
        headers = {}
        if token is not None and not query_token:
            headers["Authorization"] = f"Bearer {token}"
        if token is not None and query_token:
            url = f"{url}?access_token={token}"
        ws = await http.ws_connect(url, headers=headers, max_msg_size=1 << 20)
        return cls(http, ws)

    async def _read(self) -> None:
        try:
            async for msg in self.ws:
                now = time.monotonic()
                if msg.type is aiohttp.WSMsgType.BINARY:
                    self.got.frames.append((now, msg.data))
                elif msg.type is aiohttp.WSMsgType.TEXT:
                    self.got.events.append((now, json.loads(msg.data)))
                self._changed.set()
        finally:
            if not self.closed.done():
                self.closed.set_result(self.ws.close_code)
            self._changed.set()

    async def send(self, **message: Any) -> float:
        await self.ws.send_str(json.dumps(message))
        return time.monotonic()

    async def start(
        self, voice: str = "en-us", fmt: str = "mulaw_8000", **kw: Any
    ) -> dict[str, Any]:
        await self.send(type="start", voice=voice, format=fmt, **kw)
        return await self.wait_event("ready")

    async def wait_event(
        self, kind: str, timeout: float = 10.0, count: int = 1, **match: Any
    ) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                found = [
                    e
                    for e in self.got.of_type(kind)
                    if all(e.get(k) == v for k, v in match.items())
                ]
                if len(found) >= count:
                    return found[count - 1]
                if self.closed.done():
                    raise AssertionError(
                        f"closed ({self.closed.result()}) before {kind}; got {self.got.types()}"
                    )
                self._changed.clear()
                await self._changed.wait()

    async def wait_closed(self, timeout: float = 10.0) -> int | None:
        async with asyncio.timeout(timeout):
            code: int | None = await asyncio.shield(self.closed)
            return code

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self.ws.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        await self.http.close()


async def voices_of(gw: GatewayProcess) -> dict[str, dict[str, Any]]:
    """``GET /v1/voices`` (the default tenant's token), by voice id."""
    async with aiohttp.ClientSession() as http:
        r = await http.get(
            gw.base + "/v1/voices", headers={"Authorization": f"Bearer {gw.token()}"}
        )
        return {v["id"]: v for v in (await r.json())["voices"]}


async def metric(gw: GatewayProcess, name: str, **labels: str) -> float:
    async with aiohttp.ClientSession() as http:
        text = await (await http.get(gw.base + "/metrics")).text()
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


async def metric_reaches(
    gw: GatewayProcess, name: str, value: float, timeout: float = 5.0, **labels: str
) -> float:
    """The metric once it is at least ``value`` (what a teardown that runs after the far
    end saw its answer updates), or its last reading after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        current = await metric(gw, name, **labels)
        if current >= value or time.monotonic() > deadline:
            return current
        await asyncio.sleep(0.05)
