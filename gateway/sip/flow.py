"""Run a route's flow (:mod:`gateway.sip.routes`) on a call: an IVR application inside
the gateway.

The runner attaches to the :class:`gateway.calls.Call` exactly as a native-protocol
application does: it speaks through the call's session and learns from the call's events
(``utterance_done``, ``cleared``/``barge_in``, ``dtmf``, errors). A digit pressed during a
gather prompt stops the prompt (the caller knows the menu); a gather's timeout runs from
the end of its prompt. Every wait is bounded; the runner ends by hanging up, by a
transfer, or when the call ends (its task is cancelled by the leg).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from gateway.calls import Call
from gateway.errors import SessionError
from gateway.events import BargeIn, Cleared, Dtmf, ErrorEvent, SessionEvent, UtteranceDone
from gateway.sip.routes import Flow, Gather, Step

log = logging.getLogger(__name__)
#: The longest a prompt may take to play before the flow moves on regardless.
PROMPT_TIMEOUT_S = 120.0
#: Steps one call may run: a flow that loops for ever (an announcement repeated, a menu
#: the caller never answers) ends, hung up, after this many.
MAX_STEPS_PER_CALL = 500
END_OF_INPUT = "#"


class _Stop(Exception):
    """The flow cannot go on (a prompt was refused); the call is hung up."""


class FlowHost(Protocol):
    """What the runner needs of the leg besides the call."""

    def hangup(self) -> None: ...

    async def transfer(self, target: str) -> bool:
        """REFER the caller to ``target``; True when the far end accepted."""
        ...


class FlowRunner:
    def __init__(self, call: Call, flow: Flow, host: FlowHost) -> None:
        self._call = call
        self._flow = flow
        self._host = host
        self._digits: asyncio.Queue[str] = asyncio.Queue(maxsize=64)
        self._prompt: str | None = None  # the utterance id being played
        self._prompt_over = asyncio.Event()
        self._gathering = False
        self.last_digits = ""
        self.visited: list[str] = []  # step names, in order (for the log and tests)

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

    # --- the flow --------------------------------------------------------------------------

    async def run(self) -> None:
        self._call.subscribers.add(self)
        try:
            name: str | None = self._flow.start
            while name is not None:
                if len(self.visited) >= MAX_STEPS_PER_CALL:
                    log.warning(
                        "call %s: %d flow steps; hanging up", self._call.call_id, len(self.visited)
                    )
                    self._host.hangup()
                    return
                step = self._flow.steps[name]
                self.visited.append(name)
                log.info("call %s: flow %s step %s", self._call.call_id, self._flow.name, name)
                name = await self._run_step(step)
        except _Stop:
            self._host.hangup()
        finally:
            self._call.subscribers.discard(self)

    async def _run_step(self, step: Step) -> str | None:
        if step.gather is not None:
            return await self._gather_step(step, step.gather)
        await self._say(step.say)
        await self._wait_prompt()
        if step.next is not None:
            return step.next
        if step.transfer is not None:
            if await self._host.transfer(step.transfer):
                self._host.hangup()
                return None
            log.info("call %s: transfer to %s refused", self._call.call_id, step.transfer)
            return step.fallback
        self._host.hangup()
        return None

    async def _gather_step(self, step: Step, gather: Gather) -> str | None:
        for _attempt in range(gather.attempts):
            self._drain_digits()
            self._gathering = True
            try:
                await self._say(step.say)
                await self._wait_prompt()
                digits = await self._collect(gather)
            finally:
                self._gathering = False
            if digits:
                self.last_digits = digits
                target = step.on.get(digits)
                if target is not None:
                    return target
                log.info("call %s: no match for %r at %s", self._call.call_id, digits, step.name)
        if step.fallback is not None:
            return step.fallback
        self._host.hangup()
        return None

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
            raise _Stop from None

    async def _wait_prompt(self) -> None:
        try:
            async with asyncio.timeout(PROMPT_TIMEOUT_S):
                await self._prompt_over.wait()
        except TimeoutError:
            log.warning("call %s: a prompt did not finish in time", self._call.call_id)
