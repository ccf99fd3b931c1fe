"""Fakes for the SIP scripts' tests: a session that records what is spoken and a host
that records hangups and transfers. The call itself is a real :class:`gateway.calls.Call`;
the test plays the events a real session would publish."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from gateway.calls import Call
from gateway.errors import SessionError
from gateway.events import UtteranceDone


class FakeSession:
    def __init__(self) -> None:
        self.spoken: list[tuple[str, str]] = []
        self.clears = 0
        self.refuse: SessionError | None = None

    def speak(self, text: str) -> str:
        if self.refuse is not None:
            raise self.refuse
        uid = f"u{len(self.spoken) + 1}"
        self.spoken.append((uid, text))
        return uid

    def clear(self) -> None:
        self.clears += 1


class Host:
    def __init__(self) -> None:
        self.hung_up = 0
        self.transfers: list[str] = []
        self.accept_transfer = True

    def hangup(self) -> None:
        self.hung_up += 1

    async def transfer(self, target: str) -> bool:
        self.transfers.append(target)
        return self.accept_transfer


def make_call(session: FakeSession, host: Host, **parameters: str) -> Call:
    return Call("c1", "sip", "t", dict(parameters), cast(Any, session), host.hangup)


async def played(call: Call, session: FakeSession, count: int) -> str:
    """Wait for prompt ``count`` and report it played; returns its text."""
    for _ in range(200):
        if len(session.spoken) >= count:
            break
        await asyncio.sleep(0.005)
    uid, text = session.spoken[count - 1]
    call.publish(UtteranceDone(uid, audio_ms=1000, first_audio_ms=100))
    return text
