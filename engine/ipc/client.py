"""The gateway's side of the engine IPC: one control connection, many streams.

:class:`EngineClient` speaks :mod:`engine.ipc.schema` over the engine's Unix socket and maps
its shared-memory slot arena. :class:`EngineStream` is one session's slot: the outbound
ring it reads synthesized PCM from, the inbound ring it writes caller audio to, and the
control calls (speak, cancel, close). Engine events for a stream go to its
:class:`StreamListener`, called on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, cast

from engine.ipc.ring import SpscRing
from engine.ipc.schema import (
    PROTOCOL_VERSION,
    Cancel,
    Cancelled,
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
    PromptRequest,
    PromptState,
    ProtocolError,
    PurgeTenant,
    Speak,
    SpeechStarted,
    StreamClosed,
    StreamOpened,
    StreamRejected,
    TenantPurged,
    UtteranceAudio,
    UtteranceEnd,
    UtteranceFailed,
    UtteranceWords,
    VoicePrepared,
    VoicePrepareFailed,
    WarmPrompt,
    Welcome,
    encode,
)
from engine.ipc.shm import SharedRegion, SlotArena

log = logging.getLogger(__name__)
AnswerT = TypeVar("AnswerT")


class EngineUnavailable(Exception):
    """The engine is not connected, went away, or did not answer in time."""

    code = "engine_unavailable"


class EngineRejected(Exception):
    """The engine refused a request; ``code`` is client-facing (``overloaded``, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class StreamListener(Protocol):
    def on_utterance_audio(self, event: UtteranceAudio) -> None: ...
    def on_utterance_words(self, event: UtteranceWords) -> None: ...
    def on_utterance_end(self, event: UtteranceEnd) -> None: ...
    def on_utterance_failed(self, event: UtteranceFailed) -> None: ...
    def on_speech_started(self, event: SpeechStarted) -> None: ...
    def on_engine_lost(self) -> None: ...


class EngineStream:
    """One open stream. Methods must be called on the event loop."""

    def __init__(
        self,
        client: EngineClient,
        stream_id: int,
        slot: int,
        listener: StreamListener,
    ) -> None:
        self.client = client
        self.stream_id = stream_id
        self.slot = slot
        self.listener = listener
        self.outbound: SpscRing = client.arena.outbound(slot)
        self.inbound: SpscRing = client.arena.inbound(slot)
        self.boundaries: SpscRing = client.arena.boundaries(slot)
        self.closed = False
        self._cancel_waiters: list[asyncio.Future[int]] = []
        self._close_waiter: asyncio.Future[None] | None = None

    def speak(
        self,
        utterance: int,
        text: str,
        *,
        final: bool,
        release: bool = False,
        instruct: str | None = None,
        retain: bool | None = None,
    ) -> None:
        self.client.send(
            Speak(
                stream_id=self.stream_id,
                utterance=utterance,
                text=text,
                final=final,
                release=release,
                instruct=instruct,
                retain=retain,
            )
        )

    def cancel_utterance(self, utterance: int) -> None:
        """Stop synthesizing ``utterance`` after its segment in progress (no reply: it
        ends with ``UtteranceEnd`` as usual)."""
        self.client.send(CancelUtterance(stream_id=self.stream_id, utterance=utterance))

    def request_cancel(self, timeout: float = 2.0) -> asyncio.Future[int]:
        """Stop the engine's work. The future resolves to the ring position where the
        cancelled audio ends (bytes before it belong to cancelled work), or fails with
        :class:`EngineUnavailable` if the engine does not confirm within ``timeout``."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[int] = loop.create_future()
        self._cancel_waiters.append(waiter)
        try:
            self.client.send(Cancel(stream_id=self.stream_id))
        except EngineUnavailable as exc:
            self._cancel_waiters.remove(waiter)
            waiter.set_exception(exc)
            return waiter

        def expire() -> None:
            if not waiter.done():
                waiter.set_exception(EngineUnavailable("engine did not confirm cancel"))

        handle = loop.call_later(timeout, expire)
        waiter.add_done_callback(lambda _f: handle.cancel())
        return waiter

    async def close(self, timeout: float = 2.0) -> None:
        """Release the slot. Safe to call more than once and after the engine is gone."""
        if self.closed:
            return
        self.closed = True
        if self.client.lost:
            return
        self._close_waiter = asyncio.get_running_loop().create_future()
        self.client.send(CloseStream(stream_id=self.stream_id))
        with contextlib.suppress(TimeoutError, EngineUnavailable):
            await asyncio.wait_for(self._close_waiter, timeout)
        # The rings are the arena's (cached per slot); they stay mapped for reuse.

    # called by the client
    def _dispatch(self, message: Message) -> None:
        if isinstance(message, UtteranceAudio):
            self.listener.on_utterance_audio(message)
        elif isinstance(message, UtteranceWords):
            self.listener.on_utterance_words(message)
        elif isinstance(message, UtteranceEnd):
            self.listener.on_utterance_end(message)
        elif isinstance(message, UtteranceFailed):
            self.listener.on_utterance_failed(message)
        elif isinstance(message, SpeechStarted):
            self.listener.on_speech_started(message)
        elif isinstance(message, Cancelled):
            # Cancels are answered in order; one that timed out still consumes its answer.
            if self._cancel_waiters:
                waiter = self._cancel_waiters.pop(0)
                if not waiter.done():
                    waiter.set_result(message.write_pos)
        elif (
            isinstance(message, StreamClosed)
            and self._close_waiter is not None
            and not self._close_waiter.done()
        ):
            self._close_waiter.set_result(None)

    def _lost(self) -> None:
        for waiter in self._cancel_waiters:
            if not waiter.done():
                waiter.set_exception(EngineUnavailable("engine connection lost"))
        self._cancel_waiters.clear()
        if self._close_waiter is not None and not self._close_waiter.done():
            self._close_waiter.set_result(None)
        if not self.closed:
            self.closed = True
            self.listener.on_engine_lost()


class EngineClient(asyncio.Protocol):
    """A connection to one engine. Create it with :meth:`connect`."""

    def __init__(self, client_name: str) -> None:
        self._client_name = client_name
        self._decoder = FrameDecoder("from_engine")
        self._transport: asyncio.Transport | None = None
        self._welcome: asyncio.Future[Welcome] = asyncio.get_running_loop().create_future()
        self._pongs: dict[int, asyncio.Future[Pong]] = {}
        self._opening: dict[int, asyncio.Future[StreamOpened]] = {}
        self._preparing: dict[int, asyncio.Future[VoicePrepared]] = {}
        self._prompts: dict[int, asyncio.Future[PromptState]] = {}
        self._purges: dict[int, asyncio.Future[TenantPurged]] = {}
        self.streams: dict[int, EngineStream] = {}
        self._ids = itertools.count(1)
        self._ping_seq = itertools.count(1)
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.lost = False
        self.welcome: Welcome | None = None
        self.region: SharedRegion | None = None
        self._arena: SlotArena | None = None
        self.last_pong: Pong | None = None
        # Messages sent in one turn of the event loop go out in one write (a surge of
        # sessions opening streams, many calls speaking): see :meth:`send`.
        self._outbox: list[bytes] = []
        self._loop = asyncio.get_running_loop()

    @classmethod
    async def connect(
        cls, socket_path: str, *, timeout: float = 5.0, client_name: str = ""
    ) -> EngineClient:
        """Connect, say Hello, wait for Welcome and map the engine's slot arena."""
        loop = asyncio.get_running_loop()
        name = client_name or f"gateway-{os.getpid()}"
        async with asyncio.timeout(timeout):
            _, client = await loop.create_unix_connection(lambda: cls(name), socket_path)
            try:
                client.send(Hello(protocol_version=PROTOCOL_VERSION, client=name))
                welcome = await client._welcome
                client._attach(welcome)
            except BaseException:
                client.abort()
                raise
        return client

    @property
    def arena(self) -> SlotArena:
        if self._arena is None:
            raise EngineUnavailable("not attached")
        return self._arena

    def _attach(self, welcome: Welcome) -> None:
        self.region = SharedRegion.attach(welcome.shm_name, directory=welcome.shm_directory)
        self._arena = SlotArena(
            self.region, welcome.slots, welcome.out_ring_bytes, welcome.in_ring_bytes
        )
        self.welcome = welcome

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        try:
            messages = self._decoder.feed(data)
        except FramingError as exc:
            log.error("engine sent an invalid frame: %s", exc)
            self.abort()
            return
        for message in messages:
            self._handle(message)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        error = EngineUnavailable("engine connection lost")
        futures: list[asyncio.Future[Any]] = [
            self._welcome,
            *self._pongs.values(),
            *self._opening.values(),
            *self._preparing.values(),
            *self._prompts.values(),
            *self._purges.values(),
        ]
        for future in futures:
            if not future.done():
                future.set_exception(error)
                future.exception()  # mark retrieved: nobody may be waiting any more
        self._pongs.clear()
        self._opening.clear()
        self._preparing.clear()
        self._prompts.clear()
        self._purges.clear()
        streams = list(self.streams.values())
        self.streams.clear()
        for stream in streams:
            stream._lost()
        if not self.closed.done():
            self.closed.set_result(None)
        if self._arena is not None:
            with contextlib.suppress(Exception):
                self._arena.close()
        if self.region is not None:
            with contextlib.suppress(Exception):
                self.region.close()

    def _handle(self, message: Message) -> None:
        if isinstance(message, Welcome):
            if not self._welcome.done():
                self._welcome.set_result(message)
        elif isinstance(message, Pong):
            self.last_pong = message
            future = self._pongs.pop(message.seq, None)
            if future is not None and not future.done():
                future.set_result(message)
        elif isinstance(message, StreamOpened | StreamRejected):
            opening = self._opening.pop(message.stream_id, None)
            if opening is None or opening.done():
                if isinstance(message, StreamOpened):
                    # Nobody waits for it any more (timed out, cancelled): the engine
                    # holds a slot for it, so give the slot back.
                    self._close_orphan(message.stream_id)
                return
            if isinstance(message, StreamOpened):
                opening.set_result(message)
            else:
                opening.set_exception(EngineRejected(message.code, message.message))
        elif isinstance(message, VoicePrepared | VoicePrepareFailed):
            waiter = self._preparing.pop(message.request_id, None)
            if waiter is not None and not waiter.done():
                if isinstance(message, VoicePrepared):
                    waiter.set_result(message)
                else:
                    waiter.set_exception(EngineRejected(message.code, message.message))
        elif isinstance(message, PromptState):
            answer = self._prompts.pop(message.request_id, None)
            if answer is not None and not answer.done():
                answer.set_result(message)
        elif isinstance(message, TenantPurged):
            purged = self._purges.pop(message.request_id, None)
            if purged is not None and not purged.done():
                purged.set_result(message)
        elif isinstance(message, ProtocolError):
            log.error("engine reports a protocol error: %s", message.message)
        else:
            stream_id = getattr(message, "stream_id", None)
            stream = self.streams.get(stream_id) if stream_id is not None else None
            if stream is not None:
                if isinstance(message, StreamClosed):
                    del self.streams[message.stream_id]
                stream._dispatch(message)

    # API

    def send(self, message: Message) -> None:
        """Queue ``message``; what is queued in this turn of the event loop is written
        at its end, in order, in one system call (and one wake-up of the engine)."""
        if self.lost or self._transport is None or self._transport.is_closing():
            raise EngineUnavailable("engine connection is closed")
        if not self._outbox:
            self._loop.call_soon(self._flush)
        self._outbox.append(encode(message))

    def _flush(self) -> None:
        outbox, self._outbox = self._outbox, []
        transport = self._transport
        if outbox and transport is not None and not transport.is_closing():
            transport.write(b"".join(outbox))

    async def prepare_voice(
        self,
        pcm16k: bytes,
        *,
        language: str | None = None,
        transcript: str | None = None,
        timeout: float = 60.0,
    ) -> VoicePrepared:
        """Extract voice features from normalized reference audio (16 kHz mono PCM).

        Raises :class:`EngineRejected` (e.g. ``voice_cloning_unsupported``) or
        :class:`EngineUnavailable` (no answer in ``timeout``)."""
        request_id = next(self._ids)
        future: asyncio.Future[VoicePrepared] = asyncio.get_running_loop().create_future()
        self._preparing[request_id] = future
        try:
            self.send(
                PrepareVoice(
                    request_id=request_id, pcm16k=pcm16k, language=language, transcript=transcript
                )
            )
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise EngineUnavailable("engine did not answer PrepareVoice") from None
        finally:
            self._preparing.pop(request_id, None)

    async def warm_prompt(self, prompt: PromptRequest, *, timeout: float = 120.0) -> PromptState:
        """Render ``prompt`` into the engine's speech cache (behind the calls' work).

        The answer's ``code`` is "" when every segment is cached, else the reason; raises
        :class:`EngineUnavailable` when there is no answer in ``timeout``."""
        return await self._prompt_request(WarmPrompt, prompt, timeout, "WarmPrompt")

    async def check_prompt(self, prompt: PromptRequest, *, timeout: float = 5.0) -> PromptState:
        """Which speech-cache levels hold each segment of ``prompt`` (nothing is rendered)."""
        return await self._prompt_request(CheckPrompt, prompt, timeout, "CheckPrompt")

    def forget_voice(self, voice_digest: str, tenant: str) -> None:
        """Ask the engine to drop every cached segment of ``tenant``'s registered voice."""
        self.send(ForgetVoice(voice_digest=voice_digest, tenant=tenant))

    async def purge_tenant(self, tenant: str, *, timeout: float = 60.0) -> TenantPurged:
        """Ask the engine to drop everything cached from ``tenant``; raises
        :class:`EngineUnavailable` when there is no answer in ``timeout``."""
        return await self._request(
            self._purges,
            lambda request_id: PurgeTenant(request_id=request_id, tenant=tenant),
            timeout,
            "PurgeTenant",
        )

    async def _prompt_request(
        self,
        kind: type[WarmPrompt] | type[CheckPrompt],
        prompt: PromptRequest,
        timeout: float,
        name: str,
    ) -> PromptState:
        return await self._request(
            self._prompts, lambda request_id: kind(request_id=request_id, prompt=prompt),
            timeout, name,
        )  # fmt: skip

    async def _request(
        self,
        waiting: dict[int, asyncio.Future[AnswerT]],
        message: Callable[[int], Message],
        timeout: float,
        name: str,
    ) -> AnswerT:
        """Send ``message(request_id)`` and wait for its answer (put in ``waiting`` by
        :meth:`_handle`); raises :class:`EngineUnavailable` after ``timeout``."""
        request_id = next(self._ids)
        future: asyncio.Future[AnswerT] = asyncio.get_running_loop().create_future()
        waiting[request_id] = future
        try:
            self.send(message(request_id))
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise EngineUnavailable(f"engine did not answer {name}") from None
        finally:
            waiting.pop(request_id, None)

    async def ping(self, timeout: float) -> Pong:
        seq = next(self._ping_seq)
        future: asyncio.Future[Pong] = asyncio.get_running_loop().create_future()
        self._pongs[seq] = future
        try:
            self.send(Ping(seq=seq))
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise EngineUnavailable("engine heartbeat timed out") from None
        finally:
            self._pongs.pop(seq, None)

    async def open_stream(
        self,
        *,
        voice: str,
        sample_rate: int,
        listener: StreamListener,
        speed: float = 1.0,
        language: str | None = None,
        voice_profile: bytes | None = None,
        input_sample_rate: int | None = None,
        instruct: str | None = None,
        tenant: str = "",
        retain: bool = True,
        voice_digest: str = "",
        timeout: float = 5.0,
    ) -> EngineStream:
        """Open a stream; raises :class:`EngineRejected` or :class:`EngineUnavailable`."""
        stream_id = next(self._ids)
        future: asyncio.Future[StreamOpened] = asyncio.get_running_loop().create_future()
        self._opening[stream_id] = future
        try:
            self.send(
                OpenStream(
                    stream_id=stream_id,
                    voice=voice,
                    sample_rate=sample_rate,
                    speed=speed,
                    language=language,
                    voice_profile=voice_profile,
                    input_sample_rate=input_sample_rate,
                    instruct=instruct,
                    tenant=tenant,
                    retain=retain,
                    voice_digest=voice_digest,
                )
            )
            opened = await asyncio.wait_for(future, timeout)
        except BaseException as exc:
            self._opening.pop(stream_id, None)
            if future.done() and not future.cancelled() and future.exception() is None:
                self._close_orphan(stream_id)  # opened, but our caller is gone
            if isinstance(exc, TimeoutError):
                raise EngineUnavailable("engine did not answer OpenStream") from None
            raise
        stream = EngineStream(self, stream_id, opened.slot, listener)
        self.streams[stream_id] = stream
        return stream

    def _close_orphan(self, stream_id: int) -> None:
        """Close a stream the engine opened for a caller that stopped waiting."""
        log.info("engine stream %d opened after its caller left: closing it", stream_id)
        with contextlib.suppress(EngineUnavailable):
            self.send(CloseStream(stream_id=stream_id))

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    async def aclose(self) -> None:
        if self._transport is not None:
            self._transport.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(self.closed), 2.0)
