"""The engine's control server: a Unix socket speaking :mod:`engine.ipc.schema`.

One :class:`EngineServer` per engine process. Each gateway worker holds one connection;
streams belong to the connection that opened them and are closed (their slots freed)
when it goes away. Slots are allocated here from a fixed pool; an exhausted pool answers
``StreamRejected(code="overloaded")``.

The speech cache (engine/speech_cache) is given to the server by whoever opened it
(``python -m engine``: from ``SpeechCacheSettings.from_env``), who also closes it after
:meth:`EngineServer.stop`; without one the cache is off. WarmPrompt, CheckPrompt and
ForgetVoice and PurgeTenant are handled by :class:`~engine.prompts.PromptService`; Pong carries the
cache's statistics.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from engine.backends.base import BackendError, VoiceSettings, capabilities_of
from engine.backends.routing import BackendSet
from engine.ipc.schema import (
    PROTOCOL_VERSION,
    Cancel,
    CancelUtterance,
    CheckPrompt,
    CloseStream,
    ForgetVoice,
    FrameDecoder,
    FramingError,
    Hello,
    Message,
    OpenStream,
    Ping,
    Pong,
    PrepareVoice,
    ProtocolError,
    PurgeTenant,
    Speak,
    SpeechCacheStats,
    StreamClosed,
    StreamOpened,
    StreamRejected,
    WarmPrompt,
    Welcome,
    encode,
)
from engine.ipc.shm import SharedRegion, SlotArena
from engine.prompts import PromptService
from engine.scheduler import START_TIMEOUT_S, Scheduler
from engine.speech_cache import SpeechCache, tenant_scope
from engine.vad import SileroVad, VadModel, VadWorker
from telephony.codecs.formats import ENGINE_RATES

log = logging.getLogger(__name__)
SUPPORTED_RATES = ENGINE_RATES  # the rates a stream's audio may have (one table)


#: The engine's exit status when its scheduler fails (EX_SOFTWARE): the supervisor starts a
#: new engine; the gateways see the control connection close and end their sessions.
EXIT_SCHEDULER_FAILED = 70


def _exit_on_scheduler_failure(exc: BaseException) -> None:
    log.critical("engine exiting: the scheduler failed (%r)", exc)
    logging.shutdown()
    os._exit(EXIT_SCHEDULER_FAILED)


def resident_memory_bytes() -> int:
    """This process's resident set size, from /proc (0 where unavailable)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class SlotPool:
    """Fixed pool of slot numbers; ``acquire`` returns None when exhausted."""

    def __init__(self, size: int) -> None:
        self._free: deque[int] = deque(range(size))
        self.size = size

    def acquire(self) -> int | None:
        return self._free.popleft() if self._free else None

    def release(self, slot: int) -> None:
        self._free.append(slot)

    @property
    def in_use(self) -> int:
        return self.size - len(self._free)


@dataclass(frozen=True)
class MemoryUse:
    rss: int
    gpu_used: int
    gpu_total: int
    used: int  # what counts against the budget: GPU memory on a GPU, else RSS
    budget: int

    @property
    def fraction(self) -> float:
        return self.used / self.budget if self.budget > 0 else 0.0


@dataclass(frozen=True)
class EngineLayout:
    region: SharedRegion
    arena: SlotArena
    slots: int
    out_ring_bytes: int
    in_ring_bytes: int


class _Connection(asyncio.Protocol):
    def __init__(self, server: EngineServer) -> None:
        self._server = server
        self._decoder = FrameDecoder("to_engine")
        self._transport: asyncio.Transport | None = None
        self._greeted = False
        self.streams: dict[int, int] = {}  # stream_id -> slot
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self._server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._server.connections.discard(self)
        for slot in self.streams.values():
            self._server.close_slot(slot)
        self.streams.clear()

    def send(self, message: Message) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(encode(message))

    def data_received(self, data: bytes) -> None:
        try:
            messages = self._decoder.feed(data)
        except FramingError as exc:
            self._protocol_error(str(exc))
            return
        for message in messages:
            try:
                self._handle(message)
            except Exception:
                # A bug here must not take every stream of this gateway down with it.
                log.exception("control message %s failed", type(message).__name__)
                if isinstance(message, OpenStream):
                    self.send(
                        StreamRejected(
                            stream_id=message.stream_id,
                            code="engine_error",
                            message="the engine could not open the stream",
                        )
                    )

    def _protocol_error(self, reason: str) -> None:
        log.warning("control connection: %s", reason)
        self.send(ProtocolError(message=reason))
        if self._transport is not None:
            self._transport.close()

    def _handle(self, message: Message) -> None:
        server = self._server
        if isinstance(message, Hello):
            if message.protocol_version != PROTOCOL_VERSION:
                self._protocol_error(f"unsupported protocol version {message.protocol_version}")
                return
            self._greeted = True
            self.send(server.welcome())
            log.info("gateway %s attached", message.client)
            return
        if not self._greeted:
            self._protocol_error("Hello expected first")
            return
        if isinstance(message, Ping):
            stats = server.scheduler.stats
            memory = server.memory()
            self.send(
                Pong(
                    seq=message.seq,
                    active_streams=stats.active_streams,
                    queued_utterances=stats.queued_utterances,
                    rss_bytes=memory.rss,
                    gpu_used_bytes=memory.gpu_used,
                    gpu_total_bytes=memory.gpu_total,
                    memory_used_bytes=memory.used,
                    memory_budget_bytes=memory.budget,
                    vad_ready=server.vad.ready,
                    speech_cache=server.speech_cache_stats(),
                )
            )
        elif isinstance(message, OpenStream):
            self._open(message)
        elif isinstance(message, Speak):
            slot = self.streams.get(message.stream_id)
            if slot is not None:
                server.scheduler.speak(
                    slot,
                    message.utterance,
                    message.text,
                    message.final,
                    message.release,
                    instruct=message.instruct,
                    retain=message.retain,
                )
        elif isinstance(message, Cancel):
            slot = self.streams.get(message.stream_id)
            if slot is not None:
                server.scheduler.cancel(slot)
        elif isinstance(message, CancelUtterance):
            slot = self.streams.get(message.stream_id)
            if slot is not None:
                server.scheduler.cancel_utterance(slot, message.utterance)
        elif isinstance(message, PrepareVoice):
            server.scheduler.prepare_voice(
                request_id=message.request_id,
                owner=self,
                pcm16k=message.pcm16k,
                language=message.language,
                transcript=message.transcript,
            )
        elif isinstance(message, WarmPrompt):
            server.prompts.warm(self.send, message.request_id, message.prompt, self)
        elif isinstance(message, CheckPrompt):
            server.prompts.check(self.send, message.request_id, message.prompt)
        elif isinstance(message, ForgetVoice):
            server.prompts.forget(message.voice_digest, message.tenant)
        elif isinstance(message, PurgeTenant):
            server.prompts.purge(self.send, message.request_id, message.tenant)
        elif isinstance(message, CloseStream):
            slot = self.streams.pop(message.stream_id, None)
            if slot is None:
                self.send(StreamClosed(stream_id=message.stream_id))
            else:
                server.close_slot(slot)
        else:
            self._protocol_error(f"unexpected message {type(message).__name__}")

    def _open(self, message: OpenStream) -> None:
        server = self._server

        def reject(code: str, text: str) -> None:
            self.send(StreamRejected(stream_id=message.stream_id, code=code, message=text))

        if message.stream_id in self.streams:
            reject("protocol_error", "stream id already open")
            return
        if message.sample_rate not in SUPPORTED_RATES:
            reject("unsupported_format", f"sample rate {message.sample_rate} not supported")
            return
        try:
            voice = server.backend.resolve_voice(
                VoiceSettings(
                    voice_id=message.voice,
                    speed=message.speed,
                    language=message.language,
                    profile=message.voice_profile,
                    instruct=message.instruct,
                )
            )
        except BackendError as exc:
            reject(exc.code, exc.message)
            return
        memory = server.memory()
        if memory.fraction > server.memory_reject_fraction:
            reject(
                "overloaded",
                f"engine memory at {memory.fraction:.0%} of its budget "
                f"(limit {server.memory_reject_fraction:.0%})",
            )
            return
        slot = server.pool.acquire()
        if slot is None:
            reject("overloaded", f"all {server.pool.size} engine slots are in use")
            return
        if message.input_sample_rate is not None and (
            message.input_sample_rate not in SUPPORTED_RATES
        ):
            server.pool.release(slot)
            reject("unsupported_format", f"input rate {message.input_sample_rate} not supported")
            return
        server.layout.arena.reset_slot(slot)
        self.streams[message.stream_id] = slot
        holds = 1
        if message.input_sample_rate is not None:
            holds += 1
            server.vad.add(
                slot=slot,
                stream_id=message.stream_id,
                owner=self,
                ring=server.layout.arena.inbound(slot),
                sample_rate=message.input_sample_rate,
            )
        server.holds[slot] = holds
        server.scheduler.open_stream(
            slot=slot,
            stream_id=message.stream_id,
            owner=self,
            ring=server.layout.arena.outbound(slot),
            boundaries=server.layout.arena.boundaries(slot),
            voice=voice,
            sample_rate=message.sample_rate,
            scope=tenant_scope(message.tenant),
            retain=message.retain,
            voice_digest=message.voice_digest,
        )
        self.send(StreamOpened(stream_id=message.stream_id, slot=slot))


class EngineServer:
    """Owns the slot pool, the scheduler and the control socket."""

    def __init__(
        self,
        backend: BackendSet,
        layout: EngineLayout,
        *,
        vad_model_factory: Callable[[], VadModel] | None = None,
        memory_budget_bytes: int = 4 << 30,
        memory_reject_fraction: float = 0.85,
        start_timeout_s: float = START_TIMEOUT_S,
        speech_cache: SpeechCache | None = None,
    ) -> None:
        self.backend = backend
        # Opened and closed by the caller (see the module docstring); None: off.
        self.speech_cache = SpeechCache.disabled() if speech_cache is None else speech_cache
        self.layout = layout
        self.memory_budget_bytes = memory_budget_bytes
        self.memory_reject_fraction = memory_reject_fraction
        self.pool = SlotPool(layout.slots)
        # Threads still using a closing slot (scheduler, VAD): freed when it reaches 0.
        self.holds: dict[int, int] = {}
        self.connections: set[_Connection] = set()
        self.scheduler = Scheduler(
            backend,
            self._from_worker,
            max_text_chars=backend.max_text_chars,
            tap_directory=os.environ.get("ENGINE_PCM_TAP_DIR") or None,
            on_fatal=_exit_on_scheduler_failure,
            start_timeout_s=start_timeout_s,
            speech_cache=self.speech_cache,
        )
        self.prompts = PromptService(
            backend, self.scheduler, self.speech_cache, max_text_chars=backend.max_text_chars
        )
        self.vad = VadWorker(
            self._from_worker,
            slots=layout.slots,
            on_released=self._vad_released,
            model_factory=vad_model_factory or SileroVad,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outbox: deque[Callable[[], None]] = deque()
        self._relay_scheduled = False
        self._server: asyncio.AbstractServer | None = None

    def speech_cache_stats(self) -> SpeechCacheStats | None:
        """The speech cache's levels and what the scheduler's joins and cached prefixes
        spared (None: no cache)."""
        if not self.speech_cache.enabled:
            return None
        stats = self.speech_cache.stats()
        counted = self.scheduler.stats
        stats.joined_segments = counted.joined_segments
        stats.joined_audio_seconds = counted.joined_audio_s
        stats.prefix_hits = counted.prefix_hits
        stats.prefix_audio_seconds = counted.prefix_audio_s
        stats.played_audio_seconds = counted.audio_s
        stats.cached_audio_seconds = counted.cached_audio_s
        return stats

    def memory(self) -> MemoryUse:
        """Engine memory for admission: device memory when the backend is on a GPU,
        else this process's resident memory against the configured budget."""
        rss = resident_memory_bytes()
        gpu = self.backend.gpu()
        if gpu is not None:
            used, total = gpu.gpu_memory()
            return MemoryUse(rss, used, total, used, total)
        return MemoryUse(rss, 0, 0, rss, self.memory_budget_bytes)

    def welcome(self) -> Welcome:
        return Welcome(
            protocol_version=PROTOCOL_VERSION,
            engine_pid=os.getpid(),
            backend=self.backend.name,
            shm_name=self.layout.region.name,
            shm_directory=self.layout.region.directory,
            slots=self.layout.slots,
            out_ring_bytes=self.layout.out_ring_bytes,
            in_ring_bytes=self.layout.in_ring_bytes,
            native_sample_rate=self.backend.native_sample_rate,
            max_text_chars=self.backend.max_text_chars,
            voices=tuple(self.backend.voices()),
            vad=self.vad.load_error is None,
            backend_version=self.backend.version,
            voice_cloning=self.backend.preparer is not None,
            cloning_backend=self.backend.preparer.name if self.backend.preparer else "",
            capabilities={b.name: capabilities_of(b) for b in self.backend.members},
        )

    async def start(self, socket_path: str) -> None:
        self._loop = asyncio.get_running_loop()
        self.scheduler.start()
        self.vad.load()  # tens of ms: the first Pong already says whether VAD is ready
        self.vad.start()
        if os.path.exists(socket_path):
            os.unlink(socket_path)
        self._server = await self._loop.create_unix_server(
            lambda: _Connection(self), path=socket_path
        )
        os.chmod(socket_path, 0o600)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        await self.prompts.close()
        self.scheduler.stop()
        self.vad.stop()

    def close_slot(self, slot: int) -> None:
        """Stop all work on ``slot``; it returns to the pool once every thread let go."""
        self.scheduler.close_stream(slot)
        if self.holds.get(slot, 1) > 1:
            self.vad.remove(slot)

    def _let_go(self, slot: int) -> None:
        remaining = self.holds.get(slot, 1) - 1
        if remaining > 0:
            self.holds[slot] = remaining
            return
        self.holds.pop(slot, None)
        self.pool.release(slot)

    # Worker threads hand results to the loop through one batched relay.
    def _post(self, action: Callable[[], None]) -> None:
        self._outbox.append(action)
        if not self._relay_scheduled and self._loop is not None:
            self._relay_scheduled = True
            self._loop.call_soon_threadsafe(self._relay)

    def _from_worker(self, owner: object, message: Message) -> None:
        self._post(lambda: self._deliver(owner, message))

    def _vad_released(self, slot: int) -> None:
        self._post(lambda: self._let_go(slot))

    def _deliver(self, owner: object, message: Message) -> None:
        assert isinstance(owner, _Connection)
        if isinstance(message, StreamClosed) and message.slot is not None:
            self._let_go(message.slot)  # the scheduler no longer writes to the slot
        if not owner.lost:
            owner.send(message)

    def _relay(self) -> None:
        self._relay_scheduled = False
        while self._outbox:
            self._outbox.popleft()()
