"""Call drivers: one simulated IVR call over one wire protocol.

:class:`CallDriver` holds what every protocol shares (the current utterance's probe,
waiting for its end, errors by code, the session's fate); a subclass only translates
between its wire protocol and four operations (``open``, ``speak``, ``close``,
``send_caller_audio``) and reports what it receives through ``_audio``,
``_utterance_done``, ``_server_error`` and ``_lost``. :data:`DRIVERS` is the registry the
CLI picks from (``--protocol``).

Adding the Twilio Media Streams protocol means one more subclass registered here: it
plays Twilio (sends ``connected`` and ``start``, the token in ``customParameters``),
and the server's audio arrives as text frames ``{"event": "media", "streamSid": ...,
"media": {"payload": <base64 mu-law>}}`` every 20 ms; its ``on_text`` decodes those and
calls ``self._audio(t, len(payload))`` exactly as :class:`NativeCall` does for binary
frames, and turns the protocol's end-of-prompt signal into ``_utterance_done``.

Client-side error codes are prefixed ``client:`` to keep them apart from the server's
``error`` codes (docs/protocol.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from tests.bench import wsclient
from tests.bench.recorder import Recorder, UtteranceProbe

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


DRIVERS: dict[str, type[CallDriver]] = {NativeCall.protocol: NativeCall}
