"""Prometheus metrics of one gateway worker, in a registry of its own.

Names are prefixed ``gateway_``; help text on every metric. A registry per application
(rather than the global default) keeps several gateways in one process (tests) apart.

With several workers on a host (``GATEWAY_WORKERS``), the host supervisor sets
``PROMETHEUS_MULTIPROC_DIR`` for its workers: prometheus_client then keeps every value in
a file per process there, and a scrape of any worker answers for the whole host
(:func:`exposition_registry`), under the same names: counters and histograms are summed
over the workers (those of a worker that died included, so counters never go back),
gauges are combined as each one's ``multiprocess_mode`` says (``livesum``: summed over
live workers; ``livemax``/``livemin``; ``mostrecent``: the last value any worker set). The
``process_*`` metrics of one worker are left out there: they would describe only the
worker that happened to answer (the host's CPU and memory come from node or container
metrics).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from engine.ipc.schema import SpeechCacheStats

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def multiprocess_dir() -> str | None:
    """Where this process's metric values live when several workers share a host."""
    return os.environ.get(MULTIPROC_ENV) or None


def exposition_registry(
    registry: CollectorRegistry, live: tuple[Collector, ...] = ()
) -> CollectorRegistry:
    """What a scrape serves: the host's workers together in multiprocess mode (read from
    their files at each scrape), else ``registry`` itself. ``live`` collectors (already
    in ``registry``) read the engine's own counters at the scrape: every worker of a host
    talks to the same engine, so the worker that answers serves them for the host."""
    directory = multiprocess_dir()
    if directory is None:
        return registry
    host = CollectorRegistry()
    MultiProcessCollector(host, path=directory)  # type: ignore[no-untyped-call]
    for collector in live:
        host.register(collector)
    return host


class EngineSpeechCacheCollector(Collector):
    """The engine's speech cache, from its last heartbeat (``Pong.speech_cache``), in
    the ``engine_*`` family of names. The engine counts since it started: its counters
    start again from 0 after an engine restart, which ``rate()`` handles.

    - ``engine_speech_cache_enabled``: 1 when the engine has a speech cache;
    - ``engine_speech_cache_hits_total`` / ``engine_speech_cache_misses_total``
      {level, backend}: lookups found / not found per level (every lookup starts in
      ``memory``; a memory miss looks in ``shared`` when there is one), so the hit ratio
      is (memory hits + shared hits) / (memory hits + memory misses);
    - ``engine_speech_cache_entries`` / ``engine_speech_cache_bytes`` {level, store};
    - ``engine_speech_cache_evictions_total`` {level}: entries dropped for the budgets
      (the level's, a tenant's);
    - ``engine_speech_cache_errors_total`` {level}: lookups or writes that failed or
      timed out (served as misses: synthesis);
    - ``engine_speech_cache_rejected_total`` {level}: shared entries that failed
      authentication (changed, forged, another secret): deleted, served as misses;
    - ``engine_speech_cache_joins_total`` / ``engine_speech_cache_joined_audio_seconds_total``:
      segments a stream heard from another stream's synthesis in flight (one synthesis per
      text), and the audio not synthesized again;
    - ``engine_speech_cache_prefix_hits_total`` / ``..._prefix_audio_seconds_total``: hits
      on the words before a personal item (a dynamic prompt's first audio from the
      cache), and their audio;
    - ``engine_speech_cache_played_audio_seconds_total`` / ``..._cached_audio_seconds_total``:
      every stream's audio and what of it came from the cache (synthesized audio is played
      less cached less joined).
    """

    def __init__(self, source: Callable[[], SpeechCacheStats | None]) -> None:
        self._source = source

    def describe(self) -> list[Metric]:
        return list(self._families(None))

    def collect(self) -> Iterator[Metric]:
        return self._families(self._source())

    @staticmethod
    def _families(stats: SpeechCacheStats | None) -> Iterator[Metric]:
        enabled = GaugeMetricFamily(
            "engine_speech_cache_enabled",
            "1 when the engine has a speech cache (ENGINE_SPEECH_CACHE).",
        )
        hits = CounterMetricFamily(
            "engine_speech_cache_hits",
            "Speech-cache lookups found, by level (memory, shared) and backend.",
            labels=["level", "backend"],
        )
        misses = CounterMetricFamily(
            "engine_speech_cache_misses",
            "Speech-cache lookups not found, by level and backend (a shared miss is synthesized).",
            labels=["level", "backend"],
        )
        entries = GaugeMetricFamily(
            "engine_speech_cache_entries",
            "Segments held by a speech-cache level (store: memory, directory, redis).",
            labels=["level", "store"],
        )
        size = GaugeMetricFamily(
            "engine_speech_cache_bytes",
            "Bytes held by a speech-cache level (audio and word timings).",
            labels=["level", "store"],
        )
        evictions = CounterMetricFamily(
            "engine_speech_cache_evictions",
            "Segments a speech-cache level dropped to stay within its byte budget.",
            labels=["level"],
        )
        errors = CounterMetricFamily(
            "engine_speech_cache_errors",
            "Speech-cache lookups or writes that failed or timed out, by level (served by "
            "synthesis).",
            labels=["level"],
        )
        rejected = CounterMetricFamily(
            "engine_speech_cache_rejected",
            "Shared speech-cache entries that failed authentication (deleted, synthesized).",
            labels=["level"],
        )
        saved = [
            CounterMetricFamily(name, text)
            for name, text in (
                ("engine_speech_cache_joins",
                 "Segments a stream heard from another stream's synthesis in flight."),
                ("engine_speech_cache_joined_audio_seconds",
                 "Audio heard from another stream's synthesis: not synthesized again."),
                ("engine_speech_cache_prefix_hits",
                 "Cache hits on the words before a personal item (amount, code, date)."),
                ("engine_speech_cache_prefix_audio_seconds",
                 "Audio of those words played from the cache: not synthesized."),
                ("engine_speech_cache_played_audio_seconds",
                 "Every stream's audio, whatever its source (synthesized, cached, joined)."),
                ("engine_speech_cache_cached_audio_seconds",
                 "Audio played from the speech cache."),
            )
        ]  # fmt: skip
        if stats is not None:
            enabled.add_metric([], 1.0 if stats.enabled else 0.0)
            for family, value in zip(
                saved,
                (stats.joined_segments, stats.joined_audio_seconds, stats.prefix_hits,
                 stats.prefix_audio_seconds, stats.played_audio_seconds,
                 stats.cached_audio_seconds),
                strict=True,
            ):  # fmt: skip
                family.add_metric([], value)
            for level in stats.levels:
                for backend, count in sorted(level.hits.items()):
                    hits.add_metric([level.level, backend], count)
                for backend, count in sorted(level.misses.items()):
                    misses.add_metric([level.level, backend], count)
                entries.add_metric([level.level, level.store], level.entries)
                size.add_metric([level.level, level.store], level.bytes)
                evictions.add_metric([level.level], level.evictions)
                errors.add_metric([level.level], level.errors)
                rejected.add_metric([level.level], level.rejected)
        yield from (enabled, hits, misses, entries, size, evictions, errors, rejected, *saved)


LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    1.5,
    2.5,
    5.0,
)
FINE_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        if multiprocess_dir() is None:
            # process_* (CPU seconds, resident memory, open file descriptors) of this worker
            ProcessCollector(registry=self.registry)
        r = self.registry
        self.sessions_active = Gauge(
            "gateway_sessions_active",
            "Sessions currently open, by protocol.",
            ["protocol"],
            multiprocess_mode="livesum",
            registry=r,
        )
        self.connections_open = Gauge(
            "gateway_connections_open",
            "TCP connections open on this worker (HTTP and WebSocket).",
            multiprocess_mode="livesum",
            registry=r,
        )
        self.connections_refused = Counter(
            "gateway_connections_refused_total",
            "Connections refused at accept, by reason (limit: GATEWAY_MAX_CONNECTIONS).",
            ["reason"],
            registry=r,
        )
        self.connections_refused.labels(reason="limit")
        self.connections_aborted = Counter(
            "gateway_connections_aborted_total",
            "Connections aborted by the gateway, by reason (write_stall: the peer read "
            "nothing for GATEWAY_SEND_STALL_S).",
            ["reason"],
            registry=r,
        )
        self.connections_aborted.labels(reason="write_stall")
        self.sessions_total = Counter(
            "gateway_sessions_total",
            "Sessions accepted since start, by protocol.",
            ["protocol"],
            registry=r,
        )
        self.first_audio = Histogram(
            "gateway_first_audio_seconds",
            "Time from an utterance's text (or from reaching the head of the queue) "
            "to its first audio frame on the wire.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.gateway_latency = Histogram(
            "gateway_added_latency_seconds",
            "Time from the engine reporting an utterance's first audio in the ring to "
            "its first frame on the wire.",
            buckets=FINE_BUCKETS,
            registry=r,
        )
        self.frames_sent = Counter(
            "gateway_frames_sent_total", "Audio frames sent to peers.", registry=r
        )
        self.underruns = Counter(
            "gateway_underruns_total",
            "Times a playing stream had no audio when its next frame was due.",
            registry=r,
        )
        self.errors = Counter(
            "gateway_errors_total",
            "Errors reported to peers, by error code.",
            ["code"],
            registry=r,
        )
        self.auth_failures = Counter(
            "gateway_auth_failures_total",
            "Rejected credentials, by reason.",
            ["code"],
            registry=r,
        )
        self.barge_ins = Counter(
            "gateway_barge_ins_total",
            "Playback stopped because the caller started speaking, by protocol.",
            ["protocol"],
            registry=r,
        )
        self.caller_audio_dropped = Counter(
            "gateway_caller_audio_dropped_bytes_total",
            "Caller audio dropped because the engine's inbound ring was full.",
            registry=r,
        )
        self.rejections = Counter(
            "gateway_rejections_total",
            "Sessions or utterances refused, by reason.",
            ["reason"],
            registry=r,
        )
        # Golden metrics (names fixed by the admission-control issue).
        self.request_duration = Histogram(
            "cosy2_tts_request_duration_seconds",
            "Time from an utterance's text to the engine's last audio for it "
            "(admission wait included).",
            buckets=(*LATENCY_BUCKETS, 10.0, 20.0, 30.0),
            registry=r,
        )
        self.gpu_memory_used = Gauge(
            "cosy2_gpu_memory_used_bytes",
            "GPU memory the engine uses (0 when its backend has no GPU).",
            multiprocess_mode="mostrecent",
            registry=r,
        )
        self.engine_memory_used = Gauge(
            "engine_memory_used_bytes",
            "Memory the engine counts against its budget: GPU memory with a GPU backend, "
            "else the engine process's resident memory.",
            multiprocess_mode="mostrecent",
            registry=r,
        )
        self.engine_memory_budget = Gauge(
            "engine_memory_budget_bytes",
            "What engine_memory_used_bytes is measured against: GPU memory with a GPU "
            "backend, else ENGINE_MEMORY_BUDGET_MB. New sessions are refused above "
            "ENGINE_MEMORY_REJECT_PERCENT of it.",
            multiprocess_mode="mostrecent",
            registry=r,
        )
        self.cache_hit_ratio = Gauge(
            "cosy2_cache_hit_ratio",
            "Voice-feature cache hits / lookups (memory and Redis levels together).",
            multiprocess_mode="mostrecent",
            registry=r,
        )
        self.voice_cache_hits = Counter(
            "gateway_voice_cache_hits_total",
            "Voice-feature lookups served from a cache level (l1: memory, l2: shared store).",
            ["level"],
            registry=r,
        )
        self.voice_cache_misses = Counter(
            "gateway_voice_cache_misses_total",
            "Voice-feature lookups a cache level could not serve.",
            ["level"],
            registry=r,
        )
        for level in ("l1", "l2"):
            self.voice_cache_hits.labels(level=level)
            self.voice_cache_misses.labels(level=level)
        self.voice_extraction = Histogram(
            "gateway_voice_extraction_seconds",
            "Time the engine spent extracting a voice's features from reference audio.",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=r,
        )
        self.queue_length = Gauge(
            "cosy2_queue_length",
            "Utterances waiting at the admission gate for the engine.",
            multiprocess_mode="livesum",
            registry=r,
        )
        self.golden_errors = Counter(
            "cosy2_tts_errors_total",
            "TTS failures by type.",
            ["type"],
            registry=r,
        )
        for error_type in (
            "cuda_oom", "engine_unavailable", "overloaded", "queue_timeout", "lease_lost",
        ):  # fmt: skip
            self.golden_errors.labels(type=error_type)
        self.engine_first_audio = Histogram(
            "gateway_engine_first_audio_seconds",
            "Time from dispatching an utterance to the engine to its first audio in the "
            "ring (the admission controller's signal; queue wait excluded).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.admission_degraded = Gauge(
            "gateway_admission_degraded",
            "1 while the engine's first-audio latency is over the soft threshold.",
            multiprocess_mode="livemax",
            registry=r,
        )
        self.lease_store_errors = Counter(
            "gateway_lease_store_errors_total",
            "Tenant-lease operations that could not reach Redis, by operation and by the "
            "configured policy (fail-open: local limit only; fail-closed: refused).",
            ["op", "policy"],
            registry=r,
        )
        self.call_relays = Counter(
            "gateway_call_relays_total",
            "Applications attaching to a call held by another worker or instance, by result "
            "(relayed; unreachable: the owner could not be reached; lost: the owner went "
            "away during the call).",
            ["result"],
            registry=r,
        )
        for result in ("relayed", "unreachable", "lost"):
            self.call_relays.labels(result=result)
        self.engine_ready = Gauge(
            "gateway_engine_ready",
            "1 when the engine is connected and healthy.",
            multiprocess_mode="livemin",
            registry=r,
        )
        self.engine_restarts = Counter(
            "gateway_engine_restarts_total", "Engine restarts after a crash or hang.", registry=r
        )
        # The speech cache (docs/speech-cache.md): first audio by where it came from, the
        # warm prompts, and the engine's own counters (EngineSpeechCacheCollector).
        self.speech_cache_first_audio = Histogram(
            "gateway_speech_cache_first_audio_seconds",
            "gateway_first_audio_seconds split by where the utterance's first segment came "
            "from: cache=hit (the engine's speech cache), join (another stream's synthesis "
            "of it, in flight) or miss (synthesized).",
            ["cache"],
            buckets=(0.001, 0.0025, *LATENCY_BUCKETS),
            registry=r,
        )
        for label in ("hit", "join", "miss"):
            self.speech_cache_first_audio.labels(cache=label)
        self.speech_cache_prompts = Gauge(
            "gateway_speech_cache_prompts",
            "Warm prompts this worker knows (prompts file, SIP flows, API), by state "
            "(pending, warming, warm, failed).",
            ["state"],
            multiprocess_mode="livesum",
            registry=r,
        )
        self.speech_cache_warmups = Counter(
            "gateway_speech_cache_warmups_total",
            "Prompt warm-ups finished, by result (warm; failed; retried: the engine went "
            "away or was busy, tried again).",
            ["result"],
            registry=r,
        )
        for result in ("warm", "failed", "retried"):
            self.speech_cache_warmups.labels(result=result)
        #: Set by the engine link: the last Pong's speech-cache statistics.
        self.engine_speech_cache: SpeechCacheStats | None = None
        self.engine_speech_cache_collector = EngineSpeechCacheCollector(
            lambda: self.engine_speech_cache
        )
        r.register(self.engine_speech_cache_collector)
        self.pacer_lag = Histogram(
            "gateway_pacer_tick_lag_seconds",
            "How late the pacing clock's ticks fire.",
            buckets=FINE_BUCKETS,
            registry=r,
        )
