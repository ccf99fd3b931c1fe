"""Telephony calls, and IVR applications attached to them.

A telephony leg (a Twilio media stream, an Asterisk chan_websocket channel) is a
:class:`Call` with an id (Twilio ``callSid``, Asterisk channel id) and a
:class:`gateway.session.Session` that speaks into it. An IVR application attaches with a
native-protocol ``start`` carrying ``"call": "<id>"``: its ``speak``/``clear``/``mark``
then act on the call's session, ``hangup`` ends the call, and it receives the call's
events (``call_started``, ``dtmf``, ``barge_in``, ``call_ended`` and the session's
utterance, mark and error events).

A call lives on the worker holding its leg. The registry publishes it in the call
directory (:mod:`gateway.call_directory`), so that an application that reaches another
worker or instance is relayed to this one (:mod:`gateway.protocols.relay`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gateway.call_directory import CallDirectory, LocalCallDirectory
from gateway.events import SessionEvent
from telephony.limits import MAX_CALL_ID_CHARS

if TYPE_CHECKING:
    from gateway.session import Session

log = logging.getLogger(__name__)
__all__ = ["MAX_CALL_ID_CHARS", "Call", "CallIdInUse", "CallRegistry", "CallSubscriber"]


class CallSubscriber(Protocol):
    def on_call_event(self, event: SessionEvent) -> None: ...


class CallIdInUse(Exception):
    pass


@dataclass(eq=False)
class Call:
    call_id: str
    protocol: str
    tenant: str
    custom_parameters: dict[str, str]
    session: Session
    hangup: Callable[[], None]
    subscribers: set[CallSubscriber] = field(default_factory=set)

    def publish(self, event: SessionEvent) -> None:
        """Deliver ``event`` to every attached application."""
        for subscriber in list(self.subscribers):
            try:
                subscriber.on_call_event(event)
            except Exception:
                log.exception("call %s: subscriber failed", self.call_id)
                self.subscribers.discard(subscriber)


class CallRegistry:
    """The calls of one gateway worker, by tenant and id: call ids are scoped per tenant,
    so one tenant's call can neither block nor reveal another tenant's call with the
    same id."""

    def __init__(self, directory: CallDirectory | None = None) -> None:
        self._calls: dict[tuple[str, str], Call] = {}
        self.directory: CallDirectory = directory or LocalCallDirectory()

    def __len__(self) -> int:
        return len(self._calls)

    def register(self, call: Call) -> None:
        key = (call.tenant, call.call_id)
        if key in self._calls:
            raise CallIdInUse(call.call_id)
        self._calls[key] = call
        self.directory.publish(call.tenant, call.call_id)

    def unregister(self, call: Call) -> None:
        key = (call.tenant, call.call_id)
        if self._calls.get(key) is call:
            del self._calls[key]
            self.directory.withdraw(call.tenant, call.call_id)

    def get(self, call_id: str, tenant: str) -> Call | None:
        """The tenant's call with ``call_id`` (others' calls do not exist)."""
        return self._calls.get((tenant, call_id))
