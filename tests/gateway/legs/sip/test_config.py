"""SIP bridge settings: listen address, RTP range, trusted networks and their tenants."""

from __future__ import annotations

import ipaddress

import pytest

from engine.ipc.env import ConfigError
from gateway.legs.sip.config import (
    MediaNetwork,
    SipSettings,
    media_allowed,
    parse_allow,
    parse_host_port,
    parse_media_networks,
    tenant_for,
)


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
        {"GATEWAY_SIP_MEDIA_NETWORKS": "10.0.0.0/8=media"},
        {"GATEWAY_SIP_MEDIA_NETWORKS": "10.0.0.0/33"},
    ],
)
def test_bad_settings_are_refused(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        SipSettings.from_env({"GATEWAY_SIP_LISTEN": "127.0.0.1:5060", **env})


# --------------------------------------------------------------------------- media destinations


def test_media_goes_only_to_the_signalling_source_by_default() -> None:
    settings = SipSettings.from_env({"GATEWAY_SIP_LISTEN": "127.0.0.1:5060"})
    assert settings is not None and settings.media_networks == ()
    rules = settings.media_networks
    assert media_allowed(rules, "127.0.0.1", "127.0.0.1")
    assert media_allowed(rules, "::ffff:127.0.0.1", "127.0.0.1")  # a dual-stack socket's
    assert media_allowed(rules, "::1", "0:0:0:0:0:0:0:1")  # spelt differently, same address
    # a trusted network (GATEWAY_SIP_ALLOW) is no place to send media: the victim
    assert not media_allowed(rules, "127.0.0.1", "127.0.0.9")
    assert not media_allowed(rules, "127.0.0.1", "::1")
    assert not media_allowed(rules, "127.0.0.1", "localhost")  # never looked up
    assert not media_allowed(rules, "not-an-address", "not-an-address")


def test_media_networks_are_per_signalling_network() -> None:
    rules = parse_media_networks(
        "10.0.0.5/32=10.0.8.0/22, 192.168.0.0/16, 2001:db8::/32=2001:db8::/32"
    )
    assert rules[0] == MediaNetwork(
        ipaddress.ip_network("10.0.0.5/32"), ipaddress.ip_network("10.0.8.0/22")
    )
    assert media_allowed(rules, "10.0.0.5", "10.0.9.200")
    assert not media_allowed(rules, "10.0.0.6", "10.0.9.200")  # another source: not its media
    assert not media_allowed(rules, "10.0.0.5", "10.0.12.1")
    assert media_allowed(rules, "192.168.1.1", "192.168.200.7")  # a bare CIDR: both sides
    assert not media_allowed(rules, "192.168.1.1", "10.0.9.200")
    assert media_allowed(rules, "2001:db8::1", "2001:db8:ffff::2")
    assert not media_allowed(rules, "2001:db8::1", "10.0.9.200")  # the family is the rule's
    settings = SipSettings.from_env(
        {
            "GATEWAY_SIP_LISTEN": "127.0.0.1:5060",
            "GATEWAY_SIP_MEDIA_NETWORKS": "127.0.0.1=127.0.0.10",
        }
    )
    assert settings is not None
    assert media_allowed(settings.media_networks, "127.0.0.1", "127.0.0.10")
    assert not media_allowed(settings.media_networks, "127.0.0.1", "127.0.0.9")
