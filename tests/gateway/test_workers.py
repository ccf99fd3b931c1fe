"""The host supervisor's pieces that need no process: worker environments, the worker
state table, and metrics shared between worker processes (real processes, real files).
The supervisor itself runs in tests/integration/test_workers.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prometheus_client.multiprocess import mark_process_dead

from gateway.errors import IllegalTransition
from gateway.workers import (
    FIRST_WORKER_ONLY,
    RUN_DIR_ENV,
    WORKER_INDEX_ENV,
    Worker,
    WorkerState,
    clear_metrics_dir,
    worker_env,
)
from tests.bench.promscrape import Scrape

BASE = {
    "GATEWAY_PORT": "8080",
    "GATEWAY_SIP_LISTEN": "0.0.0.0:5060",
    "GATEWAY_AUDIOSOCKET_LISTEN": "0.0.0.0:9092",
}


def test_each_worker_gets_the_hosts_engine_metrics_and_run_dir() -> None:
    env = worker_env(BASE, 0, run_dir="/run/x", metrics_dir="/run/x/m", engine_socket="/e.sock")
    assert env[WORKER_INDEX_ENV] == "0" and env[RUN_DIR_ENV] == "/run/x"
    assert env["PROMETHEUS_MULTIPROC_DIR"] == "/run/x/m"
    assert env["ENGINE_SOCKET"] == "/e.sock"
    assert env["GATEWAY_PORT"] == "8080"


def test_only_worker_0_runs_sip_and_audiosocket() -> None:
    first = worker_env(BASE, 0, run_dir="r", metrics_dir="m", engine_socket="e")
    second = worker_env(BASE, 1, run_dir="r", metrics_dir="m", engine_socket="e")
    for name in FIRST_WORKER_ONLY:
        assert first[name] == BASE[name]
        assert name not in second
    assert "GATEWAY_SIP_LISTEN" in BASE  # the host's own environment is left alone


def test_worker_transitions_follow_the_table() -> None:
    worker = Worker(0)
    for state in (WorkerState.RUNNING, WorkerState.BACKOFF, WorkerState.RUNNING):
        worker.transition(state, "test")
    worker.transition(WorkerState.STOPPING, "drain")
    with pytest.raises(IllegalTransition):
        worker.transition(WorkerState.RUNNING, "no restart while stopping")
    worker.transition(WorkerState.STOPPED, "exited")
    with pytest.raises(IllegalTransition):
        Worker(1).transition(WorkerState.BACKOFF, "never started")


def test_clear_metrics_dir_removes_values_of_an_earlier_run(tmp_path: Path) -> None:
    (tmp_path / "counter_123.db").write_bytes(b"x")
    (tmp_path / "keep.txt").write_text("x")
    clear_metrics_dir(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]
    clear_metrics_dir(str(tmp_path / "new"))  # made when missing
    assert (tmp_path / "new").is_dir()


WORKER = textwrap.dedent(
    """
    import sys
    from gateway.metrics import GatewayMetrics
    m = GatewayMetrics()
    sessions = int(sys.argv[1])
    for _ in range(sessions):
        m.sessions_total.labels(protocol="native").inc()
    m.sessions_active.labels(protocol="native").set(sessions)
    m.engine_ready.set(int(sys.argv[2]))
    m.first_audio.observe(0.05)
    print("ok")
    """
)
SCRAPE = textwrap.dedent(
    """
    from prometheus_client import generate_latest
    from gateway.metrics import GatewayMetrics, exposition_registry
    m = GatewayMetrics()
    print(generate_latest(exposition_registry(m.registry)).decode())
    """
)


def _run(code: str, directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, check=True
    )


def test_a_scrape_of_any_worker_answers_for_the_host(tmp_path: Path) -> None:
    """Two worker processes write their values; a third process's scrape sums the
    counters and histograms, sums live gauges, takes the minimum of engine readiness,
    and leaves out one process's process_* metrics. A dead worker's live gauges go; its
    counters stay (a host's counters never go back)."""
    first = subprocess.Popen(
        [sys.executable, "-c", WORKER, "3", "1"],
        env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)},
        stdout=subprocess.PIPE,
    )
    first.wait(60)
    _run(WORKER, tmp_path, "2", "0")
    samples = Scrape.parse(_run(SCRAPE, tmp_path).stdout).values
    assert samples["gateway_sessions_total{protocol=native}"] == 5
    assert samples["gateway_first_audio_seconds_count"] == 2
    assert samples["gateway_engine_ready"] == 0  # one worker without an engine: not ready
    assert not any(name.startswith("process_") for name in samples)
    # The processes have exited, but nobody said so: their live gauges still count.
    assert samples["gateway_sessions_active{protocol=native}"] == 5
    mark_process_dead(first.pid, str(tmp_path))  # type: ignore[no-untyped-call]
    samples = Scrape.parse(_run(SCRAPE, tmp_path).stdout).values
    assert samples["gateway_sessions_active{protocol=native}"] == 2
    assert samples["gateway_sessions_total{protocol=native}"] == 5
