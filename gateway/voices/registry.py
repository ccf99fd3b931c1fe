"""The voice registry: reference audio in, reusable voice out, features cached twice.

Registration: the upload is decoded and normalized (:mod:`gateway.voices.reference_audio`, by
the caller, in a worker process: :mod:`gateway.voices.upload_worker`), the engine extracts the
backend's features (``PrepareVoice``), and the record, the normalized audio and the
features are stored (:mod:`gateway.voices.store`).

Features are looked up in L1 (an in-process LRU, ``GATEWAY_VOICE_CACHE_SIZE`` entries),
then L2 (the shared store: Redis, or a local directory), and only then extracted. The
cache key is ``backend:version:language:sha256(normalized audio)``, so a new backend
version recomputes features from the stored audio instead of using stale ones. Across
instances, an extraction lock in the store makes the same audio extracted once: other
instances wait for the features to appear.

Voice records are cached in L1 too, for at most ``RECORD_TTL_S``. With Redis, a deletion
is also announced to every instance (:mod:`gateway.voices.deletions`), which drop the
voice from L1 when the message arrives; the record lifetime bounds what a lost message
costs: a voice deleted through one instance stops speaking on every instance within that
time at worst. When the store is
unreachable, voices whose record and features are in L1 still speak (an expired record is
served until the store answers again); registration answers 503 ``storage_unavailable``
and writes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from engine.ipc.client import EngineClient, EngineRejected, EngineUnavailable
from engine.speech_cache.key import registered_voice_digest
from gateway.errors import ErrorCode
from gateway.metrics import GatewayMetrics
from gateway.voices.deletions import Deletion, DeletionChannel
from gateway.voices.reference_audio import ReferenceAudio
from gateway.voices.store import StorageUnavailable, VoiceRecord, VoiceStore

log = logging.getLogger(__name__)
VOICE_ID_PREFIX = "vc_"
# What a registered voice's id looks like: the registry mints VOICE_ID_PREFIX + 16 lowercase
# hex digits. Anything else is no voice and never reaches the store (a 5,000-character id
# made the file store fail).
_VOICE_ID = re.compile(r"vc_[0-9a-f]{16}")
MAX_NAME_CHARS = 100
FEATURES_TTL_S = 30 * 24 * 3600.0
RECORD_TTL_S = 10.0  # how long an instance trusts its cached copy of a voice's record
LOCK_TTL_S = 60.0
WAIT_FOR_OTHER_S = 60.0

K = TypeVar("K")
V = TypeVar("V")


class VoiceError(Exception):
    """A client-facing registry error: ``code`` and an HTTP status."""

    def __init__(self, code: ErrorCode, message: str, status: int) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


class Lru(Generic[K, V]):
    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def pop(self, key: K) -> None:
        self._items.pop(key, None)

    def pop_where(self, predicate: Callable[[K], bool]) -> None:
        for key in [k for k in self._items if predicate(k)]:
            del self._items[key]

    def items(self) -> list[tuple[K, V]]:
        return list(self._items.items())

    def __len__(self) -> int:
        return len(self._items)


@dataclass(frozen=True)
class BackendInfo:
    name: str
    version: str
    cloning: bool
    voices: dict[str, str]  # built-in voice id -> language tag


def is_voice_id(value: str) -> bool:
    """Whether ``value`` has the shape of a registered voice's id (not whether it exists).

    The one check applied before an id is looked up anywhere: ids of another shape are
    unknown voices (404, ``unknown_voice``) without a round trip to the store.
    """
    return _VOICE_ID.fullmatch(value) is not None


def transcript_tag(transcript: str | None) -> str:
    """The part of a feature key that names the reference's transcript ("" without one):
    features made with another transcript are other features."""
    if not transcript:
        return ""
    return "t" + hashlib.blake2b(transcript.encode(), digest_size=8).hexdigest() + ":"


def _features_key(info: BackendInfo, sha: str, language: str, transcript: str | None) -> str:
    return f"{info.name}:{info.version}:{language.lower()}:{transcript_tag(transcript)}{sha}"


def base_voice_for(language: str, voices: dict[str, str]) -> str | None:
    """The built-in voice that speaks ``language`` (exact tag first, then its prefix,
    then a multilingual voice: language ``mul``)."""
    wanted = language.lower()
    for voice_id, tag in voices.items():
        if tag.lower() == wanted or voice_id == wanted:
            return voice_id
    prefix = wanted.split("-")[0]
    for voice_id, tag in voices.items():
        if tag.lower().split("-")[0] == prefix:
            return voice_id
    return next((voice_id for voice_id, tag in voices.items() if tag.lower() == "mul"), None)


class VoiceRegistry:
    def __init__(
        self,
        store: VoiceStore,
        engine: Callable[[], EngineClient],
        backend: Callable[[], BackendInfo | None],
        metrics: GatewayMetrics,
        *,
        l1_size: int = 100,
        features_ttl_s: float = FEATURES_TTL_S,
        record_ttl_s: float = RECORD_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._engine = engine
        self._backend = backend
        self._metrics = metrics
        self._features: Lru[str, bytes] = Lru(l1_size)
        self._records: Lru[str, tuple[VoiceRecord, float]] = Lru(l1_size)  # record, fetched
        self._features_ttl_s = features_ttl_s
        self._record_ttl_s = record_ttl_s
        self._clock = clock
        self._inflight: dict[str, asyncio.Future[bytes]] = {}
        # Set by the app when the store is shared through Redis: deletions are announced.
        self.deletions: DeletionChannel | None = None
        #: Called for every deletion this instance applies (its own and, with Redis, every
        #: instance's): the speech cache forgets the voice's speech.
        self.deletion_listeners: list[Callable[[Deletion], None]] = []
        self.lookups = 0
        self.hits = 0

    # --- features: L1, L2, extraction ---------------------------------------------------

    def _count(self, level: str, hit: bool) -> None:
        (self._metrics.voice_cache_hits if hit else self._metrics.voice_cache_misses).labels(
            level=level
        ).inc()

    def _ratio(self) -> None:
        self._metrics.cache_hit_ratio.set(self.hits / self.lookups if self.lookups else 0.0)

    async def features(
        self,
        sha: str,
        language: str,
        load_audio: Callable[[], asyncio.Future[bytes | None]] | None = None,
        audio: bytes | None = None,
        transcript: str | None = None,
    ) -> bytes:
        """Features of reference ``sha`` (and its ``transcript``, for backends that
        condition on what the reference says): L1, then L2, then extraction (once per
        cluster)."""
        info = self._backend()
        if info is None:
            raise VoiceError(ErrorCode.ENGINE_UNAVAILABLE, "the TTS engine is not ready", 503)
        key = _features_key(info, sha, language, transcript)
        self.lookups += 1
        blob = self._features.get(key)
        self._count("l1", blob is not None)
        if blob is not None:
            self.hits += 1
            self._ratio()
            return blob
        blob = await self._store.load_features(key)
        self._count("l2", blob is not None)
        if blob is not None:
            self.hits += 1
            self._ratio()
            self._features.put(key, blob)
            return blob
        self._ratio()
        running = self._inflight.get(key)
        if running is not None:  # this instance is already extracting it
            return await asyncio.shield(running)
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            blob = await self._extract_once(key, language, load_audio, audio, transcript)
            future.set_result(blob)
            self._features.put(key, blob)
            return blob
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved here; waiters get it too
            raise
        finally:
            del self._inflight[key]

    async def _extract_once(
        self,
        key: str,
        language: str,
        load_audio: Callable[[], asyncio.Future[bytes | None]] | None,
        audio: bytes | None,
        transcript: str | None,
    ) -> bytes:
        deadline = time.monotonic() + WAIT_FOR_OTHER_S
        while not await self._store.try_lock(key, LOCK_TTL_S):
            # Another instance is extracting the same audio: wait for its result.
            await asyncio.sleep(0.05)
            blob = await self._store.load_features(key)
            if blob is not None:
                return blob
            if time.monotonic() > deadline:
                raise VoiceError(
                    ErrorCode.STORAGE_UNAVAILABLE, "voice extraction lock timed out", 503
                )
        try:
            blob = await self._store.load_features(key)  # finished while we took the lock?
            if blob is not None:
                return blob
            if audio is None and load_audio is not None:
                audio = await load_audio()
            if audio is None:
                raise VoiceError(
                    ErrorCode.VOICE_UNAVAILABLE, "the voice's reference audio is gone", 410
                )
            try:
                prepared = await self._engine().prepare_voice(
                    audio, language=language, transcript=transcript
                )
            except EngineRejected as exc:
                raise VoiceError(ErrorCode.from_engine(exc.code), exc.message, 400) from None
            except EngineUnavailable:
                raise VoiceError(
                    ErrorCode.ENGINE_UNAVAILABLE, "the TTS engine is not ready", 503
                ) from None
            self._metrics.voice_extraction.observe(prepared.seconds)
            await self._store.save_features(key, prepared.features, self._features_ttl_s)
            return prepared.features
        finally:
            with contextlib.suppress(StorageUnavailable):  # else the lock expires by itself
                await self._store.unlock(key)

    # --- registration and lookup --------------------------------------------------------

    async def register(
        self,
        tenant: str,
        reference: Callable[[], Awaitable[ReferenceAudio]],
        *,
        name: str | None,
        language: str | None,
        transcript: str | None = None,
    ) -> VoiceRecord:
        """Register a voice from the normalized audio ``reference()`` produces.

        ``reference`` is awaited once, after the cheap checks (backend, language, name)
        passed; decoding the upload is its business (the gateway runs it in a worker
        process, :class:`gateway.voices.upload_worker.UploadWorkers`). Raises
        :class:`VoiceError` (400/503), or whatever ``reference`` raises (such as
        :class:`gateway.voices.reference_audio.ReferenceAudioError`). Nothing is stored on
        failure."""
        info = self._backend()
        if info is None:
            raise VoiceError(ErrorCode.ENGINE_UNAVAILABLE, "the TTS engine is not ready", 503)
        if not info.cloning:
            raise VoiceError(
                ErrorCode.VOICE_CLONING_UNSUPPORTED,
                f"backend {info.name} has no custom voices",
                400,
            )
        language = (language or "en-US").strip()
        base_voice = base_voice_for(language, info.voices)
        if base_voice is None:
            raise VoiceError(ErrorCode.UNSUPPORTED_LANGUAGE, f"no voice speaks {language!r}", 400)
        if name is not None and len(name) > MAX_NAME_CHARS:
            raise VoiceError(ErrorCode.INVALID_NAME, f"name over {MAX_NAME_CHARS} characters", 400)
        ref = await reference()
        voice_id = VOICE_ID_PREFIX + secrets.token_hex(8)
        try:
            await self.features(ref.sha256, language, audio=ref.pcm, transcript=transcript)
            await self._store.save_audio(ref.sha256, ref.pcm, voice_id)
            record = VoiceRecord(
                id=voice_id,
                tenant=tenant,
                name=name or "Custom voice",
                language=language,
                base_voice=base_voice,
                duration_ms=ref.duration_ms,
                audio_sha256=ref.sha256,
                created_at=time.time(),
                transcript=transcript,
            )
            await self._store.save_record(record)
        except StorageUnavailable:
            with contextlib.suppress(StorageUnavailable):  # nothing half-registered
                await self._store.release_audio(ref.sha256, voice_id)
            raise VoiceError(
                ErrorCode.STORAGE_UNAVAILABLE, "voice storage is unreachable", 503
            ) from None
        self._records.put(record.id, (record, self._clock()))
        log.info("voice %s registered for tenant %s (%d ms)", record.id, tenant, ref.duration_ms)
        return record

    async def get(self, tenant: str, voice_id: str) -> VoiceRecord | None:
        """The tenant's voice, or None (another tenant's voice does not exist, nor does an
        id that :func:`is_voice_id` refuses: the store is not asked)."""
        if not is_voice_id(voice_id):
            return None
        cached = self._records.get(voice_id)
        now = self._clock()
        record = cached[0] if cached is not None else None
        if cached is None or now - cached[1] > self._record_ttl_s:
            try:
                record = await self._store.load_record(voice_id)
            except StorageUnavailable:
                if record is None:
                    raise VoiceError(
                        ErrorCode.STORAGE_UNAVAILABLE, "voice storage is unreachable", 503
                    ) from None
                # The store is down: keep speaking with what this instance knows, and do
                # not ask again (paying a timeout per session start) for another TTL.
                self._records.put(voice_id, (record, now))
            else:
                if record is None:
                    self._records.pop(voice_id)  # deleted, possibly through another instance
                else:
                    self._records.put(voice_id, (record, now))
        if record is None or record.tenant != tenant:
            return None
        return record

    async def list(self, tenant: str) -> list[VoiceRecord]:
        try:
            return await self._store.list_records(tenant)
        except StorageUnavailable:
            raise VoiceError(
                ErrorCode.STORAGE_UNAVAILABLE, "voice storage is unreachable", 503
            ) from None

    async def _features_digest(self, record: VoiceRecord) -> str | None:
        """The voice's digest (its tenant, id and features) if this instance or the store
        has its features (nothing is extracted): what the engines' speech caches key its
        speech by (engine/speech_cache/key.py ``registered_voice_digest``)."""
        info = self._backend()
        if info is None:
            return None
        key = _features_key(info, record.audio_sha256, record.language, record.transcript)
        blob = self._features.get(key)
        if blob is None:
            with contextlib.suppress(StorageUnavailable):
                blob = await self._store.load_features(key)
        if blob is None:
            return None
        return registered_voice_digest(record.tenant, record.id, blob)

    async def delete(self, tenant: str, voice_id: str) -> bool:
        record = await self.get(tenant, voice_id)
        if record is None:
            return False
        digest = await self._features_digest(record)
        try:
            await self._store.delete_record(record)
        except StorageUnavailable:
            raise VoiceError(
                ErrorCode.STORAGE_UNAVAILABLE, "voice storage is unreachable", 503
            ) from None
        try:
            erased = await self._store.release_audio(record.audio_sha256, record.id)
        except StorageUnavailable:
            # The voice is gone; its reference may outlive it. Say so where operators look.
            log.error(
                "voice %s deleted but its reference audio %s could not be released",
                voice_id,
                record.audio_sha256,
            )
            raise VoiceError(
                ErrorCode.STORAGE_UNAVAILABLE, "voice storage is unreachable", 503
            ) from None
        deletion = Deletion(
            voice_id, record.audio_sha256 if erased else None, digest, record.tenant
        )
        self.forget(deletion)
        log.info("voice %s deleted (reference audio erased: %s)", voice_id, erased)
        if self.deletions is not None:
            await self.deletions.publish(deletion)
        return True

    def forget(self, deletion: Deletion) -> None:
        """Drop a deleted voice from L1 (and its reference's features, when erased), and
        tell the listeners (the speech cache)."""
        self._records.pop(deletion.voice_id)
        sha = deletion.erased_sha256
        if sha is not None:  # no voice uses the reference any more
            self._features.pop_where(lambda key: key.endswith(":" + sha))
        for listener in self.deletion_listeners:
            try:
                listener(deletion)
            except Exception:  # a listener's bug must not undo the deletion
                log.exception("voice %s: a deletion listener failed", deletion.voice_id)

    def expire_records(self) -> None:
        """Treat every cached record as stale: the next use asks the store (deletions
        may have been missed). Kept, so that an unreachable store still finds them."""
        for voice_id, (record, _) in self._records.items():
            self._records.put(voice_id, (record, float("-inf")))

    async def profile(self, tenant: str, voice_id: str) -> tuple[str, bytes] | None:
        """(base voice, features) for speaking with ``voice_id``; None if unknown."""
        record = await self.get(tenant, voice_id)
        if record is None:
            return None

        def load_audio() -> asyncio.Future[bytes | None]:
            return asyncio.ensure_future(self._store.load_audio(record.audio_sha256))

        try:
            blob = await self.features(
                record.audio_sha256, record.language, load_audio, transcript=record.transcript
            )
        except StorageUnavailable:
            raise VoiceError(
                ErrorCode.STORAGE_UNAVAILABLE, "voice storage is unreachable", 503
            ) from None
        return record.base_voice, blob
