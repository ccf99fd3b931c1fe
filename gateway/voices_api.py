"""``/v1/voices``: list, register, inspect and delete voices (JSON, JWT).

Reading needs scope ``tts:stream``; registering and deleting need ``voices:write``. A
tenant never sees, uses or deletes another tenant's voice: such ids answer 404, exactly
like ids that do not exist.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import BodyPartReader, web

from engine.schema import VoiceInfo
from gateway.auth import AuthError, Principal
from gateway.reference_audio import MAX_UPLOAD_BYTES, ReferenceAudioError
from gateway.state import STATE_KEY, GatewayState
from gateway.voice_store import VoiceRecord
from gateway.voices import VoiceError

log = logging.getLogger(__name__)
READ_SCOPE = "tts:stream"
WRITE_SCOPE = "voices:write"
MAX_FIELD_BYTES = 4096


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


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


def _auth(state: GatewayState, request: web.Request, scope: str) -> Principal | web.Response:
    try:
        return state.authenticate(request, scope)
    except AuthError as exc:
        return _error(exc.http_status, exc.code, exc.message)


async def list_voices(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    who = _auth(state, request, READ_SCOPE)
    if isinstance(who, web.Response):
        return who
    if not state.voices:
        return _error(503, "engine_unavailable", "the TTS engine is not ready")
    voices = [builtin_json(v) for v in state.voices]
    try:
        voices += [record_json(r) for r in await state.registry.list(who.tenant)]
    except VoiceError as exc:
        return _error(exc.status, exc.code, exc.message)
    return web.json_response({"voices": voices})


async def get_voice(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    who = _auth(state, request, READ_SCOPE)
    if isinstance(who, web.Response):
        return who
    voice_id = request.match_info["voice_id"]
    builtin = next((v for v in state.voices if v.id == voice_id), None)
    if builtin is not None:
        return web.json_response(builtin_json(builtin))
    try:
        record = await state.registry.get(who.tenant, voice_id)
    except VoiceError as exc:
        return _error(exc.status, exc.code, exc.message)
    if record is None:
        return _error(404, "unknown_voice", "no such voice")
    return web.json_response(record_json(record))


async def delete_voice(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    who = _auth(state, request, WRITE_SCOPE)
    if isinstance(who, web.Response):
        return who
    try:
        deleted = await state.registry.delete(who.tenant, request.match_info["voice_id"])
    except VoiceError as exc:
        return _error(exc.status, exc.code, exc.message)
    if not deleted:
        return _error(404, "unknown_voice", "no such voice")
    return web.Response(status=204)


async def _read_text(part: BodyPartReader) -> str:
    data = await part.read_chunk(MAX_FIELD_BYTES + 1)
    if len(data) > MAX_FIELD_BYTES:
        raise VoiceError("invalid_field", f"field {part.name} too long", 400)
    return data.decode("utf-8", errors="replace").strip()


async def register_voice(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    who = _auth(state, request, WRITE_SCOPE)
    if isinstance(who, web.Response):
        return who
    if request.content_length is not None and request.content_length > MAX_UPLOAD_BYTES + 65536:
        return _error(413, "audio_too_large", f"uploads are limited to {MAX_UPLOAD_BYTES} bytes")
    if not request.content_type.startswith("multipart/"):
        return _error(400, "invalid_request", "send multipart/form-data with an 'audio' file")
    fields: dict[str, str] = {}
    audio: bytes | None = None
    try:
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader):
                continue
            if part.name == "audio":
                chunks = bytearray()
                while chunk := await part.read_chunk(65536):
                    chunks += chunk
                    if len(chunks) > MAX_UPLOAD_BYTES:
                        return _error(
                            413, "audio_too_large", f"audio is limited to {MAX_UPLOAD_BYTES} bytes"
                        )
                audio = bytes(chunks)
            elif part.name in ("name", "language", "transcript"):
                fields[part.name] = await _read_text(part)
        if audio is None:
            return _error(400, "invalid_request", "the 'audio' file field is missing")
        record = await state.registry.register(
            who.tenant,
            audio,
            name=fields.get("name") or None,
            language=fields.get("language") or None,
            transcript=fields.get("transcript") or None,
        )
    except ReferenceAudioError as exc:
        state.metrics.errors.labels(code=exc.code).inc()
        return _error(exc.http_status, exc.code, exc.message)
    except VoiceError as exc:
        state.metrics.errors.labels(code=exc.code).inc()
        return _error(exc.status, exc.code, exc.message)
    except ValueError as exc:  # malformed multipart
        log.info("bad voice upload: %s", exc)
        return _error(400, "invalid_request", "malformed multipart body")
    return web.json_response(record_json(record), status=201)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/voices", list_voices)
    app.router.add_post("/v1/voices", register_voice)
    app.router.add_get("/v1/voices/{voice_id}", get_voice)
    app.router.add_delete("/v1/voices/{voice_id}", delete_voice)
