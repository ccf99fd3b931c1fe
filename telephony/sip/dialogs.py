"""Dialogs of a UAS (RFC 3261 section 12) and the INVITE session state around them.

A dialog is identified by Call-ID, local tag and remote tag (12, :class:`DialogId`). This
UAS creates one per initial INVITE: its local tag (our To tag) is chosen when the INVITE
arrives and used on every non-100 response (8.2.6.2, 12.1.1), so it is stable across
retransmissions, 180, 200 and 487 alike.

The state of a dialog and of the INVITE session it carries is one machine, its
transitions in :data:`DIALOG_TRANSITIONS`::

    EARLY --ring--> EARLY --answer--> ANSWERED --ACK--> CONFIRMED
    EARLY --reject|CANCEL|remote BYE|no answer--> TERMINATED
    ANSWERED --2xx timer--> ANSWERED (13.3.1.4: retransmit, T1 doubling to T2)
    ANSWERED --ACK timeout (64*T1)--> TERMINATED (a BYE is sent)
    ANSWERED|REINVITE_ANSWERED --local bye--> CLOSING --ACK|ACK timeout--> TERMINATED
    CONFIRMED --re-INVITE--> REINVITE_PENDING --answer--> REINVITE_ANSWERED --ACK--> CONFIRMED
    REINVITE_PENDING --reject|CANCEL|no answer--> CONFIRMED
    CONFIRMED|... --BYE (either side)--> TERMINATED

CLOSING exists because the callee "MUST NOT send a BYE on a confirmed dialog until it has
received an ACK for its 2xx response or until the server transaction times out" (15):
the application's hangup is over at once for the application, the BYE waits.

Triggers are the application's intents (:data:`APP_TRIGGERS`: no table entry is local
misuse, :class:`~telephony.sip.message.SipUsageError`), requests from the remote end (no
entry: absorbed, or answered with the refusal the UAS core chooses) and timers.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from telephony.sip.message import NameAddr, SipUri, SipUsageError, UsageErrorCode
from telephony.sip.transactions import Address, Timer, TxKey

__all__ = [
    "APP_TRIGGERS",
    "DIALOG_TRANSITIONS",
    "LIVE_STATES",
    "Dialog",
    "DialogId",
    "DialogState",
    "DialogTrigger",
]


@dataclass(frozen=True, slots=True)
class DialogId:
    """12: Call-ID, local tag (ours: the To tag of our responses), remote tag (the From tag
    of the INVITE; "" for an RFC 2543 peer that sent none)."""

    call_id: str
    local_tag: str
    remote_tag: str


class DialogState(enum.Enum):
    EARLY = "early"  # INVITE received, no final response yet
    ANSWERED = "answered"  # 2xx sent, waiting for the ACK
    CONFIRMED = "confirmed"
    REINVITE_PENDING = "reinvite_pending"  # a re-INVITE is with the application
    REINVITE_ANSWERED = "reinvite_answered"  # its 2xx sent, waiting for the ACK
    CLOSING = "closing"  # the application hung up; the BYE waits for the ACK (15)
    TERMINATED = "terminated"


class DialogTrigger(enum.Enum):
    # the application's intents
    RING = "ring"
    ANSWER = "answer"
    REJECT = "reject"
    BYE = "bye"
    ANSWER_REINVITE = "answer_reinvite"
    REJECT_REINVITE = "reject_reinvite"
    REFER = "refer"
    # the remote end
    ACK = "ack"  # the ACK for our pending 2xx
    CANCEL = "cancel"  # 9.2, before our final response
    REMOTE_BYE = "remote_bye"
    REINVITE = "reinvite"
    # timers
    RETRANSMIT_2XX = "retransmit_2xx"  # 13.3.1.4
    ACK_TIMEOUT = "ack_timeout"  # 13.3.1.4: 64*T1 without an ACK
    NO_ANSWER = "no_answer"  # the application never answered (our limit)


APP_TRIGGERS: Final = frozenset(
    {
        DialogTrigger.RING,
        DialogTrigger.ANSWER,
        DialogTrigger.REJECT,
        DialogTrigger.BYE,
        DialogTrigger.ANSWER_REINVITE,
        DialogTrigger.REJECT_REINVITE,
        DialogTrigger.REFER,
    }
)

_E, _A, _C, _RP, _RA, _X, _T = (
    DialogState.EARLY,
    DialogState.ANSWERED,
    DialogState.CONFIRMED,
    DialogState.REINVITE_PENDING,
    DialogState.REINVITE_ANSWERED,
    DialogState.CLOSING,
    DialogState.TERMINATED,
)
_G = DialogTrigger

#: Every legal transition: (state, trigger) -> next state. Comments name the action.
DIALOG_TRANSITIONS: Final[Mapping[tuple[DialogState, DialogTrigger], DialogState]] = {
    # --- early: the INVITE is with the application (13.3.1)
    (_E, _G.RING): _E,  # 180 with our tag (13.3.1.1)
    (_E, _G.ANSWER): _A,  # 200 with the answer (13.3.1.4)
    (_E, _G.REJECT): _T,  # 300-699 (13.3.1.3)
    (_E, _G.CANCEL): _T,  # 200 to the CANCEL, 487 to the INVITE (9.2); CallCancelled
    (_E, _G.REMOTE_BYE): _T,  # 200 to the BYE, 487 to the INVITE (15.1.2); CallEnded
    (_E, _G.REINVITE): _E,  # 500 + Retry-After (14.2: INVITE before our final response)
    (_E, _G.NO_ANSWER): _T,  # 480; CallEnded("no_answer")
    # --- our 2xx waits for its ACK (13.3.1.4)
    (_A, _G.ACK): _C,  # CallConfirmed
    (_A, _G.RETRANSMIT_2XX): _A,
    (_A, _G.ACK_TIMEOUT): _T,  # BYE; CallEnded("ack_timeout")
    (_A, _G.REMOTE_BYE): _T,  # the ACK was lost or is late; CallEnded("remote_bye")
    (_A, _G.BYE): _X,  # CallEnded("local_bye"); the BYE waits (15)
    (_A, _G.REINVITE): _A,  # 491 (our INVITE transaction is not over: 14.2)
    (_A, _G.REFER): _A,
    # --- confirmed
    (_C, _G.ACK): _C,  # a duplicate (each 2xx retransmission draws one)
    (_C, _G.REMOTE_BYE): _T,  # CallEnded("remote_bye")
    (_C, _G.BYE): _T,  # BYE; CallEnded("local_bye")
    (_C, _G.REINVITE): _RP,  # 100; ReInvite
    (_C, _G.REFER): _C,
    # --- a re-INVITE is with the application (14.2)
    (_RP, _G.ANSWER_REINVITE): _RA,  # 200 with the answer
    (_RP, _G.REJECT_REINVITE): _C,  # 300-699; the dialog goes on (14.2)
    (_RP, _G.CANCEL): _C,  # 200 to the CANCEL, 487 to the re-INVITE
    (_RP, _G.REINVITE): _RP,  # 500 + Retry-After (14.2)
    (_RP, _G.ACK): _RP,  # a late duplicate of an earlier ACK
    (_RP, _G.REMOTE_BYE): _T,  # 487 to the re-INVITE (15.1.2); CallEnded("remote_bye")
    (_RP, _G.BYE): _T,  # 487 to the re-INVITE, BYE; CallEnded("local_bye")
    (_RP, _G.REFER): _RP,
    (_RP, _G.NO_ANSWER): _C,  # 500 to the re-INVITE; the dialog goes on
    # --- the re-INVITE's 2xx waits for its ACK
    (_RA, _G.ACK): _C,
    (_RA, _G.RETRANSMIT_2XX): _RA,
    (_RA, _G.ACK_TIMEOUT): _T,  # 13.3.1.4: "the session SHOULD be terminated": BYE
    (_RA, _G.REMOTE_BYE): _T,
    (_RA, _G.BYE): _X,
    (_RA, _G.REINVITE): _RA,  # 491
    (_RA, _G.REFER): _RA,
    # --- closing: over for the application, the 2xx still waits for its ACK
    (_X, _G.ACK): _T,  # now the BYE
    (_X, _G.RETRANSMIT_2XX): _X,
    (_X, _G.ACK_TIMEOUT): _T,  # the BYE anyway (15)
    (_X, _G.REMOTE_BYE): _T,  # 200; no event (the application already has CallEnded)
    (_X, _G.REINVITE): _X,  # 491
}

#: States in which the application still has the call (it has not been told it ended).
LIVE_STATES: Final = frozenset({_E, _A, _C, _RP, _RA})


@dataclass(eq=False)
class Dialog:
    """One dialog's state (12.1.1 UAS side) and its INVITE session bookkeeping."""

    id: DialogId
    source: Address  # where the dialog-creating INVITE came from: the flow (see uas.py)
    local_party: NameAddr  # the INVITE's To with our tag: the From of our requests
    remote_party: NameAddr  # the INVITE's From: the To of our requests
    remote_target: SipUri  # 12.1.1: the INVITE's Contact URI (updated by re-INVITE)
    route_set: tuple[str, ...]  # 12.1.1: the Record-Route values, in order
    remote_seq: int
    local_seq: int  # the CSeq of our last request; the next one is one higher
    invite_tx: TxKey  # the (re-)INVITE whose final response is ours to send (or was)
    state: DialogState = DialogState.EARLY
    # 13.3.1.4: the 2xx we retransmit until its ACK
    pending_2xx: bytes | None = None
    pending_2xx_cseq: int = 0
    pending_2xx_to: Address = ("", 0)
    retransmit_interval: float = 0.0
    pending_target: SipUri | None = None  # a re-INVITE's Contact, adopted on its 2xx
    reinvite_withdrawn: bool = False  # a CANCEL or the deadline took the re-INVITE away
    refer_pending: bool = False
    timers: dict[str, Timer] = field(default_factory=dict)

    def step(self, trigger: DialogTrigger) -> DialogState | None:
        """Apply ``trigger``: the new state, or None when the table has no entry (then an
        application intent raises :class:`SipUsageError`)."""
        next_state = DIALOG_TRANSITIONS.get((self.state, trigger))
        if next_state is None:
            if trigger in APP_TRIGGERS:
                raise SipUsageError(
                    UsageErrorCode.ILLEGAL_STATE,
                    f"{trigger.value} in dialog state {self.state.value}",
                )
            return None
        self.state = next_state
        return next_state

    def allows(self, trigger: DialogTrigger) -> bool:
        return (self.state, trigger) in DIALOG_TRANSITIONS

    @property
    def live(self) -> bool:
        """The application still has this call."""
        return self.state in LIVE_STATES
