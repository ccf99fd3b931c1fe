"""Run a route's flow (:mod:`gateway.legs.sip.routes`) on a call: an IVR application inside
the gateway, built on the shared script primitives (:mod:`gateway.legs.sip.script`).

The runner ends by hanging up, by a transfer, or when the call ends (its task is
cancelled by the leg); a flow that would loop for ever ends after
:data:`MAX_STEPS_PER_CALL` steps.
"""

from __future__ import annotations

import logging

from gateway.calls import Call
from gateway.legs.sip.routes import Flow, Gather, Step
from gateway.legs.sip.script import CallScript, ScriptHost

log = logging.getLogger(__name__)
#: Steps one call may run: a flow that loops for ever (an announcement repeated, a menu
#: the caller never answers) ends, hung up, after this many.
MAX_STEPS_PER_CALL = 500


class FlowRunner(CallScript):
    def __init__(self, call: Call, flow: Flow, host: ScriptHost) -> None:
        super().__init__(call, host)
        self._flow = flow
        self.visited: list[str] = []  # step names, in order (for the log and tests)

    async def _script(self) -> None:
        name: str | None = self._flow.start
        while name is not None:
            if len(self.visited) >= MAX_STEPS_PER_CALL:
                log.warning(
                    "call %s: %d flow steps; hanging up", self._call.call_id, len(self.visited)
                )
                self.hangup()
                return
            step = self._flow.steps[name]
            self.visited.append(name)
            log.info("call %s: flow %s step %s", self._call.call_id, self._flow.name, name)
            name = await self._run_step(step)

    async def _run_step(self, step: Step) -> str | None:
        if step.gather is not None:
            return await self._gather_step(step, step.gather)
        await self.play(step.say)
        if step.next is not None:
            return step.next
        if step.transfer is not None:
            if await self.transfer(step.transfer):
                return None
            return step.fallback
        self.hangup()
        return None

    async def _gather_step(self, step: Step, gather: Gather) -> str | None:
        for _attempt in range(gather.attempts):
            digits = await self.gather(step.say, gather)
            if digits:
                self.last_digits = digits
                target = step.on.get(digits)
                if target is not None:
                    return target
                log.info("call %s: no match for %r at %s", self._call.call_id, digits, step.name)
        if step.fallback is not None:
            return step.fallback
        self.hangup()
        return None
