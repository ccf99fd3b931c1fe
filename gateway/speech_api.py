"""``POST /v1/audio/speech``: OpenAI's speech endpoint, so that the official ``openai``
package (``client.audio.speech.with_streaming_response.create``) works against the gateway
with nothing changed but ``base_url`` and the key (the gateway's JWT, as a bearer token).

The request is OpenAI's: ``model`` (any name: the voice decides the backend), ``input``
(at most :data:`MAX_INPUT_CHARS`), ``voice`` (a voice of ``GET /v1/voices``, a registered
one, or one of OpenAI's names, which speak with the engine's default voice),
``response_format`` (``mp3`` by default, ``opus``, ``wav``, ``pcm``; see
:mod:`gateway.speech_formats`), ``speed`` (0.25 to 4). ``instructions`` and
``stream_format: "sse"`` are refused: no backend here takes free-form instructions yet.

The answer streams as it is synthesized (chunked transfer encoding), as fast as the
engine produces it, with backpressure: a client that reads slowly holds the session's
pacing (about :data:`MAX_BUFFERED_FRAMES` frames wait, plus at most what one pump takes
from the engine's ring), not the worker's memory. The
session is an ordinary one (protocol ``openai``): tenant limits, admission control and
the drain apply. Errors before the first audio are HTTP errors in OpenAI's shape
(``{"error": {"message", "type", "param", "code"}}``: 400, 401, 403, 413, 429, 503 with
``Retry-After``); after it, a failure ends the stream without its final chunk, which every
HTTP client reports as an incomplete body.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any, Final

import msgspec
from aiohttp import web

from gateway.auth import AuthError, token_from_request
from gateway.errors import ErrorCode, SessionError
from gateway.events import ErrorEvent, SessionEvent
from gateway.peer_log import PeerLog
from gateway.session import Session, StartOptions
from gateway.speech_formats import SPEECH_FORMATS, SpeechFormat
from gateway.state import STATE_KEY, GatewayState
from gateway.tenant_quota import quota_for

log = logging.getLogger(__name__)
_auth_log = PeerLog(log, "speech API")

SCOPE: Final = "tts:stream"
MAX_BODY_BYTES: Final = 64 * 1024
MAX_INPUT_CHARS: Final = 4096  # OpenAI's limit
#: Frames queued for a slow reader before the session stops producing (2 s of audio;
#: one pump may add what the engine's ring holds, a few seconds more).
MAX_BUFFERED_FRAMES: Final = 100
#: Burst pacing's lead for a speech request: in effect none (see MAX_BUFFERED_FRAMES).
UNLIMITED_LEAD_S: Final = 24 * 3600.0
#: No audio for this long while synthesis should be running: the request fails.
STALL_TIMEOUT_S: Final = 30.0
#: OpenAI's built-in voice names: they speak with the engine's default voice.
OPENAI_VOICES: Final = frozenset(
    {"alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer",
     "verse", "marin", "cedar"}
)  # fmt: skip
_SENTENCE_END = re.compile(r"(?<=[.!?。！？;；])\s+")


class SpeechRequest(msgspec.Struct, forbid_unknown_fields=False):
    model: str
    input: str
    voice: str | dict[str, Any]
    response_format: str = "mp3"
    speed: float = 1.0
    instructions: str | None = None
    stream_format: str | None = None
    # Zero retention (DESIGN.md section 8): false keeps none of this speech in the cache.
    cache: bool | None = None


class _BadRequest(Exception):
    def __init__(self, message: str, param: str | None, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


def openai_error(
    status: int, message: str, *, code: str, param: str | None = None, retry_after_s: int = 0
) -> web.Response:
    kind = "invalid_request_error" if status < 500 and status != 429 else "server_error"
    if status == 429:
        kind = "rate_limit_error"
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s else None
    return web.json_response(
        {"error": {"message": message, "type": kind, "param": param, "code": code}},
        status=status,
        headers=headers,
    )


def parse_request(body: bytes) -> tuple[SpeechRequest, SpeechFormat, str]:
    """The request, its format and its voice name; raises :class:`_BadRequest`."""
    try:
        request = msgspec.json.decode(body, type=SpeechRequest)
    except msgspec.ValidationError as exc:
        raise _BadRequest(f"invalid request: {exc}", None) from None
    except (msgspec.DecodeError, RecursionError):
        raise _BadRequest("the body is not JSON", None) from None
    if not request.input.strip():
        raise _BadRequest("input is empty", "input")
    if len(request.input) > MAX_INPUT_CHARS:
        raise _BadRequest(f"input is over {MAX_INPUT_CHARS} characters", "input")
    if not 0 < len(request.model) <= 128:
        raise _BadRequest("model must be 1 to 128 characters", "model")
    if not 0.25 <= request.speed <= 4.0:
        raise _BadRequest("speed must be from 0.25 to 4", "speed")
    if request.instructions:
        raise _BadRequest(
            "instructions are not supported by this gateway's voices", "instructions",
            "instruct_unsupported",
        )  # fmt: skip
    if request.stream_format not in (None, "audio"):
        raise _BadRequest("only stream_format 'audio' is supported", "stream_format")
    fmt = SPEECH_FORMATS.get(request.response_format)
    if fmt is None:
        raise _BadRequest(
            f"response_format must be one of {sorted(SPEECH_FORMATS)}", "response_format",
            ErrorCode.UNSUPPORTED_FORMAT,
        )  # fmt: skip
    voice = request.voice.get("id") if isinstance(request.voice, dict) else request.voice
    if not isinstance(voice, str) or not 0 < len(voice) <= 128:
        raise _BadRequest('voice must be a voice name (or {"id": name})', "voice")
    return request, fmt, voice


def split_input(text: str, limit: int) -> list[str]:
    """``text`` in pieces of at most ``limit`` characters, cut after sentences where it
    can, else between words, else anywhere."""
    pieces: list[str] = []
    current = ""
    for sentence in _SENTENCE_END.split(text.strip()):
        while len(sentence) > limit:
            cut = sentence.rfind(" ", 0, limit)
            cut = cut if cut > 0 else limit
            pieces.append(sentence[:cut])
            sentence = sentence[cut:].lstrip()
        if current and len(current) + 1 + len(sentence) > limit:
            pieces.append(current)
            current = ""
        current = f"{current} {sentence}" if current else sentence
    if current:
        pieces.append(current)
    return [p for p in pieces if p.strip()]


class _SpeechPeer:
    """The session's peer: frames into a bounded queue the response drains."""

    def __init__(self) -> None:
        self.frames: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.error: ErrorEvent | None = None

    def send_audio(self, frame: bytes) -> None:
        self.frames.put_nowait(frame)

    def send_event(self, event: SessionEvent) -> None:
        if isinstance(event, ErrorEvent) and self.error is None:
            self.error = event

    def backlogged(self) -> bool:
        return self.frames.qsize() >= MAX_BUFFERED_FRAMES

    def on_interrupt(self) -> None:
        return None


class _SpeechRequestConnection:
    """What the drain sees of one request (``gateway.connections.Connection``)."""

    def __init__(self, session: Session) -> None:
        self.session = session

    @property
    def established(self) -> bool:
        return self.session.started


def _status_for(error: SessionError) -> int:
    if error.code in (ErrorCode.UNKNOWN_VOICE, ErrorCode.INVALID_SPEED, ErrorCode.TEXT_TOO_LONG):
        return 400
    if error.code is ErrorCode.TENANT_LIMIT:
        return 429
    if error.code in (
        ErrorCode.OVERLOADED,
        ErrorCode.QUEUE_TIMEOUT,
        ErrorCode.QUEUE_FULL,
        ErrorCode.ENGINE_UNAVAILABLE,
        ErrorCode.SHUTTING_DOWN,
        ErrorCode.LIMITS_UNAVAILABLE,
        ErrorCode.CLOSING,
    ):
        return 503
    return 500


def _session_error(error: SessionError) -> web.Response:
    status = _status_for(error)
    retry = -(-(error.retry_after_ms or 0) // 1000) or (1 if status in (429, 503) else 0)
    param = "voice" if error.code is ErrorCode.UNKNOWN_VOICE else None
    return openai_error(status, error.message, code=error.code, param=param, retry_after_s=retry)


async def create_speech(request: web.Request) -> web.StreamResponse:
    state: GatewayState = request.app[STATE_KEY]
    try:
        who = state.verify(token_from_request(request.headers, request.query), SCOPE)
    except AuthError as exc:
        _auth_log.info("auth failed: %s", exc.code)
        return openai_error(exc.http_status, exc.message, code=exc.code)
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        return openai_error(413, f"the body is over {MAX_BODY_BYTES} bytes", code="too_large")
    try:
        body = await request.content.read(MAX_BODY_BYTES + 1)
        if len(body) > MAX_BODY_BYTES:
            return openai_error(413, f"the body is over {MAX_BODY_BYTES} bytes", code="too_large")
        speech, fmt, voice_name = parse_request(body)
    except _BadRequest as exc:
        return openai_error(400, exc.message, code=exc.code, param=exc.param)
    if state.connections.draining:
        return openai_error(
            503, "this gateway instance is shutting down", code="shutting_down", retry_after_s=1
        )
    peer = _SpeechPeer()
    # Burst without a lead limit: as fast as the engine goes and the client reads (the
    # peer's backlog bound is the backpressure).
    session = state.new_session(peer, "openai", quota_for(who), burst_lead_s=UNLIMITED_LEAD_S)
    connection = _SpeechRequestConnection(session)
    state.connections.track(connection)
    state.metrics.sessions_total.labels(protocol="openai").inc()
    state.metrics.sessions_active.labels(protocol="openai").inc()
    try:
        return await _synthesize(request, state, session, peer, speech, fmt, voice_name)
    finally:
        try:
            await session.aclose("request done")
        finally:
            state.connections.untrack(connection)
            state.metrics.sessions_active.labels(protocol="openai").dec()


async def _synthesize(
    request: web.Request,
    state: GatewayState,
    session: Session,
    peer: _SpeechPeer,
    speech: SpeechRequest,
    fmt: SpeechFormat,
    voice_name: str,
) -> web.StreamResponse:
    if voice_name in OPENAI_VOICES:
        voice_name = state.engine.default_voice
    try:
        voice, profile, digest = await state.resolve_voice(session.tenant or "", voice_name)
        await session.start(
            StartOptions(
                voice=voice,
                format=fmt.engine_format,
                speed=speech.speed,
                pacing="burst",
                voice_profile=profile,
                cache=speech.cache,
                voice_digest=digest,
            )
        )
        for piece in split_input(speech.input, state.session_limits().max_text_chars):
            session.speak(piece)
        session.request_close()  # finish what is queued, then end
    except SessionError as exc:
        log.info("speech request refused: %s", exc.code)
        return _session_error(exc)
    session.done.add_done_callback(lambda _done: peer.frames.put_nowait(None))
    encoder = fmt.encoder()
    first = await _next_frame(peer)
    error = peer.error
    if first is None or error is not None:  # nothing sent yet: an HTTP error still fits
        if error is not None:
            code = _error_code(str(error.code)) or ErrorCode.ENGINE_ERROR
            return _session_error(SessionError(code, error.message))
        ended = session.done.result()[1] if session.done.done() else ""
        if not _ended_normally(session) and _error_code(ended) is not None:
            return _session_error(SessionError(ErrorCode(ended), "the session ended early"))
        return openai_error(500, "the engine produced no audio", code=ErrorCode.ENGINE_ERROR)
    response = web.StreamResponse(headers={"Content-Type": fmt.content_type})
    response.enable_chunked_encoding()
    try:
        await response.prepare(request)
        await response.write(encoder.start() + encoder.encode(first))
        frames = 1
        while True:
            frame = await _next_frame(peer)
            if peer.error is not None or (frame is None and not _ended_normally(session)):
                reason = peer.error.code if peer.error is not None else "stalled or closed"
                log.warning("speech request: ended after %d frames: %s", frames, reason)
                if request.transport is not None:
                    request.transport.abort()  # no final chunk: the client sees a cut body
                return response
            if frame is None:
                break
            chunk = encoder.encode(frame)
            if chunk:
                await response.write(chunk)
            frames += 1
        tail = encoder.end()
        if tail:
            await response.write(tail)
        await response.write_eof()
    except ConnectionError:  # the client went away: its session is released all the same
        log.info("speech request: the client left")
    return response


async def _next_frame(peer: _SpeechPeer) -> bytes | None:
    """The next frame; None at the end (or when nothing came for STALL_TIMEOUT_S)."""
    try:
        async with asyncio.timeout(STALL_TIMEOUT_S):
            return await peer.frames.get()
    except TimeoutError:
        return None


def _error_code(name: str) -> ErrorCode | None:
    try:
        return ErrorCode(name)
    except ValueError:
        return None


def _ended_normally(session: Session) -> bool:
    if not session.done.done():
        return False  # stalled
    code, _reason = session.done.result()
    return bool(code == 1000)


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/audio/speech", create_speech)


__all__ = ["add_routes", "create_speech", "openai_error", "parse_request", "split_input"]
