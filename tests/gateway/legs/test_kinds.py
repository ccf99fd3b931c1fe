"""The table of leg kinds: a new leg is one row, and the application mounts, builds and
announces it with no other file naming it (docs/architecture.md, "Adding a leg")."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
from aiohttp import web

from engine.ipc.env import ConfigError
from gateway.app import LEG_SERVICES_KEY, create_app
from gateway.auth import AuthSettings
from gateway.config import GatewaySettings
from gateway.context import LegContext
from gateway.legs.kinds import LEG_KINDS, LegKind, LegService, check_leg_settings, leg_routes

SECRET = "leg-kinds-secret-0123456789abcdef0123456789"


class PagerListener:
    """A made-up TCP/UDP leg's listener: what a new leg's service looks like to the app."""

    def __init__(self, context: LegContext, port: int) -> None:
        self.context, self.port, self.started = context, port, False

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.started = False

    def describe(self) -> str:
        return f"Pager     : udp port {self.port}"


def pager_service(context: LegContext, env: Mapping[str, str]) -> LegService | None:
    text = env.get("GATEWAY_PAGER_PORT")
    if not text:
        return None
    if not text.isdigit():
        raise ConfigError(f"GATEWAY_PAGER_PORT must be a port, got {text!r}")
    return PagerListener(context, int(text))


async def pager_handler(_request: web.Request) -> web.StreamResponse:
    return web.Response(text="pager")


PAGER = LegKind(
    "pager",
    routes={"/v1/pager": pager_handler},
    service=pager_service,
    read_settings=lambda env: pager_service(None, env),  # type: ignore[arg-type]
)


def settings(tmp_path: Path, env: Mapping[str, str]) -> GatewaySettings:
    return GatewaySettings(
        auth=AuthSettings(secret=SECRET, public_key_path=None, audience=None, issuer=None),
        voice_dir=tmp_path,
        engine_socket=str(tmp_path / "no-engine"),
        leg_env=env,
    )


def paths(app: web.Application) -> set[str]:
    return {r.resource.canonical for r in app.router.routes() if r.resource is not None}


def test_every_kind_has_routes_or_a_service_and_names_are_unique() -> None:
    assert len({kind.name for kind in LEG_KINDS}) == len(LEG_KINDS)
    assert all(kind.routes or kind.service for kind in LEG_KINDS)
    assert set(leg_routes()) == {"/v1/twilio", "/v1/asterisk", "/v1/jambonz", "/v1/freeswitch"}


def test_a_new_row_is_mounted_built_from_its_own_settings_and_announced(tmp_path: Path) -> None:
    kinds = (*LEG_KINDS, PAGER)
    app = create_app(settings(tmp_path, {"GATEWAY_PAGER_PORT": "7070"}), legs=kinds)
    assert {"/v1/pager", "/v1/stream", "/v1/twilio"} <= paths(app)
    services = app[LEG_SERVICES_KEY]
    assert len(services) == 1 and isinstance(services[0], PagerListener)
    assert services[0].describe() == "Pager     : udp port 7070"


def test_a_row_whose_settings_are_unset_is_off(tmp_path: Path) -> None:
    app = create_app(settings(tmp_path, {}), legs=(*LEG_KINDS, PAGER))
    assert app[LEG_SERVICES_KEY] == []  # no SIP, no AudioSocket, no pager
    assert "/v1/pager" in paths(app)  # its WebSocket route needs no setting


def test_the_start_up_check_reads_every_legs_settings() -> None:
    check_leg_settings({"GATEWAY_PAGER_PORT": "7070"}, (*LEG_KINDS, PAGER))
    with pytest.raises(ConfigError, match="GATEWAY_PAGER_PORT"):
        check_leg_settings({"GATEWAY_PAGER_PORT": "x"}, (*LEG_KINDS, PAGER))
    with pytest.raises(ConfigError, match="GATEWAY_SIP_LISTEN"):
        check_leg_settings({"GATEWAY_SIP_LISTEN": "nowhere"})
