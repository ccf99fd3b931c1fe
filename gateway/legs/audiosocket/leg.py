"""One AudioSocket call: a TCP connection from Asterisk, its session, its call.

:class:`AudioSocketLeg` is a :class:`gateway.legs.base.CallLeg` (the call in the registry
with protocol ``audiosocket`` and the dialplan's UUID as id, what an attached IVR
application sees) whose media is the AudioSocket stream (``telephony/audiosocket.py``
frames it; this module only moves bytes):

- inbound: every read (at most :data:`READ_BYTES`) goes to the core; audio feeds the
  session's VAD (barge-in as on every leg), DTMF messages become ``dtmf`` for the
  application, a terminate or the socket's close ends the call. A message the protocol
  does not allow ends the call with ``audiosocket_<code>`` (the application gets it as
  an ``error``, then ``call_ended``);
- outbound: the session's 20 ms frames, paced in real time by the worker's pacer (Asterisk
  plays what it reads at once and buffers nothing), each written as one audio message of
  the call's rate. While more than :data:`WRITE_BUFFER_FRAMES` frames wait in the
  transport the pacer skips the call (:meth:`backlogged`), so a peer that stops reading
  costs a bounded buffer, not an ever later prompt; the listener's write-stall watch
  aborts one that reads nothing for ``GATEWAY_SEND_STALL_S``;
- marks: AudioSocket has none, so a mark is reported when the audio before it was
  written (as on SIP legs): with nothing buffered at the far end that is when it plays,
  within the pacing lead.

The sample rate: the UUID message says nothing about it; only audio messages do
(``0x10`` 8 kHz from the dialplan application, ``0x12`` 16 kHz from ``c(slin16)``...). A
call starts once its first audio message is in (Asterisk sends one per 20 ms from the
start) or, when none came within ``first_audio_wait_s`` (2 s; a caller behind silence
suppression), at 8 kHz, what the dialplan application always uses. The session speaks
and hears that rate (``pcm_8000``, ``pcm_16000``, ``pcm_24000`` or ``pcm_48000``); audio of
another rate later ends the call (``audiosocket_sample_rate_changed``), a rate the
gateway has no format for too (``audiosocket_unsupported_sample_rate``). DTMF before the
call is registered has nobody to go to and is dropped.

The lifecycle (:meth:`AudioSocketLeg.run`): start the session (admission applies; a
refusal ends the call like any other end), run until the peer hangs up, an application
or a watchdog (no application attached in ``GATEWAY_AUDIOSOCKET_ATTACH_TIMEOUT_S``, a
call longer than ``GATEWAY_AUDIOSOCKET_MAX_CALL_S``) hangs up, or the session ends;
whatever ends it, the call, the session, the connection tracking and the metrics are
released and the socket is closed (a terminate message first when the call was still
up at our end).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, ClassVar

from prometheus_client import Gauge

from gateway.context import LegContext
from gateway.errors import CloseCode, ProtocolViolation, SessionError, vendor_code
from gateway.events import MarkReached
from gateway.legs.audiosocket.config import AudioSocketSettings
from gateway.legs.audiosocket.metrics import AudioSocketMetrics
from gateway.legs.base import StandaloneLeg
from gateway.peer_log import PeerLog
from gateway.tenant_quota import quota_for
from telephony.audiosocket import (
    HEADER_BYTES,
    AudioReceived,
    AudioSocketConnection,
    AudioSocketError,
    AudioSocketEvent,
    AudioSocketProtocolError,
    AudioSocketState,
    AudioSocketUsageError,
    DtmfReceived,
    ErrorReceived,
    HangupReceived,
    frame_bytes,
)

log = logging.getLogger(__name__)

#: The most bytes one read takes from the socket (a 20 ms message is 323 bytes at 8 kHz,
#: 1,923 at 48 kHz).
READ_BYTES = 16 * 1024
#: The largest inbound payload accepted (``frame_too_large`` beyond): 170 ms at 48 kHz.
MAX_PAYLOAD_BYTES = 16 * 1024
#: Outbound frames that may wait in the transport before the pacer holds the call back.
WRITE_BUFFER_FRAMES = 10
#: The rate of a call whose first audio did not come in time (the dialplan application's).
DEFAULT_SAMPLE_RATE = 8000
#: At the end: how long the terminate and the last frames may take to leave.
CLOSE_WAIT_S = 2.0
PROTOCOL = "audiosocket"


def vendor_error(exc: AudioSocketError) -> ProtocolViolation:
    """A core error as the call's error: ``audiosocket_<code>``, ending the call."""
    return ProtocolViolation(vendor_code(PROTOCOL, exc.code), exc.message, CloseCode.POLICY)


class AudioSocketLeg(StandaloneLeg):
    protocol: ClassVar[str] = PROTOCOL

    def __init__(
        self,
        state: LegContext,
        *,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        core: AudioSocketConnection,
        pending: list[AudioSocketEvent],
        tenant: str,
        settings: AudioSocketSettings,
        metrics: AudioSocketMetrics,
    ) -> None:
        if core.call_id is None:
            raise ValueError("a leg starts after the UUID")
        self._state = state
        self._reader = reader
        self._writer = writer
        self._core = core
        self._pending = list(pending)  # what the read that carried the UUID also carried
        self.call_id = core.call_id
        self.tenant = tenant
        self._settings = settings
        self._metrics = metrics
        # no token: the trusted network's tenant, under GATEWAY_TENANT_MAX_STREAMS
        self.session = state.new_session(self, self.protocol, quota_for(tenant))
        self.peer_log = PeerLog(log, f"audiosocket {self.call_id}")
        self.sample_rate: int | None = None  # the call's rate, once chosen
        self._max_buffer = 0
        self._first_audio: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.started_at = time.monotonic()
        self.end_reason = ""  # how the call ended, once known (gateway_audiosocket_calls_total)

    # --- Connection (for the drain) -------------------------------------------------------

    @property
    def established(self) -> bool:
        return self.call is not None

    # --- Peer -----------------------------------------------------------------------------

    def send_audio(self, frame: bytes) -> None:
        rate = self.sample_rate
        if rate is None or self._writer.transport.is_closing():
            return
        try:
            messages = self._core.audio(frame, rate)
        except AudioSocketUsageError:
            return  # a terminate went out or came in: Asterisk takes no more audio
        self._writer.write(b"".join(messages))

    def backlogged(self) -> bool:
        return self._paused or self._writer.transport.get_write_buffer_size() > self._max_buffer

    def on_interrupt(self) -> None:
        return None  # Asterisk buffers nothing: at most the pacing lead is still in flight

    def mark_reached(self, name: str) -> None:
        self.publish(MarkReached(name))  # no vendor marks: reached when its audio was sent

    def vendor_hangup(self) -> None:
        if not self.end_reason:
            self.end_reason = "hangup"
        self._send_terminate()
        self._writer.close()  # after what is buffered; Asterisk ends its application

    def _send_terminate(self) -> None:
        if self._core.state is AudioSocketState.ACTIVE and not self._writer.transport.is_closing():
            self._writer.write(self._core.hangup())

    # --- lifecycle --------------------------------------------------------------------------

    @property
    def calls_active(self) -> Gauge:
        return self._metrics.calls_active

    async def _serve(self) -> None:
        receiver = asyncio.ensure_future(self._receive())
        starting = asyncio.ensure_future(self._start())
        watchdog: asyncio.Future[None] | None = None
        done = self.session.done
        try:
            first: list[asyncio.Future[Any]] = [starting, receiver, done]
            await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
            if not starting.done() or starting.cancelled():  # the peer left, or the drain
                return
            error = starting.exception()
            if error is not None:
                if not isinstance(error, SessionError):
                    self.end_reason = "failed"
                    raise error  # a bug: logged by the listener
                self.peer_log.info("refused: %s (%s)", error.code, error.message)
                self.end_reason = self.end_reason or "refused"
                self.session.fail(error)
                return
            watchdog = asyncio.ensure_future(self._watch())
            ending: list[asyncio.Future[Any]] = [receiver, done, watchdog]
            await asyncio.wait(ending, return_when=asyncio.FIRST_COMPLETED)
        finally:
            tasks: list[asyncio.Future[None]] = [starting, receiver]
            if watchdog is not None:
                tasks.append(watchdog)
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)
            if not starting.cancelled():
                starting.exception()  # handled above, or raised on its way out
            for task in tasks[1:]:
                if not task.cancelled() and task.exception() is not None:
                    log.error(
                        "audiosocket call %s: a task failed",
                        self.call_id,
                        exc_info=task.exception(),
                    )
                    self.end_reason = self.end_reason or "failed"

    async def _start(self) -> None:
        """Choose the call's rate (its first audio, or 8 kHz), then start the call."""
        arrived, _ = await asyncio.wait(
            [self._first_audio], timeout=self._settings.first_audio_wait_s
        )
        if arrived:
            rate = self._first_audio.result()
        else:
            rate = DEFAULT_SAMPLE_RATE
            self.peer_log.info(
                "no audio %.1f s after the UUID: starting at %d Hz",
                self._settings.first_audio_wait_s,
                rate,
            )
        try:
            format_name = AudioSocketConnection.format_name(rate)
        except AudioSocketUsageError as exc:
            self.end_reason = "protocol_error"
            raise vendor_error(exc) from None
        self.sample_rate = rate
        self._max_buffer = WRITE_BUFFER_FRAMES * (frame_bytes(rate) + HEADER_BYTES)
        parameters: dict[str, str] = {}
        if self._settings.voice:
            parameters["voice"] = self._settings.voice
        if self._settings.say:
            parameters["say"] = self._settings.say
        await self.start_call(
            call_id=self.call_id,
            tenant=self.tenant,
            format_name=format_name,
            parameters=parameters,
        )

    async def _receive(self) -> None:
        """Read until the peer hangs up, closes or misbehaves, or the session ends."""
        pending, self._pending = self._pending, []
        self._on_events(pending)
        done = self.session.done
        while not done.done():
            try:
                data = await self._reader.read(READ_BYTES)
            except ConnectionError:
                data = b""
            if not data:
                self._peer_closed()
                return
            try:
                events = self._core.receive(data)
            except AudioSocketProtocolError as exc:
                self._on_events(list(exc.events))
                self._protocol_error(exc)
                return
            self._on_events(events)

    def _on_events(self, events: list[AudioSocketEvent]) -> None:
        for event in events:
            if self.session.done.done():
                return  # ending: what follows has nowhere to go
            if isinstance(event, AudioReceived):
                self._on_audio(event)
            elif isinstance(event, DtmfReceived):
                self._metrics.dtmf.inc()
                self.dtmf(event.digit)
            elif isinstance(event, HangupReceived):
                self.end_reason = self.end_reason or "remote_hangup"
                self.session.finish(CloseCode.NORMAL, "remote_hangup")
            elif isinstance(event, ErrorReceived):
                self.peer_log.warning(
                    "error message from the peer: %s (payload %s)",
                    event.description,
                    event.payload[:16].hex(),
                )
                self.end_reason = self.end_reason or "peer_error"
                self.session.fail(
                    SessionError(
                        vendor_code(self.protocol, "peer_error"),
                        f"Asterisk reported an error: {event.description}",
                        CloseCode.POLICY,
                    )
                )
            # CallStarted comes once, before the leg exists (the core refuses a second)

    def _on_audio(self, event: AudioReceived) -> None:
        if not self._first_audio.done():
            self._first_audio.set_result(event.sample_rate)
        rate = self.sample_rate
        if rate is None or not self.session.started:
            return  # the call is starting: nothing listens yet
        if event.sample_rate != rate:
            self.end_reason = self.end_reason or "protocol_error"
            self.session.fail(
                ProtocolViolation(
                    vendor_code(self.protocol, "sample_rate_changed"),
                    f"{event.sample_rate} Hz audio on a call started at {rate} Hz",
                    CloseCode.POLICY,
                )
            )
            return
        try:
            self.session.feed_caller_audio(event.payload)
        except SessionError as exc:
            self.peer_log.info("caller audio refused: %s", exc.code)

    def _peer_closed(self) -> None:
        try:
            self._core.connection_closed()
        except AudioSocketProtocolError as exc:  # closed inside a message: it is over anyway
            self.peer_log.info("%s", exc)
        self.end_reason = self.end_reason or "remote_closed"
        self.session.finish(CloseCode.NORMAL, "remote_closed")

    def _protocol_error(self, exc: AudioSocketProtocolError) -> None:
        self.peer_log.info("protocol error: %s", exc)
        self.end_reason = self.end_reason or "protocol_error"
        self.session.fail(vendor_error(exc))

    async def _watch(self) -> None:
        """The call's two watchdogs: an application must attach in time, and no call is
        longer than the maximum."""
        settings = self._settings
        await asyncio.sleep(settings.attach_timeout_s)
        call = self.call
        if call is not None and not call.subscribers:
            self.peer_log.info("no application attached in %.0f s", settings.attach_timeout_s)
            self.end_reason = self.end_reason or "no_application"
            self.hangup()
            return
        await asyncio.sleep(max(0.0, self.started_at + settings.max_call_s - time.monotonic()))
        self.peer_log.info("longer than %.0f s: hanging up", settings.max_call_s)
        self.end_reason = self.end_reason or "max_duration"
        self.hangup()

    async def _teardown(self) -> None:
        done = self.session.done
        reason = done.result()[1] if done.done() else self.end_reason or "hangup"
        how = self.end_reason or (reason if reason in ("hangup", "shutting_down") else "failed")
        try:
            self.release_call(reason)
        except Exception:
            log.exception("audiosocket call %s: release failed", self.call_id)
        try:
            await self.session.aclose(reason)
        finally:
            try:
                await self._close_socket()
            finally:
                self._metrics.calls_active.dec()
                self._metrics.calls.labels(reason=how).inc()
                self._state.connections.untrack(self)
                self._state.metrics.sessions_active.labels(protocol=self.protocol).dec()

    async def _close_socket(self) -> None:
        """Terminate (when the call is still up at our end), then close; a peer that does
        not take the last bytes within :data:`CLOSE_WAIT_S` is cut off."""
        writer = self._writer
        try:
            self._send_terminate()
        finally:
            writer.close()
            try:
                async with asyncio.timeout(CLOSE_WAIT_S):
                    await writer.wait_closed()
            except TimeoutError:
                writer.transport.abort()
            except (ConnectionError, OSError):
                pass  # gone already: nothing left to close
            except asyncio.CancelledError:
                writer.transport.abort()
                raise

    def __repr__(self) -> str:
        return f"AudioSocketLeg({self.call_id!r})"


__all__ = ["AudioSocketLeg", "vendor_error"]
