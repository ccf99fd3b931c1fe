"""Voice deletions announced through a real Redis reach every instance's L1 at once."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import redis.asyncio as aioredis

from gateway.metrics import GatewayMetrics
from gateway.voices.deletions import Deletion, DeletionChannel
from gateway.voices.registry import VoiceRegistry
from gateway.voices.store import RedisVoiceStore, VoiceRecord
from tests.integration.harness import RedisServer, running_redis

SHA = "ab" * 32
RECORD = VoiceRecord(
    id="vc_7e57000000000002",
    tenant="acme",
    name="Agent",
    language="en",
    base_voice="en-us",
    duration_ms=4000,
    audio_sha256=SHA,
    created_at=0.0,
)
FEATURES_KEY = f"espeak:1:en:{SHA}"


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


class Instance:
    """One gateway's registry on the shared Redis, its clock frozen: without an
    announcement a cached record would be trusted forever."""

    def __init__(self, url: str, prefix: str, *, announced: bool = True) -> None:
        self.client = aioredis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)

        def no_engine() -> object:
            raise AssertionError("no engine needed")

        self.registry = VoiceRegistry(
            RedisVoiceStore(self.client, prefix=prefix),
            no_engine,  # type: ignore[arg-type]
            lambda: None,
            GatewayMetrics(),
            clock=lambda: 1000.0,
        )
        self.resyncs = 0
        if announced:
            self.registry.deletions = DeletionChannel(
                self.client,
                prefix,
                on_deleted=self.registry.forget,
                on_resync=self._resynced,
                retry_s=0.05,
            )

    def _resynced(self) -> None:
        self.resyncs += 1
        self.registry.expire_records()

    async def start(self) -> None:
        if self.registry.deletions is not None:
            self.registry.deletions.start()
            await asyncio.wait_for(self.registry.deletions.subscribed.wait(), 5)

    async def close(self) -> None:
        if self.registry.deletions is not None:
            await self.registry.deletions.stop()
        await self.client.aclose()


@pytest.fixture
async def instances(redis_server: RedisServer) -> AsyncIterator[Callable[..., Instance]]:
    prefix = "test-" + secrets.token_hex(4)
    made: list[Instance] = []

    def make(*, announced: bool = True) -> Instance:
        made.append(Instance(redis_server.url, prefix, announced=announced))
        return made[-1]

    yield make
    for instance in made:
        await instance.close()


async def eventually(condition: Callable[[], object], timeout: float = 2.0) -> float:
    """Seconds until ``condition()`` held (fails after ``timeout``)."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, "not within the timeout"
        await asyncio.sleep(0.005)
    return time.monotonic() - started


@pytest.mark.realtime  # dropped within 1 s: runs alone (Makefile)
async def test_a_deletion_through_one_instance_reaches_the_others_at_once(
    instances: Callable[..., Instance],
) -> None:
    a, b, unannounced = instances(), instances(), instances(announced=False)
    for instance in (a, b):
        await instance.start()
    await a.registry._store.save_audio(SHA, b"pcm", RECORD.id)
    await a.registry._store.save_record(RECORD)
    for instance in (a, b, unannounced):
        assert await instance.registry.get("acme", RECORD.id) == RECORD  # now cached in L1
    b.registry._features.put(FEATURES_KEY, b"features")
    assert await a.registry.delete("acme", RECORD.id)
    # B drops it from L1 when the message arrives, not after the record lifetime
    # (its clock is frozen): the next get asks the store, which has no such voice.
    waited = await eventually(lambda: b.registry._records.get(RECORD.id) is None)
    assert waited < 1.0
    assert await b.registry.get("acme", RECORD.id) is None
    assert b.registry._features.get(FEATURES_KEY) is None  # its reference was erased
    # An instance that does not listen trusts its copy until the record lifetime ends.
    assert await unannounced.registry.get("acme", RECORD.id) == RECORD


async def test_malformed_messages_are_ignored_and_later_ones_applied(
    instances: Callable[..., Instance],
) -> None:
    b = instances()
    await b.start()
    b.registry._records.put(RECORD.id, (RECORD, 1000.0))
    channel = b.registry.deletions
    assert channel is not None
    for junk in (b"not json", b"[1, 2]", b'{"voice": 7}', b'{"voice": "x", "erased": 1}'):
        await b.client.publish(channel.channel, junk)
    await b.client.publish(channel.channel, b"x" * 5000)
    await b.client.publish(channel.channel, Deletion(RECORD.id, None).encode())
    await eventually(lambda: b.registry._records.get(RECORD.id) is None)


async def test_a_lost_subscription_comes_back_and_expires_the_cached_records(
    instances: Callable[..., Instance], redis_server: RedisServer
) -> None:
    """Deletions announced while the subscription was down are lost: when it is back,
    every cached record is asked of the store again at its next use."""
    b = instances()
    await b.start()
    b.registry._records.put(RECORD.id, (RECORD, 1000.0))
    admin = aioredis.from_url(redis_server.url)
    try:
        assert await admin.client_kill_filter(_type="pubsub") >= 1
    finally:
        await admin.aclose()
    await eventually(lambda: b.resyncs == 1, timeout=5.0)
    record, fetched = b.registry._records.get(RECORD.id) or (None, 0.0)
    assert record == RECORD and fetched == float("-inf")  # kept, but stale
    # And the new subscription works.
    channel = b.registry.deletions
    assert channel is not None
    await b.client.publish(channel.channel, Deletion(RECORD.id, None).encode())
    await eventually(lambda: b.registry._records.get(RECORD.id) is None)


async def test_an_announcement_redis_cannot_take_is_logged_not_raised() -> None:
    from tests.integration.harness import free_port

    client = aioredis.from_url(
        f"redis://127.0.0.1:{free_port()}/0", socket_timeout=0.5, socket_connect_timeout=0.5
    )
    channel = DeletionChannel(client, "x", on_deleted=lambda _d: None, on_resync=lambda: None)
    try:
        assert await channel.publish(Deletion(RECORD.id, None)) is False
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b'{"voice": "vc_1", "erased": null}', Deletion("vc_1", None)),
        (b'{"voice": "vc_1", "erased": "ab"}', Deletion("vc_1", "ab")),
        (b'{"voice": "vc_1"}', Deletion("vc_1", None)),
        (b"{}", None),
        (b"null", None),
        (b"\xff", None),
    ],
)
def test_the_message_format(data: bytes, expected: Deletion | None) -> None:
    assert Deletion.decode(data) == expected
    if expected is not None:
        assert Deletion.decode(expected.encode()) == expected
