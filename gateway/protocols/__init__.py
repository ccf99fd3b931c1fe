"""Wire protocols, one file each, registered by path.

A protocol module exposes an aiohttp handler; :data:`PROTOCOLS` maps the WebSocket path
to it, and the application adds one route per entry (a registry, not an if/elif chain).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway.protocols import asterisk, freeswitch, jambonz, native, twilio

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

PROTOCOLS: dict[str, Handler] = {
    "/v1/stream": native.handle_stream,
    "/v1/twilio": twilio.handle_twilio,
    "/v1/asterisk": asterisk.handle_asterisk,
    "/v1/jambonz": jambonz.handle_jambonz,
    "/v1/freeswitch": freeswitch.handle_freeswitch,
}
