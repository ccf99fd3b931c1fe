"""SIP bridge settings: listen address, RTP range, trusted networks and their tenants."""

from __future__ import annotations

import pytest

from engine.ipc.env import ConfigError
from gateway.legs.sip.config import SipSettings, parse_allow, parse_host_port, tenant_for


def test_off_unless_listen_is_set() -> None:
    assert SipSettings.from_env({}) is None


def test_defaults() -> None:
    settings = SipSettings.from_env({"GATEWAY_SIP_LISTEN": "0.0.0.0:5060"})
    assert settings is not None
    assert settings.listen == ("0.0.0.0", 5060)
    assert settings.public_addr == "127.0.0.1"  # a wildcard is no address to give out
    assert settings.rtp_ports == (20000, 20999)
    assert tenant_for(settings.allow, "127.0.0.1") == "sip"
    assert tenant_for(settings.allow, "::1") == "sip"
    assert tenant_for(settings.allow, "192.0.2.1") is None
    assert settings.routes_path is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [("10.0.0.1:5060", ("10.0.0.1", 5060)), ("[::1]:5080", ("::1", 5080))],
)
def test_host_port(value: str, expected: tuple[str, int]) -> None:
    assert parse_host_port(value, "X") == expected


@pytest.mark.parametrize("value", ["5060", "host:", "host:port", "h:70000", ":5060"])
def test_bad_host_port(value: str) -> None:
    with pytest.raises(ConfigError):
        parse_host_port(value, "X")


def test_the_most_specific_network_names_the_tenant() -> None:
    networks = parse_allow("10.0.0.0/8=carrier, 10.1.0.0/16=acme,192.0.2.7/32")
    assert tenant_for(networks, "10.1.2.3") == "acme"
    assert tenant_for(networks, "10.9.9.9") == "carrier"
    assert tenant_for(networks, "192.0.2.7") == "sip"
    assert tenant_for(networks, "192.0.2.8") is None
    assert tenant_for(networks, "::ffff:10.1.2.3") == "acme"  # v4-mapped
    assert tenant_for(networks, "not-an-address") is None


@pytest.mark.parametrize(
    "env",
    [
        {"GATEWAY_SIP_ALLOW": "10.0.0.0/33"},
        {"GATEWAY_SIP_ALLOW": "10.0.0.0/8=two words"},
        {"GATEWAY_SIP_RTP_PORTS": "30000"},
        {"GATEWAY_SIP_RTP_PORTS": "30000-29000"},
        {"GATEWAY_SIP_RTP_PORTS": "80-1000"},
        {"GATEWAY_SIP_MAX_CALLS": "0"},
    ],
)
def test_bad_settings_are_refused(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        SipSettings.from_env({"GATEWAY_SIP_LISTEN": "127.0.0.1:5060", **env})
