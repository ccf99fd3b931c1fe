from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.harness import GatewayProcess, NativeClient, RedisServer, running_redis

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


@pytest.fixture(scope="module")
def gateway(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    """A real gateway with its real espeak engine, shared by a test module; a module's
    ``GATEWAY_ENV`` (a dict) adds to its environment."""
    log = tmp_path_factory.mktemp("gateway") / "gateway.log"
    gw = GatewayProcess(log, **getattr(request.module, "GATEWAY_ENV", {}))
    gw.start()
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real redis-server on a free port for the module (tests may stop and restart it)."""
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


Connect = Callable[..., Awaitable[NativeClient]]


@pytest.fixture
async def connect(gateway: GatewayProcess) -> AsyncIterator[Connect]:
    clients: list[NativeClient] = []

    async def _connect(token: str | None = "", *, query_token: bool = False) -> NativeClient:
        tok = gateway.token() if token == "" else token
        client = await NativeClient.connect(gateway.ws_url, tok, query_token=query_token)
        clients.append(client)
        return client

    yield _connect
    for client in clients:
        await client.aclose()
