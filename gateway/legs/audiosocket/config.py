"""AudioSocket listener settings from the environment.

- ``GATEWAY_AUDIOSOCKET_LISTEN``: ``HOST:PORT`` (TCP); unset, the listener is off.
- ``GATEWAY_AUDIOSOCKET_ALLOW``: trusted source networks, comma-separated
  ``CIDR[=TENANT]`` (default ``127.0.0.0/8,::1/128``): AudioSocket has no authentication
  on the wire, so a connection from anywhere else is closed at once. A call is billed to
  its network's tenant (``audiosocket`` when none is named).
- ``GATEWAY_AUDIOSOCKET_MAX_CALLS``: connections at once, calls and connections still
  waiting for their UUID together (default 500); beyond, a connection is closed at once.
- ``GATEWAY_AUDIOSOCKET_VOICE``: the voice of the calls (default: the engine's default).
- ``GATEWAY_AUDIOSOCKET_SAY``: spoken when a call starts (default: nothing).
- ``GATEWAY_AUDIOSOCKET_ATTACH_TIMEOUT_S``: a call that no IVR application has attached
  to this long after it started is hung up (default 30).
- ``GATEWAY_AUDIOSOCKET_MAX_CALL_S``: a call longer than this is hung up (default 14400).

The network syntax and the lookup are shared with the SIP bridge (:mod:`gateway.legs.networks`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from engine.ipc.env import ConfigError, env_int
from gateway.legs.networks import TrustedNetwork, parse_allow, parse_host_port, tenant_for

__all__ = ["DEFAULT_ALLOW", "DEFAULT_TENANT", "AudioSocketSettings", "tenant_for"]

DEFAULT_TENANT = "audiosocket"
DEFAULT_ALLOW = "127.0.0.0/8,::1/128"
MAX_VOICE_CHARS = 128


def _allow(value: str) -> tuple[TrustedNetwork, ...]:
    return parse_allow(value, setting="GATEWAY_AUDIOSOCKET_ALLOW", default_tenant=DEFAULT_TENANT)


def _voice(value: str | None) -> str | None:
    if not value:
        return None
    if len(value) > MAX_VOICE_CHARS or not value.isprintable() or " " in value:
        raise ConfigError(f"GATEWAY_AUDIOSOCKET_VOICE: bad voice name {value[:64]!r}")
    return value


def _say(value: str | None) -> str | None:
    """The text as given (the leg speaks its first ``gateway.legs.base.MAX_SAY_CHARS``)."""
    if not value or not value.strip():
        return None
    return value


@dataclass(frozen=True)
class AudioSocketSettings:
    listen: tuple[str, int]
    allow: tuple[TrustedNetwork, ...] = _allow(DEFAULT_ALLOW)
    max_calls: int = 500
    voice: str | None = None
    say: str | None = None
    attach_timeout_s: float = 30.0
    max_call_s: float = 4 * 3600.0
    #: Asterisk sends its UUID first, at once; a connection without one this long is closed.
    uuid_timeout_s: float = 5.0
    #: The call's sample rate is that of the first audio message; none this long after the
    #: UUID (a caller behind silence suppression), the call starts at 8 kHz.
    first_audio_wait_s: float = 2.0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AudioSocketSettings | None:
        listen = env.get("GATEWAY_AUDIOSOCKET_LISTEN")
        if not listen:
            return None
        return cls(
            listen=parse_host_port(listen, "GATEWAY_AUDIOSOCKET_LISTEN"),
            allow=_allow(env.get("GATEWAY_AUDIOSOCKET_ALLOW") or DEFAULT_ALLOW),
            max_calls=env_int(env, "GATEWAY_AUDIOSOCKET_MAX_CALLS", 500, minimum=1),
            voice=_voice(env.get("GATEWAY_AUDIOSOCKET_VOICE")),
            say=_say(env.get("GATEWAY_AUDIOSOCKET_SAY")),
            attach_timeout_s=float(
                env_int(env, "GATEWAY_AUDIOSOCKET_ATTACH_TIMEOUT_S", 30, minimum=1)
            ),
            max_call_s=float(env_int(env, "GATEWAY_AUDIOSOCKET_MAX_CALL_S", 4 * 3600, minimum=10)),
        )
