"""The load generator measures a real gateway: 3 calls, 2 prompts each, a few seconds.

This tests the instrument, not the gateway's performance: it asserts that every field a
benchmark report reads is there and plausible, and that client and server agree on
what was sent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.bench import plots, report
from tests.bench.loadgen import LoadOptions, run_level
from tests.bench.targets import GatewayTarget

pytestmark = [pytest.mark.timeout(120), pytest.mark.realtime]


def smoke_options(**overrides: Any) -> LoadOptions:
    """Two quick prompts per call; the duration is an upper bound: the level ends when
    every call spoke its prompts."""
    defaults: dict[str, Any] = dict(
        duration_s=30.0,
        think_min_s=0.05,
        think_max_s=0.2,
        max_prompts=2,
        settle_s=0.2,
        sample_s=0.5,
        progress_s=60.0,
        drain_s=5.0,
    )
    return LoadOptions(**{**defaults, **overrides})


@pytest.fixture(scope="module")
def level(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    target = GatewayTarget(tmp_path_factory.mktemp("gateway"))
    target.start()
    try:
        return run_level(target, 3, smoke_options(), log=lambda _line: None)
    finally:
        target.stop()


def test_every_call_spoke_its_prompts(level: dict[str, Any]) -> None:
    client = level["client"]
    assert client["sessions_ready"] == 3 and client["sessions_failed"] == 0
    assert client["utterances"] == {"speaks": 6, "completed": 6, "unfinished": 0, "no_audio": 0}
    assert client["errors"] == {}
    assert client["bad_size_frames"] == 0 and client["stray_frames"] == 0
    assert len(client["first_audio_sorted_ms"]) == 6


def test_latency_and_pacing_are_plausible(level: dict[str, Any]) -> None:
    client = level["client"]
    fa = client["first_audio_ms"]
    assert 0 < fa["p50"] <= fa["p95"] <= fa["p99"] <= fa["max"] < 2000
    gap = client["gap_ms"]
    assert 10 < gap["p50"] < 30  # realtime: a frame every 20 ms
    assert client["frames"] > 6 * 25  # a 15-character prompt is longer than half a second
    assert 0 <= client["run_ahead_ms"]["max"] <= 60 + 40  # the lead, plus slack
    assert sum(client["gap_histogram"]["counts"]) + client["gap_histogram"]["over"] == (
        client["frames"] - 6
    )


def test_server_metrics_agree_with_the_client(level: dict[str, Any]) -> None:
    server = level["server"]
    assert server is not None
    assert server["frames_sent"] == level["client"]["frames"]
    assert server["errors"] == {}
    assert isinstance(server["underruns"], int)
    added = server["added_latency_ms"]
    assert added["count"] == 6
    assert added["p99"]["estimate"] is not None and added["p99"]["estimate"] >= 0


def test_resources_are_measured(level: dict[str, Any]) -> None:
    cpu = level["cpu_pct"]
    for role in ("server", "engine", "loadgen", "machine"):
        assert cpu[role] >= 0
    assert cpu["server"] > 0  # the gateway sent frames
    memory = level["memory"]
    assert memory["base_kib"]["server"]["rss"] > 10_000
    assert memory["base_kib"]["engine"]["anon"] > 0
    assert memory["base_kib"]["engine"]["shmem"] >= 0
    assert memory["base_kib"]["total"] >= memory["base_kib"]["server"]["anon"]
    assert isinstance(memory["per_idle_session_kib"], float)
    assert level["timeline"] and "total_kib" in level["timeline"][0]


def test_result_serializes_and_renders(level: dict[str, Any], tmp_path: Path) -> None:
    body = {
        "command": "smoke",
        "started": "now",
        "machine": {
            "cpu_model": "cpu",
            "cores": 2,
            "memory_gib": 1,
            "kernel": "k",
            "python": "3",
        },
        "options": level["options"],
        "levels": [level],
    }
    json.dumps(body)
    section = report.matrix_section(body)
    assert "| gateway | 3 | 3 | 6 / 0 |" in section
    doc = tmp_path / "benchmarks.md"
    report.update_doc(doc, report.MATRIX_MARKERS, section)
    report.update_doc(doc, report.MATRIX_MARKERS, section)
    assert doc.read_text().count(report.MATRIX_MARKERS[0]) == 1
    if plots.available():
        for png in plots.plot_all([level], tmp_path):
            assert png.stat().st_size > 1000


def test_twilio_calls_driven_by_attached_applications(tmp_path: Path) -> None:
    """The Twilio driver: a Media Streams leg streaming caller audio, prompts spoken by an
    IVR application attached over the native protocol, audio counted from ``media``."""
    target = GatewayTarget(tmp_path)
    target.start()
    try:
        opts = smoke_options(protocol="twilio", caller_audio=True)
        level = run_level(target, 2, opts, log=lambda _line: None)
    finally:
        target.stop()
    client = level["client"]
    assert client["sessions_ready"] == 2 and client["sessions_failed"] == 0
    assert client["utterances"] == {"speaks": 4, "completed": 4, "unfinished": 0, "no_audio": 0}
    assert client["errors"] == {}
    assert client["bad_size_frames"] == 0 and client["stray_frames"] == 0
    assert 10 < client["gap_ms"]["p50"] < 30
    assert level["server"]["frames_sent"] == client["frames"]
