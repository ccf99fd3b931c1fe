"""The JSON answers of the gateway's HTTP API (``{"error": {"code", "message"}}``) and its
token check, shared by every handler module (voices, speech cache, the application's own
routes). The OpenAI-compatible endpoint answers in OpenAI's error format instead
(gateway/speech_api.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from aiohttp import web

from gateway.auth import AuthError, Principal, token_from_request
from gateway.peer_log import PeerLog


def json_error(
    status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.json_response(
        {"error": {"code": code, "message": message}}, status=status, headers=headers
    )


def authenticate(
    verify: Callable[[str | None, str], Principal],
    request: web.Request,
    scope: str,
    auth_log: PeerLog,
) -> Principal | web.Response:
    """The request's principal for ``scope``, or the error answer (the failure logged,
    rate-limited: anyone can fail auth)."""
    try:
        return verify(token_from_request(request.headers, request.query), scope)
    except AuthError as exc:
        auth_log.info("auth failed on %s: %s", request.path[:64], exc.code)
        return json_error(exc.http_status, exc.code, exc.message)
