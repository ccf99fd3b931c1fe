"""``/v1/speech-cache/prompts`` at the HTTP boundary, in a real aiohttp server with the
real registry (file store), service, catalog and warmer, and a stand-in engine
(:mod:`tests.gateway.speech_cache.stand_in`): auth, limits, tenant isolation of cloned
voices and of the levels reported, fairness (checks, the warm-up queue), voice deletion,
a tenant's erasure, an engine without a cache."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from engine.ipc.client import EngineUnavailable
from engine.ipc.schema import VoiceInfo
from engine.speech_cache.key import registered_voice_digest
from gateway.auth import AuthSettings, mint_token
from gateway.config import GatewaySettings
from gateway.engine_supervisor import EngineSupervisor, SupervisorSettings
from gateway.speech_cache import api
from gateway.speech_cache.prompts import PromptLimits
from gateway.speech_cache.service import SpeechCacheService, SpeechCacheSettings
from gateway.state import STATE_KEY, GatewayState
from gateway.voices import api as voices_api
from gateway.voices.reference_audio import ReferenceAudio
from gateway.voices.registry import BackendInfo
from gateway.voices.store import FileVoiceStore
from gateway.voices.upload_worker import UploadWorkers
from tests.gateway.speech_cache.stand_in import CachingEngine

SECRET = "speech-cache-api-test-secret-0123456789-abc"
BACKEND = BackendInfo(name="test", version="1", cloning=True, voices={"en-us": "en-US"})
Client = TestClient[web.Request, web.Application]


def reference(seed: int) -> ReferenceAudio:
    pcm = bytes([seed % 256, 1]) * 16000
    return ReferenceAudio(
        pcm=pcm, duration_ms=4000, speech_ms=3500, source_format="WAV", source_rate=16000,
        source_channels=1, peak_dbfs=-1.0, loudness_dbfs=-20.0,
        sha256=hashlib.sha256(pcm).hexdigest(),
    )  # fmt: skip


class World:
    def __init__(self, tmp_path: Path, engine: CachingEngine, max_prompts: int) -> None:
        config = GatewaySettings(
            auth=AuthSettings(secret=SECRET, public_key_path=None, audience=None, issuer=None),
            voice_dir=tmp_path,
        )
        self.engine = engine
        self.up = True
        state = GatewayState.create(
            config,
            supervisor=EngineSupervisor(SupervisorSettings(socket_path=str(tmp_path / "none"))),
            store=FileVoiceStore(tmp_path / "voices"),
        )

        def client() -> CachingEngine:
            if not self.up:
                raise EngineUnavailable("the engine is not ready")
            return self.engine

        state.engine.client = client  # type: ignore[assignment,method-assign]
        state.engine.backend = BACKEND
        state.engine.voices = tuple(
            VoiceInfo(id=v, language="en-US", name=v, backend="test") for v in engine.voices
        )
        self.state = state
        self.service = SpeechCacheService(
            SpeechCacheSettings(limits=PromptLimits(max_text_chars=200, max_prompts=max_prompts)),
            link=state.engine,
            resolve_voice=state.resolve_voice,
            metrics=state.metrics,
        )
        state.registry.deletion_listeners.append(
            lambda d: self.service.forget_voice(d.voice_id, d.features_digest, d.tenant)
        )
        app = web.Application()
        app[STATE_KEY] = state
        app[voices_api.UPLOAD_WORKERS_KEY] = UploadWorkers(1)
        voices_api.add_routes(app, state)
        api.add_routes(app, self.service)

        async def lifecycle(_app: web.Application) -> AsyncIterator[None]:
            await self.service.start()
            yield
            await self.service.stop()

        app.cleanup_ctx.append(lifecycle)
        self.app = app

    async def register(self, tenant: str, seed: int = 1) -> str:
        async def ref() -> ReferenceAudio:
            return reference(seed)

        record = await self.state.registry.register(tenant, ref, name=None, language="en-US")
        return record.id


def auth(tenant: str, scopes: tuple[str, ...] = ("tts:stream", "voices:write")) -> dict[str, str]:
    token = mint_token(secret=SECRET, subject="t", tenant=tenant, scopes=list(scopes))
    return {"Authorization": f"Bearer {token}"}


Make = Callable[..., Awaitable[tuple[Client, World]]]


@pytest.fixture
async def make(tmp_path: Path) -> AsyncIterator[Make]:
    clients: list[Client] = []

    async def _make(
        engine: CachingEngine | None = None, max_prompts: int = 10
    ) -> tuple[Client, World]:
        world = World(tmp_path, engine or CachingEngine(), max_prompts)
        client: Client = TestClient(TestServer(world.app))
        await client.start_server()
        clients.append(client)
        return client, world

    yield _make
    for client in clients:
        await client.close()


async def warm(client: Client, tenant: str, **body: Any) -> tuple[int, dict[str, Any]]:
    r = await client.post(api.PATH, json={"voice": "en-us", **body}, headers=auth(tenant))
    return r.status, await r.json()


async def settled(client: Client, tenant: str, prompt_id: str) -> dict[str, Any]:
    async with asyncio.timeout(5):
        while True:
            r = await client.get(api.PATH, headers=auth(tenant))
            found = [p for p in (await r.json())["prompts"] if p["id"] == prompt_id]
            if found and found[0]["state"] in ("warm", "failed"):
                prompt: dict[str, Any] = found[0]
                return prompt
            await asyncio.sleep(0.01)


async def test_a_warmed_prompt_is_listed_and_reports_its_levels(make: Make) -> None:
    client, world = await make()
    status, body = await warm(client, "acme", text="Welcome to Acme Bank. Please hold.")
    assert status == 202
    prompt = body["prompt"]
    assert prompt["id"].startswith("sp_") and prompt["state"] in ("pending", "warming")
    assert (await settled(client, "acme", prompt["id"]))["state"] == "warm"
    r = await client.get(f"{api.PATH}/{prompt['id']}", headers=auth("acme"))
    got = (await r.json())["prompt"]
    assert got["segments"] == [
        {"text": "Welcome to Acme Bank.", "levels": ["memory"]},
        {"text": "Please hold.", "levels": ["memory"]},
    ]
    assert got["cached"] is True
    [request] = world.engine.warmed
    assert (request.voice, request.sample_rate, request.voice_profile) == ("en-us", 8000, None)
    assert (request.tenant, request.shared) == ("acme", False)  # the tenant's alone
    # the same prompt again: the same id, warmed again (its audio may have been evicted)
    status, again = await warm(client, "acme", text="Welcome to Acme Bank. Please hold.")
    assert (status, again["prompt"]["id"]) == (202, prompt["id"])


async def test_a_cloned_voice_is_warmed_with_its_features_for_its_tenant_only(make: Make) -> None:
    client, world = await make()
    voice = await world.register("acme")
    status, body = await warm(client, "acme", voice=voice, text="Hello from Acme.")
    assert status == 202
    await settled(client, "acme", body["prompt"]["id"])
    [request] = world.engine.warmed
    base, features, digest = await world.state.resolve_voice("acme", voice)
    assert (request.voice, request.voice_profile) == (base, features)  # as OpenStream
    assert features is not None and request.voice_digest == digest
    assert digest == registered_voice_digest("acme", voice, features)
    # another tenant can neither warm with it nor see the prompt
    status, refused = await warm(client, "other", voice=voice, text="Hello from Acme.")
    assert (status, refused["error"]["code"]) == (404, "unknown_voice")
    r = await client.get(f"{api.PATH}/{body['prompt']['id']}", headers=auth("other"))
    assert (r.status, (await r.json())["error"]["code"]) == (404, "not_found")
    r = await client.get(api.PATH, headers=auth("other"))
    assert (await r.json())["prompts"] == []
    r = await client.delete(f"{api.PATH}/{body['prompt']['id']}", headers=auth("other"))
    assert r.status == 404


async def test_deleting_a_voice_forgets_its_speech_and_its_prompts(make: Make) -> None:
    client, world = await make()
    voice = await world.register("acme")
    _, body = await warm(client, "acme", voice=voice, text="Hello from Acme.")
    await settled(client, "acme", body["prompt"]["id"])
    _, features, digest = await world.state.resolve_voice("acme", voice)
    assert features is not None and world.engine.held
    r = await client.delete(f"/v1/voices/{voice}", headers=auth("acme"))
    assert r.status == 204
    assert world.engine.forgotten == [registered_voice_digest("acme", voice, features)]
    assert world.engine.forgotten == [digest]
    assert world.engine.held == {}
    r = await client.get(f"{api.PATH}/{body['prompt']['id']}", headers=auth("acme"))
    assert r.status == 404


async def test_a_deletion_while_the_engine_is_away_is_sent_when_it_is_back(make: Make) -> None:
    client, world = await make()
    voice = await world.register("acme")
    _, _, digest = await world.state.resolve_voice("acme", voice)
    world.up = False
    r = await client.delete(f"/v1/voices/{voice}", headers=auth("acme"))
    assert r.status == 204 and world.engine.forgotten == []
    world.up = True
    async with asyncio.timeout(5):
        while not world.engine.forgotten:  # noqa: ASYNC110 - the 1 s retry
            await asyncio.sleep(0.05)
    assert world.engine.forgotten == [digest]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"text": "x" * 201}, 400, "text_too_long"),
        ({"text": "Hi.", "speed": 9}, 400, "invalid_speed"),
        ({"text": "Hi.", "format": "flac"}, 400, "unsupported_format"),
        ({"text": "Hi.", "tenant": "other"}, 400, "invalid_field"),
        ({"text": "Hi.", "voice": "nobody"}, 404, "unknown_voice"),
        ({"text": "Hi.", "voice": "vc_0123456789abcdef"}, 404, "unknown_voice"),
        ({"voice": "en-us"}, 400, "invalid_field"),
    ],
)
async def test_bad_prompts_are_refused_with_codes(
    make: Make, body: dict[str, Any], status: int, code: str
) -> None:
    client, world = await make()
    r = await client.post(api.PATH, json={"voice": "en-us", **body}, headers=auth("acme"))
    assert (r.status, (await r.json())["error"]["code"]) == (status, code)
    assert world.engine.warmed == []


async def test_bodies_and_tenants_are_bounded(make: Make) -> None:
    client, _world = await make(max_prompts=2)
    for text in ("One.", "Two."):
        assert (await warm(client, "acme", text=text))[0] == 202
    status, body = await warm(client, "acme", text="Three.")
    assert (status, body["error"]["code"]) == (429, "too_many_prompts")
    assert (await warm(client, "other", text="Three."))[0] == 202  # per tenant
    big = b'{"text": "' + b"a" * (api.MAX_BODY_BYTES + 10) + b'", "voice": "en-us"}'
    r = await client.post(api.PATH, data=big, headers=auth("other"))
    assert (r.status, (await r.json())["error"]["code"]) == (413, "request_too_large")
    r = await client.post(api.PATH, data=b"{nope", headers=auth("other"))
    assert (r.status, (await r.json())["error"]["code"]) == (400, "invalid_request")


async def test_credentials_are_required(make: Make) -> None:
    client, _world = await make()
    r = await client.get(api.PATH)
    assert (r.status, (await r.json())["error"]["code"]) == (401, "token_missing")
    r = await client.post(api.PATH, json={"text": "Hi.", "voice": "en-us"},
                          headers=auth("acme", scopes=("voices:write",)))  # fmt: skip
    assert (r.status, (await r.json())["error"]["code"]) == (403, "insufficient_scope")


async def test_an_engine_without_a_cache_or_no_engine_is_a_clear_error(make: Make) -> None:
    client, world = await make(CachingEngine(cache=False))
    status, body = await warm(client, "acme", text="Hi.")
    assert (status, body["error"]["code"]) == (409, "speech_cache_off")
    world.up = False
    status, body = await warm(client, "acme", text="Hi.")
    assert (status, body["error"]["code"]) == (503, "engine_unavailable")
    assert world.engine.warmed == []


async def test_a_check_answers_only_the_tenants_own_entries(make: Make) -> None:
    """Tenant B warming the very prompt tenant A warmed gets B's own levels (nothing
    until B's warm-up), never A's: the check API is no oracle of another's callers."""
    client, world = await make()
    text = "Your verification code is in the app."
    _, a_body = await warm(client, "acme", text=text)
    await settled(client, "acme", a_body["prompt"]["id"])
    world.engine.hold = asyncio.Event()  # B's warm-up does not reach the engine yet
    _, b_body = await warm(client, "other", text=text)
    assert b_body["prompt"]["id"] != a_body["prompt"]["id"]
    world.engine.hold.set()
    await settled(client, "other", b_body["prompt"]["id"])
    held = {k[0] for k in world.engine.held}
    assert held == {"tenant:acme", "tenant:other"}  # one entry each, by scope
    world.engine.held = {k: v for k, v in world.engine.held.items() if k[0] == "tenant:acme"}
    r = await client.get(f"{api.PATH}/{b_body['prompt']['id']}", headers=auth("other"))
    got = (await r.json())["prompt"]
    assert got["segments"] == [{"text": text, "levels": []}] and got["cached"] is False


async def test_too_many_checks_answer_503_with_retry_after(make: Make) -> None:
    """A tenant's checks beyond its share, or an engine too busy to check, are 503
    ``overloaded`` with Retry-After (not 400): the client may try again."""
    client, world = await make()
    _, body = await warm(client, "acme", text="Hello.")
    prompt_id = body["prompt"]["id"]
    await settled(client, "acme", prompt_id)
    world.engine.hold = asyncio.Event()  # checks wait in the engine
    url = f"{api.PATH}/{prompt_id}"
    waiting = [asyncio.ensure_future(client.get(url, headers=auth("acme"))) for _ in range(4)]
    await asyncio.sleep(0.2)
    r = await client.get(url, headers=auth("acme"))
    assert (r.status, (await r.json())["error"]["code"]) == (503, "overloaded")
    assert r.headers["Retry-After"] == "1"
    world.engine.hold.set()
    assert [(await w).status for w in waiting] == [200] * 4
    world.engine.checks_answer = "overloaded"
    r = await client.get(url, headers=auth("acme"))
    assert (r.status, (await r.json())["error"]["code"]) == (503, "overloaded")


async def test_a_deleted_prompt_leaves_the_queue_and_a_flood_spares_others(make: Make) -> None:
    """POST+DELETE floods by one tenant neither fill the warm-up queue nor keep another
    tenant's prompt from being warmed; a full share answers 503 to its tenant only."""
    client, world = await make(max_prompts=20)
    world.engine.hold = asyncio.Event()  # nothing is warmed while the flood runs
    for i in range(300):
        _, body = await warm(client, "flood", text=f"Prompt number {i}.")
        r = await client.delete(f"{api.PATH}/{body['prompt']['id']}", headers=auth("flood"))
        assert r.status == 204
    assert world.service.warmer.pending <= 1  # the deleted ones left the queue
    status, mine = await warm(client, "acme", text="Welcome to Acme Bank.")
    assert status == 202
    world.engine.hold.set()
    assert (await settled(client, "acme", mine["prompt"]["id"]))["state"] == "warm"
    assert len(world.engine.warmed) <= 3  # the flood's deleted prompts never got there


async def test_a_tenant_erases_its_own_entries_only(make: Make) -> None:
    client, world = await make()
    for tenant in ("acme", "other"):
        _, body = await warm(client, tenant, text="Hello.")
        await settled(client, tenant, body["prompt"]["id"])
    r = await client.delete(api.ENTRIES_PATH, headers=auth("acme"))
    assert r.status == 200 and (await r.json()) == {"purged": {"memory_entries": 1}}
    assert world.engine.purged == ["acme"]
    assert {k[0] for k in world.engine.held} == {"tenant:other"}
    r = await client.get(api.PATH, headers=auth("acme"))
    assert (await r.json())["prompts"] == []  # its prompts left the list too
    r = await client.get(api.PATH, headers=auth("other"))
    assert len((await r.json())["prompts"]) == 1
    r = await client.delete(api.ENTRIES_PATH)
    assert r.status == 401
