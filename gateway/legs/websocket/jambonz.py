"""``GET /v1/jambonz``: jambonz's ``listen``/``stream`` verb, bidirectional, the gateway as
the WebSocket server its audio fork connects to (subprotocol ``audio.jambonz.org``).

Wire format: ``telephony/jambonz.py``. The verb streams both ways at the call's rate::

    {"verb": "listen", "url": "wss://gateway/v1/jambonz?access_token=<jwt>",
     "sampleRate": 8000, "passDtmf": true,
     "bidirectionalAudio": {"enabled": true, "streaming": true, "sampleRate": 8000}}

(``wsAuth`` with the JWT as the password works too.) Without streaming
(``bidirectionalAudio.streaming: false``), add ``audio=playaudio`` to the URL: our audio
then goes back as ``playAudio`` messages of ``chunk_ms`` (default 500), which jambonz
queues and plays as files, and marks are reported when their audio was sent.

The call id is jambonz's ``callSid``: an IVR application attaches with ``start.call`` =
that id. The verb's ``metadata`` members ``say`` and ``voice`` drive a notification call,
as Twilio's custom parameters do. DTMF (``passDtmf``) becomes ``dtmf``; marks go to
jambonz and are reported when played (at most 30 at once, jambonz's limit); clear and
barge-in send ``killAudio``.
Hanging up sends ``disconnect``, which ends the ``listen`` verb: jambonz goes on with the
application's next verb (a ``hangup`` verb ends the call). jambonz holds back up to
160 ms of audio until more arrives, so each utterance ends with 160 ms of silence: its
tail plays at once instead of with the next prompt.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, ClassVar

from aiohttp import web

from gateway.errors import CloseCode, ProtocolViolation, vendor_code
from gateway.events import MarkReached
from gateway.legs.websocket.asterisk import basic_auth_password
from gateway.legs.websocket.telephony import TelephonyLeg
from gateway.protocols.base import serve
from telephony.jambonz import (
    SUBPROTOCOL,
    VENDOR_MAX_MARKS,
    AudioReceived,
    DtmfReceived,
    JambonzConnection,
    JambonzError,
    JambonzState,
    MarkReported,
    StreamStarted,
)

log = logging.getLogger(__name__)
#: Silence after each utterance, so that jambonz's pre-buffer releases the tail.
TAIL_SILENCE_MS = 160
#: ``audio=playaudio``: audio per ``playAudio`` message (jambonz plays each as a file).
DEFAULT_PLAY_CHUNK_MS = 500
PLAY_CHUNK_MS_RANGE = (100, 5000)


class JambonzLeg(TelephonyLeg):
    protocol = "jambonz"
    subprotocols: ClassVar[tuple[str, ...]] = (SUBPROTOCOL,)
    max_vendor_marks: ClassVar[int] = VENDOR_MAX_MARKS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        query = self._request.query
        # ``audio=playaudio``: the verb has bidirectionalAudio without streaming, and our
        # audio goes back as playAudio messages of ``chunk_ms`` (jambonz queues each as a
        # file); no marks then (jambonz reports none on files): a mark is reported when
        # its audio was sent.
        self._play_audio = query.get("audio") == "playaudio"
        chunk_ms = DEFAULT_PLAY_CHUNK_MS
        with contextlib.suppress(ValueError):
            chunk_ms = int(query.get("chunk_ms", chunk_ms))
        low, high = PLAY_CHUNK_MS_RANGE
        self._play_chunk_ms = min(high, max(low, chunk_ms))
        self._pending = bytearray()  # playAudio mode: audio not yet a whole chunk
        self._core = JambonzConnection(bidirectional_streaming=not self._play_audio)

    def credentials(self, request: web.Request) -> str | None:
        return basic_auth_password(request.headers.get("Authorization")) or request.query.get(
            "access_token"
        )

    def _send(self, frames: list[bytes | str]) -> None:
        for frame in frames:
            if isinstance(frame, bytes):
                self._writer.send_binary(frame)
            else:
                self._writer.send_text(frame)

    @property
    def _streaming(self) -> bool:
        """Audio and commands may go out (not before the metadata, not after disconnect)."""
        return self._core.state is JambonzState.STREAMING

    def vendor_media(self, frame: bytes) -> None:
        if not self._streaming:
            return
        if not self._play_audio:
            self._send(self._core.audio(frame))
            return
        self._pending += frame
        rate = self._core.output_sample_rate or 8000
        if len(self._pending) >= rate * 2 * self._play_chunk_ms // 1000:
            self._flush_pending()

    def _flush_pending(self) -> None:
        if self._pending and self._streaming:
            self._send(self._core.audio(bytes(self._pending)))
        self._pending.clear()

    def mark_reached(self, name: str) -> None:
        if not self._play_audio:
            super().mark_reached(name)
            return
        self._flush_pending()  # what precedes the mark goes out first
        self.publish(MarkReached(name))  # no marks on files: reached when its audio was sent

    def vendor_mark(self, vendor_id: str) -> None:
        if self._streaming:
            self._writer.send_text(self._core.mark(vendor_id))

    def vendor_pending_marks(self) -> int:
        return len(self._core.pending_marks)

    def vendor_clear(self) -> None:
        # The marks jambonz held are reported cleared by the leg; their echoes are dropped.
        self._pending.clear()
        if self._streaming:
            kill, _cleared = self._core.kill_audio()
            self._writer.send_text(kill)

    def vendor_utterance_done(self) -> None:
        if self._play_audio:
            self._flush_pending()  # the utterance's last, shorter file
            return
        rate = self._core.output_sample_rate
        if rate is not None and self._streaming:
            self._send(self._core.audio(bytes(rate * TAIL_SILENCE_MS // 1000 * 2)))

    def vendor_hangup(self) -> None:
        if self._streaming:
            self._writer.send_text(self._core.disconnect())

    async def on_binary(self, data: bytes) -> None:
        try:
            events = self._core.receive_binary(data)
        except JambonzError as exc:
            raise self.vendor_error(exc) from None
        for event in events:
            if isinstance(event, AudioReceived) and self.session.started:
                self.session.feed_caller_audio(event.payload)

    async def on_text(self, text: str) -> None:
        try:
            events = self._core.receive_text(text)
        except JambonzError as exc:
            raise self.vendor_error(exc) from None
        for event in events:
            if isinstance(event, StreamStarted):
                await self._started(event)
            elif isinstance(event, DtmfReceived):
                self.dtmf(event.digit)
            elif isinstance(event, MarkReported):
                self.vendor_mark_done(event.name, cleared=event.cleared)

    async def _started(self, event: StreamStarted) -> None:
        if event.channels != 1:
            raise ProtocolViolation(
                vendor_code(self.protocol, "stereo_unsupported"),
                "mixType stereo is not supported: use mono or mixed",
                CloseCode.POLICY,
            )
        parameters = {k: v for k, v in event.metadata.items() if k in ("say", "voice")}
        if event.from_:
            parameters["from"] = event.from_
        if event.to:
            parameters["to"] = event.to
        await self.start_call(
            tenant=self._tenant(),
            call_id=event.call_id,
            format_name=self._core.format_name(event.sample_rate),
            parameters=parameters,
        )


async def handle_jambonz(request: web.Request) -> web.StreamResponse:
    return await serve(request, JambonzLeg, request=request)
