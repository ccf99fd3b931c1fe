"""Where registered voices live: Redis (shared by every gateway instance) or a local
directory (one instance, no Redis configured).

What is stored, per voice: its record (id, tenant, name, language, base voice, the
SHA-256 of its normalized reference audio), and, per distinct reference, the normalized
audio itself (so features can be recomputed when a backend's version changes) and the
backend's features, under a key made of backend name, backend version, language and the
audio's SHA-256, with a TTL.

A reference's audio and features are shared by every voice registered from the same
audio (content-addressed); the store counts who uses them (``save_audio`` names the
voice) and ``release_audio`` erases audio and features when the last voice using them is
deleted.

Redis keys (one hash tag per record, per tenant index and per reference, so every
command and script touches one slot and works on Redis Cluster)::

    {P:voice:<id>}                          record (JSON)
    {P:tenant:<tenant>}:voices              set of the tenant's voice ids
    {P:ref:<sha>}:audio                     normalized reference PCM
    {P:ref:<sha>}:users                     set of the voice ids registered from it
    {P:ref:<sha>}:variants                  set of <backend>:<version>:<language> with features
    {P:ref:<sha>}:features:<variant>        features blob (TTL)
    {P:ref:<sha>}:features:<variant>:lock   extraction lock (SET NX PX)

Features are looked up by ``<backend>:<version>:<language>:<sha>``.

Every storage failure is raised as :class:`StorageUnavailable`.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError


class StorageUnavailable(Exception):
    """The voice store cannot be reached (Redis down, disk error)."""


@dataclass(frozen=True)
class VoiceRecord:
    id: str
    tenant: str
    name: str
    language: str
    base_voice: str
    duration_ms: int
    audio_sha256: str
    created_at: float
    transcript: str | None = None  # what the reference says (CosyVoice2 conditions on it)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> VoiceRecord:
        obj: dict[str, Any] = json.loads(data)
        return cls(**obj)


def split_feature_key(key: str) -> tuple[str, str]:
    """``<backend>:<version>:<language>:<sha>`` -> (variant, sha)."""
    variant, _, sha = key.rpartition(":")
    if not variant or not sha:
        raise ValueError(f"malformed feature key {key!r}")
    return variant, sha


# Drop one user of a reference; the last one out erases its audio and every features
# variant (and their locks). KEYS: users, audio, variants; ARGV: voice id, the prefix
# of the features keys. Every key shares the reference's hash tag.
_RELEASE_SCRIPT = """
redis.call('SREM', KEYS[1], ARGV[1])
if redis.call('SCARD', KEYS[1]) > 0 then return 0 end
for _, variant in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  redis.call('DEL', ARGV[2] .. variant, ARGV[2] .. variant .. ':lock')
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
return 1
"""


class VoiceStore(Protocol):
    async def save_audio(self, sha: str, pcm: bytes, user: str) -> None:
        """Store reference ``sha`` (idempotent) and count voice ``user`` as using it."""

    async def release_audio(self, sha: str, user: str) -> bool:
        """``user`` no longer uses reference ``sha``; True when that erased it (audio and
        features) because no voice uses it any more."""

    async def load_audio(self, sha: str) -> bytes | None: ...
    async def save_record(self, record: VoiceRecord) -> None: ...
    async def load_record(self, voice_id: str) -> VoiceRecord | None: ...
    async def delete_record(self, record: VoiceRecord) -> None: ...
    async def list_records(self, tenant: str) -> list[VoiceRecord]: ...
    async def load_features(self, key: str) -> bytes | None: ...
    async def save_features(self, key: str, blob: bytes, ttl_s: float) -> None: ...
    async def try_lock(self, key: str, ttl_s: float) -> bool: ...
    async def unlock(self, key: str) -> None: ...


class RedisVoiceStore:
    def __init__(self, client: aioredis.Redis, *, prefix: str = "ivr") -> None:
        self._r = client
        self._p = prefix

    def _k_record(self, voice_id: str) -> str:
        return f"{{{self._p}:voice:{voice_id}}}"

    def _k_index(self, tenant: str) -> str:
        return f"{{{self._p}:tenant:{tenant}}}:voices"

    def _k_ref(self, sha: str) -> str:
        return f"{{{self._p}:ref:{sha}}}"

    def _k_audio(self, sha: str) -> str:
        return self._k_ref(sha) + ":audio"

    def _k_features(self, key: str) -> str:
        variant, sha = split_feature_key(key)
        return f"{self._k_ref(sha)}:features:{variant}"

    async def _call(self, coro: Any) -> Any:
        try:
            return await coro
        except (TimeoutError, RedisError, OSError) as exc:
            raise StorageUnavailable(type(exc).__name__) from None

    async def save_audio(self, sha: str, pcm: bytes, user: str) -> None:
        async def transaction() -> None:
            async with self._r.pipeline(transaction=True) as pipe:  # MULTI ... EXEC
                pipe.sadd(self._k_ref(sha) + ":users", user)
                pipe.set(self._k_audio(sha), pcm)
                await pipe.execute()

        await self._call(transaction())

    async def release_audio(self, sha: str, user: str) -> bool:
        ref = self._k_ref(sha)
        erased = await self._call(
            self._r.eval(
                _RELEASE_SCRIPT,
                3,
                ref + ":users",
                ref + ":audio",
                ref + ":variants",
                user,
                ref + ":features:",
            )
        )
        return bool(erased)

    async def load_audio(self, sha: str) -> bytes | None:
        value: bytes | None = await self._call(self._r.get(self._k_audio(sha)))
        return value

    async def save_record(self, record: VoiceRecord) -> None:
        await self._call(self._r.set(self._k_record(record.id), record.to_json()))
        try:
            await self._call(self._r.sadd(self._k_index(record.tenant), record.id))
        except StorageUnavailable:
            # Nothing half-registered: best effort to take the record back.
            try:
                await self._call(self._r.delete(self._k_record(record.id)))
            finally:
                raise

    async def load_record(self, voice_id: str) -> VoiceRecord | None:
        data = await self._call(self._r.get(self._k_record(voice_id)))
        return VoiceRecord.from_json(data) if data else None

    async def delete_record(self, record: VoiceRecord) -> None:
        await self._call(self._r.srem(self._k_index(record.tenant), record.id))
        await self._call(self._r.delete(self._k_record(record.id)))

    async def list_records(self, tenant: str) -> list[VoiceRecord]:
        ids = await self._call(self._r.smembers(self._k_index(tenant)))
        records = []
        for voice_id in sorted(i.decode() if isinstance(i, bytes) else i for i in ids):
            record = await self.load_record(voice_id)
            if record is not None:
                records.append(record)
        return records

    async def load_features(self, key: str) -> bytes | None:
        value: bytes | None = await self._call(self._r.get(self._k_features(key)))
        return value

    async def save_features(self, key: str, blob: bytes, ttl_s: float) -> None:
        variant, sha = split_feature_key(key)

        async def transaction() -> None:
            async with self._r.pipeline(transaction=True) as pipe:
                pipe.sadd(self._k_ref(sha) + ":variants", variant)
                pipe.set(self._k_features(key), blob, px=int(ttl_s * 1000))
                await pipe.execute()

        await self._call(transaction())

    async def try_lock(self, key: str, ttl_s: float) -> bool:
        got = await self._call(
            self._r.set(self._k_features(key) + ":lock", b"1", nx=True, px=int(ttl_s * 1000))
        )
        return bool(got)

    async def unlock(self, key: str) -> None:
        await self._call(self._r.delete(self._k_features(key) + ":lock"))


class FileVoiceStore:
    """One directory, for a single gateway instance without Redis."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._locks: dict[str, float] = {}
        self._refs_lock = asyncio.Lock()

    def _path(self, kind: str, name: str) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        return self._root / kind / safe

    async def _write(self, path: Path, data: bytes) -> None:
        def write() -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(path.suffix + ".tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)  # atomic: never a half-written file

        try:
            await asyncio.to_thread(write)
        except OSError as exc:
            raise StorageUnavailable(str(exc)) from None

    async def _read(self, path: Path) -> bytes | None:
        try:
            return await asyncio.to_thread(path.read_bytes)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageUnavailable(str(exc)) from None

    async def save_audio(self, sha: str, pcm: bytes, user: str) -> None:
        async with self._refs_lock:
            users = await self._users(sha) or set()
            await self._write(self._path("audio", sha), pcm)
            await self._write(self._path("users", sha), json.dumps(sorted(users | {user})).encode())

    async def release_audio(self, sha: str, user: str) -> bool:
        async with self._refs_lock:
            users = await self._users(sha)
            if users is None:
                return False  # stored before users were counted: keep it, others may use it
            users.discard(user)
            if users:
                await self._write(self._path("users", sha), json.dumps(sorted(users)).encode())
                return False

            def erase() -> None:
                for path in (self._path("audio", sha), self._path("users", sha)):
                    path.unlink(missing_ok=True)
                features = self._root / "features"
                if features.is_dir():
                    for path in features.iterdir():
                        if path.name.endswith(sha):
                            path.unlink(missing_ok=True)

            try:
                await asyncio.to_thread(erase)
            except OSError as exc:
                raise StorageUnavailable(str(exc)) from None
            return True

    async def _users(self, sha: str) -> set[str] | None:
        """The voices using reference ``sha``; None if it has no users file."""
        data = await self._read(self._path("users", sha))
        return None if data is None else set(json.loads(data))

    async def load_audio(self, sha: str) -> bytes | None:
        return await self._read(self._path("audio", sha))

    async def save_record(self, record: VoiceRecord) -> None:
        await self._write(self._path("records", record.id), record.to_json())

    async def load_record(self, voice_id: str) -> VoiceRecord | None:
        data = await self._read(self._path("records", voice_id))
        return VoiceRecord.from_json(data) if data else None

    async def delete_record(self, record: VoiceRecord) -> None:
        try:
            self._path("records", record.id).unlink(missing_ok=True)
        except OSError as exc:
            raise StorageUnavailable(str(exc)) from None

    async def list_records(self, tenant: str) -> list[VoiceRecord]:
        folder = self._root / "records"
        if not folder.is_dir():
            return []
        records = []
        for path in sorted(folder.iterdir()):
            if path.suffix == ".tmp":
                continue
            data = await self._read(path)
            if data:
                record = VoiceRecord.from_json(data)
                if record.tenant == tenant:
                    records.append(record)
        return records

    async def load_features(self, key: str) -> bytes | None:
        path = self._path("features", key)
        data = await self._read(path)
        if data is None:
            return None
        expires, _, blob = data.partition(b"\n")
        if float(expires) < time.time():
            return None
        return blob

    async def save_features(self, key: str, blob: bytes, ttl_s: float) -> None:
        expires = str(time.time() + ttl_s).encode()
        await self._write(self._path("features", key), expires + b"\n" + blob)

    async def try_lock(self, key: str, ttl_s: float) -> bool:
        now = time.monotonic()
        if self._locks.get(key, 0.0) > now:
            return False
        self._locks[key] = now + ttl_s
        return True

    async def unlock(self, key: str) -> None:
        self._locks.pop(key, None)
