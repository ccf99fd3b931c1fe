"""A Pipecat TTS service that speaks through this gateway's native WebSocket protocol.

``VoiceGatewayTTSService`` holds one WebSocket to ``GET /v1/stream``, which is one gateway
session: ``start`` (PCM at the pipeline's rate, ``burst`` pacing: Pipecat's output
transport paces playback itself) on connect, then one ``speak`` per sentence Pipecat hands
to :meth:`run_tts`, each with its own ``utterance_id``. The gateway answers every utterance
with ``utterance_started``, its audio as binary 20 ms PCM frames, and ``utterance_done``.

How that maps onto Pipecat (1.14):

- A Pipecat *audio context* is one bot turn (every sentence of an LLM reply shares it) or
  one ``TTSSpeakFrame``. The base class opens it with a ``TTSStartedFrame``; this service
  ends it with a ``TTSStoppedFrame`` once the turn is complete (:meth:`flush_audio`) and
  the gateway has reported ``utterance_done`` for each of its utterances.
- Binary frames carry no utterance id: the gateway plays utterances in order and sends
  ``utterance_started`` right before an utterance's first frame, so the frames that follow
  belong to that utterance (and its audio context) until its ``utterance_done``.
- An interruption sends ``clear`` (the gateway stops before its next frame and drops
  everything queued). When speech that may not be interrupted is still queued
  (``TTSSpeakFrame(interruptible=False)``), it sends ``cancel`` for each interrupted
  utterance instead, so that speech goes on.
- ``keepalive`` every 60 s while nothing is being spoken (the gateway closes a session
  that sends nothing for ``GATEWAY_IDLE_TIMEOUT_S``, 300 s by default). A session the
  gateway closes is reconnected by Pipecat's websocket base class.
- ``error`` messages become ``ErrorFrame``\\s (pushed upstream), with an
  :class:`~pipecat.utils.errors.ErrorCategory` from the gateway's error code; an
  authentication failure leaves the service unusable (reconnecting cannot fix it).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from loguru import logger
from pipecat.frames.frames import (
    ErrorFrame,
    Frame,
    InterruptionFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessorSetup
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import WebsocketTTSService
from pipecat.utils.errors import ErrorCategory
from websockets.asyncio.client import ClientConnection
from websockets.protocol import State

#: PCM rates the gateway streams (``pcm_<rate>`` formats); 16 and 24 kHz are the usual
#: rates of Pipecat transports.
SUPPORTED_SAMPLE_RATES = (8000, 16000, 24000, 48000)

# Gateway error codes (docs/protocol.md) as Pipecat error categories. Authentication and
# invalid-request categories are permanent: Pipecat stops giving the service work.
_ERROR_CATEGORIES: dict[str, ErrorCategory] = {
    "token_missing": ErrorCategory.AUTHENTICATION,
    "token_malformed": ErrorCategory.AUTHENTICATION,
    "token_expired": ErrorCategory.AUTHENTICATION,
    "token_invalid": ErrorCategory.AUTHENTICATION,
    "token_claims": ErrorCategory.AUTHENTICATION,
    "insufficient_scope": ErrorCategory.AUTHORIZATION,
    "unknown_voice": ErrorCategory.INVALID_REQUEST,
    "unsupported_format": ErrorCategory.INVALID_REQUEST,
    "invalid_speed": ErrorCategory.INVALID_REQUEST,
    "invalid_voice_profile": ErrorCategory.INVALID_REQUEST,
    # one utterance's text was refused; the session goes on
    "text_too_long": ErrorCategory.APPLICATION,
    "overloaded": ErrorCategory.RATE_LIMIT,
    "tenant_limit": ErrorCategory.RATE_LIMIT,
    "queue_full": ErrorCategory.RATE_LIMIT,
    "queue_timeout": ErrorCategory.RATE_LIMIT,
    "limits_unavailable": ErrorCategory.SERVER,
    "lease_lost": ErrorCategory.SERVER,
    "shutting_down": ErrorCategory.SERVER,
    "engine_unavailable": ErrorCategory.SERVER,
    "engine_error": ErrorCategory.SERVER,
    "backend_error": ErrorCategory.SERVER,
    "internal_error": ErrorCategory.SERVER,
}

# Errors naming an utterance the gateway then drops without an ``utterance_done``.
_UTTERANCE_DROPPED = frozenset({"queue_full", "overloaded", "queue_timeout", "closing"})


class GatewayError(Exception):
    """An ``error`` message from the gateway."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.category = _ERROR_CATEGORIES.get(code, ErrorCategory.UNKNOWN)


@dataclass
class _AudioContext:
    """What the gateway still owes one Pipecat audio context."""

    #: utterances sent and not yet ended by ``utterance_done``, in the order sent
    pending: list[str] = field(default_factory=list)
    #: no more text will come for it (its turn is complete)
    complete: bool = False


class VoiceGatewayTTSService(WebsocketTTSService):
    """Text-to-speech through the IVR voice gateway (``GET /v1/stream``).

    Example::

        tts = VoiceGatewayTTSService(
            url="ws://gateway:8080/v1/stream",
            token=os.environ["GATEWAY_TOKEN"],  # a JWT with scope tts:stream
            voice="en-us",
            sample_rate=16000,
        )
    """

    def __init__(
        self,
        *,
        url: str,
        token: str,
        voice: str = "en-us",
        sample_rate: int | None = None,
        keepalive_interval_s: float | None = 60.0,
        start_timeout_s: float = 10.0,
        settings: TTSSettings | None = None,
        **kwargs: Any,
    ) -> None:
        """Create the service; it connects when the pipeline sets it up.

        Args:
            url: The gateway's native endpoint, ``ws://host:port/v1/stream``.
            token: A gateway JWT with scope ``tts:stream``. The session ends when it
                expires: the service then reports an authentication error.
            voice: A voice of the gateway's ``GET /v1/voices`` (or a registered ``vc_...``
                voice). Changing it at run time (``TTSUpdateSettingsFrame``) opens a new
                session.
            sample_rate: Output rate, one of :data:`SUPPORTED_SAMPLE_RATES`; ``None``: the
                pipeline's ``audio_out_sample_rate``.
            keepalive_interval_s: Seconds between ``keepalive`` messages while nothing is
                being spoken; ``None`` sends none.
            start_timeout_s: How long to wait for ``ready`` after ``start``.
            settings: Runtime-updatable settings (``voice``); override ``voice``.
            **kwargs: Passed to Pipecat's ``WebsocketTTSService`` / ``TTSService``
                (``text_aggregation_mode``, ``text_transforms``, ``reconnect_on_error``, ...).
        """
        if sample_rate is not None and sample_rate not in SUPPORTED_SAMPLE_RATES:
            raise ValueError(f"sample_rate must be one of {SUPPORTED_SAMPLE_RATES}")
        default_settings = TTSSettings(model=None, voice=voice, language=None)
        if settings is not None:
            default_settings.apply_update(settings)
        super().__init__(
            sample_rate=sample_rate,
            push_start_frame=True,  # the base class opens each context with TTSStartedFrame
            push_stop_frames=False,  # this service ends each context on utterance_done
            settings=default_settings,
            **kwargs,
        )
        if self._is_streaming_tokens:
            logger.warning(
                f"{self}: with text_aggregation_mode=TOKEN every token becomes an utterance "
                "of its own; the gateway speaks whole sentences (the default) far better"
            )
        self._url = url
        self._token = token
        self._keepalive_interval_s = keepalive_interval_s
        self._start_timeout_s = start_timeout_s

        self._receive_task: asyncio.Task[None] | None = None
        self._session_id: str | None = None
        self._utterance_numbers = itertools.count(1)
        self._contexts: dict[str, _AudioContext] = {}
        self._utterance_contexts: dict[str, str] = {}  # utterance id -> audio context id
        self._playing_context: str | None = None  # whose frames are arriving now
        self._interrupted: list[str] = []  # utterances dropped by the current interruption

    @property
    def session_id(self) -> str | None:
        """The gateway's id for the current session (``ready.session_id``)."""
        return self._session_id

    def can_generate_metrics(self) -> bool:
        """Whether the service reports TTFB and usage metrics (it does)."""
        return True

    # --- connection --------------------------------------------------------------------

    # Pipecat's FrameProcessor narrows BaseObject.setup itself, hence the ignore.
    async def setup(self, setup: FrameProcessorSetup) -> None:  # type: ignore[override]
        """Learn the pipeline's output rate, then connect."""
        await super().setup(setup)
        if self.sample_rate not in SUPPORTED_SAMPLE_RATES:
            await self.push_error(
                error_msg=f"{self}: the gateway streams PCM at {SUPPORTED_SAMPLE_RATES} Hz, "
                f"not {self.sample_rate}",
                category=ErrorCategory.INVALID_REQUEST,
            )
            return
        await self._connect()

    async def _connect(self) -> None:
        await super()._connect()
        await self._connect_websocket()
        if self._websocket is not None and self._receive_task is None:
            self._receive_task = self.create_task(self._receive_task_handler(self._report_error))
        if self._keepalive_interval_s:
            self._create_keepalive_task(self._keepalive_interval_s)

    async def _disconnect(self) -> None:
        await super()._disconnect()
        await self._cancel_keepalive_task()
        if self._receive_task is not None:
            await self.cancel_task(self._receive_task)
            self._receive_task = None
        await self._disconnect_websocket()

    async def _connect_websocket(self) -> None:
        """Open the WebSocket and start a gateway session on it (``start`` -> ``ready``)."""
        if self._websocket is not None and self._websocket.state is State.OPEN:
            return
        websocket: ClientConnection | None = None
        try:
            logger.debug(f"{self}: connecting to {self._url}")
            websocket = await self._websocket_connect(
                self._url, additional_headers={"Authorization": f"Bearer {self._token}"}
            )
            ready = await self._start_session(websocket)
        except Exception as e:
            if websocket is not None:
                with contextlib.suppress(Exception):
                    await websocket.close()
            self._websocket = None
            category = e.category if isinstance(e, GatewayError) else None
            await self.push_error(
                error_msg=f"{self}: could not start a gateway session: {e}",
                exception=e,
                category=category,
            )
            await self._call_event_handler("on_connection_error", str(e))
            return
        # A new session: nothing the old one was asked to speak will come from it.
        self._contexts.clear()
        self._utterance_contexts.clear()
        self._playing_context = None
        self._session_id = ready.get("session_id")
        self._websocket = websocket
        logger.debug(f"{self}: gateway session {self._session_id} ready")
        await self._call_event_handler("on_connected")

    async def _start_session(self, websocket: ClientConnection) -> dict[str, Any]:
        start = {
            "type": "start",
            "voice": self._settings.voice,
            "format": f"pcm_{self.sample_rate}",
            "pacing": "burst",
        }
        await websocket.send(json.dumps(start))
        async with asyncio.timeout(self._start_timeout_s):
            async for message in websocket:
                event = json.loads(message) if isinstance(message, str) else {}
                if event.get("type") == "ready":
                    return dict(event)
                if event.get("type") == "error":
                    raise GatewayError(str(event.get("code")), str(event.get("message")))
        raise ConnectionError("the gateway closed the session before it was ready")

    async def _disconnect_websocket(self) -> None:
        try:
            await self.stop_all_metrics()
            if self._websocket is not None:
                logger.debug(f"{self}: closing gateway session {self._session_id}")
                await self._websocket.close()
        except Exception as e:
            logger.warning(f"{self}: error closing the WebSocket: {e}")
        finally:
            self._websocket = None
            self._playing_context = None
            await self._call_event_handler("on_disconnected")

    async def _send(self, message: dict[str, Any]) -> None:
        if self._websocket is None:
            raise ConnectionError("not connected to the gateway")
        await self._websocket.send(json.dumps(message))

    def _is_keepalive_ready(self) -> bool:
        # Only while idle: while an utterance is queued or playing the session is busy.
        return super()._is_keepalive_ready() and not self._utterance_contexts

    async def _send_keepalive(self) -> None:
        await self._send({"type": "keepalive"})

    # Pipecat's TTSService narrows AIService._update_settings itself, hence the ignore.
    async def _update_settings(self, delta: TTSSettings) -> dict[str, Any]:  # type: ignore[override]
        changed = await super()._update_settings(delta)
        if "voice" in changed and self._websocket is not None:
            # The voice is fixed when a session starts: start a new one.
            await self._disconnect()
            await self._connect()
        return changed

    # --- receiving ---------------------------------------------------------------------

    async def _receive_messages(self) -> None:
        if self._websocket is None:
            return
        async for message in self._websocket:
            if isinstance(message, bytes):
                await self._on_audio(message)
            else:
                await self._on_event(json.loads(message))

    async def _on_audio(self, audio: bytes) -> None:
        """One 20 ms frame of 16-bit mono PCM at the session's rate."""
        context_id = self._playing_context
        if context_id is None:
            return  # the rest of an utterance that was interrupted
        frame = TTSAudioRawFrame(audio, self.sample_rate, 1, context_id=context_id)
        await self.append_to_audio_context(context_id, frame)

    async def _on_event(self, event: dict[str, Any]) -> None:
        """One JSON message from the gateway."""
        kind = event.get("type")
        utterance_id = event.get("utterance_id")
        if kind == "utterance_started" and isinstance(utterance_id, str):
            self._playing_context = self._utterance_contexts.get(utterance_id)
        elif kind == "utterance_done" and isinstance(utterance_id, str):
            self._playing_context = None
            await self._end_utterance(utterance_id)
        elif kind == "error":
            await self._on_error(event)
        # cleared, flushed, mark, barge_in: nothing to do

    async def _on_error(self, event: dict[str, Any]) -> None:
        code = str(event.get("code"))
        message = str(event.get("message"))
        utterance_id = event.get("utterance_id")
        if code == "unknown_utterance":
            return  # a cancel that crossed its utterance's utterance_done
        if code == "idle_timeout":
            logger.info(f"{self}: the gateway closed the idle session; reconnecting")
            return
        if isinstance(utterance_id, str) and code in _UTTERANCE_DROPPED:
            await self._end_utterance(utterance_id)
        await self.push_error(
            error_msg=f"{self}: gateway error {code}: {message}",
            category=_ERROR_CATEGORIES.get(code, ErrorCategory.UNKNOWN),
        )

    async def _end_utterance(self, utterance_id: str) -> None:
        context_id = self._utterance_contexts.pop(utterance_id, None)
        context = self._contexts.get(context_id) if context_id is not None else None
        if context_id is None or context is None:
            return  # an utterance of an interrupted context
        if utterance_id in context.pending:
            context.pending.remove(utterance_id)
        await self._end_context_if_done(context_id)

    async def _end_context_if_done(self, context_id: str) -> None:
        context = self._contexts.get(context_id)
        if context is None or not context.complete or context.pending:
            return
        del self._contexts[context_id]
        await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
        await self.remove_audio_context(context_id)

    # --- synthesis ---------------------------------------------------------------------

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """Send ``text`` as one utterance; its audio arrives on the receive task."""
        if self._websocket is None or self._websocket.state is State.CLOSED:
            await self._connect()
        if context_id not in self._contexts:
            # Text outside a turn (a bare TextFrame) gets a context of its own, which
            # no more text will join.
            self._contexts[context_id] = _AudioContext(complete=context_id != self._turn_context_id)
        utterance_id = f"{context_id}.{next(self._utterance_numbers)}"
        try:
            await self._send({"type": "speak", "text": text, "utterance_id": utterance_id})
        except Exception as e:
            yield ErrorFrame(error=f"{self}: could not send text: {e}", exception=e)
            await self._end_context_if_done(context_id)
            return
        self._contexts[context_id].pending.append(utterance_id)
        self._utterance_contexts[utterance_id] = context_id
        await self.start_tts_usage_metrics(text)
        yield None  # audio comes through _receive_messages

    async def flush_audio(self, context_id: str | None = None) -> None:
        """The turn of ``context_id`` is complete: end its context once its audio is in.

        Each ``speak`` is sent with ``flush: true``, so there is nothing to flush at the
        gateway; this only tells the service that no more text will join the context.
        """
        context = self._contexts.get(context_id) if context_id is not None else None
        if context_id is None or context is None:
            return
        context.complete = True
        await self._end_context_if_done(context_id)

    # --- interruption ------------------------------------------------------------------

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        """Forget an interrupted context; :meth:`_handle_interruption` tells the gateway."""
        await self.stop_all_metrics()
        context = self._contexts.pop(context_id, None)
        if context is not None:
            for utterance_id in context.pending:
                self._utterance_contexts.pop(utterance_id, None)
                self._interrupted.append(utterance_id)
        if self._playing_context == context_id:
            self._playing_context = None
        await super().on_audio_context_interrupted(context_id)

    async def _handle_interruption(
        self, frame: InterruptionFrame, direction: FrameDirection
    ) -> None:
        await super()._handle_interruption(frame, direction)
        interrupted, self._interrupted = self._interrupted, []
        if not interrupted:
            return  # nothing was queued or playing at the gateway
        try:
            if self._utterance_contexts:
                # Uninterruptible speech is still queued: drop only what was interrupted.
                for utterance_id in interrupted:
                    await self._send({"type": "cancel", "utterance_id": utterance_id})
            else:
                await self._send({"type": "clear"})
        except Exception as e:
            logger.warning(f"{self}: could not stop the gateway's audio: {e}")
