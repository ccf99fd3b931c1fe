"""Servers under test: our gateway, the naive baseline, or one already running.

A :class:`Target` says where calls connect, which token they carry, where its metrics
are, and which processes to watch: role ``server`` (the gateway worker, or the
baseline's single process) and role ``engine`` (the gateway's engine; the baseline
synthesizes in-process and has none).
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.integration.harness import (
    ROOT,
    GatewayProcess,
    engine_pid_of,
    free_port,
    free_udp_port,
    wait_workers,
    worker_pids,
)

TOKEN_TTL_S = 6 * 3600


def _get_json(url: str, timeout: float = 2.0) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, {}


class Target(ABC):
    """A server the load generator drives."""

    name: str
    ws_url: str
    #: Where SIP calls go (protocol ``sip``), when the server has a SIP bridge.
    sip_target: tuple[str, int] | None = None
    #: Where AudioSocket calls go (protocol ``audiosocket``), when it listens for them.
    audiosocket_target: tuple[str, int] | None = None

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...

    @abstractmethod
    def token(self, max_streams: int | None = None) -> str | None:
        """A bearer token for the calls; ``max_streams``: the tenant's stream limit
        (``max_streams`` claim) the run needs, when this target mints its tokens."""

    @abstractmethod
    def processes(self) -> dict[str, int]:
        """Role (``server``, ``engine``) -> pid, for the processes on this machine."""

    @property
    def metrics_url(self) -> str | None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "ws_url": self.ws_url}


class GatewayTarget(Target):
    """Our gateway with its own engine, started fresh on a free port."""

    name = "gateway"

    def __init__(
        self,
        log_dir: Path,
        *,
        backend: str = "espeak",
        slots: int = 512,
        env: dict[str, str] | None = None,
    ) -> None:
        self._log_dir = log_dir
        self._backend = backend
        self._slots = slots
        self._env = dict(env or {})  # more settings of the gateway and its engine
        self._gw: GatewayProcess | None = None
        self.ws_url = ""

    def start(self) -> None:
        self._log_dir.mkdir(parents=True, exist_ok=True)
        sip_port = free_udp_port()
        audiosocket_port = free_port()
        settings = {
            "LOG_LEVEL": "WARNING",
            "ENGINE_BACKEND": self._backend,
            "ENGINE_SLOTS": str(self._slots),
            # the SIP bridge, for protocol sip: calls from here are the loadgen tenant's
            "GATEWAY_SIP_LISTEN": f"127.0.0.1:{sip_port}",
            "GATEWAY_SIP_ALLOW": "127.0.0.0/8=loadgen",
            "GATEWAY_SIP_RTP_PORTS": "21000-23999",
            "GATEWAY_SIP_INVITES_PER_S": "1000",
            # the AudioSocket listener, for protocol audiosocket: the same trusted network
            "GATEWAY_AUDIOSOCKET_LISTEN": f"127.0.0.1:{audiosocket_port}",
            "GATEWAY_AUDIOSOCKET_ALLOW": "127.0.0.0/8=loadgen",
            "GATEWAY_AUDIOSOCKET_MAX_CALLS": str(max(500, self._slots)),
            **self._env,
        }
        gw = GatewayProcess(self._log_dir / "gateway.log", **settings)
        gw.start()
        self._gw = gw
        self.ws_url = gw.ws_url
        self.sip_target = ("127.0.0.1", sip_port)
        self.audiosocket_target = ("127.0.0.1", audiosocket_port)

    def stop(self) -> None:
        if self._gw is not None:
            self._gw.stop()

    def token(self, max_streams: int | None = None) -> str | None:
        assert self._gw is not None
        # One tenant ("loadgen") for every call: provisioned for the whole level, so the
        # per-tenant limit (GATEWAY_TENANT_MAX_STREAMS, 100 without the claim) admits it.
        return self._gw.token(
            subject="loadgen", tenant="loadgen", ttl_s=TOKEN_TTL_S, max_streams=max_streams
        )

    def processes(self) -> dict[str, int]:
        gw = self._gw
        if gw is None or gw.proc is None:
            return {}
        return {"server": gw.proc.pid, "engine": gw.engine_pid()}

    @property
    def metrics_url(self) -> str | None:
        return None if self._gw is None else self._gw.base + "/metrics"

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "engine_backend": self._backend, "engine_slots": self._slots}


class HostTarget(GatewayTarget):
    """Our gateway as ``GATEWAY_WORKERS`` worker processes under the host supervisor,
    sharing one port and one engine (docs/architecture.md, "Workers and instances")."""

    def __init__(self, log_dir: Path, *, workers: int, **kwargs: Any) -> None:
        env = {**kwargs.pop("env", {}), "GATEWAY_WORKERS": str(workers)}
        super().__init__(log_dir, env=env, **kwargs)
        self.workers = workers
        self.name = f"gateway-{workers}w"

    def start(self) -> None:
        super().start()
        assert self._gw is not None
        wait_workers(self._gw, self.workers)

    def processes(self) -> dict[str, int]:
        gw = self._gw
        if gw is None or gw.proc is None:
            return {}
        roles = {f"worker{i}": pid for i, pid in sorted(worker_pids(gw.proc.pid).items())}
        return {"supervisor": gw.proc.pid, **roles, "engine": gw.engine_pid()}

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "gateway_workers": self.workers}


class BaselineTarget(Target):
    """The naive server of :mod:`tests.bench.baseline_server`, started fresh."""

    name = "baseline"

    def __init__(self, log_dir: Path) -> None:
        self._log_dir = log_dir
        self._proc: subprocess.Popen[bytes] | None = None
        self._port = 0
        self.ws_url = ""

    def start(self, timeout: float = 30.0) -> None:
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self._port = free_port()
        self.ws_url = f"ws://127.0.0.1:{self._port}/v1/stream"
        log = open(self._log_dir / "baseline.log", "ab")  # noqa: SIM115 - owned by the child
        with log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "tests.bench.baseline_server", "--port", str(self._port)],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"baseline server exited with {self._proc.returncode}")
            with contextlib.suppress(OSError):
                if _get_json(f"http://127.0.0.1:{self._port}/readyz")[0] == 200:
                    return
            time.sleep(0.05)
        raise TimeoutError("baseline server not ready")

    def stop(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def token(self, max_streams: int | None = None) -> str | None:
        return None  # the baseline does not authenticate (see its docstring)

    def processes(self) -> dict[str, int]:
        return {} if self._proc is None else {"server": self._proc.pid}


class ExternalTarget(Target):
    """A gateway someone else started (``--target ws://host:port/v1/stream``).

    CPU and memory are only watched for the pid given (and, when the gateway runs on this
    machine, its engine child).
    """

    name = "external"

    def __init__(self, ws_url: str, token: str | None, server_pid: int | None = None) -> None:
        self.ws_url = ws_url
        self._token = token
        self._server_pid = server_pid
        parts = urlsplit(ws_url)
        self._http = f"http://{parts.netloc}"

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def token(self, max_streams: int | None = None) -> str | None:
        return self._token  # given by the operator: its tenant must admit the level

    def processes(self) -> dict[str, int]:
        pids: dict[str, int] = {}
        if self._server_pid is not None:
            pids["server"] = self._server_pid
            engine = engine_pid_of(self._server_pid)
            if engine is not None:
                pids["engine"] = engine
        return pids

    @property
    def metrics_url(self) -> str | None:
        return self._http + "/metrics"
