"""VoiceRegistry's cached records: a voice deleted through one instance stops on all."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.metrics import GatewayMetrics
from gateway.voices.registry import RECORD_TTL_S, VoiceRegistry, base_voice_for
from gateway.voices.store import FileVoiceStore, StorageUnavailable, VoiceRecord

RECORD = VoiceRecord(
    id="vc_7e57000000000001",
    tenant="acme",
    name="Agent",
    language="en",
    base_voice="en-us",
    duration_ms=4000,
    audio_sha256="0" * 64,
    created_at=0.0,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FlakyStore(FileVoiceStore):
    """A real file store that can be made unreachable."""

    down = False

    async def load_record(self, voice_id: str) -> VoiceRecord | None:
        if self.down:
            raise StorageUnavailable("down")
        return await super().load_record(voice_id)


def registry(store: FileVoiceStore, clock: Clock) -> VoiceRegistry:
    def no_engine() -> object:
        raise AssertionError("no engine needed to look up a record")

    return VoiceRegistry(
        store,
        no_engine,  # type: ignore[arg-type]
        lambda: None,
        GatewayMetrics(),
        clock=clock,
    )


async def test_delete_on_one_instance_reaches_the_others_within_the_record_ttl(
    tmp_path: Path,
) -> None:
    store = FileVoiceStore(tmp_path)
    await store.save_record(RECORD)
    clock = Clock()
    a, b = registry(store, clock), registry(store, clock)
    assert await b.get("acme", RECORD.id) == RECORD  # B caches the record
    assert await a.delete("acme", RECORD.id)
    clock.now += RECORD_TTL_S / 2
    assert await b.get("acme", RECORD.id) == RECORD  # still trusted for a while
    clock.now += RECORD_TTL_S
    assert await b.get("acme", RECORD.id) is None
    assert await a.get("acme", RECORD.id) is None


async def test_an_unreachable_store_keeps_known_voices_speaking(tmp_path: Path) -> None:
    store = FlakyStore(tmp_path)
    await store.save_record(RECORD)
    clock = Clock()
    reg = registry(store, clock)
    assert await reg.get("acme", RECORD.id) == RECORD
    store.down = True
    clock.now += RECORD_TTL_S * 3
    assert await reg.get("acme", RECORD.id) == RECORD  # stale but served
    with pytest.raises(Exception) as info:
        await reg.get("acme", "vc_0000000000000bad")
    assert getattr(info.value, "code", None) == "storage_unavailable"


async def test_another_tenant_never_sees_the_voice(tmp_path: Path) -> None:
    store = FileVoiceStore(tmp_path)
    await store.save_record(RECORD)
    reg = registry(store, Clock())
    assert await reg.get("other", RECORD.id) is None
    assert not await reg.delete("other", RECORD.id)
    assert await reg.get("acme", RECORD.id) == RECORD


async def test_file_store_erases_a_reference_with_its_last_voice(tmp_path: Path) -> None:
    store = FileVoiceStore(tmp_path)
    sha = "ab" * 32
    await store.save_audio(sha, b"\x00\x01" * 100, "vc_one")
    await store.save_audio(sha, b"\x00\x01" * 100, "vc_two")
    await store.save_features(f"espeak:1:en:{sha}", b"features", 60.0)
    await store.save_features(f"espeak:1:en:{'cd' * 32}", b"other", 60.0)
    assert not await store.release_audio(sha, "vc_one")
    assert await store.load_audio(sha) is not None
    assert await store.release_audio(sha, "vc_two")
    assert await store.load_audio(sha) is None
    assert await store.load_features(f"espeak:1:en:{sha}") is None
    assert await store.load_features(f"espeak:1:en:{'cd' * 32}") == b"other"


async def test_redis_store_erases_a_reference_with_its_last_voice() -> None:
    import secrets

    import redis.asyncio as aioredis

    from gateway.voices.store import RedisVoiceStore

    client = aioredis.from_url("redis://127.0.0.1:6379/0", socket_timeout=2.0)
    prefix = "test-" + secrets.token_hex(4)
    try:
        await client.ping()
    except Exception:
        await client.aclose()
        pytest.skip("no Redis at 127.0.0.1:6379")
    store = RedisVoiceStore(client, prefix=prefix)
    sha, other = "ab" * 32, "cd" * 32
    try:
        await store.save_audio(sha, b"pcm", "vc_one")
        await store.save_audio(sha, b"pcm", "vc_two")
        await store.save_audio(other, b"pcm2", "vc_three")
        await store.save_features(f"espeak:1:en:{sha}", b"f-en", 60.0)
        await store.save_features(f"espeak:1:zh:{sha}", b"f-zh", 60.0)
        assert await store.try_lock(f"espeak:1:en:{sha}", 60.0)
        assert not await store.release_audio(sha, "vc_one")
        assert await store.load_features(f"espeak:1:zh:{sha}") == b"f-zh"
        assert await store.release_audio(sha, "vc_two")
        keys = sorted([k.decode() async for k in client.scan_iter(match=f"{{{prefix}:*")])
        assert keys == [f"{{{prefix}:ref:{other}}}:audio", f"{{{prefix}:ref:{other}}}:users"]
        assert await store.load_audio(other) == b"pcm2"
    finally:
        async for key in client.scan_iter(match=f"{{{prefix}:*"):
            await client.delete(key)
        await client.aclose()


def test_a_multilingual_voice_is_the_base_voice_of_any_language() -> None:
    voices = {"en-us": "en-US", "cosyvoice2": "mul"}
    assert base_voice_for("en-GB", voices) == "en-us"
    assert base_voice_for("zh-CN", voices) == "cosyvoice2"
    assert base_voice_for("fr", {"en-us": "en-US"}) is None
