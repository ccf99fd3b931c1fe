"""Who may read /metrics (gateway/app.py ``may_scrape``): the counters say how callers
are served, so they go only where an operator chooses: peers in
``GATEWAY_METRICS_ALLOW`` (loopback by default, the socket's own peer, never a header),
or whoever bears ``GATEWAY_METRICS_TOKEN``."""

from __future__ import annotations

from unittest import mock

import pytest
from aiohttp.test_utils import make_mocked_request

from engine.ipc.env import ConfigError
from gateway.app import may_scrape
from gateway.auth import AuthSettings
from gateway.config import GatewaySettings

TOKEN = "a-metrics-token-for-prometheus-0123"


def settings(**env: str) -> GatewaySettings:
    return GatewaySettings.from_env({"GATEWAY_JWT_SECRET": "s" * 40, **env})


def request(peer: str, headers: dict[str, str] | None = None) -> object:
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: (
        (peer, 40000) if name == "peername" else default
    )
    return make_mocked_request("GET", "/metrics", headers=headers or {}, transport=transport)


def test_loopback_only_by_default() -> None:
    config = settings()
    assert may_scrape(config, request("127.0.0.1"))  # type: ignore[arg-type]
    assert may_scrape(config, request("::1"))  # type: ignore[arg-type]
    assert may_scrape(config, request("::ffff:127.0.0.1"))  # type: ignore[arg-type]
    assert not may_scrape(config, request("10.1.2.3"))  # type: ignore[arg-type]
    forwarded = request("10.1.2.3", {"X-Forwarded-For": "127.0.0.1"})
    assert not may_scrape(config, forwarded)  # type: ignore[arg-type]


def test_networks_and_a_token() -> None:
    config = settings(GATEWAY_METRICS_ALLOW="10.0.0.0/8", GATEWAY_METRICS_TOKEN=TOKEN)
    assert may_scrape(config, request("10.1.2.3"))  # type: ignore[arg-type]
    assert not may_scrape(config, request("127.0.0.1"))  # type: ignore[arg-type]
    bearer = request("192.0.2.7", {"Authorization": f"Bearer {TOKEN}"})
    assert may_scrape(config, bearer)  # type: ignore[arg-type]
    wrong = request("192.0.2.7", {"Authorization": f"Bearer {TOKEN}x"})
    assert not may_scrape(config, wrong)  # type: ignore[arg-type]
    closed = settings(GATEWAY_METRICS_ALLOW="", GATEWAY_METRICS_TOKEN=TOKEN)
    assert not may_scrape(closed, request("127.0.0.1"))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "env", [{"GATEWAY_METRICS_ALLOW": "not-a-network"}, {"GATEWAY_METRICS_TOKEN": "short"}]
)
def test_bad_settings_are_refused(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        settings(**env)


def test_auth_settings_are_untouched() -> None:
    assert settings().auth == AuthSettings.from_env({"GATEWAY_JWT_SECRET": "s" * 40})
