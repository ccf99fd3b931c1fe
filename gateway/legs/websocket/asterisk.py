"""``GET /v1/asterisk``: Asterisk chan_websocket (Asterisk 20.16+, 22.6+).

Wire format: ``telephony/asterisk.py`` (binary frames carry media, text frames carry
control, plain-text or JSON control format). Auth: ``access_token`` query parameter, or
HTTP Basic with the token as the password. Query parameters ``say`` and ``voice`` drive
a notification call. ``MEDIA_XOFF``/``MEDIA_XON`` pause and resume sending without losing
audio; ``FLUSH_MEDIA`` clears Asterisk's queue on clear and barge-in; no message is ever
over 65,500 bytes (Asterisk hangs up on those).
"""

from __future__ import annotations

import base64
import binascii
import logging
from typing import Any

from aiohttp import web

from gateway.legs.websocket.telephony import TelephonyLeg
from gateway.protocols.base import serve
from telephony.asterisk import (
    AsteriskConnection,
    AsteriskError,
    DtmfEnd,
    MediaMarkProcessed,
    MediaReceived,
    MediaStart,
    MediaXoff,
    MediaXon,
)

log = logging.getLogger(__name__)


def basic_auth_password(header: str | None) -> str | None:
    """The password of an HTTP Basic ``Authorization`` header (RFC 7617), if any."""
    if not header or not header.lower().startswith("basic "):
        return None
    try:
        decoded = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    _, sep, password = decoded.partition(":")
    return password if sep else None


class AsteriskLeg(TelephonyLeg):
    protocol = "asterisk"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._core = AsteriskConnection()

    def credentials(self, request: web.Request) -> str | None:
        # Before any media: Asterisk sends none unasked.
        return basic_auth_password(request.headers.get("Authorization")) or request.query.get(
            "access_token"
        )

    def vendor_media(self, frame: bytes) -> None:
        for message in self._core.media_frames(frame):
            self._writer.send_binary(message)

    def vendor_mark(self, vendor_id: str) -> None:
        self._writer.send_text(self._core.mark_media(vendor_id))

    def vendor_pending_marks(self) -> int:
        return len(self._core.pending_marks)

    def vendor_clear(self) -> None:
        # FLUSH_MEDIA drops queued marks silently; the leg reports them as cleared.
        self._writer.send_text(self._core.flush_media().text)

    def vendor_utterance_done(self) -> None:
        # Asterisk drops a partial frame: pad the prompt's tail to a whole frame.
        if self._core.can_send:
            for message in self._core.flush_tail():
                self._writer.send_binary(message)

    def vendor_hangup(self) -> None:
        self._writer.send_text(self._core.hangup())

    async def on_binary(self, data: bytes) -> None:
        try:
            events = self._core.receive_bytes(data)
        except AsteriskError as exc:
            raise self.vendor_error(exc) from None
        for event in events:
            if isinstance(event, MediaReceived) and self.session.started:
                self.session.feed_caller_audio(event.payload)

    async def on_text(self, text: str) -> None:
        try:
            events = self._core.receive_text(text)
        except AsteriskError as exc:
            raise self.vendor_error(exc) from None
        for event in events:
            if isinstance(event, MediaStart):
                self._writer.send_text(self._core.answer())
                await self.start_call(
                    tenant=self._tenant(),
                    call_id=event.channel_id or event.connection_id,
                    format_name=event.format,
                    parameters={
                        k: v for k, v in self._request.query.items() if k in ("say", "voice")
                    },
                )
            elif isinstance(event, DtmfEnd):
                self.dtmf(event.digit)
            elif isinstance(event, MediaXoff):
                self.pause(True)
            elif isinstance(event, MediaXon):
                self.pause(False)
            elif isinstance(event, MediaMarkProcessed):
                self.vendor_mark_done(event.correlation_id, cleared=False)


async def handle_asterisk(request: web.Request) -> web.StreamResponse:
    return await serve(request, AsteriskLeg, request=request)
