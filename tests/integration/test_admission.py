"""Admission control end to end: slot pool, memory threshold, soft-threshold queueing,
and the golden metrics as Prometheus parses them."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.bench.promscrape import histogram_quantile
from tests.integration.harness import GatewayProcess, NativeClient
from tests.integration.pacing import LoopStallWatch, assert_on_time, lateness

# Timing under load: `make test` runs these alone, after the parallel suites.
pytestmark = pytest.mark.realtime

PROMPT = "Your call is important to us. Please stay on the line."


@pytest.fixture
def gateways(tmp_path: Path) -> Iterator[list[GatewayProcess]]:
    started: list[GatewayProcess] = []
    yield started
    for gw in started:
        gw.stop()


def start(gateways: list[GatewayProcess], tmp_path: Path, **env: str) -> GatewayProcess:
    gw = GatewayProcess(tmp_path / f"gateway{len(gateways)}.log", **env)
    gateways.append(gw)
    gw.start()
    return gw


async def scrape(gw: GatewayProcess) -> dict[str, object]:
    async with aiohttp.ClientSession() as http:
        text = await (await http.get(gw.base + "/metrics")).text()
    return {f.name: f for f in text_string_to_metric_families(text)}


def worst_bucket(families: dict[str, object], name: str) -> float | None:
    """The upper bound of the bucket that holds histogram ``name``'s largest sample."""
    buckets = sorted(
        (float(s.labels["le"]), s.value)
        for s in families[name].samples  # type: ignore[attr-defined]
        if s.name == f"{name}_bucket"
    )
    found = histogram_quantile(1.0, buckets)
    return None if found is None else found[1]


def sample(families: dict[str, object], name: str, **labels: str) -> float:
    """Sum of the samples called ``name`` (a counter's family drops ``_total``)."""
    family = families.get(name) or families[name.removesuffix("_total").removesuffix("_count")]
    total = 0.0
    for s in family.samples:  # type: ignore[attr-defined]
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            total += s.value
    return total


async def test_slot_pool_admits_exactly_n_and_they_stay_on_time(
    gateways: list[GatewayProcess], tmp_path: Path
) -> None:
    n = 8
    gw = start(gateways, tmp_path, ENGINE_SLOTS=str(n), ENGINE_VAD="0")
    clients = [await NativeClient.connect(gw.ws_url, gw.token()) for _ in range(n + 5)]
    try:
        for c in clients:
            await c.send(type="start", voice="en-us", format="mulaw_8000")
        results = await asyncio.gather(
            *(c.wait_event("ready", timeout=10) for c in clients), return_exceptions=True
        )
        admitted = [c for c, r in zip(clients, results, strict=True) if isinstance(r, dict)]
        refused = [c for c, r in zip(clients, results, strict=True) if not isinstance(r, dict)]
        assert len(admitted) == n and len(refused) == 5
        for c in refused:
            error = c.got.of_type("error")[0]
            assert error["code"] == "overloaded" and error["retry_after_ms"] > 0
            assert await c.wait_closed() == 1013
        for c in admitted:
            await c.send(type="speak", text=PROMPT, utterance_id="p")
        dones = await asyncio.gather(*(c.wait_event("utterance_done") for c in admitted))
        for c, done in zip(admitted, dones, strict=True):
            assert_on_time(np.array([t for t, _ in c.got.frames]), done["audio_ms"])
        families = await scrape(gw)
        assert sample(families, "gateway_underruns_total") == 0
        assert sample(families, "gateway_rejections_total", reason="overloaded") == 5
    finally:
        for c in clients:
            await c.aclose()


async def test_memory_threshold_refuses_new_sessions_only(
    gateways: list[GatewayProcess], tmp_path: Path
) -> None:
    # Each stream holds 40 MiB in the engine; the budget is the engine's idle memory
    # plus about 100 MiB, so the third stream crosses 85% and the fourth is refused.
    probe = start(gateways, tmp_path, ENGINE_BACKEND="synthetic", ENGINE_VAD="0")
    idle_rss = sample(await scrape(probe), "engine_memory_used_bytes")
    await asyncio.sleep(1.2)  # a heartbeat carries the engine's memory
    idle_rss = sample(await scrape(probe), "engine_memory_used_bytes")
    assert idle_rss > 10 * 2**20
    probe.stop()
    budget_mb = int(idle_rss / 2**20 + 100)
    gw = start(
        gateways,
        tmp_path,
        ENGINE_BACKEND="synthetic",
        ENGINE_VAD="0",
        ENGINE_SYNTHETIC_BALLAST_MB="40",
        ENGINE_MEMORY_BUDGET_MB=str(budget_mb),
    )
    clients: list[NativeClient] = []
    try:
        admitted = 0
        refused: NativeClient | None = None
        for _ in range(6):
            c = await NativeClient.connect(gw.ws_url, gw.token())
            clients.append(c)
            await c.send(type="start", voice="tone", format="pcm_16000")
            try:
                await c.wait_event("ready", timeout=5)
                admitted += 1
            except AssertionError:
                refused = c
                break
        assert refused is not None and 1 <= admitted <= 4
        error = refused.got.of_type("error")[0]
        assert error["code"] == "overloaded" and "memory" in error["message"]
        assert error["retry_after_ms"] > 0
        assert await refused.wait_closed() == 1013
        # The admitted sessions are not affected.
        for c in clients[:admitted]:
            await c.send(type="speak", text="admitted", utterance_id="a")
        for c in clients[:admitted]:
            done = await c.wait_event("utterance_done")
            assert abs(len(c.got.frames) * 20 - done["audio_ms"]) <= 20
    finally:
        for c in clients:
            await c.aclose()


async def utterance_outcome(c: NativeClient, uid: str) -> tuple[float, dict[str, Any]]:
    """When and how utterance ``uid`` ended: its ``utterance_done`` or its ``error``."""
    while True:
        for at, event in c.got.events:
            if event.get("utterance_id") == uid and event["type"] in ("utterance_done", "error"):
                return at, event
        await asyncio.sleep(0.01)


async def one_caller(gw: GatewayProcess, prompts: int, codes: list[str]) -> list[int]:
    """Speak ``prompts`` short utterances back to back; returns first_audio_ms values."""
    c = await NativeClient.connect(gw.ws_url, gw.token())
    firsts: list[int] = []
    try:
        await c.start("tone", "pcm_16000", pacing="burst")
        for i in range(prompts):
            await c.send(type="speak", text="ab", utterance_id=f"u{i}")
            _, end = await utterance_outcome(c, f"u{i}")
            if end["type"] == "error":
                codes.append(end["code"])
            elif end["first_audio_ms"] is not None:
                firsts.append(end["first_audio_ms"])
    finally:
        await c.aclose()
    return firsts


def buckets(families: dict[str, object], name: str) -> dict[float, float]:
    return {
        float(s.labels["le"]): s.value
        for s in families[name].samples  # type: ignore[attr-defined]
        if s.name == name + "_bucket"
    }


def quantile(cumulative: dict[float, float], q: float) -> float:
    """Upper bound of the bucket holding quantile ``q`` of a cumulative histogram."""
    total = cumulative[float("inf")]
    assert total > 0
    for upper in sorted(cumulative):
        if cumulative[upper] >= q * total:
            return upper
    return float("inf")


async def load_phases(gw: GatewayProcess, callers: int, prompts: int, codes: list[str]) -> float:
    """Two waves of callers; the p90 engine latency of the second wave only (the first
    teaches the admission controller, which judges from latencies it has seen)."""
    name = "gateway_engine_first_audio_seconds"
    await asyncio.gather(*(one_caller(gw, prompts, []) for _ in range(callers)))
    before = buckets(await scrape(gw), name)
    await asyncio.gather(*(one_caller(gw, prompts, codes) for _ in range(callers)))
    after = buckets(await scrape(gw), name)
    return quantile({le: after[le] - before[le] for le in after}, 0.9)


async def test_soft_threshold_queues_excess_and_keeps_admitted_latency_bounded(
    gateways: list[GatewayProcess], tmp_path: Path
) -> None:
    slow = {
        "ENGINE_BACKEND": "synthetic",
        "ENGINE_VAD": "0",
        "ENGINE_SYNTHETIC_FIRST_CHUNK_MS": "150",  # the engine does ~6 segments a second
        "GATEWAY_LATENCY_WINDOW_S": "5",
        "GATEWAY_QUEUE_TIMEOUT_MS": "1500",
        "GATEWAY_ADMISSION_QUEUE": "6",
    }
    callers, prompts = 16, 4
    # Without admission control (a soft threshold nobody reaches) ...
    free = start(gateways, tmp_path, GATEWAY_SOFT_LATENCY_MS="600000", **slow)
    free_codes: list[str] = []
    free_p90 = await load_phases(free, callers, prompts, free_codes)
    free.stop()
    # ... and with it (soft threshold 0.5 s).
    gated = start(gateways, tmp_path, GATEWAY_SOFT_LATENCY_MS="500", **slow)
    codes: list[str] = []
    peak_queue = 0.0

    async def watch_queue() -> None:
        nonlocal peak_queue
        while True:
            peak_queue = max(peak_queue, sample(await scrape(gated), "cosy2_queue_length"))
            await asyncio.sleep(0.1)

    watcher = asyncio.create_task(watch_queue())
    try:
        gated_p90 = await load_phases(gated, callers, prompts, codes)
    finally:
        watcher.cancel()
    families = await scrape(gated)
    assert free_codes == []  # without admission everything piles onto the engine ...
    assert free_p90 >= 1.5  # ... and the engine's latency grows with the load
    assert gated_p90 <= 1.0, gated_p90  # admitted work stays near the target
    assert peak_queue > 0  # the excess waited at the gate ...
    assert set(codes) <= {"queue_timeout", "overloaded"} and codes  # ... or was refused
    refused = sample(families, "cosy2_tts_errors_total", type="queue_timeout") + sample(
        families, "cosy2_tts_errors_total", type="overloaded"
    )
    assert refused >= len(codes)  # (the first wave may have been refused too)


async def test_golden_metrics_parse_with_the_right_types(
    gateways: list[GatewayProcess], tmp_path: Path
) -> None:
    gw = start(gateways, tmp_path)
    c = await NativeClient.connect(gw.ws_url, gw.token())
    await c.start()
    await c.send(type="speak", text="Metrics, please.")
    await c.wait_event("utterance_done")
    await c.aclose()
    async with aiohttp.ClientSession() as http:
        await http.get(gw.base + "/v1/voices")  # an auth failure
    await asyncio.sleep(1.2)
    families = await scrape(gw)
    expected = {
        "cosy2_tts_request_duration_seconds": "histogram",
        "cosy2_gpu_memory_used_bytes": "gauge",
        "engine_memory_used_bytes": "gauge",
        "cosy2_cache_hit_ratio": "gauge",
        "cosy2_queue_length": "gauge",
        "cosy2_tts_errors": "counter",
        "gateway_sessions_active": "gauge",
        "gateway_sessions": "counter",
        "gateway_first_audio_seconds": "histogram",
        "gateway_frames_sent": "counter",
        "gateway_underruns": "counter",
        "gateway_barge_ins": "counter",
        "gateway_rejections": "counter",
        "gateway_auth_failures": "counter",
    }
    for name, kind in expected.items():
        assert name in families, name
        assert families[name].type == kind, (name, families[name].type)  # type: ignore[attr-defined]
        assert families[name].documentation  # type: ignore[attr-defined]
    types = {s.labels["type"] for s in families["cosy2_tts_errors"].samples}  # type: ignore[attr-defined]
    assert {"cuda_oom", "engine_unavailable", "overloaded", "queue_timeout", "lease_lost"} <= types
    assert sample(families, "cosy2_tts_request_duration_seconds_count") == 1
    assert sample(families, "engine_memory_used_bytes") > 0
    assert sample(families, "cosy2_gpu_memory_used_bytes") == 0
    assert sample(families, "gateway_auth_failures_total", code="token_missing") == 1


NEURAL_PROMPT = (
    "Thank you for calling Northwind Bank. Your call is important to us, so please stay "
    "on the line and the next available agent will be with you shortly."
)


async def neural_caller(gw: GatewayProcess, prompts: int) -> list[tuple[str, float, float]]:
    """Speak ``prompts`` neural prompts back to back at telephone pace; per utterance its
    outcome ("done" or the error code), seconds from speak to that outcome, and when
    done its worst frame lateness (:func:`tests.integration.pacing.lateness`)."""
    c = await NativeClient.connect(gw.ws_url, gw.token())
    outcomes: list[tuple[str, float, float]] = []
    try:
        await c.start("en-us-joe", "mulaw_8000")
        for i in range(prompts):
            uid = f"u{i}"
            spoke_at = await c.send(type="speak", text=NEURAL_PROMPT, utterance_id=uid)
            end_at, end = await utterance_outcome(c, uid)
            if end["type"] == "error":
                outcomes.append((end["code"], end_at - spoke_at, 0.0))
                continue
            started_at = next(
                t
                for t, e in c.got.events
                if e["type"] == "utterance_started" and e["utterance_id"] == uid
            )
            times = np.array([t for t, _ in c.got.frames if started_at <= t <= end_at])
            assert abs(len(times) * 20 - end["audio_ms"]) <= 20, (len(times), end)
            outcomes.append(("done", end_at - spoke_at, float(lateness(times).max())))
    finally:
        await c.aclose()
    return outcomes


async def test_neural_overload_queues_the_excess_and_admitted_calls_never_stutter(
    gateways: list[GatewayProcess], tmp_path: Path
) -> None:
    """More calls than one neural worker can voice, three prompts each: 40 (Piper speaks
    this prompt at 0.039 of real time on this machine idle, so one worker keeps about 25
    calls fed; 20 and 30 calls left it no excess, or too little, to refuse). Every
    utterance either plays with no frame late (from its first frame on) or is refused;
    none does both. The engine keeps speaking calls fed before it starts new utterances, so the
    excess shows as first-audio latency, the gateway's soft threshold degrades, and the
    queued excess times out."""
    queue_timeout_s = 1.5
    gw = start(
        gateways,
        tmp_path,
        ENGINE_BACKEND="piper,espeak",
        ENGINE_WORKERS="1",
        ENGINE_VAD="0",
        GATEWAY_SOFT_LATENCY_MS="500",
        GATEWAY_LATENCY_WINDOW_S="10",
        GATEWAY_QUEUE_TIMEOUT_MS=str(int(queue_timeout_s * 1000)),
        # Refusals here are the gateway queue's; the engine's own start deadline (which
        # refuses after 10 s, on a machine slow enough to hold work that long) is tested
        # in tests/engine/test_scheduler.py.
        ENGINE_START_TIMEOUT_MS="60000",
    )
    callers, prompts = 40, 3
    async with LoopStallWatch() as client_stalls:
        results = await asyncio.gather(*(neural_caller(gw, prompts) for _ in range(callers)))
    outcomes = [o for r in results for o in r]
    families = await scrape(gw)
    played = [late for code, _, late in outcomes if code == "done"]
    refused = [waited for code, waited, _ in outcomes if code != "done"]
    assert {code for code, _, _ in outcomes} <= {"done", "queue_timeout", "overloaded"}
    assert max(played) <= 0.0, (
        f"{sum(late > 0 for late in played)} utterances stuttered, worst by "
        f"{max(played) * 1000:.0f} ms; where: underruns "
        f"{sample(families, 'gateway_underruns_total'):.0f}, gateway pacer tick lag up to "
        f"{worst_bucket(families, 'gateway_pacer_tick_lag_seconds')} s, this client's loop "
        f"stalled up to {client_stalls.worst_s * 1000:.0f} ms, the hypervisor's steal "
        f"{client_stalls.steal_pct} % of a core"
    )
    assert sample(families, "gateway_underruns_total") == 0
    # The excess was there and was refused, within the queue timeout (plus a poll).
    assert len(refused) >= callers // 4 and len(played) >= callers
    assert max(refused) <= queue_timeout_s + 0.5
    assert sample(families, "gateway_rejections_total") + sample(
        families, "cosy2_tts_errors_total", type="queue_timeout"
    ) >= len(refused)
