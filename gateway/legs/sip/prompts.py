"""The prompts the SIP routes' flows say, declared so the speech cache warms them at start.

Every route with a flow says its steps' ``say`` texts in the route's voice (the engine's
default voice when the route names none) at 8 kHz (PCMU and PCMA calls). A text with
``{digits}`` is declared once for each digit string the flow's menus match (the keys of
the ``on`` tables: the digits a caller can have pressed to get there), at most
:data:`MAX_DIGIT_VARIANTS` of them; a route's registered voice (``vc_...``) belongs to a
tenant the route does not name, so its prompts are left to the calls.
"""

from __future__ import annotations

from collections.abc import Iterator

from gateway.legs.sip.leg import CODEC_FORMATS
from gateway.legs.sip.routes import Flow, Routes
from gateway.speech_cache.prompts import DeclaredPrompt

MAX_DIGIT_VARIANTS = 32
DIGITS = "{digits}"
#: The format a flow's prompts are warmed in: every SIP codec is 8 kHz (its sample rate
#: is what the cache's key holds; mu-law and A-law share it).
FLOW_FORMAT = CODEC_FORMATS["PCMU"]


def _texts(flow: Flow) -> Iterator[tuple[str, str]]:
    """(step name, text as said) for every step of ``flow``."""
    digits = sorted({key for step in flow.steps.values() for key in step.on})[:MAX_DIGIT_VARIANTS]
    for name, step in flow.steps.items():
        if DIGITS in step.say:
            for variant in digits:
                yield name, step.say.replace(DIGITS, variant).strip()
        elif step.say.strip():
            yield name, step.say.strip()


def flow_prompts(routes: Routes) -> list[DeclaredPrompt]:
    """Every distinct prompt the routes' flows say (text, voice), in route order."""
    seen: set[tuple[str, str | None]] = set()
    prompts: list[DeclaredPrompt] = []
    for route in routes.routes.values():
        flow = route.flow
        if flow is None or (route.voice or "").startswith("vc_"):
            continue
        for step, text in _texts(flow):
            if (text, route.voice) in seen:
                continue
            seen.add((text, route.voice))
            prompts.append(
                DeclaredPrompt(
                    source=f"sip flow {flow.name}, step {step}",
                    text=text,
                    voice=route.voice,
                    format=FLOW_FORMAT,
                )
            )
    return prompts


__all__ = ["FLOW_FORMAT", "flow_prompts"]
