"""``/v1/speech-cache/prompts``: warm, list, inspect and forget a tenant's warm prompts.

Authenticated like the voices API (a JWT with scope ``tts:stream``: whoever may speak may
warm what they will speak); errors are JSON ``{"error": {"code", "message"}}`` with the
project's codes (docs/protocol.md):

- ``POST /v1/speech-cache/prompts`` ``{text, voice, speed?, language?, instruct?,
  format?}``: queued for the caller's tenant, 202 ``{"prompt": {...}}`` (``state``
  ``pending``; the same prompt again answers the same id). The voice is resolved now with
  the voices registry's permission check: a registered voice of another tenant is 404
  ``unknown_voice``, exactly like one that does not exist.
- ``GET /v1/speech-cache/prompts``: ``{"prompts": [...]}``, the tenant's own and the
  shared ones (the prompts file's and the SIP flows', in built-in voices).
- ``GET /v1/speech-cache/prompts/{id}``: the prompt and, asked of the engine now
  (CheckPrompt), its ``segments`` ``[{"text", "levels"}]`` (``levels``: ``memory``,
  ``shared``; empty: not cached) and ``cached`` (every segment held somewhere).
- ``DELETE /v1/speech-cache/prompts/{id}``: the tenant's prompt leaves the list and the
  warm-up queue (its audio stays cached until the cache's LRU or TTL drops it): 204.
- ``DELETE /v1/speech-cache/entries``: the tenant's erasure: every prompt of the tenant
  leaves the list, and everything cached from its calls and prompts is dropped from
  every level: 200 ``{"purged": {"memory_entries": n}}``.

Everything is the caller's tenant's: a check answers the levels of its own entries (an
operator's shared prompt: the shared ones), never another tenant's.

Refusals: 400 (``invalid_request``, ``invalid_field``, ``invalid_speed``,
``unsupported_format``, ``text_too_long``), 404 (``not_found``, ``unknown_voice``), 413
``request_too_large``, 429 ``too_many_prompts`` (``GATEWAY_SPEECH_CACHE_MAX_PROMPTS`` per
tenant), 409 ``speech_cache_off`` (the engine runs without a cache:
``ENGINE_SPEECH_CACHE=0``), 503 ``overloaded`` (the tenant's checks or warm-up queue
full, the engine busy), ``engine_unavailable``, ``storage_unavailable`` (each with
``Retry-After``).
"""

from __future__ import annotations

import json
import logging
from typing import Any, Final

from aiohttp import web

from engine.ipc.client import EngineUnavailable
from gateway.auth import Principal
from gateway.errors import ErrorCode
from gateway.http_errors import authenticate, json_error
from gateway.peer_log import PeerLog
from gateway.speech_cache.catalog import CatalogFull, Entry
from gateway.speech_cache.prompts import PromptError, parse_prompt
from gateway.speech_cache.service import Overloaded, SpeechCacheService
from gateway.speech_cache.warmer import SpeechCacheOff
from gateway.state import STATE_KEY, GatewayState

log = logging.getLogger(__name__)
_auth_log = PeerLog(log, "speech cache API")

SCOPE: Final = "tts:stream"
MAX_BODY_BYTES: Final = 64 * 1024
PATH: Final = "/v1/speech-cache/prompts"
ENTRIES_PATH: Final = "/v1/speech-cache/entries"
SPEECH_CACHE_KEY = web.AppKey("speech_cache", SpeechCacheService)
_STATUS: Final[dict[str, int]] = {
    ErrorCode.UNKNOWN_VOICE: 404,
    ErrorCode.STORAGE_UNAVAILABLE: 503,
    ErrorCode.ENGINE_UNAVAILABLE: 503,
    ErrorCode.OVERLOADED: 503,
    ErrorCode.QUEUE_TIMEOUT: 503,
}


def _error(status: int, code: str, message: str) -> web.Response:
    return json_error(status, code, message, {"Retry-After": "1"} if status == 503 else None)


def _auth(state: GatewayState, request: web.Request) -> Principal | web.Response:
    return authenticate(state.verify, request, SCOPE, _auth_log)


def _refused(state: GatewayState, status: int, code: str, message: str) -> web.Response:
    state.metrics.errors.labels(code=code).inc()
    return _error(status, code, message)


def _unusable(state: GatewayState, exc: Exception) -> web.Response:
    if isinstance(exc, SpeechCacheOff):
        return _refused(
            state, 409, ErrorCode.SPEECH_CACHE_OFF, "the engine runs without a speech cache"
        )
    return _refused(state, 503, ErrorCode.ENGINE_UNAVAILABLE, "the TTS engine is not ready")


async def _body(request: web.Request) -> object:
    """The JSON body, at most :data:`MAX_BODY_BYTES`; raises :class:`PromptError`."""
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise PromptError(ErrorCode.REQUEST_TOO_LARGE, f"the body is over {MAX_BODY_BYTES} bytes")
    raw = await request.content.read(MAX_BODY_BYTES + 1)
    if len(raw) > MAX_BODY_BYTES:
        raise PromptError(ErrorCode.REQUEST_TOO_LARGE, f"the body is over {MAX_BODY_BYTES} bytes")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise PromptError(ErrorCode.INVALID_REQUEST, "the body is not JSON") from None


async def warm_prompt(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    who = _auth(state, request)
    if isinstance(who, web.Response):
        return who
    service = request.app[SPEECH_CACHE_KEY]
    try:
        spec, tenant_field = parse_prompt(await _body(request), service.settings.limits)
        if tenant_field is not None:
            raise PromptError(
                ErrorCode.INVALID_FIELD, "'tenant' is the token's: leave it out", "tenant"
            )
        entry, queued = await service.warm(who.tenant, spec)
        if not queued and entry.code == "queue_full":
            return _refused(state, 503, ErrorCode.OVERLOADED, "the tenant's warm-up queue is full")
    except PromptError as exc:
        status = 413 if exc.code == ErrorCode.REQUEST_TOO_LARGE else _STATUS.get(exc.code, 400)
        return _refused(state, status, exc.code, exc.message)
    except CatalogFull as exc:
        return _refused(state, 429, ErrorCode.TOO_MANY_PROMPTS, str(exc))
    except (SpeechCacheOff, EngineUnavailable) as exc:
        return _unusable(state, exc)
    log.info("speech cache: tenant %s warms %s (%s)", who.tenant[:64], entry.id, entry.state)
    return web.json_response(
        {"prompt": entry.to_json()}, status=202, headers={"Location": f"{PATH}/{entry.id}"}
    )


async def list_prompts(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    who = _auth(state, request)
    if isinstance(who, web.Response):
        return who
    service = request.app[SPEECH_CACHE_KEY]
    return web.json_response(
        {"prompts": [e.to_json() for e in service.catalog.visible(who.tenant)]}
    )


def _found(request: web.Request, who: Principal) -> Entry | None:
    service = request.app[SPEECH_CACHE_KEY]
    return service.catalog.get(who.tenant, request.match_info["prompt_id"][:64])


async def get_prompt(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    who = _auth(state, request)
    if isinstance(who, web.Response):
        return who
    entry = _found(request, who)
    if entry is None:
        return _error(404, ErrorCode.NOT_FOUND, "no such prompt")
    service = request.app[SPEECH_CACHE_KEY]
    try:
        answer = await service.check(who.tenant, entry)
    except PromptError as exc:  # its voice was deleted meanwhile
        return _refused(state, _STATUS.get(exc.code, 400), exc.code, exc.message)
    except Overloaded as exc:
        return _refused(state, 503, ErrorCode.OVERLOADED, str(exc))
    except (SpeechCacheOff, EngineUnavailable) as exc:
        return _unusable(state, exc)
    if answer.code:
        code = ErrorCode.from_engine(answer.code)
        return _refused(state, _STATUS.get(code, 400), code, answer.message)
    body: dict[str, Any] = entry.to_json()
    body["segments"] = [{"text": s.text, "levels": list(s.levels)} for s in answer.segments]
    body["cached"] = bool(answer.segments) and all(s.levels for s in answer.segments)
    return web.json_response({"prompt": body})


async def delete_prompt(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    who = _auth(state, request)
    if isinstance(who, web.Response):
        return who
    service = request.app[SPEECH_CACHE_KEY]
    if not service.remove(who.tenant, request.match_info["prompt_id"][:64]):
        return _error(404, ErrorCode.NOT_FOUND, "no such prompt of this tenant")
    return web.Response(status=204)


async def purge_entries(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    who = _auth(state, request)
    if isinstance(who, web.Response):
        return who
    service = request.app[SPEECH_CACHE_KEY]
    try:
        dropped = await service.purge(who.tenant)
    except (SpeechCacheOff, EngineUnavailable) as exc:
        return _unusable(state, exc)
    log.info("speech cache: tenant %s purged its entries (%d in memory)", who.tenant[:64],
             dropped)  # fmt: skip
    return web.json_response({"purged": {"memory_entries": dropped}})


def add_routes(app: web.Application, service: SpeechCacheService) -> None:
    app[SPEECH_CACHE_KEY] = service
    app.router.add_post(PATH, warm_prompt)
    app.router.add_get(PATH, list_prompts)
    app.router.add_get(PATH + "/{prompt_id}", get_prompt)
    app.router.add_delete(PATH + "/{prompt_id}", delete_prompt)
    app.router.add_delete(ENTRIES_PATH, purge_entries)


__all__ = ["ENTRIES_PATH", "MAX_BODY_BYTES", "PATH", "SPEECH_CACHE_KEY", "add_routes"]
