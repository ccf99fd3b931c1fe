"""An IVR application's connection relayed to the worker that holds its call.

When an application attaches (``start`` with ``call``) on a worker that does not hold the
call, the worker looks the call up in the call directory (:mod:`gateway.call_directory`)
and opens a WebSocket of its own to the owner's relay listener (a Unix socket on the host,
or TCP between instances), carrying the application's token and :data:`RELAY_HEADER`. The
application's ``start`` and every later frame go up unchanged; every frame the owner sends
comes back unchanged: ``ready``, ``call_started``, ``dtmf``, ``barge_in``, marks and
``call_ended`` alike. The owner verifies the token again and applies its own limits; a
relayed connection is never relayed further (no loops).

When the owner ends the connection, the application's connection ends with the same close
code; when the owner goes away without a close (its worker was killed, its instance died),
the application gets ``call_lost`` and the connection closes (1011).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

log = logging.getLogger(__name__)
RELAY_HEADER = "X-Gateway-Relay"
RELAY_PATH = "/v1/stream"  # the route the owner's relay listener serves, and only it
CONNECT_TIMEOUT_S = 2.0
BACKPRESSURE_POLL_S = 0.02
UNIX_PREFIX = "unix:"


@dataclass(frozen=True)
class RelayEnd:
    """How the owner's side ended: its close code and reason, or ``lost`` (no close)."""

    code: int
    reason: str
    lost: bool


class RelayUnavailable(Exception):
    """The owner could not be reached (gone, refusing, too slow)."""


class Relay:
    def __init__(self, client: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._client = client
        self._ws = ws

    @classmethod
    async def open(cls, address: str, token: str, *, max_message_bytes: int) -> Relay:
        """Connect to the owner's ``/v1/stream`` at ``address`` (``unix:PATH`` or
        ``http://HOST:PORT``)."""
        if address.startswith(UNIX_PREFIX):
            path = address[len(UNIX_PREFIX) :]
            connector: aiohttp.BaseConnector = aiohttp.UnixConnector(path=path)
            url = f"http://gateway-worker{RELAY_PATH}"
        else:
            connector = aiohttp.TCPConnector(limit=1)
            url = f"{address}{RELAY_PATH}"
        client = aiohttp.ClientSession(connector=connector)
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):  # connect and upgrade
                ws = await client.ws_connect(
                    url,
                    headers={"Authorization": f"Bearer {token}", RELAY_HEADER: "1"},
                    timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=CONNECT_TIMEOUT_S),
                    max_msg_size=max_message_bytes,
                    compress=0,
                    autoping=True,
                    autoclose=True,
                )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            await client.close()
            raise RelayUnavailable(f"{address}: {exc!r}") from exc
        return cls(client, ws)

    async def send_text(self, text: str) -> None:
        if not self._ws.closed:
            await self._ws.send_str(text)

    async def send_binary(self, data: bytes) -> None:
        if not self._ws.closed:
            await self._ws.send_bytes(data)

    async def pump(
        self,
        on_text: Callable[[str], object],
        on_binary: Callable[[bytes], object],
        backlogged: Callable[[], bool],
    ) -> RelayEnd:
        """Deliver the owner's frames until it ends the connection; while our peer does
        not read, read nothing more from the owner."""
        ws = self._ws
        while True:
            msg = await ws.receive()
            if msg.type is aiohttp.WSMsgType.TEXT:
                on_text(msg.data)
            elif msg.type is aiohttp.WSMsgType.BINARY:
                on_binary(msg.data)
            elif msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED):
                code = ws.close_code
                if code is None or code == 1006:
                    return RelayEnd(1011, "call lost", lost=True)
                return RelayEnd(code, str(msg.extra or ""), lost=False)
            elif msg.type is aiohttp.WSMsgType.ERROR:
                return RelayEnd(1011, "call lost", lost=True)
            while backlogged() and not ws.closed:  # noqa: ASYNC110
                await asyncio.sleep(BACKPRESSURE_POLL_S)

    async def close(self) -> None:
        try:
            if not self._ws.closed:
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    await self._ws.close()
        except (aiohttp.ClientError, OSError, TimeoutError):
            pass
        finally:
            await self._client.close()
