"""The gateway's own WebSocket protocol and the connection lifecycle every WebSocket
protocol shares (:mod:`gateway.protocols.base`).

:data:`PROTOCOLS` maps the native protocol's path to its handler; the telephony legs that
arrive as WebSockets add theirs from :data:`gateway.legs.kinds.LEG_KINDS`, and the
application mounts both (:data:`gateway.app.WEBSOCKET_ROUTES`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway.protocols import native

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

PROTOCOLS: dict[str, Handler] = {
    "/v1/stream": native.handle_stream,
}
