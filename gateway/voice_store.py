"""Where registered voices live: Redis (shared by every gateway instance) or a local
directory (one instance, no Redis configured).

What is stored, per voice: its record (id, tenant, name, language, base voice, the
SHA-256 of its normalized reference audio), and, per distinct reference, the normalized
audio itself (so features can be recomputed when a backend's version changes) and the
backend's features, under a key made of backend name, backend version, language and the
audio's SHA-256, with a TTL.

Redis keys (every command touches one key, so they work on Redis Cluster; a tenant's
index carries the tenant hash tag)::

    {P:voice:<id>}                       record (JSON)
    {P:tenant:<tenant>}:voices           set of the tenant's voice ids
    {P:voice-audio:<sha>}                normalized reference PCM
    {P:voice-features:<feature key>}     features blob (TTL)
    {P:voice-features:<feature key>}:lock   extraction lock (SET NX PX)

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

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> VoiceRecord:
        obj: dict[str, Any] = json.loads(data)
        return cls(**obj)


class VoiceStore(Protocol):
    async def save_audio(self, sha: str, pcm: bytes) -> None: ...
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

    def _k_audio(self, sha: str) -> str:
        return f"{{{self._p}:voice-audio:{sha}}}"

    def _k_features(self, key: str) -> str:
        return f"{{{self._p}:voice-features:{key}}}"

    async def _call(self, coro: Any) -> Any:
        try:
            return await coro
        except (TimeoutError, RedisError, OSError) as exc:
            raise StorageUnavailable(type(exc).__name__) from None

    async def save_audio(self, sha: str, pcm: bytes) -> None:
        await self._call(self._r.set(self._k_audio(sha), pcm))

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
        await self._call(self._r.set(self._k_features(key), blob, px=int(ttl_s * 1000)))

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

    async def save_audio(self, sha: str, pcm: bytes) -> None:
        await self._write(self._path("audio", sha), pcm)

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
