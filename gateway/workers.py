"""The host supervisor: ``GATEWAY_WORKERS`` gateway worker processes on one port.

``python -m gateway serve`` with ``GATEWAY_WORKERS=N`` (N > 1) runs this instead of a
gateway: it

- starts the host's engine (unless ``ENGINE_SOCKET`` names one the operator runs) and
  keeps it up, with the engine supervisor every gateway uses (restart on crash, heartbeat);
- starts N workers (``python -m gateway worker``). Each binds the same port with
  SO_REUSEPORT (the kernel spreads new connections over them), attaches to the host's
  engine through its control socket (the engine allocates ring slots per connection, so per
  worker) and keeps its metric values in a directory the scrape of any worker reads
  (``PROMETHEUS_MULTIPROC_DIR``, gateway/metrics.py). Only worker 0 runs the SIP bridge and
  the AudioSocket listener (a UDP dialog and its RTP ports belong to one process);
- restarts a worker that exits without being asked to (with backoff), leaving the others
  alone; the dead worker's connections were its own, and its live gauges are dropped;
- on SIGTERM or SIGINT, sends SIGTERM to every worker (each drains as a single gateway
  does: ``GATEWAY_DRAIN_TIMEOUT_S``), waits for them, kills what is left after a grace
  period, then stops the engine.

Every worker dies with the supervisor (``PR_SET_PDEATHSIG``), so a killed supervisor
leaves no worker holding the port.

State of each worker (one transition table, every transition logged)::

    STOPPED -> RUNNING -> (exits unasked) -> BACKOFF -> RUNNING
    RUNNING -> STOPPING -> STOPPED      BACKOFF -> STOPPED     (drain)
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import glob
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from prometheus_client.multiprocess import mark_process_dead

from gateway.call_directory import remove_worker_calls
from gateway.config import GatewaySettings
from gateway.engine_supervisor import EngineSupervisor, SupervisorSettings
from gateway.errors import IllegalTransition
from gateway.metrics import MULTIPROC_ENV
from gateway.restart_backoff import RestartBackoff

log = logging.getLogger(__name__)

WORKER_INDEX_ENV = "GATEWAY_WORKER_INDEX"
RUN_DIR_ENV = "GATEWAY_RUN_DIR"
#: Settings of listeners that only worker 0 runs.
FIRST_WORKER_ONLY = ("GATEWAY_SIP_LISTEN", "GATEWAY_AUDIOSOCKET_LISTEN")
STOP_GRACE_S = 15.0  # beyond the drain timeout, before a worker is killed


class WorkerState(enum.Enum):
    STOPPED = "stopped"
    RUNNING = "running"
    BACKOFF = "backoff"
    STOPPING = "stopping"


_TRANSITIONS: dict[WorkerState, frozenset[WorkerState]] = {
    WorkerState.STOPPED: frozenset({WorkerState.RUNNING}),
    WorkerState.RUNNING: frozenset({WorkerState.BACKOFF, WorkerState.STOPPING}),
    WorkerState.BACKOFF: frozenset({WorkerState.RUNNING, WorkerState.STOPPED}),
    WorkerState.STOPPING: frozenset({WorkerState.STOPPED}),
}


@dataclass(eq=False)
class Worker:
    index: int
    state: WorkerState = WorkerState.STOPPED
    process: asyncio.subprocess.Process | None = None
    restarts: int = 0

    def transition(self, new: WorkerState, reason: str) -> None:
        if new not in _TRANSITIONS[self.state]:
            raise IllegalTransition(f"worker {self.index} {self.state.value} -> {new.value}")
        log.info("worker %d %s -> %s (%s)", self.index, self.state.value, new.value, reason)
        self.state = new

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None


def worker_env(
    base: Mapping[str, str], index: int, *, run_dir: str, metrics_dir: str, engine_socket: str
) -> dict[str, str]:
    """The environment of worker ``index``: the host's, plus where its engine, its
    metrics and the host's shared files are."""
    env = dict(base)
    env[WORKER_INDEX_ENV] = str(index)
    env[RUN_DIR_ENV] = run_dir
    env[MULTIPROC_ENV] = metrics_dir
    env["ENGINE_SOCKET"] = engine_socket
    if index > 0:
        for name in FIRST_WORKER_ONLY:
            env.pop(name, None)
    return env


def listening_path(run_dir: str, index: int) -> str:
    return os.path.join(run_dir, f"worker-{index}.listening")


def mark_listening(env: Mapping[str, str]) -> None:
    """A worker says it accepts connections (its pid in a file the supervisor watches)."""
    run_dir, index = env.get(RUN_DIR_ENV), env.get(WORKER_INDEX_ENV)
    if run_dir and index:
        with open(listening_path(run_dir, int(index)), "w", encoding="ascii") as f:
            f.write(str(os.getpid()))


def clear_metrics_dir(directory: str) -> None:
    """Values of an earlier run must not be summed into this one's."""
    os.makedirs(directory, exist_ok=True)
    for path in glob.glob(os.path.join(directory, "*.db")):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


class HostSupervisor:
    def __init__(
        self,
        settings: GatewaySettings,
        env: Mapping[str, str],
    ) -> None:
        self.settings = settings
        self._env = dict(env)
        self.workers = [Worker(i) for i in range(settings.workers)]
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []
        self._run_dir = tempfile.mkdtemp(prefix="ivr-gateway-")
        self.metrics_dir = self._env.get(MULTIPROC_ENV) or os.path.join(self._run_dir, "metrics")
        self.engine: EngineSupervisor | None = None
        if settings.engine_socket is None:
            self.engine = EngineSupervisor(
                SupervisorSettings(
                    socket_path=None,
                    backend=settings.engine_backend,
                    extra_args=list(settings.engine_extra_args),
                    env=self._env,
                    ready_timeout=settings.engine_ready_timeout_s,
                    heartbeat_interval=settings.engine_heartbeat_s,
                    heartbeat_timeout=settings.engine_heartbeat_timeout_s,
                )
            )
            self.engine_socket = self.engine.socket_path
        else:
            self.engine_socket = settings.engine_socket

    async def start(self) -> None:
        clear_metrics_dir(self.metrics_dir)
        if self.engine is not None:
            await self.engine.start()
            try:  # workers attach when it is up; they also retry on their own
                await self.engine.wait_ready(self.settings.engine_ready_timeout_s)
            except TimeoutError:
                log.warning("the engine is not ready yet; starting the workers anyway")
        for worker in self.workers:
            await self._spawn(worker)
            task = asyncio.create_task(self._keep(worker), name=f"worker-{worker.index}")
            self._tasks.append(task)
        await self.wait_listening(self.settings.engine_ready_timeout_s)

    def listening(self, worker: Worker) -> bool:
        """The worker's current process accepts connections."""
        try:
            with open(listening_path(self._run_dir, worker.index), encoding="ascii") as f:
                return f.read() == str(worker.pid)
        except (FileNotFoundError, ValueError):
            return False

    async def wait_listening(self, timeout_s: float) -> bool:
        """Wait until every worker accepts connections; False after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not all(self.listening(w) for w in self.workers):
            if time.monotonic() > deadline:
                log.warning("not every worker is listening after %.0f s", timeout_s)
                return False
            await asyncio.sleep(0.05)
        return True

    async def stop(self) -> None:
        """Drain every worker (SIGTERM), kill what is left after the grace period, then
        stop the engine and remove the host's files."""
        self._stopping = True
        for worker in self.workers:
            if worker.state is WorkerState.RUNNING:
                worker.transition(WorkerState.STOPPING, "draining")
                self._signal(worker, signal.SIGTERM)
        grace = self.settings.drain_timeout_s + STOP_GRACE_S
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=grace)
            for worker in self.workers:
                if worker.state is WorkerState.STOPPING:
                    log.warning("worker %d did not stop in %.0f s: killing it", worker.index, grace)
                    self._signal(worker, signal.SIGKILL)
            if pending:
                await asyncio.wait(pending, timeout=5.0)
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            self._tasks.clear()
        if self.engine is not None:
            await self.engine.stop()
        shutil.rmtree(self._run_dir, ignore_errors=True)

    async def _spawn(self, worker: Worker) -> None:
        env = worker_env(
            self._env,
            worker.index,
            run_dir=self._run_dir,
            metrics_dir=self.metrics_dir,
            engine_socket=self.engine_socket,
        )
        cmd = [sys.executable, "-m", "gateway", "worker", "--parent-pid", str(os.getpid())]
        # Its own session: a Ctrl-C reaches the supervisor alone, which then drains
        # every worker once (a second signal would cut a worker's drain short).
        worker.process = await asyncio.create_subprocess_exec(*cmd, env=env, start_new_session=True)
        reason = "started" if not worker.restarts else f"restart {worker.restarts}"
        worker.transition(WorkerState.RUNNING, f"{reason}, pid {worker.process.pid}")

    async def _keep(self, worker: Worker) -> None:
        """Wait for the worker to exit; unless draining, start it again."""
        backoff = RestartBackoff()
        while True:
            process = worker.process
            assert process is not None
            started = time.monotonic()
            code = await process.wait()
            self._forget(worker, process.pid)
            if self._stopping:
                if worker.state is WorkerState.STOPPING:
                    worker.transition(WorkerState.STOPPED, f"exited with {code}")
                return
            worker.transition(WorkerState.BACKOFF, f"exited with {code} unasked")
            await asyncio.sleep(backoff.after_exit(time.monotonic() - started))
            if self._stopping:
                worker.transition(WorkerState.STOPPED, "not restarted: draining")
                return
            worker.restarts += 1
            await self._spawn(worker)

    def _forget(self, worker: Worker, pid: int) -> None:
        """A worker process is gone: its live gauges no longer count, and its calls are
        no longer in the host's call directory."""
        with contextlib.suppress(OSError):
            mark_process_dead(pid, self.metrics_dir)  # type: ignore[no-untyped-call]
        remove_worker_calls(self._run_dir, worker.index)

    @staticmethod
    def _signal(worker: Worker, signum: int) -> None:
        process = worker.process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signum)


async def supervise_until_signalled(
    supervisor: HostSupervisor, listening: Callable[[], None]
) -> None:
    """Run the host's workers until SIGTERM or SIGINT, then drain them."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await supervisor.start()
        listening()
        await stop.wait()
        log.info("shutting down: draining %d worker(s)", len(supervisor.workers))
    finally:
        await supervisor.stop()
