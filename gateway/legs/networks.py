"""Trusted source networks and listen addresses, as every leg that listens on its own
socket (the SIP bridge, AudioSocket) reads them from its settings.

``CIDR[=TENANT],...``: a source inside a network is trusted and billed to that network's
tenant; a source in none is untrusted.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from engine.ipc.env import ConfigError

__all__ = ["TrustedNetwork", "parse_allow", "parse_host_port", "tenant_for"]

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class TrustedNetwork:
    network: IpNetwork
    tenant: str


def parse_host_port(value: str, name: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT``."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"{name} must be HOST:PORT, got {value!r}")
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"{name} must be HOST:PORT, got {value!r}") from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"{name}: port out of range in {value!r}")
    return host, port


def parse_allow(value: str, *, setting: str, default_tenant: str) -> tuple[TrustedNetwork, ...]:
    """``CIDR[=TENANT],...`` -> trusted networks, most specific first. ``setting`` names
    the variable in errors; ``default_tenant`` is the tenant of a network naming none."""
    networks: list[TrustedNetwork] = []
    for item in value.split(","):
        item = item.strip()
        if not item:
            continue
        cidr, _, tenant = item.partition("=")
        try:
            network = ipaddress.ip_network(cidr.strip(), strict=False)
        except ValueError:
            raise ConfigError(f"{setting}: {cidr!r} is not a network") from None
        tenant = tenant.strip() or default_tenant
        if not tenant.isprintable() or " " in tenant or len(tenant) > 128:
            raise ConfigError(f"{setting}: bad tenant name {tenant[:64]!r}")
        networks.append(TrustedNetwork(network, tenant))
    return tuple(sorted(networks, key=lambda n: n.network.prefixlen, reverse=True))


def tenant_for(networks: Sequence[TrustedNetwork], host: str) -> str | None:
    """The tenant of the most specific trusted network holding ``host``; None: untrusted."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    for trusted in networks:
        if address.version == trusted.network.version and address in trusted.network:
            return trusted.tenant
    return None
