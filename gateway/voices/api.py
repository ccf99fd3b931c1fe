"""``/v1/voices``: list, register, inspect and delete voices (JSON, JWT).

Reading needs scope ``tts:stream``; registering and deleting need ``voices:write``. A
tenant never sees, uses or deletes another tenant's voice: such ids answer 404, exactly
like ids that do not exist (and like ids of the wrong shape, which never reach the store).

Uploads (:func:`register_voice`) never decode audio in this process and never hold an
upload in memory: at most ``settings.max_uploads`` at a time per gateway worker (429
beyond, before the body is read), the body bounded (:data:`MAX_BODY_BYTES`) and timed
(``settings.upload_timeout_s``), the ``audio`` part streamed to a temporary file that a
worker process decodes (:mod:`gateway.voices.upload_worker`). Every refusal is a JSON error
with a code; nothing else (no stack trace) reaches the client.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol, cast

from aiohttp import BodyPartReader, HttpVersion11, MultipartReader, StreamReader, hdrs, web
from aiohttp.http_exceptions import HttpProcessingError

from engine.ipc.schema import VoiceInfo
from gateway.auth import Principal
from gateway.errors import ErrorCode
from gateway.http_errors import authenticate, json_error
from gateway.peer_log import PeerLog
from gateway.voices.reference_audio import MAX_UPLOAD_BYTES, ReferenceAudio, ReferenceAudioError
from gateway.voices.registry import VoiceError
from gateway.voices.store import VoiceRecord
from gateway.voices.upload_worker import UploadWorkerError, UploadWorkers

if TYPE_CHECKING:
    from gateway.config import GatewaySettings
    from gateway.metrics import GatewayMetrics
    from gateway.voices.registry import VoiceRegistry

log = logging.getLogger(__name__)
_auth_log = PeerLog(log, "voices API")  # anyone can fail auth: rate-limited
READ_SCOPE = "tts:stream"
WRITE_SCOPE = "voices:write"
#: How long a worker may take to decode and normalize one upload (decoding stops after
#: 120 s of audio, which takes a few seconds): beyond it, 503 upload_unavailable.
PROCESSING_TIMEOUT_S = 60.0
MAX_FIELD_BYTES = 4096
MAX_BODY_BYTES: Final = MAX_UPLOAD_BYTES + 64 * 1024  # the whole multipart body
MAX_PART_HEADERS: Final = 16
UPLOAD_CHUNK_BYTES: Final = 64 * 1024
TEXT_FIELDS: Final = ("name", "language", "transcript")


class EngineVoices(Protocol):
    """The engine's built-in voices, as its handshake listed them."""

    @property
    def voices(self) -> tuple[VoiceInfo, ...]: ...


class VoicesContext(Protocol):
    """What the voices API uses of a gateway worker (the worker's state satisfies it):
    token checks, the engine's voices, the registry, the error counter and the upload
    limits. Handed to :func:`add_routes`, so this folder imports nothing at the root that
    leads back into it."""

    @property
    def settings(self) -> GatewaySettings: ...

    @property
    def metrics(self) -> GatewayMetrics: ...

    @property
    def engine(self) -> EngineVoices: ...

    @property
    def registry(self) -> VoiceRegistry: ...

    def verify(self, token: str | None, scope: str) -> Principal: ...


CONTEXT_KEY: Final = web.AppKey("voices_context", VoicesContext)


def builtin_json(voice: VoiceInfo) -> dict[str, Any]:
    return {
        "id": voice.id,
        "language": voice.language,
        "name": voice.name,
        "gender": voice.gender,
        "backend": voice.backend,
        "kind": "builtin",
    }


def record_json(record: VoiceRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "name": record.name,
        "language": record.language,
        "duration_ms": record.duration_ms,
        "kind": "cloned",
        "base_voice": record.base_voice,
        "created_at": record.created_at,
    }


def _auth(state: VoicesContext, request: web.Request, scope: str) -> Principal | web.Response:
    return authenticate(state.verify, request, scope, _auth_log)


async def list_voices(request: web.Request) -> web.Response:
    state = request.app[CONTEXT_KEY]
    who = _auth(state, request, READ_SCOPE)
    if isinstance(who, web.Response):
        return who
    if not state.engine.voices:
        return json_error(503, ErrorCode.ENGINE_UNAVAILABLE, "the TTS engine is not ready")
    voices = [builtin_json(v) for v in state.engine.voices]
    try:
        voices += [record_json(r) for r in await state.registry.list(who.tenant)]
    except VoiceError as exc:
        return json_error(exc.status, exc.code, exc.message)
    return web.json_response({"voices": voices})


async def get_voice(request: web.Request) -> web.Response:
    state = request.app[CONTEXT_KEY]
    who = _auth(state, request, READ_SCOPE)
    if isinstance(who, web.Response):
        return who
    voice_id = request.match_info["voice_id"]
    builtin = next((v for v in state.engine.voices if v.id == voice_id), None)
    if builtin is not None:
        return web.json_response(builtin_json(builtin))
    try:
        record = await state.registry.get(who.tenant, voice_id)
    except VoiceError as exc:
        return json_error(exc.status, exc.code, exc.message)
    if record is None:
        return json_error(404, ErrorCode.UNKNOWN_VOICE, "no such voice")
    return web.json_response(record_json(record))


async def delete_voice(request: web.Request) -> web.Response:
    state = request.app[CONTEXT_KEY]
    who = _auth(state, request, WRITE_SCOPE)
    if isinstance(who, web.Response):
        return who
    try:
        deleted = await state.registry.delete(who.tenant, request.match_info["voice_id"])
    except VoiceError as exc:
        return json_error(exc.status, exc.code, exc.message)
    if not deleted:
        return json_error(404, ErrorCode.UNKNOWN_VOICE, "no such voice")
    return web.Response(status=204)


class _Refusal(Exception):
    """An upload refused at the HTTP boundary: status, ``code`` and ``message`` for the
    client; ``close`` ends the connection after the answer (``Connection: close``)."""

    def __init__(self, status: int, code: str, message: str, *, close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.close = close


class _BoundedBody:
    """The request body as :class:`MultipartReader` reads it, never past ``limit`` bytes.

    Every read checks how many bytes of the body have arrived so far (preamble, part
    headers, boundaries and epilogue included) and raises ``request_too_large`` (413)
    beyond ``limit``: however the body is split into parts, no more is read.
    """

    def __init__(self, content: StreamReader, limit: int) -> None:
        self._content = content
        self._limit = limit

    def _check(self) -> None:
        if self._content.total_bytes > self._limit:
            raise _Refusal(
                413, ErrorCode.REQUEST_TOO_LARGE, f"the request body is over {self._limit} bytes"
            )

    async def readline(self, *, max_line_length: int | None = None) -> bytes:
        line = await self._content.readline(max_line_length=max_line_length)
        self._check()
        return line

    async def read(self, n: int = -1) -> bytes:
        data = await self._content.read(n)
        self._check()
        return data

    def at_eof(self) -> bool:
        return self._content.at_eof()

    def unread_data(self, data: bytes) -> None:
        with warnings.catch_warnings():  # deprecated, and what MultipartReader uses
            warnings.simplefilter("ignore", DeprecationWarning)
            self._content.unread_data(data)


class _Spool:
    """The ``audio`` part on its way to a private temporary file (mode 0600).

    Chunks are written as they arrive, so gateway memory holds at most one chunk of an
    upload. Writes go to the page cache and take microseconds, so they are made from the
    event loop. :meth:`remove` (always, in a ``finally``) deletes the file.
    """

    def __init__(self) -> None:
        fd, name = tempfile.mkstemp(prefix="voice-upload-")
        self._fd: int | None = fd
        self.path = Path(name)
        self.size = 0

    def write(self, chunk: bytes) -> None:
        assert self._fd is not None
        view = memoryview(chunk)
        while view:
            view = view[os.write(self._fd, view) :]
        self.size += len(chunk)

    def finish(self) -> None:
        """Close the file (its content is complete); it stays until :meth:`remove`."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def remove(self) -> None:
        self.finish()
        self.path.unlink(missing_ok=True)


@dataclass
class _UploadSlots:
    """Uploads in progress in this gateway worker, from the first byte to the answer."""

    taken: int = 0

    def try_take(self, limit: int) -> bool:
        if self.taken >= limit:
            return False
        self.taken += 1
        return True

    def give_back(self) -> None:
        self.taken -= 1


UPLOAD_WORKERS_KEY = web.AppKey("upload_workers", UploadWorkers)
_UPLOAD_SLOTS_KEY = web.AppKey("upload_slots", _UploadSlots)


def _field_label(name: str | None) -> str:
    return "a part without a name" if name is None else repr(name[:40])


async def _read_text(part: BodyPartReader) -> str:
    data = bytearray()
    while chunk := await part.read_chunk(UPLOAD_CHUNK_BYTES):
        data += chunk
        if len(data) > MAX_FIELD_BYTES:
            raise VoiceError(ErrorCode.INVALID_FIELD, f"field {part.name} too long", 400)
    return data.decode("utf-8", errors="replace").strip()


async def _receive(request: web.Request, spool: _Spool) -> dict[str, str]:
    """Read the multipart body: the ``audio`` part into ``spool``, the text fields
    returned. Raises :class:`_Refusal`, :class:`VoiceError`, or what a malformed body
    raises in aiohttp (``ValueError``, ``RuntimeError``, ``HttpProcessingError``)."""
    reader = MultipartReader(
        request.headers,
        cast(StreamReader, _BoundedBody(request.content, MAX_BODY_BYTES)),
        client_max_size=MAX_UPLOAD_BYTES,
        max_headers=MAX_PART_HEADERS,
    )
    fields: dict[str, str] = {}
    seen_audio = False
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader):
            raise _Refusal(
                400, ErrorCode.INVALID_REQUEST, "nested multipart parts are not accepted"
            )
        if part.name == "audio":
            if seen_audio:
                raise _Refusal(400, ErrorCode.INVALID_REQUEST, "more than one 'audio' part")
            seen_audio = True
            while chunk := await part.read_chunk(UPLOAD_CHUNK_BYTES):
                if spool.size + len(chunk) > MAX_UPLOAD_BYTES:
                    raise _Refusal(
                        413,
                        ErrorCode.AUDIO_TOO_LARGE,
                        f"audio is limited to {MAX_UPLOAD_BYTES} bytes",
                    )
                try:
                    spool.write(chunk)
                except OSError as exc:
                    log.error("cannot spool a voice upload to %s: %s", spool.path, exc)
                    raise _Refusal(
                        503,
                        ErrorCode.UPLOAD_UNAVAILABLE,
                        "the upload cannot be stored for processing",
                    ) from None
        elif part.name in TEXT_FIELDS:
            if part.name in fields:
                raise _Refusal(400, ErrorCode.INVALID_REQUEST, f"more than one {part.name!r} part")
            fields[part.name] = await _read_text(part)
        else:
            raise _Refusal(
                400,
                ErrorCode.INVALID_REQUEST,
                f"unknown field {_field_label(part.name)}: send 'audio' and optionally "
                + ", ".join(repr(f) for f in TEXT_FIELDS),
            )
    if not seen_audio:
        raise _Refusal(400, ErrorCode.INVALID_REQUEST, "the 'audio' file field is missing")
    spool.finish()
    return fields


def _refused(state: VoicesContext, exc: _Refusal) -> web.Response:
    state.metrics.errors.labels(code=exc.code).inc()
    response = json_error(exc.status, exc.code, exc.message)
    if exc.close:
        response.force_close()
    return response


def _too_many_uploads(state: VoicesContext) -> web.Response:
    retry_after_ms = state.settings.retry_after_ms
    state.metrics.errors.labels(code=ErrorCode.TOO_MANY_UPLOADS).inc()
    return web.json_response(
        {
            "error": {
                "code": ErrorCode.TOO_MANY_UPLOADS,
                "message": "too many voice uploads in progress; try again later",
                "retry_after_ms": retry_after_ms,
            }
        },
        status=429,
        headers={"Retry-After": str(math.ceil(retry_after_ms / 1000))},
    )


def _before_body(request: web.Request) -> Principal | web.Response:
    """The uploader, or the answer to give without reading the body: bad credentials
    (401/403), a ``Content-Length`` over the limit (413), not multipart (400)."""
    state = request.app[CONTEXT_KEY]
    who = _auth(state, request, WRITE_SCOPE)
    if isinstance(who, web.Response):
        return who
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        return json_error(
            413, ErrorCode.AUDIO_TOO_LARGE, f"uploads are limited to {MAX_UPLOAD_BYTES} bytes"
        )
    if not request.content_type.startswith("multipart/"):
        return json_error(
            400, ErrorCode.INVALID_REQUEST, "send multipart/form-data with an 'audio' file"
        )
    return who


async def _expect_continue(request: web.Request) -> web.Response | None:
    """``Expect: 100-continue`` on ``POST /v1/voices``: a client that asks before sending
    its body (curl does, for large bodies) gets the refusal instead of ``100 Continue``
    when the upload would be refused before its body is read (see :func:`register_voice`),
    and then never sends the body. Otherwise as aiohttp's default: 100 Continue, or 417
    for another expectation."""
    if request.version != HttpVersion11:
        return None
    if request.headers.get(hdrs.EXPECT, "").lower() != "100-continue":
        return json_error(
            417, ErrorCode.INVALID_REQUEST, "only 'Expect: 100-continue' is understood"
        )
    checked = _before_body(request)
    if isinstance(checked, web.Response):
        return checked
    state = request.app[CONTEXT_KEY]
    if request.app[_UPLOAD_SLOTS_KEY].taken >= state.settings.max_uploads:
        return _too_many_uploads(state)
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0  # the response proper has not started
    return None


async def register_voice(request: web.Request) -> web.Response:
    """``POST /v1/voices``: multipart ``audio`` (+ ``name``, ``language``, ``transcript``).

    Refused before the body is read: bad credentials (401/403), a ``Content-Length`` over
    the limit (413), not multipart (400), and ``settings.max_uploads`` uploads already
    in progress in this worker (429 ``too_many_uploads`` with ``retry_after_ms`` and
    ``Retry-After``). The body must arrive within ``settings.upload_timeout_s`` (else 408
    ``upload_timeout``) and is at most :data:`MAX_BODY_BYTES` (413); the ``audio`` part
    is streamed to a temporary file, removed when the answer is ready, and decoded in a
    worker process (:class:`gateway.voices.upload_worker.UploadWorkers`), never in this one.
    A refused body that is still coming is read and dropped by aiohttp (its lingering
    time), so that the client sees the answer rather than a reset connection.
    """
    who = _before_body(request)
    if isinstance(who, web.Response):
        return who
    state = request.app[CONTEXT_KEY]
    slots = request.app[_UPLOAD_SLOTS_KEY]
    if not slots.try_take(state.settings.max_uploads):
        return _too_many_uploads(state)
    spool: _Spool | None = None
    try:
        spool = _Spool()
        try:
            async with asyncio.timeout(state.settings.upload_timeout_s):
                fields = await _receive(request, spool)
        except TimeoutError:
            raise _Refusal(
                408,
                ErrorCode.UPLOAD_TIMEOUT,
                f"the upload did not arrive within {state.settings.upload_timeout_s:g} s",
                close=True,
            ) from None
        except (ValueError, RuntimeError, EOFError, ConnectionError, HttpProcessingError) as exc:
            log.info("bad voice upload: %s", exc)
            raise _Refusal(400, ErrorCode.INVALID_REQUEST, "malformed multipart body") from None
        workers = request.app[UPLOAD_WORKERS_KEY]
        path = spool.path

        async def normalized() -> ReferenceAudio:
            try:
                async with asyncio.timeout(PROCESSING_TIMEOUT_S):
                    return await workers.process(path)
            except TimeoutError:
                raise UploadWorkerError("decoding the upload took too long") from None

        record = await state.registry.register(
            who.tenant,
            normalized,
            name=fields.get("name") or None,
            language=fields.get("language") or None,
            transcript=fields.get("transcript") or None,
        )
    except _Refusal as exc:
        return _refused(state, exc)
    except ReferenceAudioError as exc:
        state.metrics.errors.labels(code=exc.code).inc()
        return json_error(exc.http_status, exc.code, exc.message)
    except VoiceError as exc:
        state.metrics.errors.labels(code=exc.code).inc()
        return json_error(exc.status, exc.code, exc.message)
    except UploadWorkerError as exc:
        log.error("voice upload not processed: %s", exc)
        return _refused(
            state, _Refusal(503, ErrorCode.UPLOAD_UNAVAILABLE, "the upload could not be processed")
        )
    except OSError as exc:  # the temporary file could not be made, or read by the worker
        log.error("voice upload not processed: %s", exc)
        return _refused(
            state, _Refusal(503, ErrorCode.UPLOAD_UNAVAILABLE, "the upload was not processed")
        )
    except Exception:
        log.exception("voice upload failed")
        return _refused(state, _Refusal(500, ErrorCode.INTERNAL_ERROR, "the upload failed"))
    finally:
        if spool is not None:
            spool.remove()
        slots.give_back()
    return web.json_response(record_json(record), status=201)


def add_routes(app: web.Application, context: VoicesContext) -> None:
    """Route ``/v1/voices``, served from ``context``. The application must also hold
    :data:`UPLOAD_WORKERS_KEY`."""
    app[CONTEXT_KEY] = context
    app[_UPLOAD_SLOTS_KEY] = _UploadSlots()
    app.router.add_get("/v1/voices", list_voices)
    app.router.add_post("/v1/voices", register_voice, expect_handler=_expect_continue)
    app.router.add_get("/v1/voices/{voice_id}", get_voice)
    app.router.add_delete("/v1/voices/{voice_id}", delete_voice)
