"""Call drivers: one simulated IVR call over one wire protocol.

:class:`CallDriver` holds what every protocol shares (the current utterance's probe,
waiting for its end, errors by code, the session's fate); a subclass only translates
between its wire protocol and four operations (``open``, ``speak``, ``close``,
``send_caller_audio``) and reports what it receives through ``_audio``,
``_utterance_done``, ``_server_error`` and ``_lost``. :data:`DRIVERS` is the registry the
CLI picks from (``--protocol``).

``TwilioCall`` plays a Twilio Media Streams leg (``/v1/twilio``) driven by an IVR
application attached over the native protocol (``start`` with ``call``), the way a
call centre runs prompts on a Twilio call: the application's ``speak`` is the prompt, the
leg receives it as ``media`` events, the application gets ``utterance_done``.
``AsteriskCall`` (``/v1/asterisk``, chan_websocket), ``JambonzCall`` (``/v1/jambonz``),
``FreeSwitchCall`` (``/v1/freeswitch``, mod_audio_stream), ``AudioSocketCall`` (Asterisk
AudioSocket over TCP) and ``SipCall`` do the same over the other telephony legs: each plays
the vendor's end of the leg, written from the vendor's wire format (not from the
gateway's code), and streams caller audio (silence) every 20 ms when ``caller_audio``.

Audio is measured per message the far end receives (``frame_s``, ``frame_bytes``): 20 ms
on every leg except FreeSWITCH, whose ``streamAudio`` messages carry 100 ms each. What a
leg writes at once after an utterance's paced audio (jambonz's 160 ms of silence,
FreeSWITCH's last, shorter message) is counted apart (``Recorder.tail_frames``), not
measured.

Client-side error codes are prefixed ``client:`` to keep them apart from the server's
``error`` codes (docs/protocol.md).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, cast
from urllib.parse import urlencode

from tests.bench import wsclient
from tests.bench.recorder import Recorder, UtteranceProbe
from tests.bench.sipua import SipCallFailed, SipUac

MULAW_SILENCE = b"\xff" * 160  # mu-law code for 0 (ITU-T G.711)
L16_SILENCE = bytes(320)  # 20 ms of 16-bit linear PCM at 8 kHz
_SILENCE_FRAMES = 8  # prebuilt masked frames, rotated (distinct masking keys)


class CallFailed(Exception):
    """The call could not be set up or died; ``code`` is what the statistics count."""

    def __init__(self, code: str, detail: str = "") -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code


@dataclass(frozen=True)
class CallSpec:
    """How one call connects and what its session asks for."""

    url: str
    token: str | None
    voice: str
    fmt: str = "mulaw_8000"
    pacing: str = "realtime"
    caller_audio: bool = False
    connect_timeout_s: float = 15.0
    utterance_timeout_s: float = 30.0
    sip_target: tuple[str, int] | None = None  # the gateway's SIP address (protocol sip)
    #: the gateway's AudioSocket listener (protocol audiosocket)
    audiosocket_target: tuple[str, int] | None = None


class CallDriver(ABC):
    """One call. Not reentrant: one ``speak`` at a time (an IVR prompt, then think)."""

    protocol: ClassVar[str]
    #: What one audio message at the receiving end carries: its duration and its size
    #: (the native protocol's frame length is the ``ready`` message's ``frame_ms``).
    frame_s: ClassVar[float] = 0.020
    frame_bytes: ClassVar[int] = 160

    def __init__(self, spec: CallSpec, recorder: Recorder) -> None:
        self.spec = spec
        self.recorder = recorder
        self._probe: UtteranceProbe | None = None
        self._done: asyncio.Future[None] | None = None
        self._lost_reason: str | None = None
        self._failure: str | None = None

    @property
    def alive(self) -> bool:
        """The session is up and nothing fatal happened."""
        return self._lost_reason is None

    @property
    def completed(self) -> bool:
        """Up, and no prompt failed (what a call that ran to the end of the run is)."""
        return self.alive and self._failure is None

    # --- operations (the script calls these) -------------------------------------------

    @abstractmethod
    async def open(self) -> None:
        """Connect and start the session; raises :class:`CallFailed`."""

    async def speak(self, text: str, utterance_id: str) -> None:
        """Speak one prompt and wait for its end; raises :class:`CallFailed`.

        The first-audio clock starts right before the request is written.
        """
        if not self.alive:
            self._failure = self._lost_reason or "client:closed"
            raise CallFailed(self._failure)
        self._done = asyncio.get_running_loop().create_future()
        # time.monotonic, like the arrival times (uvloop's loop.time() is cached, in ms)
        self._probe = self.recorder.probe(utterance_id, time.monotonic())
        self._send_speak(text, utterance_id)
        try:
            async with asyncio.timeout(self.spec.utterance_timeout_s):
                await self._done
        except TimeoutError:
            self._abandon()
            self._failure = "client:utterance_timeout"
            raise CallFailed(self._failure) from None
        except CallFailed as exc:
            self._abandon()
            self._failure = exc.code
            raise
        except BaseException:
            self._abandon()
            raise

    @abstractmethod
    async def close(self) -> None:
        """End the call politely (and quickly); never raises."""

    @abstractmethod
    def send_caller_audio(self) -> None:
        """Send one 20 ms frame of caller audio (silence), if the session is open."""

    # --- protocol-specific hooks --------------------------------------------------------

    @abstractmethod
    def _send_speak(self, text: str, utterance_id: str) -> None: ...

    # --- reports from the protocol layer ------------------------------------------------

    def _audio(self, t: float, size: int) -> None:
        probe = self._probe
        if probe is None:
            self.recorder.stray_frames += 1
        else:
            probe.frame(t, size)

    def _utterance_done(self, utterance_id: str, server_first_audio_ms: float | None) -> None:
        probe, done = self._probe, self._done
        if probe is None or probe.utterance_id != utterance_id:
            return
        self.recorder.finish(probe, server_first_audio_ms)
        self._probe = None
        if done is not None and not done.done():
            done.set_result(None)

    def _server_error(self, code: str) -> None:
        self.recorder.error(code)

    def _lost(self, code: str) -> None:
        """The session ended under us (close from the server, socket lost)."""
        if self._lost_reason is not None:
            return
        self._lost_reason = code
        done = self._done
        if done is not None and not done.done():
            done.set_exception(CallFailed(code))
            done.exception()  # retrieved here: the awaiting speak() re-raises it

    def _abandon(self) -> None:
        if self._probe is not None:
            self.recorder.abandon(self._probe)
            self._probe = None


class NativeCall(CallDriver, wsclient.WsListener):
    """The native protocol v1 (docs/protocol.md): JSON control, binary audio frames."""

    protocol = "native"

    def __init__(self, spec: CallSpec, recorder: Recorder) -> None:
        super().__init__(spec, recorder)
        self._ws: wsclient.WsProtocol | None = None
        self._ready: asyncio.Future[dict[str, Any]] | None = None
        self._closed: asyncio.Future[None] | None = None
        self._silence_i = 0
        self._silence = [
            wsclient.encode_client_frame(wsclient.OP_BINARY, MULAW_SILENCE, os.urandom(4))
            for _ in range(_SILENCE_FRAMES)
        ]

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        self._closed = loop.create_future()
        headers = {"Authorization": f"Bearer {self.spec.token}"} if self.spec.token else {}
        try:
            self._ws = await wsclient.connect(
                self.spec.url, headers, self, timeout=self.spec.connect_timeout_s
            )
        except (OSError, TimeoutError, wsclient.WsProtocolError) as exc:
            raise CallFailed("client:connect_failed", repr(exc)) from None
        start: dict[str, Any] = {
            "type": "start",
            "voice": self.spec.voice,
            "format": self.spec.fmt,
            "pacing": self.spec.pacing,
        }
        if self.spec.caller_audio:
            start["input_format"] = "mulaw_8000"
        self._ws.send_text(json.dumps(start))
        try:
            async with asyncio.timeout(self.spec.connect_timeout_s):
                ready = await self._ready
        except TimeoutError:
            raise CallFailed("client:ready_timeout") from None
        frame_ms = ready.get("frame_ms", 20)
        self.recorder.frame_s = float(frame_ms) / 1000

    async def close(self) -> None:
        ws, closed = self._ws, self._closed
        if ws is None or closed is None:
            return
        if ws.is_open:
            ws.send_text('{"type":"close"}')
        try:
            async with asyncio.timeout(3.0):
                await asyncio.shield(closed)
        except TimeoutError:
            ws.abort()

    def send_caller_audio(self) -> None:
        ws = self._ws
        if ws is not None and ws.is_open:
            self._silence_i = (self._silence_i + 1) % _SILENCE_FRAMES
            ws.send_raw(self._silence[self._silence_i])

    def _send_speak(self, text: str, utterance_id: str) -> None:
        assert self._ws is not None
        self._ws.send_text(
            json.dumps(
                {"type": "speak", "text": text, "utterance_id": utterance_id},
                ensure_ascii=False,
            )
        )

    # WsListener
    def on_binary(self, t: float, payload: bytes) -> None:
        self._audio(t, len(payload))

    def on_text(self, t: float, text: str) -> None:
        try:
            message = json.loads(text)
            kind = message.get("type")
        except (ValueError, AttributeError):
            self._server_error("client:bad_server_message")
            return
        if kind == "utterance_done":
            self._utterance_done(str(message.get("utterance_id")), message.get("first_audio_ms"))
        elif kind == "error":
            self._server_error(str(message.get("code")))
            if self._ready is not None and not self._ready.done():
                self._ready.set_exception(CallFailed(str(message.get("code"))))
                self._ready.exception()
        elif kind == "ready" and self._ready is not None and not self._ready.done():
            self._ready.set_result(message)

    def on_closed(self, code: int | None, reason: str) -> None:
        label = f"client:closed_{code}" if code is not None else "client:connection_lost"
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(CallFailed(label, reason))
            self._ready.exception()
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(None)
        self._lost(label)


class _AppListener(wsclient.WsListener):
    """One attach attempt of the IVR application: its own futures, so that a refused
    attempt's late close cannot disturb the attempt after it."""

    def __init__(self, call: AttachedCall) -> None:
        loop = asyncio.get_running_loop()
        self._call = call
        self.attached: asyncio.Future[dict[str, Any]] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()

    def on_binary(self, t: float, payload: bytes) -> None:
        if self._call._app_listener is self:
            self._call._server_error("client:unexpected_binary")

    def on_text(self, t: float, text: str) -> None:
        try:
            message = json.loads(text)
            kind = message.get("type")
        except (ValueError, AttributeError):
            self._call._server_error("client:bad_server_message")
            return
        if kind == "ready" and not self.attached.done():
            self.attached.set_result(message)
        elif kind == "error" and not self.attached.done():
            code = str(message.get("code"))
            self.attached.set_exception(CallFailed(code))
            self.attached.exception()
            if code != "unknown_call":  # retried: not an error of the run
                self._call._server_error(code)
        elif self._call._app_listener is self:
            self._call._app_message(kind, message)

    def on_closed(self, code: int | None, reason: str) -> None:
        label = f"client:closed_{code}" if code is not None else "client:connection_lost"
        if not self.attached.done():
            self.attached.set_exception(CallFailed(label, reason))
            self.attached.exception()
        if not self.closed.done():
            self.closed.set_result(None)
        if self._call._app_listener is self and self.attached.exception() is None:
            self._call._lost(label)  # the attached application lost its session


class AttachedCall(CallDriver):
    """A telephony leg plus the IVR application that drives it over the native protocol
    (``start`` with ``call``: docs/protocol.md), the way a call centre runs prompts on a
    Twilio or SIP call: the application's ``speak`` is the prompt, the leg receives the
    audio, the application gets ``utterance_done``. The call is registered by the leg's
    set-up, which the gateway does not acknowledge to the application: it retries
    ``unknown_call`` briefly."""

    _ATTACH_RETRY_S = 0.05

    def __init__(self, spec: CallSpec, recorder: Recorder) -> None:
        super().__init__(spec, recorder)
        self._app: wsclient.WsProtocol | None = None
        self._app_listener: _AppListener | None = None

    @property
    @abstractmethod
    def call_id(self) -> str: ...

    @abstractmethod
    async def _open_leg(self) -> None:
        """Set the call up on its wire protocol; raises :class:`CallFailed`."""

    @abstractmethod
    async def _close_leg(self) -> None:
        """End the leg (and wait, briefly, for the gateway to confirm)."""

    async def open(self) -> None:
        await self._open_leg()
        try:
            async with asyncio.timeout(self.spec.connect_timeout_s):
                while True:
                    code = await self._attach_once()
                    if code is None:
                        break
                    if not self.alive:
                        raise CallFailed(self._lost_reason or code)
                    if code != "unknown_call":
                        raise CallFailed(code)
                    await asyncio.sleep(self._ATTACH_RETRY_S)
        except TimeoutError:
            raise CallFailed("client:ready_timeout") from None
        self.recorder.frame_s = self.frame_s
        self.recorder.frame_bytes = self.frame_bytes

    async def _attach_once(self) -> str | None:
        """One attach attempt; None when attached, else the error code that refused it."""
        listener = _AppListener(self)
        headers = {"Authorization": f"Bearer {self.spec.token}"} if self.spec.token else {}
        try:
            app = await wsclient.connect(
                self.spec.url, headers, listener, timeout=self.spec.connect_timeout_s
            )
        except (OSError, TimeoutError, wsclient.WsProtocolError) as exc:
            raise CallFailed("client:connect_failed", repr(exc)) from None
        app.send_text(json.dumps({"type": "start", "call": self.call_id}))
        try:
            await listener.attached
        except CallFailed as exc:
            app.abort()  # refused: this socket is done; its late events are ignored
            return exc.code
        self._app, self._app_listener = app, listener
        return None

    async def close(self) -> None:
        waits: list[asyncio.Future[None]] = []
        if self._app_listener is not None:
            waits.append(self._app_listener.closed)
        try:
            async with asyncio.timeout(3.0):
                await asyncio.gather(self._close_leg(), *(asyncio.shield(f) for f in waits))
        except TimeoutError:
            if self._app is not None:
                self._app.abort()

    def _send_speak(self, text: str, utterance_id: str) -> None:
        assert self._app is not None
        self._app.send_text(
            json.dumps(
                {"type": "speak", "text": text, "utterance_id": utterance_id},
                ensure_ascii=False,
            )
        )

    # the application (the current attempt's listener forwards what it does not handle)
    def _app_message(self, kind: object, message: dict[str, Any]) -> None:
        if kind == "utterance_done":
            self._utterance_done(str(message.get("utterance_id")), message.get("first_audio_ms"))
        elif kind == "error":
            self._server_error(str(message.get("code")))


class TwilioCall(AttachedCall, wsclient.WsListener):
    """A Twilio Media Streams leg (``/v1/twilio``) driven by an attached application.

    The leg sends what Twilio sends (``connected``, ``start`` with the token and voice in
    ``customParameters``, inbound ``media`` when ``caller_audio``, ``stop``), receives
    ``media`` events (base64 mu-law, 20 ms each) and echoes ``mark`` events as Twilio does
    once the audio before them has played.
    """

    protocol = "twilio"

    def __init__(self, spec: CallSpec, recorder: Recorder) -> None:
        super().__init__(spec, recorder)
        self._leg: wsclient.WsProtocol | None = None
        self._leg_closed: asyncio.Future[None] | None = None
        self._call_sid = "CA" + uuid.uuid4().hex
        self._stream_sid = "MZ" + uuid.uuid4().hex
        self._sequence = itertools.count(1)
        self._chunk = itertools.count(1)
        self._media_t0: float | None = None
        self._silence_b64 = base64.b64encode(MULAW_SILENCE).decode("ascii")
        base = spec.url.split("?", 1)[0]
        self._leg_url = base.rsplit("/", 1)[0] + "/twilio"

    @property
    def call_id(self) -> str:
        return self._call_sid

    async def _open_leg(self) -> None:
        loop = asyncio.get_running_loop()
        self._leg_closed = loop.create_future()
        started = time.monotonic()
        try:
            self._leg = await wsclient.connect(
                self._leg_url, {}, self, timeout=self.spec.connect_timeout_s
            )
        except (OSError, TimeoutError, wsclient.WsProtocolError) as exc:
            raise CallFailed("client:connect_failed", repr(exc)) from None
        self.recorder.setup.append(time.monotonic() - started)
        parameters = {"voice": self.spec.voice}
        if self.spec.token:
            parameters["token"] = self.spec.token
        self._leg.send_text(
            json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"})
        )
        self._leg.send_text(
            json.dumps(
                {
                    "event": "start",
                    "sequenceNumber": str(next(self._sequence)),
                    "start": {
                        "accountSid": "AC" + "0" * 32,
                        "streamSid": self._stream_sid,
                        "callSid": self._call_sid,
                        "tracks": ["inbound"],
                        "customParameters": parameters,
                        "mediaFormat": {
                            "encoding": "audio/x-mulaw",
                            "sampleRate": 8000,
                            "channels": 1,
                        },
                    },
                    "streamSid": self._stream_sid,
                }
            )
        )

    async def _close_leg(self) -> None:
        leg = self._leg
        if leg is None:
            return
        if leg.is_open:
            leg.send_text(
                json.dumps(
                    {
                        "event": "stop",
                        "sequenceNumber": str(next(self._sequence)),
                        "streamSid": self._stream_sid,
                        "stop": {"accountSid": "AC" + "0" * 32, "callSid": self._call_sid},
                    }
                )
            )
        try:
            if self._leg_closed is not None:
                await asyncio.shield(self._leg_closed)
        except asyncio.CancelledError:
            leg.abort()
            raise

    def send_caller_audio(self) -> None:
        leg = self._leg
        if leg is None or not leg.is_open:
            return
        now = time.monotonic()
        if self._media_t0 is None:
            self._media_t0 = now
        media = {
            "track": "inbound",
            "chunk": str(next(self._chunk)),
            "timestamp": str(round((now - self._media_t0) * 1000)),
            "payload": self._silence_b64,
        }
        leg.send_text(
            json.dumps(
                {
                    "event": "media",
                    "sequenceNumber": str(next(self._sequence)),
                    "media": media,
                    "streamSid": self._stream_sid,
                }
            )
        )

    # the leg (WsListener)
    def on_binary(self, t: float, payload: bytes) -> None:
        self._server_error("client:unexpected_binary")

    def on_text(self, t: float, text: str) -> None:
        try:
            message = json.loads(text)
            event = message.get("event")
        except (ValueError, AttributeError):
            self._server_error("client:bad_server_message")
            return
        if event == "media":
            payload = message.get("media", {}).get("payload", "")
            # base64 length without decoding: 4 characters per 3 bytes, minus the padding
            self._audio(t, len(payload) * 3 // 4 - payload[-2:].count("="))
        elif event == "mark" and self._leg is not None:
            self._leg.send_text(  # Twilio echoes a mark when the audio before it played
                json.dumps(
                    {
                        "event": "mark",
                        "sequenceNumber": str(next(self._sequence)),
                        "streamSid": self._stream_sid,
                        "mark": message.get("mark", {}),
                    }
                )
            )

    def on_closed(self, code: int | None, reason: str) -> None:
        if self._leg_closed is not None and not self._leg_closed.done():
            self._leg_closed.set_result(None)
        self._lost(f"client:leg_closed_{code}" if code is not None else "client:connection_lost")


class SipCall(AttachedCall):
    """A SIP call (``GATEWAY_SIP_LISTEN``, route ``app``) driven by an attached
    application: INVITE and BYE from :class:`tests.bench.sipua.SipUac`, prompts as RTP
    (PCMU, 20 ms packets), caller audio as RTP. Per call it records the set-up time
    (INVITE to 200 OK), RFC 3550 interarrival jitter and lost packets."""

    protocol = "sip"

    def __init__(self, spec: CallSpec, recorder: Recorder) -> None:
        super().__init__(spec, recorder)
        if spec.sip_target is None:
            raise ValueError("a SIP call needs CallSpec.sip_target")
        self._uac = SipUac(spec.sip_target, "app", self._on_rtp, self._lost)

    @property
    def call_id(self) -> str:
        return self._uac.call_id

    async def _open_leg(self) -> None:
        try:
            await self._uac.invite(self.spec.connect_timeout_s)
        except SipCallFailed as exc:
            self._uac.close()
            raise CallFailed(exc.code) from None
        except OSError as exc:
            self._uac.close()
            raise CallFailed("client:connect_failed", repr(exc)) from None
        assert self._uac.setup_s is not None
        self.recorder.setup.append(self._uac.setup_s)

    async def _close_leg(self) -> None:
        await self._uac.bye()
        stats = self._uac.stats
        if stats.packets:
            self.recorder.rtp_jitter_ms.append(stats.jitter_ms)
            self.recorder.rtp_packets += stats.packets
            self.recorder.rtp_lost += stats.lost

    def send_caller_audio(self) -> None:
        self._uac.send_audio(MULAW_SILENCE)

    def _on_rtp(self, t: float, payload: bytes) -> None:
        self._audio(t, len(payload))


def _leg_url(spec: CallSpec, path: str, query: dict[str, str]) -> str:
    """``ws://host:port/v1/<path>?<query>`` next to the native endpoint of ``spec.url``."""
    base = spec.url.split("?", 1)[0].rsplit("/", 1)[0]
    return f"{base}/{path}" + (f"?{urlencode(query)}" if query else "")


class _WebSocketLegCall(AttachedCall, wsclient.WsListener):
    """An attached call whose leg is a WebSocket the vendor opens to the gateway and
    closes when the call ends (chan_websocket, jambonz, mod_audio_stream): the shared
    connect, close and caller-audio parts. Caller audio is one binary message of
    ``_caller_frame`` per 20 ms, prebuilt with rotating masking keys."""

    _caller_frame: ClassVar[bytes] = L16_SILENCE

    def __init__(self, spec: CallSpec, recorder: Recorder) -> None:
        super().__init__(spec, recorder)
        self._leg: wsclient.WsProtocol | None = None
        self._leg_closed: asyncio.Future[None] | None = None
        self._silence_i = 0
        self._silence = [
            wsclient.encode_client_frame(wsclient.OP_BINARY, self._caller_frame, os.urandom(4))
            for _ in range(_SILENCE_FRAMES)
        ]

    async def _connect_leg(self, url: str, headers: dict[str, str]) -> wsclient.WsProtocol:
        """Open the leg's WebSocket (the set-up time is the upgrade's)."""
        self._leg_closed = asyncio.get_running_loop().create_future()
        started = time.monotonic()
        try:
            leg = await wsclient.connect(url, headers, self, timeout=self.spec.connect_timeout_s)
        except (OSError, TimeoutError, wsclient.WsProtocolError) as exc:
            raise CallFailed("client:connect_failed", repr(exc)) from None
        self.recorder.setup.append(time.monotonic() - started)
        self._leg = leg
        return leg

    async def _close_leg(self) -> None:
        """The vendor hangs up by closing the WebSocket (1000) and waits for the echo."""
        leg = self._leg
        if leg is None:
            return
        leg.close(1000)
        try:
            if self._leg_closed is not None:
                await asyncio.shield(self._leg_closed)
        except asyncio.CancelledError:
            leg.abort()
            raise

    def send_caller_audio(self) -> None:
        leg = self._leg
        if leg is not None and leg.is_open:
            self._silence_i = (self._silence_i + 1) % _SILENCE_FRAMES
            leg.send_raw(self._silence[self._silence_i])

    def on_closed(self, code: int | None, reason: str) -> None:
        if self._leg_closed is not None and not self._leg_closed.done():
            self._leg_closed.set_result(None)
        self._lost(f"client:leg_closed_{code}" if code is not None else "client:connection_lost")


class AsteriskCall(_WebSocketLegCall):
    """An Asterisk chan_websocket leg (``/v1/asterisk``) driven by an attached application.

    Asterisk's side, from docs.asterisk.org ("WebSocket" channel driver): control as
    plain-text lines, ``MEDIA_START connection_id:... channel:... channel_id:...
    format:ulaw optimal_frame_size:160 ptime:20`` first, then BINARY mu-law frames (the
    caller's audio); from the application BINARY media (measured per message, 160 bytes
    each), ``ANSWER``, ``MARK_MEDIA <id>`` (answered with ``MEDIA_MARK_PROCESSED <id>``),
    ``FLUSH_MEDIA`` and ``HANGUP`` (Asterisk then hangs up: it closes the socket). The call
    id is the channel's uniqueid (``channel_id``); the token and voice travel in the URL.
    """

    protocol = "asterisk"
    _caller_frame = MULAW_SILENCE
    _ids = itertools.count(1)

    def __init__(self, spec: CallSpec, recorder: Recorder) -> None:
        super().__init__(spec, recorder)
        self._connection_id = str(uuid.uuid4())
        self._channel_id = f"{int(time.time())}.{uuid.uuid4().hex[:12]}"
        self._channel = f"WebSocket/bench-{os.getpid()}-{next(self._ids)}"

    @property
    def call_id(self) -> str:
        return self._channel_id

    async def _open_leg(self) -> None:
        query = {"voice": self.spec.voice}
        if self.spec.token:
            query["access_token"] = self.spec.token
        leg = await self._connect_leg(_leg_url(self.spec, "asterisk", query), {})
        leg.send_text(
            f"MEDIA_START connection_id:{self._connection_id} channel:{self._channel} "
            f"channel_id:{self._channel_id} format:ulaw optimal_frame_size:160 ptime:20"
        )

    def on_binary(self, t: float, payload: bytes) -> None:
        self._audio(t, len(payload))

    def on_text(self, t: float, text: str) -> None:
        command, _, rest = text.strip().partition(" ")
        if command == "MARK_MEDIA" and self._leg is not None:
            # the mark reaches the front of the driver's queue: nothing is queued here
            self._leg.send_text(f"MEDIA_MARK_PROCESSED {rest.strip()}")
        elif command == "HANGUP" and self._leg is not None:
            self._leg.close(1000)  # Asterisk hangs the channel up and closes the socket
        elif command not in ("ANSWER", "FLUSH_MEDIA"):
            self._server_error("client:unexpected_command")


class JambonzCall(_WebSocketLegCall):
    """A jambonz ``listen`` leg with bidirectional streaming (``/v1/jambonz``, subprotocol
    ``audio.jambonz.org``) driven by an attached application.

    jambonz's side, from docs.jambonz.org (``listen``, bidirectional audio): one TEXT
    frame of JSON metadata first (``sampleRate``, ``mixType``, the call's attributes with
    ``callSid``, the verb's ``metadata`` members merged in: here ``voice``), then BINARY
    L16 at 8 kHz (the caller's audio); from the application BINARY L16 (measured per
    message, 320 bytes each), ``mark`` (echoed with ``"event": "playout"``), ``killAudio``
    and ``disconnect`` (the verb ends: jambonz closes the socket).

    The gateway ends every utterance with :data:`TAIL_FRAMES` frames of silence written at
    once, right after its last paced frame and the application's ``utterance_done``, so
    that jambonz's pre-buffer releases the prompt's tail. They are not the utterance's
    paced audio: they are counted apart (``tail_frames``) and not measured. They may
    arrive before or after ``utterance_done`` (two sockets), and right behind the last
    paced frame, so neither order nor timing tells them apart: the last
    :data:`TAIL_FRAMES` silent frames an utterance received before the next prompt (or
    the hang-up) are its tail. ``utterance_done`` ends the ``speak`` at once; the
    utterance's measurement ends at the next prompt, with its trailing silent frames held
    back until then.
    """

    protocol = "jambonz"
    frame_bytes = 320
    TAIL_FRAMES = 8  # 160 ms (gateway/legs/websocket/jambonz.py, docs/protocol.md)

    def __init__(self, spec: CallSpec, recorder: Recorder) -> None:
        super().__init__(spec, recorder)
        self._call_sid = str(uuid.uuid4())
        self._held: list[float] = []  # arrival times of trailing silent frames held back
        #: utterance_done came (its first_audio_ms): the probe ends at the next prompt
        self._ending: tuple[float | None] | None = None

    @property
    def call_id(self) -> str:
        return self._call_sid

    async def _open_leg(self) -> None:
        query = {"access_token": self.spec.token} if self.spec.token else {}
        leg = await self._connect_leg(
            _leg_url(self.spec, "jambonz", query),
            {"Sec-WebSocket-Protocol": "audio.jambonz.org"},
        )
        leg.send_text(
            json.dumps(
                {
                    "sampleRate": 8000,
                    "mixType": "mono",
                    "callSid": self._call_sid,
                    "direction": "inbound",
                    "from": "+15551230000",
                    "to": "+15559870000",
                    "callId": f"{uuid.uuid4().hex}@127.0.0.1",
                    "voice": self.spec.voice,
                }
            )
        )

    async def speak(self, text: str, utterance_id: str) -> None:
        self._end_utterance()  # every frame of the previous one is in
        await super().speak(text, utterance_id)

    async def close(self) -> None:
        self._end_utterance()
        await super().close()

    def _utterance_done(self, utterance_id: str, server_first_audio_ms: float | None) -> None:
        probe, done = self._probe, self._done
        if probe is None or probe.utterance_id != utterance_id or self._ending is not None:
            return
        self._ending = (server_first_audio_ms,)  # the tail may be still to come
        if done is not None and not done.done():
            done.set_result(None)

    def _end_utterance(self) -> None:
        """Set the tail apart and finish the utterance's measurement."""
        ending, self._ending = self._ending, None
        probe = self._probe
        if ending is None or probe is None:
            return
        held = self._held
        tail = min(self.TAIL_FRAMES, len(held))
        if tail:
            del held[-tail:]
            self.recorder.tail_frames += tail
        self._release_held()
        self._probe = None
        self.recorder.finish(probe, ending[0])

    def _release_held(self) -> None:
        for t in self._held:
            self._audio(t, len(L16_SILENCE))
        self._held.clear()

    def _abandon(self) -> None:
        self._held.clear()
        self._ending = None
        super()._abandon()

    def on_binary(self, t: float, payload: bytes) -> None:
        if payload == L16_SILENCE and self._probe is not None:
            held = self._held
            held.append(t)
            if len(held) > self.TAIL_FRAMES:  # not the tail: to the probe
                self._audio(held.pop(0), len(payload))
            return
        if self._held:
            self._release_held()  # silence inside the prompt
        self._audio(t, len(payload))

    def on_text(self, t: float, text: str) -> None:
        try:
            message = json.loads(text)
            kind = message.get("type")
        except (ValueError, AttributeError):
            self._server_error("client:bad_server_message")
            return
        if kind == "mark" and self._leg is not None:
            name = (message.get("data") or {}).get("name")
            self._leg.send_text(
                json.dumps({"type": "mark", "data": {"name": name, "event": "playout"}})
            )
        elif kind == "disconnect" and self._leg is not None:
            self._leg.close(1000)  # the listen verb ends: jambonz closes the socket
        elif kind != "killAudio":
            self._server_error("client:unexpected_message")


class FreeSwitchCall(_WebSocketLegCall):
    """A FreeSWITCH ``mod_audio_stream`` leg (``/v1/freeswitch``) driven by an attached
    application.

    FreeSWITCH's side, from the module's README (``uuid_audio_stream <uuid> start <url>
    mono 8k``): the call id, rate and voice in the URL the dialplan wrote, BINARY L16 at
    8 kHz from the start (the caller's audio: one 20 ms frame right away, then every
    20 ms when ``caller_audio``); from the application ``streamAudio`` TEXT messages
    (``{"type": "streamAudio", "data": {"audioDataType": "raw", "sampleRate": 8000,
    "audioData": <base64>}}``), which the voxcom-us fork plays in real time. A message
    carries 100 ms (the gateway's default ``chunk_ms``), so arrival is measured per
    100 ms message. FreeSWITCH hangs up by closing the socket (1000).

    The rest of an utterance (under 100 ms) goes out in one shorter message when the
    utterance ends, in the same instant as the application's ``utterance_done``, so it
    may arrive before or after it (two sockets): it is counted apart (``tail_frames``)
    and not measured, so that the interval figures are between whole 100 ms messages
    (unless it is an utterance's first audio).
    """

    protocol = "freeswitch"
    frame_s = 0.100
    frame_bytes = 1600

    def __init__(self, spec: CallSpec, recorder: Recorder) -> None:
        super().__init__(spec, recorder)
        self._uuid = str(uuid.uuid4())

    @property
    def call_id(self) -> str:
        return self._uuid

    async def _open_leg(self) -> None:
        query = {"call_id": self._uuid, "sample_rate": "8000", "voice": self.spec.voice}
        if self.spec.token:
            query["access_token"] = self.spec.token
        leg = await self._connect_leg(_leg_url(self.spec, "freeswitch", query), {})
        leg.send_raw(self._silence[0])  # the media bug's first frame starts the stream

    def on_binary(self, t: float, payload: bytes) -> None:
        self._server_error("client:unexpected_binary")  # the module ignores binary

    def on_text(self, t: float, text: str) -> None:
        try:
            message = json.loads(text)
            data = message["data"]
            audio = data["audioData"]
            if message["type"] != "streamAudio" or data["audioDataType"] != "raw":
                raise ValueError(text[:80])
        except (ValueError, KeyError, TypeError):
            self._server_error("client:bad_server_message")
            return
        # base64 length without decoding: 4 characters per 3 bytes, minus the padding
        size = len(audio) * 3 // 4 - audio[-2:].count("=")
        probe = self._probe
        if size < self.frame_bytes and (probe is None or probe.frames):
            self.recorder.tail_frames += 1  # the rest of an utterance, sent at its end
            return
        self._audio(t, size)


# AudioSocket message kinds (docs.asterisk.org, "AudioSocket", Protocol definition)
AS_HANGUP, AS_UUID, AS_AUDIO_8K = 0x00, 0x01, 0x10


def audiosocket_message(kind: int, payload: bytes = b"") -> bytes:
    """One AudioSocket message: kind (1 byte), payload length (2 bytes, big-endian),
    payload."""
    return bytes((kind,)) + len(payload).to_bytes(2, "big") + payload


class _TcpStream(asyncio.Protocol):
    """A TCP connection that hands each read, with its arrival time, to the call."""

    def __init__(self, call: AudioSocketCall) -> None:
        self._call = call
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's do not subclass it

    def data_received(self, data: bytes) -> None:
        self._call._received(time.monotonic(), data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        self._call._lost("client:connection_lost")


class AudioSocketCall(AttachedCall):
    """An Asterisk AudioSocket leg (TCP to ``GATEWAY_AUDIOSOCKET_LISTEN``) driven by an
    attached application.

    Asterisk's side, from docs.asterisk.org ("AudioSocket", Protocol definition): messages
    of a 1-byte kind, a 2-byte big-endian length and the payload; the call's UUID (kind
    0x01, 16 bytes) first, then signed linear 16-bit audio at 8 kHz (kind 0x10) every
    20 ms (one right away, the rest when ``caller_audio``). From the gateway: audio
    messages (measured per message, 320 bytes each, played at once: Asterisk buffers
    nothing) and terminate (0x00). Asterisk hangs up by closing the socket. The call id is
    the UUID's canonical string; the call's voice is the listener's
    (``GATEWAY_AUDIOSOCKET_VOICE``), its tenant the trusted network's.
    """

    protocol = "audiosocket"
    frame_bytes = 320
    _CALLER_AUDIO = audiosocket_message(AS_AUDIO_8K, L16_SILENCE)

    def __init__(self, spec: CallSpec, recorder: Recorder) -> None:
        super().__init__(spec, recorder)
        if spec.audiosocket_target is None:
            raise ValueError("an AudioSocket call needs CallSpec.audiosocket_target")
        self._target = spec.audiosocket_target
        self._uuid = uuid.uuid4()
        self._stream: _TcpStream | None = None
        self._buf = bytearray()

    @property
    def call_id(self) -> str:
        return str(self._uuid)

    async def _open_leg(self) -> None:
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.spec.connect_timeout_s):
                _, stream = await loop.create_connection(lambda: _TcpStream(self), *self._target)
        except (OSError, TimeoutError) as exc:
            raise CallFailed("client:connect_failed", repr(exc)) from None
        self.recorder.setup.append(time.monotonic() - started)
        self._stream = stream
        assert stream.transport is not None
        stream.transport.write(audiosocket_message(AS_UUID, self._uuid.bytes) + self._CALLER_AUDIO)

    async def _close_leg(self) -> None:
        stream = self._stream
        if stream is None or stream.transport is None:
            return
        stream.transport.close()  # Asterisk hangs up: it closes the socket
        try:
            await asyncio.shield(stream.closed)
        except asyncio.CancelledError:
            stream.transport.abort()
            raise

    def send_caller_audio(self) -> None:
        transport = None if self._stream is None else self._stream.transport
        if transport is not None and self.alive and not transport.is_closing():
            transport.write(self._CALLER_AUDIO)

    def _received(self, t: float, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos, size = 0, len(buf)
        while size - pos >= 3:
            kind = buf[pos]
            length = (buf[pos + 1] << 8) | buf[pos + 2]
            end = pos + 3 + length
            if end > size:
                break
            if kind == AS_AUDIO_8K:
                self._audio(t, length)
            elif kind == AS_HANGUP:  # the gateway hung up: so does Asterisk
                self._lost("client:terminated")
                if self._stream is not None and self._stream.transport is not None:
                    self._stream.transport.close()
            else:
                self._server_error(f"client:audiosocket_kind_{kind:02x}")
            pos = end
        if pos:
            del buf[:pos]


DRIVERS: dict[str, type[CallDriver]] = {
    NativeCall.protocol: NativeCall,
    TwilioCall.protocol: TwilioCall,
    SipCall.protocol: SipCall,
    AsteriskCall.protocol: AsteriskCall,
    JambonzCall.protocol: JambonzCall,
    FreeSwitchCall.protocol: FreeSwitchCall,
    AudioSocketCall.protocol: AudioSocketCall,
}
