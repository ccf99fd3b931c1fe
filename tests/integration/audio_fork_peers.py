"""Simulated jambonz and FreeSWITCH peers for ``/v1/jambonz`` and ``/v1/freeswitch``:
both fork a call's audio to a WebSocket as 16-bit linear PCM and play what comes back.

Written from the vendors' documentation and sources, not from the gateway's code:

* jambonz ``listen`` with ``bidirectionalAudio.streaming`` (docs.jambonz.org, verbs/listen;
  jambonz/freeswitch-modules ``mod_audio_fork``): subprotocol ``audio.jambonz.org``; a
  first TEXT frame of JSON metadata (``sampleRate``, ``mixType``, the call's attributes
  such as ``callSid``, ``from``, ``to``, and the verb's ``metadata`` members merged in);
  then BINARY L16 frames; DTMF as ``{"event": "dtmf", "dtmf": "5", "duration": "1600"}``.
  From the server: BINARY L16 played in real time; ``{"type": "mark", "data": {"name"}}``
  reported back with ``"event": "playout"`` once the audio before it has played;
  ``{"type": "killAudio"}`` drops what is buffered and reports pending marks ``cleared``;
  ``{"type": "disconnect"}`` ends the verb (the peer then closes the socket).
* FreeSWITCH ``mod_audio_stream`` (amigniter/mod_audio_stream README; the voxcom-us fork
  that plays ``streamAudio`` in real time): BINARY L16 from FreeSWITCH, optionally a
  metadata TEXT frame; from the server, ``{"type": "streamAudio", "data":
  {"audioDataType": "raw", "sampleRate": N, "audioData": <base64>}}``, played in order.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import itertools
import json
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
import numpy as np
import numpy.typing as npt

from tests.integration.harness import GatewayProcess
from tests.integration.telephony_peers import FRAME_S, _PeerBase

L16_RATE = 8000
L16_FRAME_BYTES = L16_RATE * 2 // 50  # 20 ms


def fork_url(gateway: GatewayProcess, protocol: str) -> str:
    return gateway.base.replace("http://", "ws://", 1) + f"/v1/{protocol}"


class _L16Peer(_PeerBase):
    """A peer that sends and plays 16-bit PCM at 8 kHz."""

    def __init__(self, http: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse) -> None:
        super().__init__(http, ws)
        self.player.bytes_per_second = L16_RATE * 2

    def pcm(self) -> npt.NDArray[np.int16]:
        """Everything played so far, as samples."""
        return np.frombuffer(bytes(self.player.played), dtype="<i2")

    async def send_media(self, ulaw: bytes) -> float:  # the base's mu-law path is unused
        raise NotImplementedError

    async def stream_l16(self, pcm: npt.NDArray[np.int16], *, until: Any = None) -> float:
        """Send ``pcm`` as real-time 20 ms L16 frames; returns the start time."""
        start = time.monotonic()
        data = pcm.astype("<i2").tobytes()
        for i, offset in enumerate(range(0, len(data), L16_FRAME_BYTES)):
            if self.closed.done() or (until is not None and until()):
                break
            await self._send_bytes(data[offset : offset + L16_FRAME_BYTES])
            await self._sleep_until(start + (i + 1) * FRAME_S)
        return start

    @staticmethod
    async def _sleep_until(when: float) -> None:
        await asyncio.sleep(max(0.0, when - time.monotonic()))


class JambonzPeer(_L16Peer):
    _ids = itertools.count(1)

    def __init__(self, http: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse) -> None:
        super().__init__(http, ws)
        self.call_sid = f"7c0d3f6e-0000-4000-8000-{next(self._ids):012x}"
        self.kills: list[float] = []
        self.disconnects: list[float] = []
        self.plays: list[tuple[float, int]] = []  # (arrival, PCM bytes) per playAudio
        self.marks_reported: list[tuple[float, str, str]] = []  # (sent, name, event)
        self._pending_marks: list[str] = []

    @classmethod
    async def connect(cls, url: str, *, query: Mapping[str, str] | None = None) -> JambonzPeer:
        http = aiohttp.ClientSession()
        try:
            ws = await http.ws_connect(
                url, params=dict(query or {}), protocols=("audio.jambonz.org",)
            )
        except BaseException:
            await http.close()
            raise
        peer = cls(http, ws)
        peer._start_tasks()
        return peer

    async def send_metadata(self, **extra: Any) -> float:
        metadata = {
            "sampleRate": L16_RATE,
            "mixType": "mono",
            "callSid": self.call_sid,
            "direction": "inbound",
            "from": "+15551234567",
            "to": "+15557654321",
            **extra,
        }
        return await self._send_str(json.dumps(metadata))

    async def send_dtmf(self, digit: str) -> float:
        return await self._send_str(
            json.dumps({"event": "dtmf", "dtmf": digit, "duration": "1600"})
        )

    def _on_binary(self, now: float, data: bytes) -> None:
        if not data or len(data) % 2:
            self.violations.append(f"binary message of {len(data)} bytes (not L16)")
            return
        self.media.append((now, data))
        self.player.enqueue_media(data)

    def _on_text(self, now: float, text: str) -> None:
        try:
            message = json.loads(text)
        except ValueError:
            self.violations.append(f"not JSON: {text[:80]!r}")
            return
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "mark":
            name = message.get("data", {}).get("name")
            if not isinstance(name, str):
                self.violations.append(f"mark without a name: {text[:80]!r}")
                return
            self._pending_marks.append(name)
            self.player.enqueue_mark(name)
        elif kind == "killAudio":
            self.kills.append(now)
            self.player.clear()
            for name in self._pending_marks:
                self._report_soon(name, "cleared")
            self._pending_marks.clear()
        elif kind == "disconnect":
            self.disconnects.append(now)
        elif kind == "playAudio":
            self._on_play_audio(now, message.get("data"), text)
        else:
            self.violations.append(f"unexpected message {text[:80]!r}")

    def _on_play_audio(self, now: float, data: object, text: str) -> None:
        """A file to queue and play (non-streaming bidirectional audio)."""
        try:
            assert isinstance(data, dict)
            assert data["audioContentType"] == "raw" and data["sampleRate"] == L16_RATE
            pcm = base64.b64decode(data["audioContent"], validate=True)
        except (AssertionError, KeyError, ValueError, binascii.Error):
            self.violations.append(f"not a raw playAudio message: {text[:80]!r}")
            return
        if not pcm or len(pcm) % 2:
            self.violations.append(f"playAudio of {len(pcm)} bytes (not L16)")
            return
        self.plays.append((now, len(pcm)))
        self.media.append((now, pcm))
        self.player.enqueue_media(pcm)

    def _report_soon(self, name: str, event: str) -> None:
        task = asyncio.ensure_future(self._report(name, event))
        self._tasks.append(task)

    async def _report(self, name: str, event: str) -> None:
        if self.closed.done():
            return
        text = json.dumps({"type": "mark", "data": {"name": name, "event": event}})
        sent = await self._send_str(text)
        self.marks_reported.append((sent, name, event))
        self._changed.set()

    async def _on_mark_played(self, name: str) -> None:
        if name in self._pending_marks:
            self._pending_marks.remove(name)
            await self._report(name, "playout")


class FreeSwitchPeer(_L16Peer):
    _ids = itertools.count(1)

    def __init__(
        self, http: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse, uuid: str
    ) -> None:
        super().__init__(http, ws)
        self.uuid = uuid
        self.messages: list[tuple[float, int]] = []  # (arrival, PCM bytes) per streamAudio

    @classmethod
    def new_uuid(cls) -> str:
        """A channel uuid, as FreeSWITCH's ``${uuid}`` would put in the URL."""
        return f"5a1f2c3d-0000-4000-9000-{next(cls._ids):012x}"

    @classmethod
    async def connect(
        cls, url: str, uuid: str, *, query: Mapping[str, str] | None = None
    ) -> FreeSwitchPeer:
        http = aiohttp.ClientSession()
        try:
            ws = await http.ws_connect(url, params=dict(query or {}))
        except BaseException:
            await http.close()
            raise
        peer = cls(http, ws, uuid)
        peer._start_tasks()
        return peer

    async def send_metadata(self, text: str) -> float:
        return await self._send_str(text)

    def _on_text(self, now: float, text: str) -> None:
        try:
            message = json.loads(text)
            data = message["data"]
            assert message["type"] == "streamAudio"
            assert data["audioDataType"] == "raw" and data["sampleRate"] == L16_RATE
            pcm = base64.b64decode(data["audioData"], validate=True)
        except (ValueError, KeyError, TypeError, AssertionError, binascii.Error):
            self.violations.append(f"not a raw streamAudio message: {text[:80]!r}")
            return
        if not pcm or len(pcm) % 2:
            self.violations.append(f"streamAudio of {len(pcm)} bytes (not L16)")
            return
        self.messages.append((now, len(pcm)))
        self.media.append((now, pcm))
        self.player.enqueue_media(pcm)

    def _on_binary(self, now: float, data: bytes) -> None:
        self.violations.append(f"binary from the server: {len(data)} bytes (the module ignores it)")
