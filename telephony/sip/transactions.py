"""SIP transactions over UDP (RFC 3261 section 17), sans-I/O, and the timer queue they share.

Three state machines, each with its transitions in one table keyed by (state, trigger):

* :data:`INVITE_SERVER_TRANSITIONS` (17.2.1, figure 7, with the "Accepted" state of
  RFC 6026 section 7.1 so that INVITE retransmissions after a 2xx are still absorbed)::

      PROCEEDING --1xx--> PROCEEDING --2xx--> ACCEPTED --timer L--> TERMINATED
      PROCEEDING --300-699--> COMPLETED --ACK--> CONFIRMED --timer I--> TERMINATED
      COMPLETED --timer G--> COMPLETED (retransmit)   COMPLETED --timer H--> TERMINATED

  A retransmitted INVITE is answered with the last response sent (17.2.1: "the most
  recent provisional response"; the final one in COMPLETED; the 2xx in ACCEPTED). The 2xx
  itself is retransmitted by the UAS core (13.3.1.4), which passes each copy through.
* :data:`NON_INVITE_SERVER_TRANSITIONS` (17.2.2, figure 8): TRYING, PROCEEDING,
  COMPLETED (timer J, 64*T1 on UDP), TERMINATED.
* :data:`NON_INVITE_CLIENT_TRANSITIONS` (17.1.2, figure 6): TRYING (timer E retransmits
  from T1 doubling to T2, timer F gives up at 64*T1), PROCEEDING (E at T2), COMPLETED
  (timer K, T4 on UDP, absorbs response retransmissions), TERMINATED.

Triggers are local (the transaction user sends a response: a missing table entry is
:class:`~telephony.sip.message.SipUsageError`), remote (a retransmitted request, an ACK, a
response: a missing entry means "absorb") or timers. A transaction that reaches
TERMINATED calls its ``on_terminated`` callback once, which removes it from its owner's
table: completed transactions are garbage-collected by their own timers.

Nothing here reads a clock: every call takes ``now`` (seconds, monotonic) and deadlines go
into a :class:`TimerQueue` that the owner fires.
"""

from __future__ import annotations

import enum
import heapq
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Final, TypeAlias

from telephony.sip.message import SipRequest, SipUsageError, UsageErrorCode

__all__ = [
    "INVITE_SERVER_TRANSITIONS",
    "NON_INVITE_CLIENT_TRANSITIONS",
    "NON_INVITE_SERVER_TRANSITIONS",
    "Address",
    "InviteServerTransaction",
    "NonInviteClientTransaction",
    "NonInviteServerTransaction",
    "Timer",
    "TimerQueue",
    "Timing",
    "Transaction",
    "TxKey",
    "TxState",
    "TxTrigger",
]

Address: TypeAlias = tuple[str, int]
TxKey: TypeAlias = tuple[str, ...]
Send: TypeAlias = Callable[[bytes, Address], None]


# --------------------------------------------------------------------------- timers


@dataclass(eq=False, slots=True)
class Timer:
    """One armed deadline; :meth:`TimerQueue.cancel` disarms it."""

    deadline: float
    callback: Callable[[float], None]
    cancelled: bool = False


class TimerQueue:
    """Deadlines of one UAS: a heap with lazy cancellation (compacted when cancelled
    entries outnumber live ones), so memory stays proportional to the live timers."""

    _COMPACT_MIN: Final = 256

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Timer]] = []
        self._order = itertools.count()
        self._cancelled = 0

    def start(self, deadline: float, callback: Callable[[float], None]) -> Timer:
        timer = Timer(deadline, callback)
        heapq.heappush(self._heap, (deadline, next(self._order), timer))
        return timer

    def cancel(self, timer: Timer | None) -> None:
        if timer is None or timer.cancelled:
            return
        timer.cancelled = True
        self._cancelled += 1
        if self._cancelled > self._COMPACT_MIN and self._cancelled * 2 > len(self._heap):
            self._heap = [entry for entry in self._heap if not entry[2].cancelled]
            heapq.heapify(self._heap)
            self._cancelled = 0

    def _drop_cancelled(self) -> None:
        while self._heap and self._heap[0][2].cancelled:
            heapq.heappop(self._heap)
            self._cancelled = max(0, self._cancelled - 1)

    def next_deadline(self) -> float | None:
        self._drop_cancelled()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> Timer | None:
        """The earliest live timer due at ``now`` (removed and marked spent), or None."""
        self._drop_cancelled()
        if not self._heap or self._heap[0][0] > now:
            return None
        _, _, timer = heapq.heappop(self._heap)
        timer.cancelled = True  # spent: a later cancel() is a no-op
        return timer

    def __len__(self) -> int:
        return len(self._heap) - self._cancelled


@dataclass(frozen=True, slots=True)
class Timing:
    """17.1.1.1 / table 4: T1 (RTT estimate), T2 (maximum retransmit interval for non-INVITE
    requests and INVITE responses), T4 (maximum time a message stays in the network)."""

    t1: float = 0.5
    t2: float = 4.0
    t4: float = 5.0

    @property
    def timeout(self) -> float:
        """64*T1: timers B, F, H, J (UDP), L and the 2xx retransmission limit (13.3.1.4)."""
        return 64 * self.t1


# --------------------------------------------------------------------------- state tables


class TxState(enum.Enum):
    TRYING = "trying"
    PROCEEDING = "proceeding"
    COMPLETED = "completed"
    CONFIRMED = "confirmed"
    ACCEPTED = "accepted"  # RFC 6026 7.1
    TERMINATED = "terminated"


class TxTrigger(enum.Enum):
    # local: the transaction user sends a response
    SEND_1XX = "send_1xx"
    SEND_2XX = "send_2xx"
    SEND_FINAL = "send_final"  # 300-699 (and any final response of a non-INVITE)
    # remote
    REQUEST = "request"  # a retransmission of the transaction's request
    ACK = "ack"
    RECV_1XX = "recv_1xx"
    RECV_FINAL = "recv_final"
    # timers (17.1.2.2, 17.2.1, 17.2.2; RFC 6026 timer L)
    TIMER_E = "timer_e"
    TIMER_F = "timer_f"
    TIMER_G = "timer_g"
    TIMER_H = "timer_h"
    TIMER_I = "timer_i"
    TIMER_J = "timer_j"
    TIMER_K = "timer_k"
    TIMER_L = "timer_l"


_LOCAL_TRIGGERS: Final = frozenset({TxTrigger.SEND_1XX, TxTrigger.SEND_2XX, TxTrigger.SEND_FINAL})

_P, _C, _F, _A, _T = (
    TxState.PROCEEDING,
    TxState.COMPLETED,
    TxState.CONFIRMED,
    TxState.ACCEPTED,
    TxState.TERMINATED,
)

#: 17.2.1 (figure 7) + RFC 6026 7.1: the INVITE server transaction.
INVITE_SERVER_TRANSITIONS: Final[Mapping[tuple[TxState, TxTrigger], TxState]] = {
    (_P, TxTrigger.REQUEST): _P,  # retransmitted INVITE: resend the last provisional
    (_P, TxTrigger.SEND_1XX): _P,
    (_P, TxTrigger.SEND_2XX): _A,  # RFC 6026: Accepted, timer L
    (_P, TxTrigger.SEND_FINAL): _C,  # timers G and H
    (_C, TxTrigger.REQUEST): _C,  # resend the final response
    (_C, TxTrigger.TIMER_G): _C,  # resend, interval min(2*interval, T2)
    (_C, TxTrigger.ACK): _F,  # timer I
    (_C, TxTrigger.TIMER_H): _T,  # the ACK never came
    (_F, TxTrigger.ACK): _F,  # absorbed
    (_F, TxTrigger.REQUEST): _F,  # absorbed
    (_F, TxTrigger.TIMER_I): _T,
    (_A, TxTrigger.REQUEST): _A,  # absorbed, answered with the 2xx
    (_A, TxTrigger.SEND_2XX): _A,  # the core's 2xx retransmissions pass through
    (_A, TxTrigger.ACK): _A,  # an ACK reusing the INVITE's branch: to the core (6026 7.1)
    (_A, TxTrigger.TIMER_L): _T,
}

#: 17.2.2 (figure 8): the non-INVITE server transaction.
NON_INVITE_SERVER_TRANSITIONS: Final[Mapping[tuple[TxState, TxTrigger], TxState]] = {
    (TxState.TRYING, TxTrigger.REQUEST): TxState.TRYING,  # discarded
    (TxState.TRYING, TxTrigger.SEND_1XX): _P,
    (TxState.TRYING, TxTrigger.SEND_FINAL): _C,  # timer J
    (_P, TxTrigger.REQUEST): _P,  # resend the provisional
    (_P, TxTrigger.SEND_1XX): _P,
    (_P, TxTrigger.SEND_FINAL): _C,
    (_C, TxTrigger.REQUEST): _C,  # resend the final response
    (_C, TxTrigger.TIMER_J): _T,
}

#: 17.1.2 (figure 6): the non-INVITE client transaction.
NON_INVITE_CLIENT_TRANSITIONS: Final[Mapping[tuple[TxState, TxTrigger], TxState]] = {
    (TxState.TRYING, TxTrigger.TIMER_E): TxState.TRYING,  # resend, min(2*interval, T2)
    (TxState.TRYING, TxTrigger.RECV_1XX): _P,
    (TxState.TRYING, TxTrigger.RECV_FINAL): _C,  # to the TU; timer K
    (TxState.TRYING, TxTrigger.TIMER_F): _T,  # timeout to the TU
    (_P, TxTrigger.TIMER_E): _P,  # resend, interval T2
    (_P, TxTrigger.RECV_1XX): _P,
    (_P, TxTrigger.RECV_FINAL): _C,
    (_P, TxTrigger.TIMER_F): _T,
    (_C, TxTrigger.RECV_1XX): _C,  # absorbed
    (_C, TxTrigger.RECV_FINAL): _C,  # absorbed
    (_C, TxTrigger.TIMER_K): _T,
}


def _trigger_for(status: int) -> TxTrigger:
    if status < 200:
        return TxTrigger.SEND_1XX
    return TxTrigger.SEND_2XX if status < 300 else TxTrigger.SEND_FINAL


# --------------------------------------------------------------------------- transactions


@dataclass(eq=False)
class Transaction:
    key: TxKey
    destination: Address  # 18.2.2 for a server transaction; the next hop for a client one
    timing: Timing
    timers: TimerQueue
    send: Send
    on_terminated: Callable[[Transaction], None]
    state: TxState = TxState.TRYING
    _armed: dict[str, Timer] = field(default_factory=dict)

    TABLE: ClassVar[Mapping[tuple[TxState, TxTrigger], TxState]] = NON_INVITE_SERVER_TRANSITIONS

    def _step(self, trigger: TxTrigger) -> TxState | None:
        """Apply ``trigger``: the new state, or None when the table has no entry (a
        remote or timer trigger is then absorbed; a local one raises)."""
        next_state = self.TABLE.get((self.state, trigger))
        if next_state is None:
            if trigger in _LOCAL_TRIGGERS:
                raise SipUsageError(
                    UsageErrorCode.ILLEGAL_STATE,
                    f"{trigger.value} in transaction state {self.state.value}",
                )
            return None
        self.state = next_state
        if next_state is TxState.TERMINATED:
            self._terminate()
        return next_state

    def _arm(self, name: str, deadline: float, callback: Callable[[float], None]) -> None:
        self.timers.cancel(self._armed.get(name))
        self._armed[name] = self.timers.start(deadline, callback)

    def _disarm(self, *names: str) -> None:
        for name in names:
            self.timers.cancel(self._armed.pop(name, None))

    def _terminate(self) -> None:
        self._disarm(*list(self._armed))
        self.on_terminated(self)

    @property
    def terminated(self) -> bool:
        return self.state is TxState.TERMINATED


@dataclass(eq=False)
class _ServerTransaction(Transaction):
    request: SipRequest | None = None  # what the responses are built from
    last_response: bytes | None = None
    last_status: int | None = None

    def on_request(self, now: float) -> bool:
        """A retransmission of the request arrived; True when a response was resent."""
        if self._step(TxTrigger.REQUEST) is None:
            return False
        if self.state in (TxState.TRYING, TxState.CONFIRMED) or self.last_response is None:
            return False
        self.send(self.last_response, self.destination)
        return True

    @property
    def final_sent(self) -> bool:
        return self.last_status is not None and self.last_status >= 200


@dataclass(eq=False)
class NonInviteServerTransaction(_ServerTransaction):
    """17.2.2; the core answers at once, so TRYING lasts no longer than one call."""

    TABLE: ClassVar[Mapping[tuple[TxState, TxTrigger], TxState]] = NON_INVITE_SERVER_TRANSITIONS

    def respond(self, status: int, data: bytes, now: float) -> None:
        trigger = TxTrigger.SEND_1XX if status < 200 else TxTrigger.SEND_FINAL
        self._step(trigger)
        self.last_response, self.last_status = data, status
        self.send(data, self.destination)
        if self.state is TxState.COMPLETED:  # timer J: 64*T1 on unreliable transports
            self._arm("J", now + self.timing.timeout, self._timer_j)

    def _timer_j(self, now: float) -> None:
        self._step(TxTrigger.TIMER_J)


@dataclass(eq=False)
class InviteServerTransaction(_ServerTransaction):
    """17.2.1 + RFC 6026. ``dialog`` links it to the UAS core's dialog (None when the INVITE
    was refused without one); ``local_tag`` is the To tag of its non-100 responses."""

    dialog: object | None = None
    local_tag: str = ""
    _g_interval: float = 0.0

    TABLE: ClassVar[Mapping[tuple[TxState, TxTrigger], TxState]] = INVITE_SERVER_TRANSITIONS

    def __post_init__(self) -> None:
        self.state = TxState.PROCEEDING  # 17.2.1: "the server transaction MUST ... Proceeding"

    def respond(self, status: int, data: bytes, now: float) -> None:
        before = self.state
        self._step(_trigger_for(status))
        self.last_response, self.last_status = data, status
        self.send(data, self.destination)
        if before is TxState.PROCEEDING and self.state is TxState.COMPLETED:
            self._g_interval = self.timing.t1
            self._arm("G", now + self._g_interval, self._timer_g)
            self._arm("H", now + self.timing.timeout, self._timer_h)
        elif before is TxState.PROCEEDING and self.state is TxState.ACCEPTED:
            self._arm("L", now + self.timing.timeout, self._timer_l)

    def on_ack(self, now: float) -> bool:
        """An ACK matched this transaction (17.2.3). True when it must go to the core (an
        ACK for the 2xx in ACCEPTED); False when absorbed here."""
        before = self.state
        if self._step(TxTrigger.ACK) is None:
            return False
        if before is TxState.COMPLETED:
            self._disarm("G", "H")
            self._arm("I", now + self.timing.t4, self._timer_i)  # timer I: T4 on UDP
        return self.state is TxState.ACCEPTED

    def _timer_g(self, now: float) -> None:
        if self._step(TxTrigger.TIMER_G) is None or self.last_response is None:
            return
        self.send(self.last_response, self.destination)
        self._g_interval = min(2 * self._g_interval, self.timing.t2)
        self._arm("G", now + self._g_interval, self._timer_g)

    def _timer_h(self, now: float) -> None:
        self._step(TxTrigger.TIMER_H)

    def _timer_i(self, now: float) -> None:
        self._step(TxTrigger.TIMER_I)

    def _timer_l(self, now: float) -> None:
        self._step(TxTrigger.TIMER_L)


@dataclass(eq=False)
class NonInviteClientTransaction(Transaction):
    """17.1.2: a request we send (BYE, REFER) until a final response or timer F.

    ``on_final(status)`` is called once: with the final response's status, or 408 when
    timer F fires (8.1.3.1: a transaction timeout is treated as a 408).
    """

    request: bytes = b""
    method: str = ""
    dialog: object | None = None
    on_final: Callable[[NonInviteClientTransaction, int], None] | None = None
    _e_interval: float = 0.0

    TABLE: ClassVar[Mapping[tuple[TxState, TxTrigger], TxState]] = NON_INVITE_CLIENT_TRANSITIONS

    def start(self, now: float) -> None:
        self.send(self.request, self.destination)
        self._e_interval = self.timing.t1
        self._arm("E", now + self._e_interval, self._timer_e)
        self._arm("F", now + self.timing.timeout, self._timer_f)

    def on_response(self, status: int, now: float) -> bool:
        """A response matched (17.1.3); True when it was new (not absorbed)."""
        before = self.state
        trigger = TxTrigger.RECV_1XX if status < 200 else TxTrigger.RECV_FINAL
        if self._step(trigger) is None or before is TxState.COMPLETED:
            return False
        if self.state is TxState.COMPLETED:
            self._disarm("E", "F")
            self._arm("K", now + self.timing.t4, self._timer_k)  # timer K: T4 on UDP
            if self.on_final is not None:
                self.on_final(self, status)
        return True

    def _timer_e(self, now: float) -> None:
        if self._step(TxTrigger.TIMER_E) is None:
            return
        self.send(self.request, self.destination)
        if self.state is TxState.PROCEEDING:
            self._e_interval = self.timing.t2
        else:
            self._e_interval = min(2 * self._e_interval, self.timing.t2)
        self._arm("E", now + self._e_interval, self._timer_e)

    def _timer_f(self, now: float) -> None:
        if self._step(TxTrigger.TIMER_F) is not None and self.on_final is not None:
            self.on_final(self, 408)

    def _timer_k(self, now: float) -> None:
        self._step(TxTrigger.TIMER_K)
