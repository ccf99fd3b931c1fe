"""The server's side of the speech cache's prompt messages (engine/ipc/schema.py):
WarmPrompt, CheckPrompt, ForgetVoice and PurgeTenant.

Scope: a prompt is keyed in its tenant's scope, or in the shared scope when the
operator declared it (``PromptRequest.shared``), so a check answers the levels of the
asking tenant's own entries only. A warmed prompt's keys are *declared*
(SpeechCache.declare): kept whole, and a shared one served to every tenant's calls.
Fairness: besides the totals, one tenant has at most :data:`MAX_CHECKS_PER_TENANT`
checks and :data:`MAX_WARMS_PER_TENANT` warm-ups in progress (``overloaded`` beyond).

A prompt is turned into its segments and keys exactly as a stream's text would be (the
voice resolved as OpenStream resolves it, the stream's splitter, the scheduler's key
maker), off the event loop, on this service's own threads: resolving a voice may load a
model, and the shared level's lookups (``levels_holding``) and removals (``forget_voice``)
block for up to their timeouts. WarmPrompt is then rendered by the scheduler behind the
calls' work (engine/scheduler/warm.py). Every answer is a PromptState; failures are
codes (``speech_cache_off``, ``unsupported_format``, ``text_too_long``, the voice's
``unknown_voice`` or other resolution codes, ``not_cacheable``, ``overloaded``,
``synthesis_failed``, ``queue_timeout``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from engine.backends.base import BackendError, VoiceSettings
from engine.backends.routing import BackendSet, RoutedVoice
from engine.ipc.schema import Message, PromptRequest, PromptState, SegmentState, TenantPurged
from engine.scheduler import Scheduler
from engine.scheduler.cache_keys import key_maker, prompt_segments
from engine.scheduler.warm import MAX_WARM_JOBS, WarmOutcome, WarmRequest
from engine.speech_cache import SHARED_SCOPE, SegmentKey, SpeechCache, tenant_scope
from telephony.codecs.formats import ENGINE_RATES

log = logging.getLogger(__name__)

PROMPT_THREADS: Final = 4  # threads resolving prompts and asking the cache's levels
MAX_PENDING_CHECKS: Final = 64  # CheckPrompt requests in progress at once; more: overloaded
MAX_PENDING_WARMS: Final = MAX_WARM_JOBS  # WarmPrompt requests in progress; more: overloaded
MAX_PENDING_FORGETS: Final = 1024  # distinct voices waiting to be forgotten; more: logged
MAX_CHECKS_PER_TENANT: Final = 8  # one tenant's CheckPrompt requests in progress
MAX_WARMS_PER_TENANT: Final = 64  # one tenant's WarmPrompt requests in progress
MAX_PENDING_PURGES: Final = 16  # PurgeTenant requests in progress; more: overloaded
CLOSE_TIMEOUT_S: Final = 5.0  # how long close() waits for a thread still in a cache level

Send = Callable[[Message], None]
T = TypeVar("T")


@dataclass(frozen=True)
class PreparedPrompt:
    voice: RoutedVoice
    texts: tuple[str, ...]
    keys: tuple[SegmentKey, ...]


class PromptService:
    """Answers WarmPrompt and CheckPrompt, applies ForgetVoice. Created and used on the
    event loop; ``close`` cancels what is in progress and stops its threads."""

    def __init__(
        self,
        backends: BackendSet,
        scheduler: Scheduler,
        cache: SpeechCache,
        *,
        max_text_chars: int,
        max_pending_checks: int = MAX_PENDING_CHECKS,
        max_pending_warms: int = MAX_PENDING_WARMS,
    ) -> None:
        self._backends = backends
        self._scheduler = scheduler
        self._cache = cache
        self._max_text_chars = max_text_chars
        self._max_pending_checks = max_pending_checks
        self._max_pending_warms = max_pending_warms
        self._checks = 0
        self._warms = 0
        self._purges = 0
        self._checks_of: dict[str, int] = {}  # scope -> checks in progress
        self._warms_of: dict[str, int] = {}  # scope -> warm-ups in progress
        self._executor = ThreadPoolExecutor(PROMPT_THREADS, thread_name_prefix="engine-prompts")
        # Forgets on their own thread: one may wait seconds for the shared level (a Redis
        # SCAN of every key), and checks and warm-ups must not queue behind it.
        self._forget_executor = ThreadPoolExecutor(1, thread_name_prefix="engine-forget")
        self._forgets: set[str] = set()  # voice digests waiting to be forgotten
        self._tasks: set[asyncio.Task[None]] = set()

    # --- messages (event loop) -----------------------------------------------------------

    def warm(self, send: Send, request_id: int, prompt: PromptRequest, owner: object) -> None:
        scope = prompt_scope(prompt)
        if (
            self._warms >= self._max_pending_warms
            or self._warms_of.get(scope, 0) >= MAX_WARMS_PER_TENANT
        ):
            send(_failed(request_id, "overloaded", "too many prompts are being warmed"))
            return
        self._warms += 1
        self._warms_of[scope] = self._warms_of.get(scope, 0) + 1
        self._spawn(self._warm(send, request_id, prompt, owner, scope))

    def check(self, send: Send, request_id: int, prompt: PromptRequest) -> None:
        scope = prompt_scope(prompt)
        if (
            self._checks >= self._max_pending_checks
            or self._checks_of.get(scope, 0) >= MAX_CHECKS_PER_TENANT
        ):
            send(_failed(request_id, "overloaded", "too many prompt checks in progress"))
            return
        self._checks += 1
        self._checks_of[scope] = self._checks_of.get(scope, 0) + 1
        self._spawn(self._check(send, request_id, prompt, scope))

    def forget(self, voice_digest: str, tenant: str) -> None:
        if not self._cache.enabled or voice_digest in self._forgets:
            return  # the same voice waits to be forgotten already
        if len(self._forgets) >= MAX_PENDING_FORGETS:
            log.error("speech cache: too many voices being forgotten; %s is not", voice_digest)
            return
        self._forgets.add(voice_digest)
        self._spawn(self._forget(voice_digest, tenant_scope(tenant)))

    def purge(self, send: Send, request_id: int, tenant: str) -> None:
        """Drop everything cached from ``tenant`` (memory and shared level)."""
        if not self._cache.enabled:
            send(TenantPurged(request_id=request_id, code="speech_cache_off",
                              message="the engine's speech cache is off"))  # fmt: skip
            return
        if self._purges >= MAX_PENDING_PURGES:
            send(TenantPurged(request_id=request_id, code="overloaded",
                              message="too many purges in progress"))  # fmt: skip
            return
        self._purges += 1
        self._spawn(self._purge(send, request_id, tenant_scope(tenant)))

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        executors = (self._executor, self._forget_executor)
        for executor in executors:
            executor.shutdown(wait=False, cancel_futures=True)

        def join() -> None:
            for executor in executors:
                executor.shutdown(wait=True)

        # A thread can be inside a cache level (each call there is bounded by its
        # timeouts): wait for it off the loop, at most CLOSE_TIMEOUT_S.
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await asyncio.to_thread(join)
        except TimeoutError:
            log.warning(
                "speech cache: a prompt thread still runs %.0f s after close", CLOSE_TIMEOUT_S
            )

    # --- work ------------------------------------------------------------------------------

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, function: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, function)

    async def _check(self, send: Send, request_id: int, prompt: PromptRequest, scope: str) -> None:
        try:
            prepared = await self._run(lambda: self.prepare(prompt))
            if isinstance(prepared, PreparedPrompt):
                send(await self._state(request_id, prepared.texts, prepared.keys))
            else:
                send(_failed(request_id, *prepared))
        except Exception:
            log.exception("CheckPrompt failed")
            send(_failed(request_id, "engine_error", "the prompt could not be checked"))
        finally:
            self._checks -= 1
            _release(self._checks_of, scope)

    async def _warm(
        self, send: Send, request_id: int, prompt: PromptRequest, owner: object, scope: str
    ) -> None:
        try:
            await self._warm_one(send, request_id, prompt, owner)
        finally:
            self._warms -= 1
            _release(self._warms_of, scope)

    async def _warm_one(
        self, send: Send, request_id: int, prompt: PromptRequest, owner: object
    ) -> None:
        epoch = self._cache.epoch()  # its voice deleted from now on: nothing is stored
        try:
            prepared = await self._run(lambda: self.prepare(prompt))
            if not isinstance(prepared, PreparedPrompt):
                send(_failed(request_id, *prepared))
                return
            for key in prepared.keys:  # a call of its text is served it, kept whole
                self._cache.declare(key)
            loop = asyncio.get_running_loop()
            ended: asyncio.Future[WarmOutcome] = loop.create_future()

            def done(outcome: WarmOutcome) -> None:  # on the coordinator thread
                loop.call_soon_threadsafe(_settle, ended, outcome)

            request = WarmRequest(
                request_id, owner, prepared.voice, prepared.texts, prepared.keys, done, epoch
            )
            if not self._scheduler.warm_prompt(request):
                send(_failed(request_id, "overloaded", "too many prompts are being warmed"))
                return
            outcome = await ended  # the scheduler ends every job (WARM_TIMEOUT_S at most)
            if outcome.error is not None:
                send(_failed(request_id, *outcome.error))
            else:
                send(await self._state(request_id, outcome.texts, outcome.keys))
        except Exception:
            log.exception("WarmPrompt failed")
            send(_failed(request_id, "engine_error", "the prompt could not be warmed"))

    async def _forget(self, voice_digest: str, scope: str) -> None:
        def forget() -> None:  # on the forget thread
            self._forgets.discard(voice_digest)  # from now on, another ForgetVoice counts
            self._cache.forget_voice(scope, voice_digest)

        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._forget_executor, forget)
        except Exception:
            log.exception("ForgetVoice failed")
        finally:
            self._forgets.discard(voice_digest)

    async def _purge(self, send: Send, request_id: int, scope: str) -> None:
        loop = asyncio.get_running_loop()
        try:
            entries = await loop.run_in_executor(
                self._forget_executor, self._cache.purge_scope, scope
            )
            send(TenantPurged(request_id=request_id, entries=entries))
            log.info("speech cache: a tenant's entries purged (%d in memory)", entries)
        except Exception:
            log.exception("PurgeTenant failed")
            send(TenantPurged(request_id=request_id, code="engine_error",
                              message="the tenant's entries could not be purged"))  # fmt: skip
        finally:
            self._purges -= 1

    async def _state(
        self, request_id: int, texts: tuple[str, ...], keys: tuple[SegmentKey, ...]
    ) -> PromptState:
        levels = await self._run(lambda: [self._cache.levels_holding(key) for key in keys])
        return PromptState(
            request_id=request_id,
            segments=tuple(SegmentState(t, held) for t, held in zip(texts, levels, strict=True)),
        )

    def prepare(self, prompt: PromptRequest) -> PreparedPrompt | tuple[str, str]:
        """The prompt's voice, segments and keys, as a stream would have them; else
        (code, message). Blocking (a voice may load its model): on this service's threads."""
        if not self._cache.enabled:
            return "speech_cache_off", "the engine's speech cache is off (ENGINE_SPEECH_CACHE)"
        if prompt.sample_rate not in ENGINE_RATES:
            return "unsupported_format", f"sample rate {prompt.sample_rate} not supported"
        if len(prompt.text) > self._max_text_chars:
            return "text_too_long", "prompt text over the limit"
        settings = VoiceSettings(
            voice_id=prompt.voice,
            speed=prompt.speed,
            language=prompt.language,
            profile=prompt.voice_profile,
            instruct=prompt.instruct,
        )
        try:
            voice = self._backends.resolve_voice(settings)
        except BackendError as exc:
            return exc.code, exc.message
        keys = key_maker(
            voice, voice.handle, prompt.instruct, prompt.sample_rate,
            scope=prompt_scope(prompt), voice_digest=prompt.voice_digest,
        )  # fmt: skip
        if keys is None:
            return "not_cacheable", f"voice {prompt.voice} ({voice.backend.name}) is not cached"
        texts, _personal = prompt_segments(prompt.text, voice.language)  # declared: kept
        return PreparedPrompt(voice, tuple(texts), tuple(keys.key(text) for text in texts))


def prompt_scope(prompt: PromptRequest) -> str:
    """The scope a prompt is keyed in: the operator's shared one, or its tenant's."""
    return SHARED_SCOPE if prompt.shared else tenant_scope(prompt.tenant)


def _release(counts: dict[str, int], scope: str) -> None:
    left = counts.get(scope, 0) - 1
    if left > 0:
        counts[scope] = left
    else:
        counts.pop(scope, None)


def _settle(future: asyncio.Future[WarmOutcome], outcome: WarmOutcome) -> None:
    if not future.done():
        future.set_result(outcome)


def _failed(request_id: int, code: str, message: str) -> PromptState:
    return PromptState(request_id=request_id, code=code, message=message)
