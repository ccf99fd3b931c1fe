"""SIP bridge settings from the environment (fixed names, design brief section 7).

- ``GATEWAY_SIP_LISTEN``: ``HOST:PORT`` (UDP); unset, the bridge is off.
- ``GATEWAY_SIP_RTP_PORTS``: ``LOW-HIGH`` (default ``20000-20999``): RTP on even ports,
  RTCP on the odd port above, so the range holds ``(HIGH - LOW + 1) // 2`` calls.
- ``GATEWAY_SIP_PUBLIC_ADDR``: the address written into SDP and Contact (default: the
  listening host, or 127.0.0.1 when that is a wildcard).
- ``GATEWAY_SIP_ALLOW``: trusted source networks, comma-separated ``CIDR[=TENANT]``
  (default ``127.0.0.0/8,::1/128``); a call is billed to its network's tenant
  (``sip`` when none is named). Requests from anywhere else get 403 and nothing is kept.
- ``GATEWAY_SIP_MEDIA_NETWORKS``: where a call's RTP and RTCP may go besides the address
  its signalling came from, comma-separated ``SOURCE_CIDR=MEDIA_CIDR`` (a call signalled
  from an address in ``SOURCE_CIDR`` may have its media anywhere in ``MEDIA_CIDR``; a bare
  ``CIDR`` stands for ``CIDR=CIDR``). Default empty: media goes only to the signalling
  source's own address (:func:`media_allowed`).
- ``GATEWAY_SIP_ROUTES``: a routes file (TOML, :mod:`gateway.legs.sip.routes`); unset, the
  built-in demo routes.

The bridge's own limits (``GATEWAY_SIP_MAX_CALLS``, ``GATEWAY_SIP_MAX_CALLS_PER_SOURCE``,
``GATEWAY_SIP_INVITES_PER_S``, ``GATEWAY_SIP_MAX_CALL_S``, ``GATEWAY_SIP_RTP_TIMEOUT_S``)
are listed in docs/telephony.md.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.ipc.env import ConfigError, env_int
from gateway.legs import networks
from gateway.legs.networks import TrustedNetwork, parse_host_port, tenant_for

__all__ = [
    "DEFAULT_TENANT",
    "MediaNetwork",
    "SipSettings",
    "TrustedNetwork",
    "host_ip",
    "media_allowed",
    "parse_allow",
    "parse_host_port",
    "parse_media_networks",
    "tenant_for",
]

DEFAULT_TENANT = "sip"
DEFAULT_ALLOW = "127.0.0.0/8,::1/128"
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def parse_allow(
    value: str, *, setting: str = "GATEWAY_SIP_ALLOW", default_tenant: str = DEFAULT_TENANT
) -> tuple[TrustedNetwork, ...]:
    """``GATEWAY_SIP_ALLOW``'s networks (:func:`gateway.legs.networks.parse_allow`)."""
    return networks.parse_allow(value, setting=setting, default_tenant=default_tenant)


def host_ip(host: str) -> IpAddress | None:
    """``host`` as an address (a zone dropped, an IPv4-mapped IPv6 address as the IPv4
    one a dual-stack socket stands for); None when it is no IP literal."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


@dataclass(frozen=True)
class MediaNetwork:
    """Calls signalled from ``source`` may send and receive media anywhere in ``media``."""

    source: IpNetwork
    media: IpNetwork


def parse_media_networks(
    value: str, *, setting: str = "GATEWAY_SIP_MEDIA_NETWORKS"
) -> tuple[MediaNetwork, ...]:
    """``SOURCE_CIDR=MEDIA_CIDR,...`` (a bare ``CIDR``: ``CIDR=CIDR``) -> the rules."""
    rules: list[MediaNetwork] = []
    for item in value.split(","):
        item = item.strip()
        if not item:
            continue
        source_text, _, media_text = item.partition("=")
        parsed: list[IpNetwork] = []
        for text in (source_text, media_text or source_text):
            try:
                parsed.append(ipaddress.ip_network(text.strip(), strict=False))
            except ValueError:
                raise ConfigError(f"{setting}: {text.strip()[:64]!r} is not a network") from None
        rules.append(MediaNetwork(*parsed))
    return tuple(rules)


def media_allowed(rules: Sequence[MediaNetwork], source: str, host: str) -> bool:
    """Whether a call whose signalling comes from ``source`` may have its RTP and RTCP at
    ``host``: the source's own address, or an address in the media network of a rule whose
    source network holds ``source``. Nothing else: an SDP cannot point media at a third
    party (issue 29 item 4). A host name is never allowed (nothing is looked up)."""
    source_ip, media_ip = host_ip(source), host_ip(host)
    if source_ip is None or media_ip is None:
        return False
    if media_ip == source_ip:
        return True
    return any(
        source_ip.version == rule.source.version
        and source_ip in rule.source
        and media_ip.version == rule.media.version
        and media_ip in rule.media
        for rule in rules
    )


@dataclass(frozen=True)
class SipSettings:
    listen: tuple[str, int]
    public_addr: str
    rtp_ports: tuple[int, int] = (20000, 20999)
    allow: tuple[TrustedNetwork, ...] = parse_allow(DEFAULT_ALLOW)
    routes_path: Path | None = None
    media_networks: tuple[MediaNetwork, ...] = ()  # besides the signalling source's address
    max_calls: int = 500  # dialogs at once (the default port range's pairs); beyond: 503
    max_calls_per_source: int = 500  # dialogs from one source address
    invites_per_s: int = 200  # new INVITEs per second, all sources; beyond: 503
    retry_after_s: int = 5
    max_call_s: float = 4 * 3600.0  # a call longer than this is hung up
    rtp_timeout_s: float = 60.0  # no RTP from the caller this long (not on hold): hung up

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> SipSettings | None:
        listen = env.get("GATEWAY_SIP_LISTEN")
        if not listen:
            return None
        host, port = parse_host_port(listen, "GATEWAY_SIP_LISTEN")
        low, high = 20000, 20999
        ports = env.get("GATEWAY_SIP_RTP_PORTS")
        if ports:
            try:
                low_text, high_text = ports.split("-")
                low, high = int(low_text), int(high_text)
            except ValueError:
                raise ConfigError(
                    f"GATEWAY_SIP_RTP_PORTS must be LOW-HIGH, got {ports!r}"
                ) from None
            if not (1024 <= low < high <= 65535) or high - low < 1:
                raise ConfigError(f"GATEWAY_SIP_RTP_PORTS: bad range {ports!r}")
        public = env.get("GATEWAY_SIP_PUBLIC_ADDR") or (
            "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        )
        routes = env.get("GATEWAY_SIP_ROUTES")
        return cls(
            listen=(host, port),
            public_addr=public,
            rtp_ports=(low, high),
            allow=parse_allow(env.get("GATEWAY_SIP_ALLOW") or DEFAULT_ALLOW),
            routes_path=Path(routes) if routes else None,
            media_networks=parse_media_networks(env.get("GATEWAY_SIP_MEDIA_NETWORKS", "")),
            max_calls=env_int(env, "GATEWAY_SIP_MAX_CALLS", 500, minimum=1),
            max_calls_per_source=env_int(env, "GATEWAY_SIP_MAX_CALLS_PER_SOURCE", 500, minimum=1),
            invites_per_s=env_int(env, "GATEWAY_SIP_INVITES_PER_S", 200, minimum=1),
            max_call_s=float(env_int(env, "GATEWAY_SIP_MAX_CALL_S", 4 * 3600, minimum=10)),
            rtp_timeout_s=float(env_int(env, "GATEWAY_SIP_RTP_TIMEOUT_S", 60, minimum=5)),
        )
