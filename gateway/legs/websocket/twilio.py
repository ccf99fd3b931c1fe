"""``GET /v1/twilio``: Twilio bidirectional Media Streams, the gateway as the WebSocket
server a ``<Connect><Stream>`` connects to.

Wire format: ``telephony/twilio.py`` (Twilio "Media Streams - WebSocket Messages").
Twilio cannot set headers: the JWT comes as the ``access_token`` query parameter or as
``start.customParameters.token``; a leg without a valid token is closed with 1008 before
any audio flows. Custom parameters ``say`` (text spoken at once) and ``voice`` drive the
simplest notification call. Outbound media is paced in real time by the worker's pacer.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from gateway.errors import CloseCode, ProtocolViolation, vendor_code
from gateway.legs.websocket.telephony import TelephonyLeg
from gateway.protocols.base import serve
from telephony.twilio import (
    TwilioConnection,
    TwilioDtmf,
    TwilioError,
    TwilioMark,
    TwilioMedia,
    TwilioStart,
    TwilioStop,
)

log = logging.getLogger(__name__)


class TwilioLeg(TelephonyLeg):
    protocol = "twilio"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._core = TwilioConnection()

    @classmethod
    def authenticates_at_upgrade(cls) -> bool:
        return False  # the token may come in start.customParameters

    def vendor_media(self, frame: bytes) -> None:
        self._writer.send_text(self._core.send_media(frame))

    def vendor_mark(self, vendor_id: str) -> None:
        self._writer.send_text(self._core.send_mark(vendor_id))

    def vendor_pending_marks(self) -> int:
        return len(self._core.pending_marks)  # cleared marks count until Twilio echoes them

    def vendor_clear(self) -> None:
        # Twilio echoes every pending mark after a clear; they were reported already.
        self._writer.send_text(self._core.send_clear())

    def vendor_utterance_done(self) -> None:
        pass  # every media message is a whole 20 ms frame

    def vendor_hangup(self) -> None:
        pass  # a media stream cannot hang up the call: closing the stream ends our leg

    async def on_binary(self, data: bytes) -> None:
        raise ProtocolViolation(
            vendor_code(self.protocol, "unexpected_binary"), "binary frame", CloseCode.POLICY
        )

    async def on_text(self, text: str) -> None:
        try:
            events = self._core.receive_text(text)
        except TwilioError as exc:
            raise self.vendor_error(exc) from None
        for event in events:
            if isinstance(event, TwilioMedia):
                if event.track in ("inbound", "inbound_track") and self.session.started:
                    self.session.feed_caller_audio(event.payload)
            elif isinstance(event, TwilioStart):
                self.authenticate(event.token or self._request.query.get("access_token"))
                await self.start_call(
                    tenant=self._tenant(),
                    call_id=event.call_sid,
                    format_name="mulaw_8000",
                    parameters=dict(event.custom_parameters),
                )
            elif isinstance(event, TwilioDtmf):
                self.dtmf(event.digit)
            elif isinstance(event, TwilioMark):
                self.vendor_mark_done(event.name, cleared=event.cleared)
            elif isinstance(event, TwilioStop):
                self.session.finish(CloseCode.NORMAL, "stop")


async def handle_twilio(request: web.Request) -> web.StreamResponse:
    return await serve(request, TwilioLeg, request=request)
