"""AudioSocket listener settings: listen address, trusted networks and their tenants,
limits, the call's voice and greeting; mistakes are ConfigError."""

from __future__ import annotations

import pytest

from engine.ipc.env import ConfigError
from gateway.config import GatewaySettings
from gateway.legs.audiosocket.config import AudioSocketSettings, tenant_for
from gateway.legs.kinds import check_leg_settings

LISTEN = {"GATEWAY_AUDIOSOCKET_LISTEN": "127.0.0.1:9092"}


def settings(**env: str) -> AudioSocketSettings:
    parsed = AudioSocketSettings.from_env({**LISTEN, **env})
    assert parsed is not None
    return parsed


def test_off_unless_listen_is_set() -> None:
    assert AudioSocketSettings.from_env({}) is None
    assert AudioSocketSettings.from_env({"GATEWAY_AUDIOSOCKET_LISTEN": ""}) is None


def test_defaults() -> None:
    s = settings()
    assert s.listen == ("127.0.0.1", 9092)
    assert s.max_calls == 500
    assert s.voice is None and s.say is None
    assert s.attach_timeout_s == 30.0
    assert s.max_call_s == 4 * 3600.0
    assert s.uuid_timeout_s == 5.0
    assert s.first_audio_wait_s == 2.0
    # loopback only, billed to the "audiosocket" tenant
    assert tenant_for(s.allow, "127.0.0.1") == "audiosocket"
    assert tenant_for(s.allow, "127.9.9.9") == "audiosocket"
    assert tenant_for(s.allow, "::1") == "audiosocket"
    assert tenant_for(s.allow, "::ffff:127.0.0.1") == "audiosocket"  # v4-mapped
    assert tenant_for(s.allow, "192.0.2.1") is None
    assert tenant_for(s.allow, "") is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [("0.0.0.0:9092", ("0.0.0.0", 9092)), ("[::]:9093", ("::", 9093)), ("gw:0", ("gw", 0))],
)
def test_listen_addresses(value: str, expected: tuple[str, int]) -> None:
    assert settings(GATEWAY_AUDIOSOCKET_LISTEN=value).listen == expected


def test_networks_name_tenants_most_specific_first() -> None:
    s = settings(GATEWAY_AUDIOSOCKET_ALLOW="10.0.0.0/8=pbx, 10.1.0.0/16=acme,192.0.2.7/32")
    assert tenant_for(s.allow, "10.1.2.3") == "acme"
    assert tenant_for(s.allow, "10.9.9.9") == "pbx"
    assert tenant_for(s.allow, "192.0.2.7") == "audiosocket"  # no tenant named
    assert tenant_for(s.allow, "127.0.0.1") is None  # the default is replaced, not extended


def test_limits_voice_and_greeting() -> None:
    s = settings(
        GATEWAY_AUDIOSOCKET_MAX_CALLS="20",
        GATEWAY_AUDIOSOCKET_VOICE="en-us-joe",
        GATEWAY_AUDIOSOCKET_SAY="Welcome to the demo.",
        GATEWAY_AUDIOSOCKET_ATTACH_TIMEOUT_S="5",
        GATEWAY_AUDIOSOCKET_MAX_CALL_S="600",
    )
    assert s.max_calls == 20
    assert s.voice == "en-us-joe"
    assert s.say == "Welcome to the demo."
    assert s.attach_timeout_s == 5.0
    assert s.max_call_s == 600.0


def test_blank_voice_and_greeting_are_unset() -> None:
    s = settings(GATEWAY_AUDIOSOCKET_VOICE="", GATEWAY_AUDIOSOCKET_SAY="   ")
    assert s.voice is None and s.say is None


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"GATEWAY_AUDIOSOCKET_LISTEN": "9092"}, "GATEWAY_AUDIOSOCKET_LISTEN"),
        ({"GATEWAY_AUDIOSOCKET_LISTEN": "host:port"}, "GATEWAY_AUDIOSOCKET_LISTEN"),
        ({"GATEWAY_AUDIOSOCKET_LISTEN": "h:70000"}, "GATEWAY_AUDIOSOCKET_LISTEN"),
        ({"GATEWAY_AUDIOSOCKET_ALLOW": "10.0.0.0/33"}, "GATEWAY_AUDIOSOCKET_ALLOW"),
        ({"GATEWAY_AUDIOSOCKET_ALLOW": "pbx.example"}, "GATEWAY_AUDIOSOCKET_ALLOW"),
        ({"GATEWAY_AUDIOSOCKET_ALLOW": "10.0.0.0/8=two words"}, "GATEWAY_AUDIOSOCKET_ALLOW"),
        ({"GATEWAY_AUDIOSOCKET_MAX_CALLS": "0"}, "GATEWAY_AUDIOSOCKET_MAX_CALLS"),
        ({"GATEWAY_AUDIOSOCKET_MAX_CALLS": "many"}, "GATEWAY_AUDIOSOCKET_MAX_CALLS"),
        ({"GATEWAY_AUDIOSOCKET_VOICE": "en us"}, "GATEWAY_AUDIOSOCKET_VOICE"),
        ({"GATEWAY_AUDIOSOCKET_VOICE": "v" * 129}, "GATEWAY_AUDIOSOCKET_VOICE"),
        ({"GATEWAY_AUDIOSOCKET_ATTACH_TIMEOUT_S": "0"}, "GATEWAY_AUDIOSOCKET_ATTACH_TIMEOUT_S"),
        ({"GATEWAY_AUDIOSOCKET_MAX_CALL_S": "9"}, "GATEWAY_AUDIOSOCKET_MAX_CALL_S"),
    ],
)
def test_bad_settings_are_refused_naming_the_variable(env: dict[str, str], names: str) -> None:
    with pytest.raises(ConfigError, match=names):
        AudioSocketSettings.from_env({**LISTEN, **env})


def test_the_leg_reads_its_settings_from_the_gateway_environment() -> None:
    base = {"GATEWAY_JWT_SECRET": "s" * 48}
    assert AudioSocketSettings.from_env(GatewaySettings.from_env(base).leg_env) is None
    gateway = GatewaySettings.from_env({**base, **LISTEN})
    assert AudioSocketSettings.from_env(gateway.leg_env) == settings()
    with pytest.raises(ConfigError):
        check_leg_settings({**base, **LISTEN, "GATEWAY_AUDIOSOCKET_MAX_CALLS": "-1"})
