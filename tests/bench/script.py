"""What a simulated caller does: open the call, then prompt, think, prompt … until the
end of the measurement window.

The first prompt waits a random part of the longest think time so that hundreds of
calls do not all speak in the same millisecond (the ramp would otherwise measure a
thundering herd, not a call centre). A call that fails (an utterance times out, the
socket closes) ends there: its audio could no longer be told apart from the next
utterance's, and a real IVR would drop the call too.
"""

from __future__ import annotations

import asyncio
import importlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from tests.bench.calls import CallDriver, CallFailed
from tests.bench.prompts import pick_prompt


@dataclass(frozen=True)
class Behaviour:
    think_min_s: float = 0.5
    think_max_s: float = 2.0
    max_prompts: int | None = None  # per call; None: until the window ends
    burst: bool = False  # every call's first prompt at the window's start, together
    #: "module:function" choosing each prompt, ``(voice, rng) -> text`` (another mix than
    #: the standard one, e.g. tests/bench/speech_cache.py's); "": :func:`pick_prompt`.
    prompts: str = ""


PromptPicker = Callable[[str, random.Random], str]


@cache
def prompt_picker(name: str) -> PromptPicker:
    """The picker ``name`` ("module:function") designates; "" is the standard mix's."""
    if not name:
        return pick_prompt
    module, _, function = name.partition(":")
    picker: PromptPicker = getattr(importlib.import_module(module), function)
    return picker


async def open_call(driver: CallDriver, delay_s: float) -> bool:
    """Connect after ``delay_s`` (the ramp); count the outcome. True when ready."""
    await asyncio.sleep(delay_s)
    rec = driver.recorder
    try:
        await driver.open()
    except CallFailed as exc:
        rec.sessions_failed += 1
        if exc.code.startswith("client:"):  # server codes were counted on arrival
            rec.error(exc.code)
        return False
    rec.sessions_ready += 1
    return True


async def converse(
    driver: CallDriver, behaviour: Behaviour, end: float, rng: random.Random
) -> None:
    """Speak prompts with think time until ``end`` (``time.monotonic()``).

    An utterance started before ``end`` is waited for (that is the drain); none starts
    after it.
    """
    if not behaviour.burst:
        await asyncio.sleep(rng.uniform(0.0, behaviour.think_max_s))
    spoken = 0
    try:
        while time.monotonic() < end:
            if behaviour.max_prompts is not None and spoken >= behaviour.max_prompts:
                return
            pick = prompt_picker(behaviour.prompts)
            await driver.speak(pick(driver.spec.voice, rng), f"u{spoken}")
            spoken += 1
            think = rng.uniform(behaviour.think_min_s, behaviour.think_max_s)
            if time.monotonic() + think >= end:
                return
            await asyncio.sleep(think)
    except CallFailed as exc:
        driver.recorder.error(exc.code)
