"""``GET /v1/freeswitch``: FreeSWITCH ``mod_audio_stream``, the gateway as the WebSocket
server ``uuid_audio_stream`` dials.

Wire format and what each build of the module does: ``telephony/freeswitch.py``. The
module sends nothing that names the call, so the dialplan puts it in the URL::

    uuid_audio_stream ${uuid} start
        wss://gateway/v1/freeswitch?access_token=<jwt>&call_id=${uuid}&sample_rate=8000
        mono 8k

Query parameters: ``call_id`` (required unless JSON metadata carries ``callId``),
``sample_rate`` (8000 or 16000, as the ``start`` command's rate), ``metadata=json`` (the
dialplan sends a JSON object as metadata, see the core), ``playback`` (``stream_audio``,
default: ``streamAudio`` JSON messages, which the voxcom-us fork plays in real time and
the community edition writes to files for an ESL controller to play; ``binary``: raw
L16, for builds that play it), ``chunk_ms`` (audio per message, default 100), ``say`` and
``voice`` (a notification call). The call id is what an IVR application attaches with
(``start.call``).

Outbound audio is paced by the worker's pacer and sent in ``chunk_ms`` messages. The
module has no marks (a mark is reported when its audio was sent, as on SIP), no DTMF on
this socket (digits come through ESL, outside the gateway) and no way to stop playback:
clear and barge-in drop what the gateway has not sent yet; what FreeSWITCH holds plays
out (at most one chunk with the fork). Hanging up closes the socket: the call goes on in
FreeSWITCH (its dialplan decides what next).
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from gateway.auth import token_from_request
from gateway.errors import CloseCode, ProtocolViolation, vendor_code
from gateway.events import MarkReached
from gateway.legs.websocket.telephony import TelephonyLeg
from gateway.protocols.base import serve
from telephony.freeswitch import (
    AudioReceived,
    FreeSwitchConnection,
    FreeSwitchError,
    FreeSwitchMetadata,
    FreeSwitchPlayback,
    FreeSwitchState,
    StreamStarted,
)

log = logging.getLogger(__name__)
DEFAULT_CHUNK_MS = 100


def _core_for(query: Any) -> FreeSwitchConnection:
    """The core configured by the URL's query; raises ValueError or FreeSwitchError."""
    rate = query.get("sample_rate")
    chunk = query.get("chunk_ms")
    return FreeSwitchConnection(
        sample_rate=int(rate) if rate else None,
        call_id=query.get("call_id") or None,
        playback=FreeSwitchPlayback(query.get("playback", FreeSwitchPlayback.STREAM_AUDIO)),
        metadata=FreeSwitchMetadata(query.get("metadata", FreeSwitchMetadata.RAW)),
        chunk_ms=int(chunk) if chunk else DEFAULT_CHUNK_MS,
    )


class FreeSwitchLeg(TelephonyLeg):
    protocol = "freeswitch"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._core: FreeSwitchConnection | None = None
        self._setup_error = ""
        try:
            self._core = _core_for(self._request.query)
        except (ValueError, FreeSwitchError) as exc:
            self._setup_error = str(exc)[:200]
        self._pending = bytearray()  # outbound PCM not yet a whole chunk

    def credentials(self, request: web.Request) -> str | None:
        # STREAM_EXTRA_HEADERS can carry Authorization; the URL's access_token always can.
        return token_from_request(request.headers, request.query)

    def _require_core(self) -> FreeSwitchConnection:
        if self._core is None:
            raise ProtocolViolation(
                vendor_code(self.protocol, "invalid_argument"),
                f"bad query parameters: {self._setup_error}",
                CloseCode.POLICY,
            )
        return self._core

    @property
    def _streaming(self) -> bool:
        return self._core is not None and self._core.state is FreeSwitchState.STREAMING

    def _send(self, pcm: bytes) -> None:
        assert self._core is not None
        for message in self._core.audio(pcm):
            if isinstance(message, bytes):
                self._writer.send_binary(message)
            else:
                self._writer.send_text(message)

    # --- vendor hooks -------------------------------------------------------------------

    def vendor_media(self, frame: bytes) -> None:
        if not self._streaming:
            return
        assert self._core is not None
        self._pending += frame
        if len(self._pending) >= self._core.chunk_bytes:
            self._send(bytes(self._pending))
            self._pending.clear()

    def vendor_utterance_done(self) -> None:
        if self._streaming and self._pending:
            self._send(bytes(self._pending))
        self._pending.clear()

    def mark_reached(self, name: str) -> None:
        self.vendor_utterance_done()  # what precedes the mark goes out first
        self.publish(MarkReached(name))  # no vendor marks: reached when its audio was sent

    def vendor_mark(self, vendor_id: str) -> None:
        return None  # never called: mark_reached reports marks itself

    def vendor_pending_marks(self) -> int:
        return 0

    def vendor_clear(self) -> None:
        self._pending.clear()  # no build can stop what FreeSWITCH already holds

    def vendor_hangup(self) -> None:
        if self._streaming:
            assert self._core is not None
            self._core.close()

    # --- frames in ----------------------------------------------------------------------

    async def on_binary(self, data: bytes) -> None:
        try:
            events = self._require_core().receive_binary(data)
        except FreeSwitchError as exc:
            raise self.vendor_error(exc) from None
        await self._handle(events)

    async def on_text(self, text: str) -> None:
        try:
            events = self._require_core().receive_text(text)
        except FreeSwitchError as exc:
            raise self.vendor_error(exc) from None
        await self._handle(events)

    async def _handle(self, events: list[Any]) -> None:
        for event in events:
            if isinstance(event, StreamStarted):
                await self._started(event)
            elif isinstance(event, AudioReceived) and self.session.started:
                self.session.feed_caller_audio(event.payload)

    async def _started(self, event: StreamStarted) -> None:
        if event.call_id is None:
            raise ProtocolViolation(
                vendor_code(self.protocol, "call_id_missing"),
                "put call_id=${uuid} in the stream URL (or callId in JSON metadata)",
                CloseCode.POLICY,
            )
        query = self._request.query
        parameters = {k: query[k] for k in ("say", "voice") if k in query}
        parameters.update({k: v for k, v in event.parameters.items() if k in ("say", "voice")})
        await self.start_call(
            tenant=self._tenant(),
            call_id=event.call_id,
            format_name=event.format,
            parameters=parameters,
        )


async def handle_freeswitch(request: web.Request) -> web.StreamResponse:
    return await serve(request, FreeSwitchLeg, request=request)
