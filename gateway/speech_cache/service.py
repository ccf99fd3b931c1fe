"""The speech cache on the gateway's side: warm prompts, ask what is cached, forget voices.

:class:`EngineCache` is the engine as far as the cache goes: it sends the cache's
messages (WarmPrompt, CheckPrompt, ForgetVoice) only while the engine's last heartbeat
(``Pong.speech_cache``) says it has a cache. :class:`SpeechCacheService` owns the catalog
of warm prompts, the warmer and a background task (started and cancelled with the
worker) that, once the engine answers, queues the prompts file's prompts and those the
leg kinds declare (the SIP flows'), and sends the voice deletions the engine missed
while it was away. ``ready`` and ``/healthz`` never wait for any of it.

Tenants (docs/speech-cache.md, "Tenants"): a prompt of the prompts file or a SIP flow is
the operator's (shared: every tenant's calls hear it from the cache); an API prompt is
its tenant's alone. A check answers the levels of the asking tenant's own entries, at
most :data:`MAX_CHECKS_PER_TENANT` at a time per tenant (:class:`Overloaded` beyond: 503
with Retry-After); a deleted prompt leaves the warm-up queue; :meth:`purge` drops
everything cached from a tenant (its right to erasure).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from engine.ipc.client import EngineUnavailable
from engine.ipc.schema import PromptRequest, PromptState
from gateway.engine_link import EngineLink
from gateway.errors import ErrorCode, SessionError
from gateway.metrics import GatewayMetrics
from gateway.speech_cache.catalog import Catalog, CatalogFull, Entry
from gateway.speech_cache.prompts import (
    SHARED_TENANT,
    DeclaredPrompt,
    PromptError,
    PromptLimits,
    PromptLine,
    PromptSpec,
    load_prompts_file,
)
from gateway.speech_cache.warmer import SpeechCacheOff, Warmer

log = logging.getLogger(__name__)

POLL_S: Final = 0.1  # how often a wait for the engine looks again
FORGET_RETRY_S: Final = 1.0
MAX_PENDING_FORGETS: Final = 1024
CHECK_TIMEOUT_S: Final = 5.0
MAX_CHECKS_PER_TENANT: Final = 4  # a tenant's checks in progress on this worker

CacheStatus = Literal["down", "unknown", "off", "on"]
#: Resolves (tenant, voice) to (engine voice, voice profile, voice digest), with the voices
#: registry's permission check; raises :class:`SessionError` (``unknown_voice``, ...).
ResolveVoice = Callable[[str, str], Awaitable[tuple[str, bytes | None, str]]]


class Overloaded(Exception):
    """Too many of the tenant's requests are in progress, or the engine said so."""


@dataclass(frozen=True)
class SpeechCacheSettings:
    """What :class:`gateway.config.GatewaySettings` read (``GATEWAY_SPEECH_CACHE_*``)."""

    prompts_path: Path | None = None  # GATEWAY_SPEECH_CACHE_PROMPTS
    limits: PromptLimits = field(default_factory=PromptLimits)
    warm_concurrency: int = 2  # GATEWAY_SPEECH_CACHE_WARM_CONCURRENCY


class EngineCache:
    """The engine's speech cache, through the worker's engine link."""

    def __init__(self, link: EngineLink) -> None:
        self._link = link

    def status(self) -> CacheStatus:
        """``down`` (no engine), ``unknown`` (connected, no heartbeat answered yet),
        ``off`` (its last Pong has no cache), ``on``."""
        try:
            client = self._link.client()
        except EngineUnavailable:
            return "down"
        pong = client.last_pong
        if pong is None:
            return "unknown"
        cache = pong.speech_cache
        return "on" if cache is not None and cache.enabled else "off"

    async def wait_usable(self, timeout: float) -> None:
        """Until the engine says whether it caches; raises :class:`SpeechCacheOff`, or
        :class:`EngineUnavailable` when it does not within ``timeout``."""
        async with asyncio.timeout(timeout):
            # The heartbeat (every second) is what changes the answer: no event to wait on.
            while (status := self.status()) in ("down", "unknown"):  # noqa: ASYNC110
                await asyncio.sleep(POLL_S)
        if status == "off":
            raise SpeechCacheOff("the engine runs without a speech cache")

    def _require(self) -> None:
        status = self.status()
        if status == "off":
            raise SpeechCacheOff("the engine runs without a speech cache")
        if status != "on":
            raise EngineUnavailable("the engine is not ready")

    async def warm(self, request: PromptRequest, timeout: float) -> PromptState:
        self._require()
        return await self._link.client().warm_prompt(request, timeout=timeout)

    async def check(self, request: PromptRequest, timeout: float = CHECK_TIMEOUT_S) -> PromptState:
        self._require()
        return await self._link.client().check_prompt(request, timeout=timeout)

    def forget(self, voice_digest: str, tenant: str) -> bool:
        """Send ForgetVoice; False when it could not be sent now (engine down or not yet
        known to cache)."""
        status = self.status()
        if status == "off":
            return True  # nothing is cached to forget
        if status != "on":
            return False
        try:
            self._link.client().forget_voice(voice_digest, tenant)
        except EngineUnavailable:
            return False
        return True

    async def purge(self, tenant: str) -> int:
        """Drop everything cached from ``tenant``: the entries the memory level held.
        Raises :class:`SpeechCacheOff` or :class:`EngineUnavailable`."""
        self._require()
        answer = await self._link.client().purge_tenant(tenant)
        if answer.code == "speech_cache_off":
            raise SpeechCacheOff(answer.message)
        if answer.code:
            raise EngineUnavailable(answer.message)
        return answer.entries


class _Observer:
    def __init__(
        self,
        metrics: GatewayMetrics,
        catalog: Catalog,
        on_warm: Callable[[str, PromptSpec], None] | None,
    ) -> None:
        self._metrics = metrics
        self._catalog = catalog
        self._on_warm = on_warm

    def finished(self, entry: Entry, result: str) -> None:
        self._metrics.speech_cache_warmups.labels(result=result).inc()
        if result == "warm" and self._on_warm is not None:
            self._on_warm(entry.tenant, entry.spec)

    def changed(self) -> None:
        for state, count in self._catalog.by_state().items():
            self._metrics.speech_cache_prompts.labels(state=state).set(count)


class SpeechCacheService:
    def __init__(
        self,
        settings: SpeechCacheSettings,
        *,
        link: EngineLink,
        resolve_voice: ResolveVoice,
        metrics: GatewayMetrics,
        declared: Sequence[DeclaredPrompt] = (),
        warm_at_start: bool = True,
        on_warm: Callable[[str, PromptSpec], None] | None = None,
    ) -> None:
        """``declared``: the prompts the leg kinds will speak (SIP flows); ``warm_at_start``
        False leaves the start-up warm-up to another worker of the host (they share the
        engine); ``on_warm``: told each prompt this worker has warmed, with its tenant
        (``SHARED_TENANT`` for the operator's: the admission gate's likely hits). Reads
        the prompts file now: raises :class:`ConfigError`."""
        self.settings = settings
        self.engine = EngineCache(link)
        self._link = link
        self._resolve_voice = resolve_voice
        self._metrics = metrics
        limits = settings.limits
        self.catalog = Catalog(
            max_per_tenant=limits.max_prompts, max_total=limits.max_prompts * 100
        )
        self.file_prompts: list[PromptLine] = (
            load_prompts_file(settings.prompts_path, limits) if settings.prompts_path else []
        )
        self.declared = list(declared)
        self._warm_at_start = warm_at_start
        self._observer = _Observer(metrics, self.catalog, on_warm)
        self._startup: list[Entry] = []
        self.warmer = Warmer(
            self.engine,
            self._request_for,
            self._observer,
            concurrency=settings.warm_concurrency,
            max_queue=self.catalog.max_total,
            max_per_tenant=limits.max_prompts,
        )
        self._pending_forgets: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._checks: dict[str, int] = {}  # tenant -> checks in progress
        self._task: asyncio.Task[None] | None = None
        self.startup_queued = asyncio.Event()

    # --- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Start the warmer and the background task; returns at once. The prompts
        file's prompts are listed from now on (``pending``)."""
        self._startup = self._catalog_startup(self.file_prompts) if self._warm_at_start else []
        self._observer.changed()
        self.warmer.start()
        self._task = asyncio.create_task(self._background(), name="speech-cache")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.warmer.stop()

    def _catalog_startup(self, lines: Sequence[PromptLine]) -> list[Entry]:
        entries: list[Entry] = []
        for line in lines:
            source = f"file:{line.line}"
            try:
                entry, new = self.catalog.add(line.tenant, line.spec, source)
            except CatalogFull:
                log.error("speech cache: prompt of %s not warmed: the catalog is full", source)
                continue
            if new:
                entries.append(entry)
        return entries

    async def _background(self) -> None:
        """Queue the start-up prompts once the engine answers; then, for ever, send the
        voice deletions the engine missed."""
        while self.engine.status() in ("down", "unknown"):  # noqa: ASYNC110 - heartbeats
            await asyncio.sleep(POLL_S)
        if self.engine.status() == "off":
            if self._startup or self.declared:
                log.warning(
                    "speech cache: the engine runs without one (ENGINE_SPEECH_CACHE=0): "
                    "%d prompts not warmed", len(self._startup) + len(self.declared),
                )  # fmt: skip
            for entry in self._startup:
                entry.state, entry.code = "failed", ErrorCode.SPEECH_CACHE_OFF
                entry.message = "the engine runs without a speech cache"
            self._observer.changed()
        elif self._warm_at_start:
            self._queue_startup()
        self.startup_queued.set()
        while True:
            self._send_pending_forgets()
            await asyncio.sleep(FORGET_RETRY_S)

    def _queue_startup(self) -> None:
        entries = list(self._startup)
        default_voice = self._link.default_voice
        for declared in self.declared:
            spec = PromptSpec(
                text=declared.text, voice=declared.voice or default_voice, format=declared.format
            )
            try:
                entry, new = self.catalog.add(SHARED_TENANT, spec, declared.source)
            except CatalogFull:
                log.error("speech cache: %s not warmed: the catalog is full", declared.source)
                continue
            if new:
                entries.append(entry)
        queued = sum(1 for entry in entries if self.warmer.submit(entry))
        if queued:
            log.info("speech cache: warming %d prompts in the background", queued)

    # --- what the API asks -------------------------------------------------------------

    def require_cache(self) -> None:
        """Raises :class:`SpeechCacheOff` or :class:`EngineUnavailable` unless the engine
        has a speech cache now."""
        self.engine._require()

    async def _request_for(self, entry: Entry) -> PromptRequest:
        """The engine's request for ``entry``: the voice resolved for its tenant (the
        registry's permission check) exactly as a call's OpenStream would be."""
        spec = entry.spec
        try:
            voice, profile, digest = await self._resolve_voice(entry.tenant, spec.voice)
        except SessionError as exc:
            if exc.code in (ErrorCode.STORAGE_UNAVAILABLE, ErrorCode.ENGINE_UNAVAILABLE):
                raise EngineUnavailable(exc.message) from None
            raise PromptError(str(exc.code), exc.message, "voice") from None
        return PromptRequest(
            voice=voice,
            text=spec.text,
            sample_rate=spec.sample_rate,
            speed=spec.speed,
            language=spec.language,
            voice_profile=profile,
            instruct=spec.instruct,
            tenant=entry.tenant,
            shared=entry.tenant == SHARED_TENANT,
            voice_digest=digest,
        )

    async def warm(self, tenant: str, spec: PromptSpec) -> tuple[Entry, bool]:
        """Queue ``spec`` for ``tenant``: (its entry, whether it was queued now). Raises
        :class:`SpeechCacheOff`, :class:`EngineUnavailable`, :class:`PromptError` (the
        voice is not one ``tenant`` may use) or :class:`CatalogFull`."""
        self.require_cache()
        probe = Entry(spec.prompt_id(tenant), tenant, spec, "api", created_at=0.0)
        await self._request_for(probe)  # an unknown voice is refused now, not later
        entry, new = self.catalog.add(tenant, spec, "api")
        if not new and entry.state in ("pending", "warming"):
            return entry, False  # already on its way
        return entry, self.warmer.submit(entry)

    async def check(self, tenant: str, entry: Entry) -> PromptState:
        """The levels holding each segment of ``entry`` now (CheckPrompt), asked by
        ``tenant``; raises :class:`Overloaded` past :data:`MAX_CHECKS_PER_TENANT` of its
        checks at once, or when the engine is too busy to check."""
        if self._checks.get(tenant, 0) >= MAX_CHECKS_PER_TENANT:
            raise Overloaded("too many prompt checks in progress")
        self._checks[tenant] = self._checks.get(tenant, 0) + 1
        try:
            request = await self._request_for(entry)
            answer = await self.engine.check(request)
        finally:
            left = self._checks[tenant] - 1
            if left:
                self._checks[tenant] = left
            else:
                del self._checks[tenant]
        if answer.code == "overloaded":
            raise Overloaded(answer.message)
        if not answer.code:
            entry.segments = answer.segments
        return answer

    def remove(self, tenant: str, prompt_id: str) -> bool:
        """Take the tenant's prompt off the list, and out of the warm-up queue."""
        entry = self.catalog.get(tenant, prompt_id)
        if entry is None or not self.catalog.remove(tenant, prompt_id):
            return False
        self.warmer.discard(entry)
        self._observer.changed()
        return True

    async def purge(self, tenant: str) -> int:
        """A tenant's erasure: its prompts leave the list and the queue, and the engine
        drops everything cached from it (every level). Returns the memory entries
        dropped. Raises :class:`SpeechCacheOff` or :class:`EngineUnavailable`."""
        for entry in [e for e in self.catalog.visible(tenant) if e.tenant == tenant]:
            self.remove(tenant, entry.id)
        return await self.engine.purge(tenant)

    # --- voice deletions ---------------------------------------------------------------

    def forget_voice(self, voice_id: str, voice_digest: str | None, tenant: str) -> None:
        """``tenant``'s registered voice was deleted: its prompts leave the catalog and
        the engine drops its cached speech (now, or once it is back)."""
        removed = self.catalog.remove_voice(voice_id)
        if removed:
            self._observer.changed()
        if voice_digest is None:
            return
        if not self.engine.forget(voice_digest, tenant):
            self._pending_forgets[(voice_digest, tenant)] = None
            while len(self._pending_forgets) > MAX_PENDING_FORGETS:
                dropped, _ = self._pending_forgets.popitem(last=False)
                log.error("speech cache: too many voice deletions pending; %s not sent", dropped[0])
        else:
            log.info("speech cache: voice %s forgotten", voice_id)

    def _send_pending_forgets(self) -> None:
        while self._pending_forgets:
            digest, tenant = next(iter(self._pending_forgets))
            if not self.engine.forget(digest, tenant):
                return
            del self._pending_forgets[(digest, tenant)]


__all__ = [
    "EngineCache",
    "Overloaded",
    "SpeechCacheService",
    "SpeechCacheSettings",
]
