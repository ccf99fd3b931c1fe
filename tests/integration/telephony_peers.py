"""Simulated telephony peers for the gateway's ``/v1/twilio`` and ``/v1/asterisk`` legs.

Written from the vendors' documentation, not from the gateway's code:

* Twilio, "Media Streams - WebSocket Messages"
  (https://www.twilio.com/docs/voice/media-streams/websocket-messages). Twilio sends
  ``connected``, ``start``, ``media``, ``dtmf``, ``mark`` and ``stop`` (counters such as
  ``sequenceNumber``, ``chunk`` and ``timestamp`` travel as decimal strings); the server
  sends ``media``, ``mark`` and ``clear``. Twilio buffers outbound media and plays it in
  real time; it sends a ``mark`` back when the media before it has played, and a
  ``clear`` "empties all buffered audio and causes any mark messages to be sent back".
* Asterisk, "WebSocket" channel driver (chan_websocket; docs.asterisk.org, Configuration /
  Channel Drivers / WebSocket). BINARY frames carry raw media, TEXT frames carry control
  (plain-text ``NAME key:value ...`` or JSON ``{"event": ...}`` / ``{"command": ...}``).
  The driver frames what it receives into ``optimal_frame_size`` frames and plays one per
  ``ptime``; ``MARK_MEDIA <id>`` puts a mark in that queue and ``MEDIA_MARK_PROCESSED``
  reports it when it reaches the front; ``FLUSH_MEDIA`` discards the queue (no event for
  the marks in it); a message over 65,500 bytes closes the socket and hangs up the call.

Both peers record every message they receive with its arrival time (``time.monotonic``),
the audio they "played", what they echoed, and the close code. Anything the vendor would
reject is recorded in ``violations``; tests assert that list is empty.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import itertools
import json
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import numpy as np
import numpy.typing as npt

from telephony.codecs import g711
from tests.integration.conftest import Connect
from tests.integration.harness import GatewayProcess, NativeClient, worker_of

FRAME_S = 0.020
ULAW_FRAME_BYTES = 160  # 20 ms of G.711 at 8 kHz
ASTERISK_MAX_MESSAGE_BYTES = 65_500

MarkCallback = Callable[[str], Awaitable[None]]


def ulaw_frames(pcm: npt.NDArray[np.int16]) -> list[bytes]:
    """16-bit PCM at 8 kHz as 20 ms mu-law frames (the last one zero-padded)."""
    pad = (-len(pcm)) % ULAW_FRAME_BYTES
    padded = np.concatenate([pcm, np.zeros(pad, dtype=np.int16)]) if pad else pcm
    return [
        bytes(g711.ulaw_encode(padded[i : i + ULAW_FRAME_BYTES]))
        for i in range(0, len(padded), ULAW_FRAME_BYTES)
    ]


@dataclass
class _Mark:
    name: str


@dataclass
class RealtimePlayer:
    """A vendor's outbound playout buffer: media played in real time, marks in line.

    ``enqueue_media`` queues audio; the player takes items from the head, "plays" a media
    chunk for its duration (``bytes_per_second``) and, when a mark reaches the head (all
    media queued before it has played), calls ``on_mark``. After an underrun the next
    chunk starts at once. ``clear`` drops the queue and returns the dropped marks.
    ``stall`` freezes playout (a stalled media path): nothing leaves the queue.
    """

    bytes_per_second: int
    on_mark: MarkCallback
    played: bytearray = field(default_factory=bytearray)
    #: (start time, bytes) of every chunk played.
    played_log: list[tuple[float, int]] = field(default_factory=list)
    _queue: deque[bytes | _Mark] = field(default_factory=deque)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    #: Set while nothing is queued or playing.
    drained: asyncio.Event = field(default_factory=asyncio.Event)
    _stalled: bool = False

    def enqueue_media(self, audio: bytes) -> None:
        self._queue.append(audio)
        self.drained.clear()
        self._changed.set()

    def enqueue_mark(self, name: str) -> None:
        self._queue.append(_Mark(name))
        self.drained.clear()
        self._changed.set()

    def clear(self) -> list[str]:
        dropped = [item.name for item in self._queue if isinstance(item, _Mark)]
        self._queue.clear()
        self._changed.set()
        return dropped

    def stall(self, stalled: bool) -> None:
        self._stalled = stalled
        self._changed.set()

    @property
    def queued_bytes(self) -> int:
        return sum(len(item) for item in self._queue if isinstance(item, bytes))

    @property
    def played_ms(self) -> float:
        return len(self.played) * 1000 / self.bytes_per_second

    async def run(self) -> None:
        next_at: float | None = None
        while True:
            while not self._queue or self._stalled:
                if not self._queue:
                    self.drained.set()
                self._changed.clear()
                await self._changed.wait()
                next_at = None  # a gap (underrun or stall): restart the clock
            item = self._queue.popleft()
            if isinstance(item, _Mark):
                await self.on_mark(item.name)
                continue
            now = time.monotonic()
            start = now if next_at is None or next_at < now else next_at
            self.played.extend(item)
            self.played_log.append((start, len(item)))
            next_at = start + len(item) / self.bytes_per_second
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))


class _PeerBase:
    """What both peers share: the socket, the reader, waiting, real-time sending."""

    def __init__(self, http: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.http = http
        self.ws = ws
        self.violations: list[str] = []
        self.close_code: int | None = None
        self.closed_at: float | None = None
        self.media: list[tuple[float, bytes]] = []  # outbound media as it arrived
        self._changed = asyncio.Event()
        self._send_lock = asyncio.Lock()
        self.closed: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        self.player = RealtimePlayer(8000, self._on_mark_played)
        self._tasks: list[asyncio.Task[None]] = []

    def _start_tasks(self) -> None:
        self._tasks = [
            asyncio.create_task(self._read(), name=f"{type(self).__name__}-read"),
            asyncio.create_task(self.player.run(), name=f"{type(self).__name__}-play"),
        ]

    async def _on_mark_played(self, name: str) -> None:
        raise NotImplementedError

    def _on_text(self, now: float, text: str) -> None:
        raise NotImplementedError

    def _on_binary(self, now: float, data: bytes) -> None:
        self.violations.append(f"unexpected binary message of {len(data)} bytes")

    async def _read(self) -> None:
        try:
            async for msg in self.ws:
                now = time.monotonic()
                if msg.type is aiohttp.WSMsgType.TEXT:
                    self._on_text(now, msg.data)
                elif msg.type is aiohttp.WSMsgType.BINARY:
                    self._on_binary(now, msg.data)
                self._changed.set()
        finally:
            self.close_code = self.ws.close_code
            self.closed_at = time.monotonic()
            if not self.closed.done():
                self.closed.set_result(self.ws.close_code)
            self._changed.set()

    async def _send_str(self, text: str) -> float:
        async with self._send_lock:
            await self.ws.send_str(text)
            return time.monotonic()

    async def _send_bytes(self, data: bytes) -> float:
        async with self._send_lock:
            await self.ws.send_bytes(data)
            return time.monotonic()

    async def send_raw(self, data: str | bytes) -> float:
        """Send anything (for malformed-input tests)."""
        if isinstance(data, bytes):
            return await self._send_bytes(data)
        return await self._send_str(data)

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        """Wait until ``predicate()`` holds; fail on timeout, or if the socket closed first."""
        async with asyncio.timeout(timeout):
            while not predicate():
                if self.closed.done():
                    raise AssertionError(f"closed ({self.close_code}) while waiting")
                self._changed.clear()
                await self._changed.wait()

    async def wait_closed(self, timeout: float = 10.0) -> int | None:
        async with asyncio.timeout(timeout):
            code: int | None = await asyncio.shield(self.closed)
            return code

    async def wait_quiet(self, quiet_s: float = 0.5, timeout: float = 30.0) -> None:
        """Wait until no media has arrived for ``quiet_s`` (the prompt has been sent)."""
        async with asyncio.timeout(timeout):
            while True:
                last = self.media[-1][0] if self.media else time.monotonic()
                remaining = last + quiet_s - time.monotonic()
                if remaining <= 0:
                    return
                await asyncio.sleep(remaining)

    async def wait_played(self, timeout: float = 10.0) -> None:
        """Wait until everything received has been played out."""
        async with asyncio.timeout(timeout):
            await self.player.drained.wait()

    async def stream_audio(
        self,
        pcm: npt.NDArray[np.int16],
        *,
        until: Callable[[], bool] | None = None,
    ) -> float:
        """Send ``pcm`` as real-time 20 ms mu-law frames; returns the start time.

        Stops early once ``until()`` holds or the socket closed.
        """
        start = time.monotonic()
        for i, frame in enumerate(ulaw_frames(pcm)):
            if self.closed.done() or (until is not None and until()):
                break
            await self.send_media(frame)
            await asyncio.sleep(max(0.0, start + (i + 1) * FRAME_S - time.monotonic()))
        return start

    async def send_media(self, ulaw: bytes) -> float:
        raise NotImplementedError

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self.ws.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.http.close()


# --------------------------------------------------------------------------- Twilio


class TwilioPeer(_PeerBase):
    """Twilio's side of a bidirectional Media Stream (``<Connect><Stream>``)."""

    _ids = itertools.count(1)

    def __init__(self, http: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse) -> None:
        super().__init__(http, ws)
        n = next(self._ids)
        self.account_sid = "AC" + "0" * 24 + f"{n:08x}"
        self.call_sid = "CA" + "1" * 24 + f"{n:08x}"
        self.stream_sid = "MZ" + "2" * 24 + f"{n:08x}"
        self._sequence = itertools.count(1)
        self._chunk = itertools.count(1)
        self._media_started_at: float | None = None
        #: Every message received: (arrival time, parsed JSON).
        self.received: list[tuple[float, dict[str, Any]]] = []
        #: Marks sent back: (time sent, name, because of a clear).
        self.echoed: list[tuple[float, str, bool]] = []
        self.clears: list[float] = []

    @classmethod
    async def connect(cls, url: str, *, access_token: str | None = None) -> TwilioPeer:
        http = aiohttp.ClientSession()
        params = {"access_token": access_token} if access_token is not None else None
        try:
            ws = await http.ws_connect(url, params=params, max_msg_size=1 << 20)
        except BaseException:
            await http.close()
            raise
        peer = cls(http, ws)
        peer._start_tasks()
        return peer

    # -- what Twilio sends

    async def send_connected(self) -> None:
        await self._send_str(
            json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"})
        )

    async def send_start(
        self,
        custom_parameters: Mapping[str, str] | None = None,
        *,
        media_format: Mapping[str, Any] | None = None,
        tracks: tuple[str, ...] = ("inbound",),
    ) -> float:
        fmt = media_format or {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}
        message = {
            "event": "start",
            "sequenceNumber": str(next(self._sequence)),
            "start": {
                "accountSid": self.account_sid,
                "streamSid": self.stream_sid,
                "callSid": self.call_sid,
                "tracks": list(tracks),
                "customParameters": dict(custom_parameters or {}),
                "mediaFormat": dict(fmt),
            },
            "streamSid": self.stream_sid,
        }
        return await self._send_str(json.dumps(message))

    async def begin(self, custom_parameters: Mapping[str, str] | None = None) -> float:
        """``connected`` then ``start``; returns when ``start`` was sent."""
        await self.send_connected()
        return await self.send_start(custom_parameters)

    async def send_media(self, ulaw: bytes) -> float:
        now = time.monotonic()
        if self._media_started_at is None:
            self._media_started_at = now
        message = {
            "event": "media",
            "sequenceNumber": str(next(self._sequence)),
            "media": {
                "track": "inbound",
                "chunk": str(next(self._chunk)),
                "timestamp": str(round((now - self._media_started_at) * 1000)),
                "payload": base64.b64encode(ulaw).decode("ascii"),
            },
            "streamSid": self.stream_sid,
        }
        return await self._send_str(json.dumps(message))

    async def send_dtmf(self, digit: str) -> float:
        message = {
            "event": "dtmf",
            "streamSid": self.stream_sid,
            "sequenceNumber": str(next(self._sequence)),
            "dtmf": {"track": "inbound_track", "digit": digit},
        }
        return await self._send_str(json.dumps(message))

    async def send_stop(self) -> float:
        message = {
            "event": "stop",
            "sequenceNumber": str(next(self._sequence)),
            "streamSid": self.stream_sid,
            "stop": {"accountSid": self.account_sid, "callSid": self.call_sid},
        }
        return await self._send_str(json.dumps(message))

    async def _send_mark(self, name: str, *, cleared: bool) -> None:
        message = {
            "event": "mark",
            "streamSid": self.stream_sid,
            "sequenceNumber": str(next(self._sequence)),
            "mark": {"name": name},
        }
        sent = await self._send_str(json.dumps(message))
        self.echoed.append((sent, name, cleared))
        self._changed.set()

    async def _on_mark_played(self, name: str) -> None:
        if not self.closed.done():
            await self._send_mark(name, cleared=False)

    # -- what Twilio receives

    def _on_text(self, now: float, text: str) -> None:
        try:
            message = json.loads(text)
        except ValueError:
            self.violations.append(f"not JSON: {text[:80]!r}")
            return
        if not isinstance(message, dict):
            self.violations.append(f"not a JSON object: {text[:80]!r}")
            return
        self.received.append((now, message))
        event = message.get("event")
        if event in ("media", "mark", "clear") and message.get("streamSid") != self.stream_sid:
            self.violations.append(f"{event} for streamSid {message.get('streamSid')!r}")
        if event == "media":
            media = message.get("media")
            payload = media.get("payload") if isinstance(media, dict) else None
            try:
                audio = base64.b64decode(payload or "", validate=True)
            except (binascii.Error, ValueError, TypeError):
                self.violations.append("media payload is not base64")
                return
            if not audio:
                self.violations.append("empty media payload")
                return
            self.media.append((now, audio))
            self.player.enqueue_media(audio)
        elif event == "mark":
            mark = message.get("mark")
            name = mark.get("name") if isinstance(mark, dict) else None
            if not isinstance(name, str) or not name:
                self.violations.append(f"mark without a name: {text[:80]!r}")
                return
            self.player.enqueue_mark(name)
        elif event == "clear":
            self.clears.append(now)
            dropped = self.player.clear()
            if dropped:
                task = asyncio.create_task(self._echo_cleared(dropped))
                self._tasks.append(task)
        else:
            self.violations.append(f"unknown event {event!r}")

    async def _echo_cleared(self, names: list[str]) -> None:
        for name in names:
            if self.closed.done():
                return
            with contextlib.suppress(ConnectionError):
                await self._send_mark(name, cleared=True)

    # -- views

    def events(self, kind: str) -> list[tuple[float, dict[str, Any]]]:
        return [(t, m) for t, m in self.received if m.get("event") == kind]


# --------------------------------------------------------------------------- Asterisk


ControlFormat = Literal["plain-text", "json"]


class AsteriskPeer(_PeerBase):
    """chan_websocket's side of a media WebSocket (Asterisk connecting to the app)."""

    _ids = itertools.count(1)

    def __init__(
        self,
        http: aiohttp.ClientSession,
        ws: aiohttp.ClientWebSocketResponse,
        control_format: ControlFormat,
    ) -> None:
        super().__init__(http, ws)
        n = next(self._ids)
        self.control_format: ControlFormat = control_format
        self.connection_id = f"2f6e0c1a-77a4-4c36-9d2b-{n:012x}"
        self.channel = f"WebSocket/test-{n:04d}"
        self.channel_id = f"1761234567.{n}"
        self.frame_bytes = ULAW_FRAME_BYTES
        #: Every TEXT message received: (arrival time, command name, parameters).
        self.commands: list[tuple[float, str, dict[str, Any]]] = []
        self.flushes: list[float] = []
        #: MEDIA_MARK_PROCESSED sent: (time sent, correlation id).
        self.marks_processed: list[tuple[float, str]] = []
        self.marks_flushed: list[str] = []  # dropped silently by FLUSH_MEDIA

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        query: Mapping[str, str] | None = None,
        basic_auth: tuple[str, str] | None = None,
        control_format: ControlFormat = "plain-text",
    ) -> AsteriskPeer:
        http = aiohttp.ClientSession()
        headers = {}
        if basic_auth is not None:  # RFC 7617: base64("user:password")
            user, password = basic_auth
            credentials = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
            headers["Authorization"] = f"Basic {credentials}"
        try:
            ws = await http.ws_connect(
                url, params=dict(query or {}), headers=headers, max_msg_size=1 << 20
            )
        except BaseException:
            await http.close()
            raise
        peer = cls(http, ws, control_format)
        peer._start_tasks()
        return peer

    # -- what Asterisk sends

    async def send_event(self, name: str, **params: Any) -> float:
        """One control event in this peer's format (plain-text ``key:value`` or JSON)."""
        if self.control_format == "json":
            return await self._send_str(json.dumps({"event": name, **params}))
        parts = [name, *(f"{k}:{v}" for k, v in params.items())]
        return await self._send_str(" ".join(parts))

    async def send_media_start(
        self, *, codec: str = "ulaw", optimal_frame_size: int = 160, ptime: int = 20
    ) -> float:
        self.frame_bytes = optimal_frame_size
        return await self.send_event(
            "MEDIA_START",
            connection_id=self.connection_id,
            channel=self.channel,
            channel_id=self.channel_id,
            format=codec,
            optimal_frame_size=optimal_frame_size,
            ptime=ptime,
        )

    async def send_dtmf_end(self, digit: str) -> float:
        return await self.send_event("DTMF_END", channel_id=self.channel_id, digit=digit)

    async def send_xoff(self) -> float:
        if self.control_format == "json":
            return await self.send_event("MEDIA_XOFF", channel_id=self.channel_id)
        return await self.send_event("MEDIA_XOFF")

    async def send_xon(self) -> float:
        if self.control_format == "json":
            return await self.send_event("MEDIA_XON", channel_id=self.channel_id)
        return await self.send_event("MEDIA_XON")

    async def send_media(self, ulaw: bytes) -> float:
        return await self._send_bytes(ulaw)

    async def _on_mark_played(self, name: str) -> None:
        if self.closed.done():
            return
        if self.control_format == "json":
            text = json.dumps(
                {
                    "event": "MEDIA_MARK_PROCESSED",
                    "channel_id": self.channel_id,
                    "correlation_id": name,
                }
            )
        else:
            text = f"MEDIA_MARK_PROCESSED {name}"
        sent = await self._send_str(text)
        self.marks_processed.append((sent, name))
        self._changed.set()

    # -- what Asterisk receives

    def _on_binary(self, now: float, data: bytes) -> None:
        if len(data) > ASTERISK_MAX_MESSAGE_BYTES:
            # chan_websocket closes the socket and hangs up the call.
            self.violations.append(f"binary message of {len(data)} bytes (over 65,500)")
            return
        if not data or len(data) % self.frame_bytes:
            self.violations.append(
                f"binary message of {len(data)} bytes, not a multiple of {self.frame_bytes}"
            )
        self.media.append((now, data))
        whole = len(data) - len(data) % self.frame_bytes  # the driver drops the rest
        for offset in range(0, whole, self.frame_bytes):
            self.player.enqueue_media(data[offset : offset + self.frame_bytes])

    def _on_text(self, now: float, text: str) -> None:
        if len(text.encode()) > ASTERISK_MAX_MESSAGE_BYTES:
            self.violations.append(f"text message of {len(text.encode())} bytes (over 65,500)")
            return
        name, params = self._parse_command(text)
        if name is None:
            return
        self.commands.append((now, name, params))
        if name == "MARK_MEDIA":
            correlation_id = params.get("correlation_id")
            self.player.enqueue_mark(str(correlation_id or ""))
        elif name == "FLUSH_MEDIA":
            self.flushes.append(now)
            self.marks_flushed.extend(self.player.clear())
        elif name not in ("ANSWER", "HANGUP"):
            self.violations.append(f"unexpected command {name!r}")

    def _parse_command(self, text: str) -> tuple[str | None, dict[str, Any]]:
        if self.control_format == "json":
            try:
                obj = json.loads(text)
            except ValueError:
                self.violations.append(f"not JSON on a json leg: {text[:80]!r}")
                return None, {}
            if not isinstance(obj, dict) or not isinstance(obj.get("command"), str):
                self.violations.append(f"not a JSON command: {text[:80]!r}")
                return None, {}
            return obj["command"], {k: v for k, v in obj.items() if k != "command"}
        if text.lstrip().startswith("{"):
            self.violations.append(f"JSON on a plain-text leg: {text[:80]!r}")
            return None, {}
        name, _, rest = text.strip().partition(" ")
        if len(text.encode()) > 128:  # the driver ignores longer commands
            self.violations.append(f"command over 128 bytes: {text[:80]!r}")
        params: dict[str, Any] = {"correlation_id": rest} if rest else {}
        return name, params

    # -- views

    def command_names(self) -> list[str]:
        return [name for _, name, _ in self.commands]

    def first(self, name: str) -> tuple[float, dict[str, Any]] | None:
        for t, n, params in self.commands:
            if n == name:
                return t, params
        return None


# --------------------------------------------------------------------------- helpers


def leg_url(gateway: GatewayProcess, protocol: Literal["twilio", "asterisk"]) -> str:
    return gateway.base.replace("http://", "ws://", 1) + f"/v1/{protocol}"


async def first_event(app: NativeClient, timeout: float = 5.0) -> dict[str, Any]:
    """The first message the application received (or fail if it closed without one)."""
    async with asyncio.timeout(timeout):
        while not app.got.events:
            if app.closed.done():
                raise AssertionError(f"closed ({app.closed.result()}) without a message")
            await asyncio.sleep(0.01)
    return app.got.events[0][1]


async def attach(
    connect: Connect, call_id: str, token: str | None = "", timeout: float = 5.0
) -> NativeClient:
    """An IVR application attached to ``call_id``; it has received ``ready``.

    The leg registers its call once the engine stream is open, a moment after the
    vendor's start message: ``unknown_call`` is retried until ``timeout``. ``voice`` is
    sent although attach mode does not use it (see the xfail test on ``start`` with
    only ``call``).
    """
    deadline = time.monotonic() + timeout
    while True:
        app = await connect(token)
        await app.send(type="start", call=call_id, voice="en-us")
        event = await first_event(app)
        if event.get("type") == "ready":
            return app
        if event.get("code") != "unknown_call" or time.monotonic() > deadline:
            raise AssertionError(f"attach to {call_id}: {event}")
        await app.aclose()
        await asyncio.sleep(0.05)


def event_time(app: NativeClient, event: dict[str, Any]) -> float:
    """When ``event`` (an object from ``app.got``) arrived."""
    return next(t for t, e in app.got.events if e is event)


def steady_interval_ms(arrivals: list[float], lead_frames: int = 4) -> float:
    """Mean inter-arrival time in ms, after the first ``lead_frames`` (sent at once to
    fill the peer's lead buffer)."""
    steady = arrivals[lead_frames - 1 :]
    return (steady[-1] - steady[0]) / (len(steady) - 1) * 1000


def max_run_ahead_ms(chunks: list[tuple[float, int]], bytes_per_second: int = 8000) -> float:
    """How far ahead of real-time playout the sender ever was, in ms.

    Models a playout buffer fed by ``chunks`` (arrival time, bytes): a chunk starts
    playing when it has arrived and the previous one has finished. The run-ahead at an
    arrival is the audio queued in front of the chunk that just arrived.
    """
    worst = 0.0
    play_end = 0.0
    for arrived, size in chunks:
        start = max(arrived, play_end)
        worst = max(worst, start - arrived)
        play_end = start + size / bytes_per_second
    return worst * 1000


# -- several workers on one port: landing on a given worker -----------------------

#: Connections tried to land one on a given worker (the kernel picks, SO_REUSEPORT).
ATTEMPTS = 40


async def client_on(url: str, token: str, *, worker: str | None = None,
                    avoid: str | None = None) -> NativeClient:  # fmt: skip
    """A native client on ``worker`` (or on any worker but ``avoid``)."""
    for _ in range(ATTEMPTS):
        client = await NativeClient.connect(url, token)
        got = worker_of(client.ws)
        if (worker is None or got == worker) and got != avoid:
            return client
        await client.aclose()
    raise AssertionError(f"no connection landed on worker {worker} (avoiding {avoid})")


async def leg_on(url: str, token: str, *, worker: str | None = None) -> TwilioPeer:
    for _ in range(ATTEMPTS):
        peer = await TwilioPeer.connect(url, access_token=token)
        if worker is None or worker_of(peer.ws) == worker:
            await peer.begin()
            return peer
        await peer.aclose()
    raise AssertionError(f"no Twilio leg landed on worker {worker}")


async def attached_app(
    url: str,
    token: str,
    call_id: str,
    *,
    worker: str | None = None,
    avoid: str | None = None,
    timeout: float = 5.0,
) -> NativeClient:
    """An application attached to ``call_id`` from ``worker`` (or any but ``avoid``). The
    leg registers its call a moment after its start message: ``unknown_call`` is retried
    until ``timeout`` (as tests/integration/telephony_peers.py's ``attach`` does)."""
    deadline = time.monotonic() + timeout
    while True:
        app = await client_on(url, token, worker=worker, avoid=avoid)
        await app.send(type="start", call=call_id)
        event = await first_event(app)
        if event.get("type") == "ready":
            await app.wait_event("call_started")
            return app
        await app.aclose()
        if event.get("code") != "unknown_call" or time.monotonic() > deadline:
            raise AssertionError(f"attach to {call_id}: {event}")
        await asyncio.sleep(0.05)
