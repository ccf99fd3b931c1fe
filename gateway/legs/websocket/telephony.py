"""What the WebSocket telephony legs (Twilio media streams, Asterisk chan_websocket) share.

A leg is a :class:`gateway.legs.base.CallLeg` (the session, the call in the worker's
registry, what an attached IVR application sees) carried by a WebSocket
:class:`gateway.protocols.base.Connection` and a vendor protocol core
(``telephony/twilio.py``, ``telephony/asterisk.py``). :class:`TelephonyLeg` turns frames
into vendor media messages and session events into vendor commands (a
``clear``/``FLUSH_MEDIA`` on clear and barge-in, a vendor mark per session mark). Marks
reach the application only when the vendor reports them played, or as cleared when a
flush dropped them.
"""

from __future__ import annotations

import abc
import itertools
import logging
from typing import ClassVar, Protocol

from aiohttp import web

from gateway.context import LegContext
from gateway.errors import CloseCode, ErrorCode, ProtocolViolation, vendor_code
from gateway.events import ErrorEvent, MarkReached
from gateway.legs.base import CallLeg
from gateway.protocols.base import Connection
from gateway.wsframe import FrameWriter

__all__ = ["MAX_PENDING_VENDOR_MARKS", "TelephonyLeg", "VendorProtocolError"]
log = logging.getLogger(__name__)
#: Marks sent to the vendor and not yet reported played. A vendor that stops echoing
#: marks (or stops playing) would otherwise make this grow for the whole call; beyond it,
#: a new mark is not sent and the application gets ``mark_backlog_full`` naming it.
MAX_PENDING_VENDOR_MARKS = 256


class VendorProtocolError(Protocol):
    """What the vendor cores raise on bad input (TwilioError, AsteriskError)."""

    @property
    def code(self) -> str: ...


class TelephonyLeg(CallLeg, Connection):
    """A telephony call leg over the shared connection base; subclasses add a vendor core."""

    _state: LegContext
    expires_with_token = False  # the vendor cannot renew a call's token (docs/protocol.md)
    #: Vendor marks sent and not yet played, at most (a vendor may allow fewer).
    max_vendor_marks: ClassVar[int] = MAX_PENDING_VENDOR_MARKS

    def __init__(
        self,
        ws: web.WebSocketResponse,
        writer: FrameWriter,
        state: LegContext,
        *,
        request: web.Request,
    ) -> None:
        super().__init__(ws, writer, state)
        self._request = request
        self._mark_ids = itertools.count(1)
        self._vendor_marks: dict[str, str] = {}  # vendor mark id -> session mark name

    @property
    def established(self) -> bool:
        return self.call is not None  # the vendor must start the call in time

    @property
    def idle(self) -> bool:
        return False  # the vendor ends the call; a quiet caller is not an idle leg

    # --- Peer ---------------------------------------------------------------------------

    def send_audio(self, frame: bytes) -> None:
        self.vendor_media(frame)

    def mark_reached(self, name: str) -> None:
        """Send a vendor mark for the session's mark ``name``; it is reported to the
        application when the vendor says it was played (bounded backlog)."""
        if self.vendor_pending_marks() >= self.max_vendor_marks:
            self._state.metrics.errors.labels(code=ErrorCode.MARK_BACKLOG_FULL).inc()
            self.peer_log.warning("mark backlog full: the vendor is not echoing marks")
            self.publish(
                ErrorEvent(
                    ErrorCode.MARK_BACKLOG_FULL,
                    f"{self.max_vendor_marks} marks are waiting for the vendor to play "
                    f"them; mark {name[:64]!r} was not sent",
                )
            )
            return
        vendor_id = f"m{next(self._mark_ids)}"
        self._vendor_marks[vendor_id] = name
        self.vendor_mark(vendor_id)

    def on_interrupt(self) -> None:
        """Called by the session before it drops its queue (clear, barge-in): flush the
        vendor's buffer and report the marks it held as cleared, oldest first, so the
        application sees every dropped mark in order (the session's own queued marks
        follow). Later vendor echoes of these marks are ignored."""
        self.vendor_clear()
        self._clear_vendor_marks()

    def _clear_vendor_marks(self) -> None:
        for vendor_id in list(self._vendor_marks):
            self.vendor_mark_done(vendor_id, cleared=True)

    def backlogged(self) -> bool:
        return self._paused or self._writer.backlogged()

    # --- vendor hooks -------------------------------------------------------------------

    @abc.abstractmethod
    def vendor_media(self, frame: bytes) -> None:
        """Send one 20 ms frame (already in the call's codec)."""

    @abc.abstractmethod
    def vendor_mark(self, vendor_id: str) -> None: ...

    @abc.abstractmethod
    def vendor_pending_marks(self) -> int:
        """Marks the vendor core has sent and not yet seen played or dropped."""

    @abc.abstractmethod
    def vendor_clear(self) -> None:
        """Flush the vendor's playback buffer."""

    # --- helpers for subclasses ---------------------------------------------------------

    def _tenant(self) -> str:
        """The authenticated tenant (a leg authenticates before its vendor starts it)."""
        assert self.principal is not None
        return self.principal.tenant

    def vendor_error(self, exc: VendorProtocolError) -> ProtocolViolation:
        """A vendor core's protocol error as the leg's error: ``<protocol>_<code>``,
        closing the leg (1008)."""
        return ProtocolViolation(vendor_code(self.protocol, exc.code), str(exc), CloseCode.POLICY)

    def vendor_mark_done(self, vendor_id: str, *, cleared: bool) -> None:
        name = self._vendor_marks.pop(vendor_id, None)
        if name is not None:
            self.publish(MarkReached(name, cleared=cleared))

    async def on_release(self, reason: str) -> None:
        if self.call is not None:
            self._clear_vendor_marks()  # never reported played: the call is over
        self.release_call(reason)
