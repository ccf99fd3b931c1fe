"""What every IVR script the gateway runs on a SIP call shares: speak a prompt and wait
for it, collect digits, transfer, hang up, and a bound on how long a script may go on.

A script attaches to the :class:`gateway.calls.Call` exactly as a native-protocol
application does: it speaks through the call's session and learns from the call's events
(``utterance_done``, ``cleared``/``barge_in``, ``dtmf``, errors). A digit pressed during a
gather prompt stops the prompt (the caller knows the menu); a gather's timeout runs from
the end of its prompt. Every wait is bounded. Two scripts build on this: a route's flow
file (:mod:`gateway.legs.sip.flow`) and a webhook (:mod:`gateway.legs.sip.webhook`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from gateway.calls import Call
from gateway.errors import SessionError
from gateway.events import BargeIn, Cleared, Dtmf, ErrorEvent, SessionEvent, UtteranceDone
from gateway.legs.sip.routes import Gather

log = logging.getLogger(__name__)
#: The longest a prompt may take to play before the script moves on regardless.
PROMPT_TIMEOUT_S = 120.0
END_OF_INPUT = "#"


class ScriptStopped(Exception):
    """The script cannot go on (a prompt was refused, the webhook failed): the call is
    hung up."""


class ScriptHost(Protocol):
    """What a script needs of the leg besides the call."""

    def hangup(self) -> None: ...

    async def transfer(self, target: str) -> bool:
        """REFER the caller to ``target``; True when the far end accepted."""
        ...


class CallScript:
    """The shared primitives; a subclass implements :meth:`_script`."""

    def __init__(self, call: Call, host: ScriptHost) -> None:
        self._call = call
        self._host = host
        self._digits: asyncio.Queue[str] = asyncio.Queue(maxsize=64)
        self._prompt: str | None = None  # the utterance id being played
        self._prompt_over = asyncio.Event()
        self._gathering = False
        self.last_digits = ""

    # --- CallSubscriber ------------------------------------------------------------------

    def on_call_event(self, event: SessionEvent) -> None:
        if isinstance(event, Dtmf):
            if self._digits.full():
                return  # a caller holding keys down: the menu has what it needs
            self._digits.put_nowait(event.digit)
            if self._gathering and self._prompt is not None and not self._prompt_over.is_set():
                self._call.session.clear()  # the caller answered: stop the prompt
        elif isinstance(event, UtteranceDone | ErrorEvent):
            uid = event.utterance_id
            if uid is not None and uid == self._prompt:
                self._prompt_over.set()
        elif isinstance(event, Cleared | BargeIn):
            self._prompt_over.set()

    # --- running -------------------------------------------------------------------------

    async def run(self) -> None:
        """Run the script; whatever stops it, the script is detached from the call."""
        self._call.subscribers.add(self)
        try:
            await self._script()
        except ScriptStopped:
            self._host.hangup()
        finally:
            self._call.subscribers.discard(self)

    async def _script(self) -> None:
        raise NotImplementedError

    # --- primitives ----------------------------------------------------------------------

    async def play(self, text: str) -> None:
        """Say ``text`` (``{digits}``: the last digits gathered) and wait until it played,
        was interrupted or failed."""
        await self._say(text)
        await self._wait_prompt()

    async def gather(self, prompt: str, gather: Gather) -> str:
        """One attempt: say ``prompt`` (a digit stops it), then collect digits."""
        self._drain_digits()
        self._gathering = True
        try:
            await self.play(prompt)
            return await self._collect(gather)
        finally:
            self._gathering = False

    async def transfer(self, target: str) -> bool:
        """REFER the caller to ``target``; hang up once it is accepted."""
        if await self._host.transfer(target):
            self._host.hangup()
            return True
        log.info("call %s: transfer to %s refused", self._call.call_id, target[:128])
        return False

    def hangup(self) -> None:
        self._host.hangup()

    async def _collect(self, gather: Gather) -> str:
        """Up to ``gather.digits`` digits, ``#`` ending early; each digit must come within
        the timeout of the previous one (or of the end of the prompt)."""
        digits = ""
        while len(digits) < gather.digits:
            try:
                async with asyncio.timeout(gather.timeout_s):
                    digit = await self._digits.get()
            except TimeoutError:
                break
            if digit == END_OF_INPUT:
                break
            digits += digit
        return digits

    def _drain_digits(self) -> None:
        while not self._digits.empty():
            self._digits.get_nowait()

    async def _say(self, text: str) -> None:
        self._prompt_over.clear()
        self._prompt = None
        text = text.replace("{digits}", self.last_digits).strip()
        if not text:
            self._prompt_over.set()
            return
        try:
            self._prompt = self._call.session.speak(text)
        except SessionError as exc:  # overloaded, closing: a menu nobody hears is no menu
            log.info("call %s: prompt refused (%s); hanging up", self._call.call_id, exc.code)
            raise ScriptStopped from None

    async def _wait_prompt(self) -> None:
        try:
            async with asyncio.timeout(PROMPT_TIMEOUT_S):
                await self._prompt_over.wait()
        except TimeoutError:
            log.warning("call %s: a prompt did not finish in time", self._call.call_id)
