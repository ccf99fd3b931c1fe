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
from typing import Any, ClassVar

from tests.bench import wsclient
from tests.bench.recorder import Recorder, UtteranceProbe
from tests.bench.sipua import SipCallFailed, SipUac

MULAW_SILENCE = b"\xff" * 160  # mu-law code for 0 (ITU-T G.711)
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


class CallDriver(ABC):
    """One call. Not reentrant: one ``speak`` at a time (an IVR prompt, then think)."""

    protocol: ClassVar[str]

    def __init__(self, spec: CallSpec, recorder: Recorder) -> None:
        self.spec = spec
        self.recorder = recorder
        self._probe: UtteranceProbe | None = None
        self._done: asyncio.Future[None] | None = None
        self._lost_reason: str | None = None

    @property
    def alive(self) -> bool:
        """The session is up and nothing fatal happened."""
        return self._lost_reason is None

    # --- operations (the script calls these) -------------------------------------------

    @abstractmethod
    async def open(self) -> None:
        """Connect and start the session; raises :class:`CallFailed`."""

    async def speak(self, text: str, utterance_id: str) -> None:
        """Speak one prompt and wait for its end; raises :class:`CallFailed`.

        The first-audio clock starts right before the request is written.
        """
        if not self.alive:
            raise CallFailed(self._lost_reason or "client:closed")
        self._done = asyncio.get_running_loop().create_future()
        # time.monotonic, like the arrival times (uvloop's loop.time() is cached, in ms)
        self._probe = self.recorder.probe(utterance_id, time.monotonic())
        self._send_speak(text, utterance_id)
        try:
            async with asyncio.timeout(self.spec.utterance_timeout_s):
                await self._done
        except TimeoutError:
            self._abandon()
            raise CallFailed("client:utterance_timeout") from None
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
        self.recorder.frame_s = 0.020

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


DRIVERS: dict[str, type[CallDriver]] = {
    NativeCall.protocol: NativeCall,
    TwilioCall.protocol: TwilioCall,
    SipCall.protocol: SipCall,
}
