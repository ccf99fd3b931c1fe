"""Voice registry figures: extraction time, L1/L2 feature-lookup time, call-mix hit ratio.

    python -m tests.bench.voice_cache [--voices 20] [--lookups 2000] [--calls 5000]
        [--zipf-s 1.1] [--l1-size 8] [--gateway-calls N] [--cold-l2] [--seed 1]
        [--redis-url URL] [--out FILE] [--quiet]

What it does, in order:

1. Starts a real gateway (``python -m gateway serve``, espeak engine, VAD off) on a free
   port, with ``GATEWAY_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``) and a unique
   ``GATEWAY_REDIS_PREFIX`` (``bench-vc-<hex>``) and ``GATEWAY_VOICE_CACHE_SIZE`` =
   ``--l1-size``. Every key under that prefix is deleted at the end.
2. Makes ``--voices`` distinct reference clips with espeak-ng (the integration tests'
   :func:`~tests.integration.caller_audio.espeak_reference`: different variants, pitches,
   rates and texts, each cut to 4-6 s) and registers them one after another with
   ``POST /v1/voices``. **Extraction time** of each registration is the increase of the
   gateway's own ``gateway_voice_extraction_seconds_sum`` across that request (the
   engine's ``VoicePrepared.seconds``: backend ``prepare_voice`` on the engine's worker
   thread, calibration included when that call needed one); the request's wall time is
   kept too.
3. **Lookup time**, in this process: a :class:`~gateway.voices.registry.VoiceRegistry` built the
   way :func:`gateway.app.create_app` builds it (``RedisVoiceStore`` on a
   ``redis.asyncio`` client with the same timeouts, a ``GatewayMetrics``, an engine
   supervisor of its own for the backend's name and version) against the same Redis and
   prefix. Timed: one ``await registry.features(sha, language)`` (the feature lookup)
   and one ``await registry.profile(tenant, voice_id)`` (what a session start calls:
   record, then features), with ``time.perf_counter_ns`` around the await. *L1 hit*: a
   registry whose L1 holds every voice, warmed first. *L2 hit*: a registry with L1 size 0
   (disabled), so every lookup reads Redis. The registry's own counters are checked to
   confirm every timed lookup was the hit it is reported as.
4. **Call mix**: ``--calls`` session starts whose voice is drawn (seeded) from a Zipf
   distribution (P(rank k) ~ 1/k^s) over the registered voices, each one
   ``registry.profile()`` on a fresh in-process registry with L1 size ``--l1-size``.
   Hits per level and the ratios come from that registry's metric counters
   (``gateway_voice_cache_hits_total{level}``, ``gateway_voice_cache_misses_total{level}``,
   ``gateway_voice_extraction_seconds_count``, ``cosy2_cache_hit_ratio``). Every
   feature is in Redis then, so misses need ``--cold-l2``: it deletes the features blobs
   first (records and audio stay), and each voice's first use extracts again from its
   stored audio, on this process's engine, as after a backend upgrade. Then the same
   draws (the first ``--gateway-calls``, default all) are played as real WebSocket session
   starts (start, ready, close) against the gateway, and the same counters are read from
   its ``/metrics`` before and after.
5. Prints a table, and writes the result as JSON to
   ``bench-results/voice-cache-<UTC timestamp>.json`` (or ``--out``).

This is a benchmark, not a test: it checks that it measured what it says, nothing else.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import os
import platform
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import numpy.typing as npt
import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families

from engine.ipc.client import EngineClient, EngineUnavailable
from gateway.engine_supervisor import EngineSupervisor, SupervisorSettings
from gateway.metrics import GatewayMetrics
from gateway.voices.registry import BackendInfo, VoiceRegistry
from gateway.voices.store import RedisVoiceStore
from tests.integration.caller_audio import espeak_reference, wav_bytes
from tests.integration.harness import ROOT, GatewayProcess, NativeClient

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
TENANT = "bench"
LANGUAGE = "en-US"
ESPEAK_RATE = 22050
TOKEN_TTL_S = 6 * 3600

# Reference clips: espeak variants (the backend picks a female variant above 165 Hz) and
# sentences; pitch, rate and length are drawn per clip.
VARIANTS = (
    "en-us+f1", "en-us+f2", "en-us+f3", "en-us+f4", "en-us+f5",
    "en-us+m1", "en-us+m2", "en-us+m3", "en-us+m4", "en-us+m5", "en-us+m6", "en-us+m7",
)  # fmt: skip
TEXTS = (
    "Thank you for calling the customer service centre. Your call is important to us.",
    "Good morning, you have reached the billing department. How may I help you today?",
    "Please hold while I transfer you to the next available agent in your area.",
    "Your appointment has been confirmed for Tuesday at ten thirty in the morning.",
    "For account balances press one, for recent payments press two, for anything else stay.",
    "We are sorry, all of our representatives are busy helping other customers right now.",
    "I can see your order was shipped yesterday and should arrive within three days.",
    "To protect your security, please tell me the last four digits of your card number.",
)


@dataclass(frozen=True)
class Options:
    voices: int = 20
    lookups: int = 2000
    calls: int = 5000
    zipf_s: float = 1.1
    l1_size: int = 8
    gateway_calls: int | None = None  # None: every draw of the mix
    cold_l2: bool = False
    seed: int = 1
    redis_url: str = DEFAULT_REDIS_URL
    min_clip_s: float = 4.0
    max_clip_s: float = 6.0
    progress: bool = True


@dataclass(frozen=True)
class ClipSpec:
    variant: str
    pitch: int
    rate_wpm: int
    seconds: float
    text: str


@dataclass
class Registered:
    spec: ClipSpec
    voice_id: str
    duration_ms: int
    http_ms: float
    extraction_ms: float
    extractions: int


@dataclass
class Log:
    enabled: bool
    started: float = field(default_factory=time.monotonic)

    def __call__(self, line: str) -> None:
        if self.enabled:
            print(f"[{time.monotonic() - self.started:7.1f}s] {line}", flush=True)


# --- statistics -------------------------------------------------------------------------


def summary(values_ms: list[float]) -> dict[str, float]:
    """Median, p99 (numpy's linear interpolation), mean, min and max, in ms."""
    arr: npt.NDArray[np.float64] = np.asarray(values_ms, dtype=np.float64)
    return {
        "n": float(len(arr)),
        "median_ms": float(np.percentile(arr, 50)),
        "p99_ms": float(np.percentile(arr, 99)),
        "mean_ms": float(arr.mean()),
        "min_ms": float(arr.min()),
        "max_ms": float(arr.max()),
    }


def zipf_draws(n_voices: int, calls: int, s: float, seed: int) -> list[int]:
    """``calls`` voice indices; index k (0-based) is drawn with P ~ 1/(k+1)^s."""
    weights = 1.0 / np.arange(1, n_voices + 1, dtype=np.float64) ** s
    rng = np.random.default_rng(seed)
    return [int(i) for i in rng.choice(n_voices, size=calls, p=weights / weights.sum())]


# --- machine ----------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    commit = ""
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        commit = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=ROOT,
            capture_output=True,
            check=True,
            text=True,
        ).stdout.strip()
    return {
        "node": platform.node(),
        "cpu_model": model,
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "load_avg_start": list(os.getloadavg()),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "source": commit,
    }


# --- reference clips --------------------------------------------------------------------


def clip_specs(opts: Options) -> list[ClipSpec]:
    rng = np.random.default_rng(opts.seed)
    return [
        ClipSpec(
            variant=VARIANTS[i % len(VARIANTS)],
            pitch=int(rng.integers(10, 91)),
            rate_wpm=int(rng.integers(140, 211)),
            seconds=round(float(rng.uniform(opts.min_clip_s, opts.max_clip_s)), 3),
            text=TEXTS[i % len(TEXTS)],
        )
        for i in range(opts.voices)
    ]


def make_clip(spec: ClipSpec) -> bytes:
    """A WAV of espeak speech, ``spec.seconds`` long (the sentence repeated, then cut)."""
    pcm, rate = espeak_reference(
        spec.variant, spec.pitch, seconds=spec.seconds, rate_wpm=spec.rate_wpm, text=spec.text
    )
    return wav_bytes(pcm[: int(spec.seconds * rate)], rate)


def make_clips(specs: list[ClipSpec], log: Log) -> list[bytes]:
    """Each clip in an espeak subprocess, two at a time."""
    clips: list[bytes] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for i, clip in enumerate(pool.map(make_clip, specs), 1):
            clips.append(clip)
            if i % 5 == 0 or i == len(specs):
                log(f"reference clips: {i}/{len(specs)}")
    return clips


# --- the gateway ------------------------------------------------------------------------


async def scrape(http: aiohttp.ClientSession, base: str) -> dict[str, float]:
    """The gateway's /metrics as ``name{k=v,...}`` -> value."""
    async with http.get(base + "/metrics") as r:
        text = await r.text()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            label = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{label}}}" if label else sample.name] = sample.value
    return out


async def register_all(
    gw: GatewayProcess, specs: list[ClipSpec], clips: list[bytes], log: Log
) -> list[Registered]:
    """Registers the clips one at a time; extraction time from the gateway's histogram."""
    token = gw.token(tenant=TENANT, scopes=["tts:stream", "voices:write"], ttl_s=TOKEN_TTL_S)
    out: list[Registered] = []
    async with aiohttp.ClientSession() as http:
        for i, (spec, clip) in enumerate(zip(specs, clips, strict=True), 1):
            before = await scrape(http, gw.base)
            form = aiohttp.FormData()
            form.add_field("audio", clip, filename="ref.wav", content_type="audio/wav")
            form.add_field("name", f"bench {i}")
            form.add_field("language", LANGUAGE)
            started = time.perf_counter()
            async with http.post(
                gw.base + "/v1/voices", data=form, headers={"Authorization": f"Bearer {token}"}
            ) as r:
                body = await r.json()
                status = r.status
            http_ms = (time.perf_counter() - started) * 1000
            if status != 201:
                raise RuntimeError(f"registering clip {i} ({spec}) answered {status}: {body}")
            after = await scrape(http, gw.base)
            n = int(
                after["gateway_voice_extraction_seconds_count"]
                - before["gateway_voice_extraction_seconds_count"]
            )
            seconds = (
                after["gateway_voice_extraction_seconds_sum"]
                - before["gateway_voice_extraction_seconds_sum"]
            )
            out.append(
                Registered(spec, body["id"], body["duration_ms"], http_ms, seconds * 1000, n)
            )
            log(
                f"registered {i}/{len(specs)} {body['id']} ({spec.variant}, pitch {spec.pitch}, "
                f"{body['duration_ms']} ms): extraction {seconds * 1000:.1f} ms, "
                f"request {http_ms:.1f} ms"
            )
    return out


def gateway_cache_counters(m: dict[str, float]) -> dict[str, float]:
    return {
        "l1_hits": m["gateway_voice_cache_hits_total{level=l1}"],
        "l1_misses": m["gateway_voice_cache_misses_total{level=l1}"],
        "l2_hits": m["gateway_voice_cache_hits_total{level=l2}"],
        "l2_misses": m["gateway_voice_cache_misses_total{level=l2}"],
        "extractions": m["gateway_voice_extraction_seconds_count"],
    }


async def gateway_mix(
    gw: GatewayProcess, voice_ids: list[str], draws: list[int], log: Log
) -> dict[str, Any]:
    """Real session starts (native protocol: start, ready, close) with the drawn voices;
    the gateway's own counters, before and after."""
    token = gw.token(tenant=TENANT, ttl_s=TOKEN_TTL_S)
    async with aiohttp.ClientSession() as http:
        before_all = await scrape(http, gw.base)
        before = gateway_cache_counters(before_all)
        ready_ms: list[float] = []
        step = max(1, len(draws) // 10)
        for i, index in enumerate(draws, 1):
            client = await NativeClient.connect(gw.ws_url, token)
            try:
                started = time.perf_counter()
                await client.start(voice_ids[index], "mulaw_8000")
                ready_ms.append((time.perf_counter() - started) * 1000)
                await client.send(type="close")
                await client.wait_closed(10)
            finally:
                await client.aclose()
            if i % step == 0 or i == len(draws):
                log(f"gateway session starts: {i}/{len(draws)}")
        after_all = await scrape(http, gw.base)
    after = gateway_cache_counters(after_all)
    delta = {k: after[k] - before[k] for k in after}
    return {
        **mix_counts(len(draws), delta),
        "cosy2_cache_hit_ratio_gauge": after_all["cosy2_cache_hit_ratio"],
        "start_to_ready": summary(ready_ms),
    }


# --- the registry, in process -----------------------------------------------------------


class Counters:
    """The registry's metric counters, read through the Prometheus registry."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self._r = metrics.registry

    def _get(self, name: str, labels: dict[str, str] | None = None) -> float:
        return self._r.get_sample_value(name, labels or {}) or 0.0

    def snapshot(self) -> dict[str, float]:
        return {
            "l1_hits": self._get("gateway_voice_cache_hits_total", {"level": "l1"}),
            "l1_misses": self._get("gateway_voice_cache_misses_total", {"level": "l1"}),
            "l2_hits": self._get("gateway_voice_cache_hits_total", {"level": "l2"}),
            "l2_misses": self._get("gateway_voice_cache_misses_total", {"level": "l2"}),
            "extractions": self._get("gateway_voice_extraction_seconds_count"),
            "extraction_s": self._get("gateway_voice_extraction_seconds_sum"),
            "hit_ratio_gauge": self._get("cosy2_cache_hit_ratio"),
        }


@dataclass
class InProcess:
    """What :func:`gateway.app.create_app` builds for the registry, minus the server."""

    redis_url: str
    prefix: str
    redis: aioredis.Redis
    store: RedisVoiceStore
    supervisor: EngineSupervisor
    backend: BackendInfo | None = None

    @classmethod
    def create(cls, redis_url: str, prefix: str) -> InProcess:
        client = aioredis.from_url(redis_url, socket_timeout=1.0, socket_connect_timeout=1.0)
        supervisor = EngineSupervisor(
            SupervisorSettings(
                backend="espeak",
                extra_args=["--slots", "4"],
                # synthesis measured, not the speech cache (tests/conftest.py)
                env={
                    **os.environ,
                    "ENGINE_VAD": "0",
                    "LOG_LEVEL": "WARNING",
                    "ENGINE_SPEECH_CACHE": "0",
                },
                ready_timeout=60.0,
            )
        )
        return cls(redis_url, prefix, client, RedisVoiceStore(client, prefix=prefix), supervisor)

    async def start(self) -> None:
        await self.supervisor.start()
        client = await self.supervisor.wait_ready(60.0)
        welcome = client.welcome
        assert welcome is not None
        # As GatewayState.on_engine_ready makes it.
        self.backend = BackendInfo(
            name=welcome.backend,
            version=welcome.backend_version,
            cloning=welcome.voice_cloning,
            voices={v.id: v.language for v in welcome.voices},
        )

    def engine_client(self) -> EngineClient:
        # As GatewayState.engine_client.
        client = self.supervisor.client
        if client is None or client.lost:
            raise EngineUnavailable("the engine is not ready")
        return client

    def registry(self, l1_size: int) -> tuple[VoiceRegistry, Counters]:
        metrics = GatewayMetrics()
        registry = VoiceRegistry(
            self.store,
            engine=self.engine_client,
            backend=lambda: self.backend,
            metrics=metrics,
            l1_size=l1_size,
        )
        return registry, Counters(metrics)

    async def close(self) -> None:
        await self.supervisor.stop()
        await self.redis.aclose()


async def timed(calls: list[Callable[[], Awaitable[object]]]) -> list[float]:
    """Milliseconds of each ``await call()``, one after another."""
    out: list[float] = []
    for call in calls:
        started = time.perf_counter_ns()
        result = await call()
        out.append((time.perf_counter_ns() - started) / 1e6)
        if result is None:
            raise RuntimeError("a lookup found nothing")
    return out


def check(delta: dict[str, float], expected: dict[str, float], what: str) -> None:
    wrong = {k: (delta[k], v) for k, v in expected.items() if delta[k] != v}
    if wrong:
        raise RuntimeError(f"{what}: counters (got, expected) {wrong}; the timing is not valid")


def mix_counts(session_starts: int, delta: dict[str, float]) -> dict[str, Any]:
    """Hits per level and hit ratios of a call mix, from counter differences."""
    lookups = delta["l1_hits"] + delta["l1_misses"]
    return {
        "session_starts": session_starts,
        "lookups": lookups,
        "l1_hits": delta["l1_hits"],
        "l2_hits": delta["l2_hits"],
        "misses": delta["l2_misses"],
        "extractions": delta["extractions"],
        "l1_hit_ratio": delta["l1_hits"] / lookups if lookups else 0.0,
        "hit_ratio": (delta["l1_hits"] + delta["l2_hits"]) / lookups if lookups else 0.0,
    }


def diff(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in after}


async def lookup_times(
    env: InProcess, voice_ids: list[str], opts: Options, log: Log
) -> dict[str, Any]:
    """features() and profile() timings with L1 hits and with L2 hits."""
    warm, warm_counters = env.registry(l1_size=max(1, len(voice_ids)))
    cold, cold_counters = env.registry(l1_size=0)
    records = []
    for voice_id in voice_ids:
        record = await warm.get(TENANT, voice_id)
        if record is None:
            raise RuntimeError(f"voice {voice_id} is not in the store")
        records.append(record)
    rng = np.random.default_rng(opts.seed + 1)
    order = [int(i) for i in rng.integers(0, len(records), size=opts.lookups)]

    def features(registry: VoiceRegistry, i: int) -> Callable[[], Awaitable[object]]:
        return lambda: registry.features(records[i].audio_sha256, records[i].language)

    def profile(registry: VoiceRegistry, i: int) -> Callable[[], Awaitable[object]]:
        return lambda: registry.profile(TENANT, records[i].id)

    # Warm-up, untimed: every voice once into the warm registry's L1 (these are L2 hits:
    # they also prove the key matches what the gateway stored, else they would extract),
    # and a few L2 reads on the cold one (connection pool).
    before = warm_counters.snapshot()
    await timed([profile(warm, i) for i in range(len(records))])
    check(
        diff(warm_counters.snapshot(), before),
        {"l2_hits": len(records), "l2_misses": 0, "extractions": 0},
        "warm-up",
    )
    await timed([features(cold, i) for i in order[:50]])

    out: dict[str, Any] = {}
    cases = (
        ("features_l1", warm, warm_counters, features, "l1_hits"),
        ("features_l2", cold, cold_counters, features, "l2_hits"),
        ("profile_l1", warm, warm_counters, profile, "l1_hits"),
        ("profile_l2", cold, cold_counters, profile, "l2_hits"),
    )
    for name, registry, counters, make, level in cases:
        before = counters.snapshot()
        times = await timed([make(registry, i) for i in order])
        delta = diff(counters.snapshot(), before)
        expected = {level: float(opts.lookups), "extractions": 0.0}
        if level == "l1_hits":
            expected["l1_misses"] = 0.0
        else:
            expected["l2_misses"] = 0.0
        check(delta, expected, name)
        out[name] = summary(times)
        log(
            f"{name}: {opts.lookups} lookups, median {out[name]['median_ms'] * 1000:.1f} µs, "
            f"p99 {out[name]['p99_ms'] * 1000:.1f} µs"
        )
    return out


async def registry_mix(
    env: InProcess, voice_ids: list[str], draws: list[int], opts: Options, log: Log
) -> dict[str, Any]:
    """Session starts as GatewayState.resolve_voice makes them: registry.profile()."""
    registry, counters = env.registry(l1_size=opts.l1_size)
    if opts.cold_l2:
        dropped = await delete_features(env.redis, env.prefix)
        log(f"--cold-l2: deleted {dropped} features blobs (records and audio kept)")
    before = counters.snapshot()
    times: list[float] = []
    step = max(1, len(draws) // 5)
    for i, index in enumerate(draws, 1):
        started = time.perf_counter_ns()
        found = await registry.profile(TENANT, voice_ids[index])
        times.append((time.perf_counter_ns() - started) / 1e6)
        if found is None:
            raise RuntimeError(f"voice {voice_ids[index]} not found")
        if i % step == 0 or i == len(draws):
            log(f"in-process session starts: {i}/{len(draws)}")
    after = counters.snapshot()
    delta = diff(after, before)
    return {
        **mix_counts(len(draws), delta),
        "extraction_mean_ms": (
            delta["extraction_s"] * 1000 / delta["extractions"] if delta["extractions"] else None
        ),
        "cosy2_cache_hit_ratio_gauge": after["hit_ratio_gauge"],
        "profile_time": summary(times),
    }


# --- redis housekeeping ------------------------------------------------------------------


async def delete_prefix(redis_url: str, prefix: str) -> int:
    """Deletes every key of this run (they all start with ``{<prefix>:``)."""
    client = aioredis.from_url(redis_url, socket_timeout=5.0, socket_connect_timeout=5.0)
    try:
        keys = [k async for k in client.scan_iter(match=f"{{{prefix}:*", count=1000)]
        for start in range(0, len(keys), 500):
            await client.delete(*keys[start : start + 500])
        left = [k async for k in client.scan_iter(match=f"{{{prefix}:*", count=1000)]
        if left:
            raise RuntimeError(f"{len(left)} keys under {prefix} survived the clean-up")
        return len(keys)
    finally:
        await client.aclose()


async def delete_features(client: aioredis.Redis, prefix: str) -> int:
    """Deletes this run's features blobs (``{<prefix>:ref:<sha>}:features:...``, see
    gateway/voices/store.py), as a backend upgrade or the TTL would."""
    pattern = f"{{{prefix}:ref:*}}:features:*"
    keys = [
        k
        async for k in client.scan_iter(match=pattern, count=1000)
        if not k.endswith(b":lock" if isinstance(k, bytes) else ":lock")
    ]
    if keys:
        await client.delete(*keys)
    return len(keys)


async def ping(redis_url: str) -> None:
    client = aioredis.from_url(redis_url, socket_timeout=2.0, socket_connect_timeout=2.0)
    try:
        await client.ping()
    finally:
        await client.aclose()


# --- the run ----------------------------------------------------------------------------


@contextlib.contextmanager
def gateway(opts: Options, prefix: str, log: Log) -> Iterator[GatewayProcess]:
    with tempfile.TemporaryDirectory(prefix="bench-voice-cache-") as tmp:
        gw = GatewayProcess(
            Path(tmp) / "gateway.log",
            GATEWAY_REDIS_URL=opts.redis_url,
            GATEWAY_REDIS_PREFIX=prefix,
            GATEWAY_VOICE_CACHE_SIZE=str(opts.l1_size),
            ENGINE_VAD="0",
            LOG_LEVEL="WARNING",
        )
        started = time.monotonic()
        gw.start(timeout=60.0)
        log(f"gateway ready on port {gw.port} in {time.monotonic() - started:.1f} s")
        try:
            yield gw
        except BaseException:
            print(f"gateway log (tail):\n{gw.log_tail()}", file=sys.stderr)
            raise
        finally:
            gw.stop()


async def measure(gw: GatewayProcess, opts: Options, prefix: str, log: Log) -> dict[str, Any]:
    specs = clip_specs(opts)
    log(f"making {len(specs)} reference clips with espeak-ng ...")
    clips = await asyncio.to_thread(make_clips, specs, log)
    registered = await register_all(gw, specs, clips, log)
    if any(r.extractions != 1 for r in registered):
        raise RuntimeError(
            "each registration should extract once: " + str([r.extractions for r in registered])
        )
    voice_ids = [r.voice_id for r in registered]
    extraction = [r.extraction_ms for r in registered]

    draws = zipf_draws(len(voice_ids), opts.calls, opts.zipf_s, opts.seed)
    env = InProcess.create(opts.redis_url, prefix)
    try:
        log("starting the in-process registry's engine (for the backend's name/version) ...")
        await env.start()
        log(f"lookup timing: {opts.lookups} lookups per case ...")
        lookups = await lookup_times(env, voice_ids, opts, log)
        log(f"call mix in process: {opts.calls} session starts, L1 size {opts.l1_size} ...")
        mix = await registry_mix(env, voice_ids, draws, opts, log)
    finally:
        await env.close()
    gw_mix = None
    n = len(draws) if opts.gateway_calls is None else min(opts.gateway_calls, len(draws))
    if n > 0:
        log(f"call mix through the gateway: {n} WebSocket session starts ...")
        gw_mix = await gateway_mix(gw, voice_ids, draws[:n], log)

    counts = np.bincount(np.asarray(draws, dtype=np.int64), minlength=len(voice_ids))
    return {
        "registration": {
            "voices": [
                {
                    **asdict(r.spec),
                    "voice_id": r.voice_id,
                    "duration_ms": r.duration_ms,
                    "extraction_ms": r.extraction_ms,
                    "request_ms": r.http_ms,
                }
                for r in registered
            ],
            "extraction": summary(extraction),
            "extraction_first_ms": extraction[0],
            "extraction_after_first": summary(extraction[1:]) if len(extraction) > 1 else None,
            "request": summary([r.http_ms for r in registered]),
        },
        "lookup": lookups,
        "mix": {
            "draws_per_voice_rank": [int(c) for c in counts],
            "in_process": mix,
            "gateway": gw_mix,
        },
    }


async def run(opts: Options, log: Log, command: str = "") -> dict[str, Any]:
    if opts.voices < 1 or opts.lookups < 1 or opts.calls < 1 or opts.l1_size < 1:
        raise ValueError("--voices, --lookups, --calls and --l1-size must be at least 1")
    await ping(opts.redis_url)
    prefix = f"bench-vc-{secrets.token_hex(4)}"
    info = machine()
    log(
        f"machine: {info['cpu_count']} CPUs ({info['cpu_model']}), python {info['python']}, "
        f"load {info['load_avg_start'][0]:.2f}; redis {opts.redis_url} prefix {prefix}"
    )
    started = datetime.now(UTC)
    try:
        with gateway(opts, prefix, log) as gw:
            figures = await measure(gw, opts, prefix, log)
    finally:
        deleted = await delete_prefix(opts.redis_url, prefix)
        log(f"deleted {deleted} redis keys under {prefix}")
    info["load_avg_end"] = list(os.getloadavg())
    return {
        "benchmark": "voice_cache",
        "date": started.isoformat(timespec="seconds"),
        "wall_s": (datetime.now(UTC) - started).total_seconds(),
        "command": command,
        "options": asdict(opts),
        "machine": info,
        "redis": {"url": opts.redis_url, "prefix": prefix, "keys_deleted": deleted},
        **figures,
    }


# --- output -----------------------------------------------------------------------------


def us(ms: float) -> str:
    """Microseconds below 1 ms, else milliseconds."""
    return f"{ms * 1000:.1f} µs" if ms < 1.0 else f"{ms:.2f} ms"


def table(result: dict[str, Any]) -> str:
    opts = result["options"]
    reg = result["registration"]
    look = result["lookup"]
    mix = result["mix"]
    m = result["machine"]
    lines = [
        f"machine: {m['cpu_count']} CPUs ({m['cpu_model']}), python {m['python']}, "
        f"load average {m['load_avg_start'][0]:.2f} -> {m['load_avg_end'][0]:.2f}; "
        f"source {m['source']}",
        "",
        "| what is timed | n | median | p99 |",
        "|---|---:|---:|---:|",
        f"| extraction: engine prepare_voice per registration (gateway histogram sum delta)"
        f" | {int(reg['extraction']['n'])} | {reg['extraction']['median_ms']:.1f} ms"
        f" | {reg['extraction']['p99_ms']:.1f} ms |",
        f"| registration request: POST /v1/voices wall time at the client"
        f" | {int(reg['request']['n'])} | {reg['request']['median_ms']:.1f} ms"
        f" | {reg['request']['p99_ms']:.1f} ms |",
    ]
    labels = {
        "features_l1": "L1 hit: await registry.features(sha, language)",
        "features_l2": "L2 hit (Redis GET, L1 size 0): await registry.features(sha, language)",
        "profile_l1": "L1 hit: await registry.profile(tenant, id) (record + features)",
        "profile_l2": "L2 hit (2 Redis GETs, L1 size 0): await registry.profile(tenant, id)",
    }
    for key, label in labels.items():
        s = look[key]
        lines.append(f"| {label} | {int(s['n'])} | {us(s['median_ms'])} | {us(s['p99_ms'])} |")
    lines += [
        "",
        f"first extraction {reg['extraction_first_ms']:.1f} ms (engine calibration included)",
        "",
        f"call mix: {opts['voices']} voices, Zipf s={opts['zipf_s']}, L1 size "
        f"{opts['l1_size']}, seed {opts['seed']} (counts from gateway_voice_cache_* counters)",
        "",
        "| where | session starts | L1 hits | L2 hits | misses (extractions) | L1 hit ratio "
        "| hit ratio (L1+L2) | cosy2_cache_hit_ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for where, row in (("in-process registry", mix["in_process"]), ("gateway", mix["gateway"])):
        if row is None:
            continue
        lines.append(
            f"| {where} | {row['session_starts']} | {int(row['l1_hits'])} | "
            f"{int(row['l2_hits'])} | {int(row['misses'])} ({int(row['extractions'])}) | "
            f"{row['l1_hit_ratio']:.3f} | {row['hit_ratio']:.3f} | "
            f"{row['cosy2_cache_hit_ratio_gauge']:.3f} |"
        )
    if mix["in_process"]["extraction_mean_ms"] is not None:
        lines.append("")
        lines.append(
            f"in-process mix extractions (--cold-l2): mean "
            f"{mix['in_process']['extraction_mean_ms']:.1f} ms (registry histogram)"
        )
    inproc = mix["in_process"]["profile_time"]
    lines.append("")
    lines.append(
        f"in-process session-start lookup (profile()) over the mix: median "
        f"{us(inproc['median_ms'])}, p99 {us(inproc['p99_ms'])}"
    )
    if mix["gateway"] is not None:
        ready = mix["gateway"]["start_to_ready"]
        lines.append(
            f"gateway session start (start -> ready, client side): median "
            f"{ready['median_ms']:.1f} ms, p99 {ready['p99_ms']:.1f} ms"
        )
    return "\n".join(lines)


def default_out() -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return ROOT / "bench-results" / f"voice-cache-{stamp}.json"


def parse(argv: list[str] | None) -> tuple[Options, Path]:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n", 1)[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d = Options()
    parser.add_argument("--voices", type=int, default=d.voices, help="voices to register")
    parser.add_argument("--lookups", type=int, default=d.lookups, help="timed lookups per case")
    parser.add_argument("--calls", type=int, default=d.calls, help="session starts in the mix")
    parser.add_argument("--zipf-s", type=float, default=d.zipf_s, help="Zipf exponent")
    parser.add_argument("--l1-size", type=int, default=d.l1_size, help="L1 entries in the mix")
    parser.add_argument(
        "--gateway-calls",
        type=int,
        default=d.gateway_calls,
        help="the first N draws of the mix also as real session starts on the gateway "
        "(default: all of them; 0: none)",
    )
    parser.add_argument(
        "--cold-l2",
        action="store_true",
        help="delete the features blobs from Redis before the in-process mix, so each "
        "voice's first use extracts again from its stored audio (a backend upgrade)",
    )
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--redis-url", default=d.redis_url)
    parser.add_argument("--out", type=Path, default=None, help="JSON result file")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    opts = Options(
        voices=args.voices,
        lookups=args.lookups,
        calls=args.calls,
        zipf_s=args.zipf_s,
        l1_size=args.l1_size,
        gateway_calls=args.gateway_calls,
        cold_l2=args.cold_l2,
        seed=args.seed,
        redis_url=args.redis_url,
        progress=not args.quiet,
    )
    return opts, args.out or default_out()


def main(argv: list[str] | None = None) -> int:
    opts, out = parse(argv)
    args = sys.argv[1:] if argv is None else argv
    command = " ".join(["python -m tests.bench.voice_cache", *args])
    result = asyncio.run(run(opts, Log(opts.progress), command))
    print()
    print(table(result))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    print(f"\nresult: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
