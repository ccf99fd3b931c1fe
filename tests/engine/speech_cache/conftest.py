"""Fixtures of the speech cache tests: segments, keys, and a redis-server the tests may
stop, freeze (SIGSTOP) and restart."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import redis

from engine.speech_cache import CachedSegment, SegmentKey, SpeechCache
from engine.speech_cache.sealing import Sealer
from engine.speech_cache.shared import Address

TEST_SECRET = "speech-cache-test-secret-0123456789abcdef"
SEALER = Sealer(TEST_SECRET.encode())


def address(key: SegmentKey, sealer: Sealer = SEALER) -> Address:
    """Where ``key`` lives in a shared store sealed with ``sealer``."""
    return Address(
        sealer.label("scope", key.scope), sealer.label("voice", key.voice_digest), sealer.name(key)
    )


def sealed(key: SegmentKey, segment: CachedSegment, written_at: float | None = None) -> bytes:
    """``segment`` as a shared store holds it under ``key``."""
    return SEALER.seal(SEALER.name(key), segment.encode(), written_at)


def make_key(text: str = "Welcome to Acme Bank.", **fields: object) -> SegmentKey:
    key = SegmentKey(
        backend="synthetic",
        model_digest="m" * 64,
        voice="en-us-test",
        voice_digest="",
        text=text,
        sample_rate=24_000,
        speed=1.0,
    )
    return replace(key, **fields)  # type: ignore[arg-type]


def make_segment(seconds: float = 0.5, seed: int = 1, rate: int = 24_000) -> CachedSegment:
    n = int(seconds * rate) * 2
    pcm = (bytes(range(seed % 251, 256)) + bytes(range(256))) * (n // 256 + 2)
    return CachedSegment(pcm=pcm[:n], words=(("welcome", 0, 300), ("to", 300, 420)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RedisProcess:
    """A redis-server on a free port, without persistence; with ``password``, it asks
    for it (``requirepass``: the default user's AUTH) and :attr:`url` carries it."""

    def __init__(self, workdir: Path, password: str | None = None) -> None:
        self.port = free_port()
        self.password = password
        auth = f":{password}@" if password else ""
        self.url = f"redis://{auth}127.0.0.1:{self.port}/0"
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        auth = ["--requirepass", self.password] if self.password else []
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir), *auth],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        client = redis.Redis(port=self.port, password=self.password, socket_connect_timeout=0.2)
        try:
            for _ in range(200):
                try:
                    if client.ping():
                        return
                except redis.RedisError:
                    time.sleep(0.025)
        finally:
            client.close()
        raise RuntimeError("redis-server did not start")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def freeze(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)


@pytest.fixture
def redis_process(tmp_path: Path) -> Iterator[RedisProcess]:
    if shutil.which("redis-server") is None:
        pytest.skip("no redis-server")
    server = RedisProcess(tmp_path)
    server.start()
    try:
        yield server
    finally:
        if server.proc is not None:
            server.thaw()
        server.kill()


@pytest.fixture
def real_redis_url() -> Iterator[str]:
    """The host's Redis at 127.0.0.1:6379 (skips without one)."""
    client = redis.Redis(socket_connect_timeout=0.3)
    try:
        client.ping()
    except redis.RedisError:
        pytest.skip("no Redis at 127.0.0.1:6379")
    finally:
        client.close()
    yield "redis://127.0.0.1:6379/0"


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A unique key prefix; its keys are deleted from the host's Redis afterwards."""
    prefix = f"test-speechcache-{uuid.uuid4().hex[:12]}:"
    yield prefix
    client = redis.Redis(socket_connect_timeout=0.3)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=500))
        if keys:
            client.unlink(*keys)
    except redis.RedisError:
        pass
    finally:
        client.close()


def fetch_sync(cache: SpeechCache, key: SegmentKey, wait_s: float = 5.0) -> CachedSegment | None:
    """cache.fetch, waited for (the answer must come within ``wait_s``)."""
    got: list[CachedSegment | None] = []
    ready = threading.Event()

    def done(k: SegmentKey, segment: CachedSegment | None) -> None:
        assert k == key
        got.append(segment)
        ready.set()

    cache.fetch(key, done)
    assert ready.wait(wait_s), "fetch did not answer"
    assert len(got) == 1
    return got[0]


def wait_for(predicate: Callable[[], bool], wait_s: float = 5.0) -> None:
    deadline = time.monotonic() + wait_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)
