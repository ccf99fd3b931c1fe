"""Speech cache stores side by side: lookup latency and write throughput per level.

    python -m tests.bench.speech_cache_stores [--entries 200] [--lookups 2000]
        [--seconds 3.0] [--rate 24000] [--burst 30] [--timeout-ms 50]
        [--redis-url redis://127.0.0.1:6379/0] [--dir /var/tmp] [--out FILE]

The figures behind the shared level's default (docs/speech-cache.md). One segment is
``--seconds`` of int16 mono audio at ``--rate`` (3 s at 24 kHz: 144,000 PCM bytes, 144 KB
encoded with its words). For each level:

- **memory**: the in-process LRU (``SpeechCache.get_local`` on a memory-only cache).
- **directory**: a ``DirectoryStore`` in a fresh folder under ``--dir`` (so on the disk
  that holds it, read through the page cache: entries written a moment before).
- **redis**: a ``RedisStore`` on ``--redis-url`` with a unique prefix, deleted at the end.

Measured, with ``time.perf_counter_ns``:

1. *write*: ``--entries`` segments written one after another straight to the store
   (encode included): segments per second and MB/s. Through the cache, ``put`` itself
   only queues the write; this is what the write thread sustains.
2. *store get*: ``--lookups`` hits of random entries read straight from the store,
   opened (AES-GCM: the entry's authentication and decryption, sealing.py) and decoded:
   p50 / p99 / mean.
3. *fetch*: the same hits through ``SpeechCache.fetch`` (the bounded queue, the lookup
   thread and the callback: what a stream waits for), one at a time, from the call to the
   callback. Memory: ``get_local``.
4. *burst*: ``--burst`` fetches of one entry issued at once (callers hearing the same
   greeting at the same instant, each engine's memory level cold): time until the last
   answer.

5. *sealing*: what naming and sealing cost per hit, in memory on this CPU: the entry's
   name (HMAC-SHA256 of its key), opening one sealed entry (AES-GCM), decoding it alone,
   and sealing one (on the write thread): p50 / p99 over ``--lookups``.

For memory, ``bytes_per_audio_second`` is the level's own accounting divided by the audio
it holds; for Redis, ``redis_usec_per_get`` is Redis's own CPU time per GET (``INFO
commandstats``) and ``redis_bytes_per_hit`` the value size. Prints a table; ``--out``
writes JSON. A benchmark, not a test: it checks every timed lookup was a hit.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from engine.speech_cache import CachedSegment, SegmentKey, SpeechCache
from engine.speech_cache.directory import DirectoryStore
from engine.speech_cache.memory import MemoryLevel
from engine.speech_cache.redis_store import RedisStore
from engine.speech_cache.sealing import Sealer
from engine.speech_cache.shared import Address, SharedLevel, SharedStore

SEALER = Sealer(b"speech-cache-benchmark-secret-0123456789")


def percentiles_us(samples_ns: list[int]) -> dict[str, float]:
    """p50 / p99 (nearest rank) / mean / max in microseconds."""
    values = sorted(samples_ns)
    n = len(values)

    def rank(q: float) -> float:
        return values[max(0, min(n - 1, -(-int(q * n) // 100) - 1))] / 1000

    return {
        "p50_us": round(rank(50), 1),
        "p99_us": round(rank(99), 1),
        "mean_us": round(sum(values) / n / 1000, 1),
        "max_us": round(values[-1] / 1000, 1),
    }


def make_segment(seconds: float, rate: int, seed: int) -> CachedSegment:
    rng = random.Random(seed)
    pcm = rng.randbytes(int(seconds * rate) * 2)
    words = tuple((f"word{i}", i * 300, i * 300 + 250) for i in range(int(seconds * 3)))
    return CachedSegment(pcm=pcm, words=words)


def make_key(i: int, rate: int) -> SegmentKey:
    return SegmentKey(
        backend="piper",
        model_digest="0" * 64,
        voice="en-us-joe",
        voice_digest="",
        text=f"Thank you for calling Acme Bank, prompt number {i}.",
        sample_rate=rate,
        speed=1.0,
    )


def timed_fetch(cache: SpeechCache, key: SegmentKey) -> tuple[int, CachedSegment | None]:
    ready = threading.Event()
    got: list[CachedSegment | None] = []

    def done(_: SegmentKey, segment: CachedSegment | None) -> None:
        got.append(segment)
        ready.set()

    start = time.perf_counter_ns()
    cache.fetch(key, done)
    if not ready.wait(10):
        raise RuntimeError("fetch did not answer")
    return time.perf_counter_ns() - start, got[0]


def burst(cache: SpeechCache, key: SegmentKey, n: int) -> float:
    """Milliseconds from issuing ``n`` fetches of ``key`` at once to the last answer."""
    left = [n]
    lock = threading.Lock()
    ready = threading.Event()

    def done(_: SegmentKey, segment: CachedSegment | None) -> None:
        if segment is None:
            raise RuntimeError("a burst fetch missed")
        with lock:
            left[0] -= 1
            if left[0] == 0:
                ready.set()

    start = time.perf_counter_ns()
    for _ in range(n):
        cache.fetch(key, done)
    if not ready.wait(10):
        raise RuntimeError("burst did not finish")
    return round((time.perf_counter_ns() - start) / 1e6, 2)


def redis_get_usec(url: str) -> tuple[int, float]:
    """(calls, usec) of GET from INFO commandstats."""
    client = redis.Redis.from_url(url)
    try:
        stats: Any = client.info("commandstats")
    finally:
        client.close()
    get = stats.get("cmdstat_get", {})
    return int(get.get("calls", 0)), float(get.get("usec", 0.0))


def bench_memory(args: argparse.Namespace, segments: list[CachedSegment]) -> dict[str, Any]:
    cache = SpeechCache(MemoryLevel(1 << 40), None, enabled=True)
    keys = [make_key(i, args.rate) for i in range(args.entries)]
    start = time.perf_counter_ns()
    for key, segment in zip(keys, segments, strict=True):
        cache.put(key, segment)
    write_s = (time.perf_counter_ns() - start) / 1e9
    rng = random.Random(2)
    samples = []
    for _ in range(args.lookups):
        key = rng.choice(keys)
        t0 = time.perf_counter_ns()
        got = cache.get_local(key)
        samples.append(time.perf_counter_ns() - t0)
        if got is None:
            raise RuntimeError("memory lookup missed")
    memory = cache.stats().levels[0]
    audio_s = args.entries * args.seconds
    return {
        "store": "memory",
        "writes_per_s": round(args.entries / write_s, 1),
        "write_mb_per_s": round(args.entries * len(segments[0].pcm) / write_s / 1e6, 1),
        "fetch": percentiles_us(samples),
        "store_get": percentiles_us(samples),
        "burst_ms": None,
        "bytes_per_audio_second": round(memory.bytes / audio_s),
    }


def address(key: SegmentKey) -> Address:
    return Address(
        SEALER.label("scope", key.scope), SEALER.label("voice", key.voice_digest), SEALER.name(key)
    )


def bench_sealing(args: argparse.Namespace, segments: list[CachedSegment]) -> dict[str, Any]:
    """Naming and sealing per hit, in memory (no store)."""
    key = make_key(0, args.rate)
    payload = segments[0].encode()
    name = SEALER.name(key)
    sealed = SEALER.seal(name, payload)
    times: dict[str, list[int]] = {"name": [], "open": [], "decode": [], "seal": []}
    for _ in range(args.lookups):
        t0 = time.perf_counter_ns()
        SEALER.name(key)
        t1 = time.perf_counter_ns()
        SEALER.open(name, sealed)
        t2 = time.perf_counter_ns()
        CachedSegment.decode(payload)
        t3 = time.perf_counter_ns()
        SEALER.seal(name, payload)
        t4 = time.perf_counter_ns()
        for what, took in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            times[what].append(took)
    return {what: percentiles_us(samples) for what, samples in times.items()}


def bench_shared(
    args: argparse.Namespace, store: SharedStore, segments: list[CachedSegment]
) -> dict[str, Any]:
    keys = [make_key(i, args.rate) for i in range(args.entries)]
    encoded = [s.encode() for s in segments]
    start = time.perf_counter_ns()
    for key, segment in zip(keys, segments, strict=True):
        store.set(address(key), SEALER.seal(SEALER.name(key), segment.encode()))
    write_s = (time.perf_counter_ns() - start) / 1e9
    rng = random.Random(2)
    gets = []
    for _ in range(args.lookups):
        i = rng.randrange(args.entries)
        t0 = time.perf_counter_ns()
        where = address(keys[i])
        data = store.get(where)
        if data is None:
            raise RuntimeError(f"{store.name} lookup missed")
        _, payload = SEALER.open(where.name, data)
        CachedSegment.decode(payload)
        gets.append(time.perf_counter_ns() - t0)
        if payload != encoded[i]:
            raise RuntimeError(f"{store.name} gave other bytes")
    timeout_s = args.timeout_ms / 1000
    # Memory budget 0: every fetch goes to the shared level (nothing is kept in memory).
    cache = SpeechCache(
        MemoryLevel(0), SharedLevel(store, SEALER, timeout_s=timeout_s), enabled=True
    )
    try:
        fetches = []
        for _ in range(args.lookups):
            took, got = timed_fetch(cache, rng.choice(keys))
            if got is None:
                raise RuntimeError(f"{store.name} fetch missed (timeout {args.timeout_ms} ms?)")
            fetches.append(took)
        burst_ms = burst(cache, keys[0], args.burst)
        errors = cache.stats().levels[1].errors
    finally:
        cache.close()
    return {
        "store": store.name,
        "writes_per_s": round(args.entries / write_s, 1),
        "write_mb_per_s": round(sum(len(e) for e in encoded) / write_s / 1e6, 1),
        "store_get": percentiles_us(gets),
        "fetch": percentiles_us(fetches),
        "burst_ms": burst_ms,
        "errors": errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=200)
    parser.add_argument("--lookups", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rate", type=int, default=24_000)
    parser.add_argument("--burst", type=int, default=30)
    parser.add_argument("--timeout-ms", type=int, default=50)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--dir", default="/var/tmp")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    segments = [make_segment(args.seconds, args.rate, i) for i in range(args.entries)]
    results = [bench_memory(args, segments)]
    sealing = bench_sealing(args, segments)

    folder = Path(tempfile.mkdtemp(prefix="speech-cache-bench-", dir=args.dir))
    try:
        store = DirectoryStore(folder, budget_bytes=1 << 40, ttl_s=3600)
        results.append(bench_shared(args, store, segments))
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    prefix = f"bench-speechcache-{uuid.uuid4().hex[:12]}:"
    redis_store = RedisStore(args.redis_url, timeout_s=args.timeout_ms / 1000, ttl_s=600,
                             prefix=prefix)  # fmt: skip
    calls0, usec0 = redis_get_usec(args.redis_url)
    try:
        row = bench_shared(args, redis_store, segments)
        calls1, usec1 = redis_get_usec(args.redis_url)
        row["redis_usec_per_get"] = round((usec1 - usec0) / max(1, calls1 - calls0), 1)
        row["redis_bytes_per_hit"] = len(segments[0].encode())
        results.append(row)
    finally:
        client = redis.Redis.from_url(args.redis_url)
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.unlink(*keys)
        client.close()

    report = {
        "what": "speech cache stores",
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "segment_pcm_bytes": len(segments[0].pcm),
        "segment_encoded_bytes": len(segments[0].encode()),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "results": results,
        "sealing_us": sealing,
    }
    header = (
        f"{'store':<10} {'writes/s':>9} {'MB/s':>7} {'get p50':>9} {'get p99':>9} "
        f"{'fetch p50':>10} {'fetch p99':>10} {'burst ms':>9}"
    )
    print(
        f"segment: {args.seconds} s at {args.rate} Hz = {len(segments[0].pcm)} PCM bytes; "
        f"{args.entries} entries, {args.lookups} lookups (microseconds)"
    )
    print(header)
    for r in results:
        print(
            f"{r['store']:<10} {r['writes_per_s']:>9} {r['write_mb_per_s']:>7} "
            f"{r['store_get']['p50_us']:>9} {r['store_get']['p99_us']:>9} "
            f"{r['fetch']['p50_us']:>10} {r['fetch']['p99_us']:>10} "
            f"{r['burst_ms'] if r['burst_ms'] is not None else '-':>9}"
        )
    print(f"memory: {results[0]['bytes_per_audio_second']} bytes per cached audio-second")
    print(
        "sealing per hit (us, p50/p99): "
        + ", ".join(f"{w} {v['p50_us']}/{v['p99_us']}" for w, v in sealing.items())
    )
    if len(results) > 2:
        print(
            f"redis: {results[2]['redis_usec_per_get']} us of Redis CPU and "
            f"{results[2]['redis_bytes_per_hit']} bytes per hit"
        )
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
