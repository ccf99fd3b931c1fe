"""The table of telephony leg kinds: what the application mounts and starts.

A WebSocket leg contributes routes (path -> handler) on the gateway's port; a leg with a
listener of its own (SIP, AudioSocket) contributes a service factory that reads the leg's
settings from the environment and returns ``None`` when the leg is off; a leg that speaks
prompts of its own (the SIP bridge's flows) declares them, so that the speech cache warms
them at start-up without knowing the leg. The application (:mod:`gateway.app`) walks this
table; nothing else names a leg.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from aiohttp import web

from gateway.context import LegContext
from gateway.legs.audiosocket.config import AudioSocketSettings
from gateway.legs.audiosocket.listener import AudioSocketListener
from gateway.legs.sip.bridge import SipBridge
from gateway.legs.sip.config import SipSettings
from gateway.legs.sip.prompts import flow_prompts
from gateway.legs.sip.routes import load_routes
from gateway.legs.websocket import asterisk, freeswitch, jambonz, twilio
from gateway.speech_cache.prompts import DeclaredPrompt

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class LegService(Protocol):
    """A leg's own listener, started and stopped with the worker."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def describe(self) -> str:
        """One line for the start-up banner: where callers reach it."""
        ...


ServiceFactory = Callable[[LegContext, Mapping[str, str]], LegService | None]
#: Reads the leg's settings and returns the prompts its calls will say by themselves.
PromptsFactory = Callable[[Mapping[str, str]], Sequence[DeclaredPrompt]]


@dataclass(frozen=True)
class LegKind:
    name: str
    #: WebSocket paths on the gateway's port and their handlers.
    routes: Mapping[str, Handler] = field(default_factory=dict)
    #: Reads the leg's settings from the environment and builds its listener; None: off.
    service: ServiceFactory | None = None
    #: Reads the leg's settings only (``ConfigError`` when bad), for the start-up check of
    #: a host whose workers build the services.
    read_settings: Callable[[Mapping[str, str]], object] | None = None
    #: The prompts the leg says by itself (empty when the leg is off): warmed at start.
    prompts: PromptsFactory | None = None


def _sip(context: LegContext, env: Mapping[str, str]) -> LegService | None:
    settings = SipSettings.from_env(env)
    if settings is None:
        return None
    return SipBridge(context, settings, load_routes(settings.routes_path))


def _sip_prompts(env: Mapping[str, str]) -> Sequence[DeclaredPrompt]:
    settings = SipSettings.from_env(env)
    if settings is None:
        return ()
    return flow_prompts(load_routes(settings.routes_path))


def _audiosocket(context: LegContext, env: Mapping[str, str]) -> LegService | None:
    settings = AudioSocketSettings.from_env(env)
    return None if settings is None else AudioSocketListener(context, settings)


LEG_KINDS: tuple[LegKind, ...] = (
    LegKind("twilio", routes={"/v1/twilio": twilio.handle_twilio}),
    LegKind("asterisk", routes={"/v1/asterisk": asterisk.handle_asterisk}),
    LegKind("jambonz", routes={"/v1/jambonz": jambonz.handle_jambonz}),
    LegKind("freeswitch", routes={"/v1/freeswitch": freeswitch.handle_freeswitch}),
    LegKind("audiosocket", service=_audiosocket, read_settings=AudioSocketSettings.from_env),
    LegKind("sip", service=_sip, read_settings=SipSettings.from_env, prompts=_sip_prompts),
)
"""Every leg kind, in the order their services start."""


def leg_routes(kinds: Sequence[LegKind] = LEG_KINDS) -> dict[str, Handler]:
    """Every WebSocket leg's path and handler."""
    return {path: handler for kind in kinds for path, handler in kind.routes.items()}


def declared_prompts(
    env: Mapping[str, str], kinds: Sequence[LegKind] = LEG_KINDS
) -> list[DeclaredPrompt]:
    """Every prompt the legs that are on will say by themselves (the speech cache's)."""
    return [p for kind in kinds if kind.prompts is not None for p in kind.prompts(env)]


def check_leg_settings(env: Mapping[str, str], kinds: Sequence[LegKind] = LEG_KINDS) -> None:
    """Read every leg's settings from ``env``; raises ``ConfigError`` naming the variable."""
    for kind in kinds:
        if kind.read_settings is not None:
            kind.read_settings(env)


__all__ = [
    "LEG_KINDS",
    "Handler",
    "LegKind",
    "LegService",
    "check_leg_settings",
    "declared_prompts",
    "leg_routes",
]
