"""The voice registry end to end: two gateways sharing a real Redis, espeak voice matching.

A ``redis-server`` is started on a free port for this module (so the outage test can stop
it); both gateways use it with their own key prefix.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.voice_profile import estimate_f0
from tests.integration.caller_audio import espeak_reference, wav_bytes
from tests.integration.harness import GatewayProcess, NativeClient, RedisServer

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server")


@pytest.fixture(scope="module")
def pair(
    redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[GatewayProcess]]:
    """Gateways A and B sharing the module's Redis."""
    prefix = f"test{secrets.token_hex(4)}"
    gateways = [
        GatewayProcess(
            tmp_path_factory.mktemp(name) / "gateway.log",
            GATEWAY_REDIS_URL=redis.url,
            GATEWAY_REDIS_PREFIX=prefix,
            ENGINE_VAD="0",
        )
        for name in ("a", "b")
    ]
    for gw in gateways:
        gw.start()
    yield gateways
    for gw in gateways:
        gw.stop()


@pytest.fixture(scope="module")
def high_ref() -> bytes:
    pcm, rate = espeak_reference("en-us+f3", pitch=85)
    return wav_bytes(pcm, rate)


@pytest.fixture(scope="module")
def low_ref() -> bytes:
    pcm, rate = espeak_reference("en-us+m3", pitch=5)
    return wav_bytes(pcm, rate, "FLAC")


def writer_token(gw: GatewayProcess, tenant: str = "acme") -> str:
    return gw.token(tenant=tenant, scopes=["tts:stream", "voices:write"])


async def register(
    gw: GatewayProcess, audio: bytes, *, tenant: str = "acme", name: str = "Agent", **extra: str
) -> tuple[int, dict[str, Any]]:
    form = aiohttp.FormData()
    form.add_field("audio", audio, filename="ref.wav", content_type="audio/wav")
    form.add_field("name", name)
    for key, value in extra.items():
        form.add_field(key, value)
    async with aiohttp.ClientSession() as http:
        r = await http.post(
            gw.base + "/v1/voices",
            data=form,
            headers={"Authorization": f"Bearer {writer_token(gw, tenant)}"},
        )
        return r.status, await r.json()


async def metrics(gw: GatewayProcess) -> dict[str, float]:
    async with aiohttp.ClientSession() as http:
        text = await (await http.get(gw.base + "/metrics")).text()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            label = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{label}}}" if label else s.name] = s.value
    return out


async def speak_pcm(gw: GatewayProcess, voice: str, tenant: str = "acme") -> np.ndarray:
    client = await NativeClient.connect(gw.ws_url, gw.token(tenant=tenant))
    try:
        await client.start(voice, "pcm_16000", pacing="burst")
        await client.send(type="speak", text="Thank you for calling. How can I help you today?")
        await client.wait_event("utterance_done", timeout=20)
        return np.frombuffer(b"".join(f for _, f in client.got.frames), dtype="<i2")
    finally:
        await client.aclose()


def median_f0(pcm16k: np.ndarray) -> float:
    track = estimate_f0(pcm16k)
    return float(np.nanmedian(track))


async def test_register_on_a_speak_on_b_from_the_shared_cache(
    pair: list[GatewayProcess], high_ref: bytes
) -> None:
    a, b = pair
    status, voice = await register(a, high_ref, name="Front desk", language="en-US")
    assert status == 201, voice
    assert voice["id"].startswith("vc_") and voice["kind"] == "cloned"
    assert voice["name"] == "Front desk" and voice["language"] == "en-US"
    assert 3000 <= voice["duration_ms"] <= 30000
    async with aiohttp.ClientSession() as http:
        listed = await (
            await http.get(
                b.base + "/v1/voices", headers={"Authorization": f"Bearer {b.token(tenant='acme')}"}
            )
        ).json()
    kinds = {v["id"]: v["kind"] for v in listed["voices"]}
    assert kinds[voice["id"]] == "cloned" and kinds["en-us"] == "builtin"
    before = await metrics(b)
    pcm = await speak_pcm(b, voice["id"])
    after = await metrics(b)
    assert len(pcm) > 16000
    assert (
        after["gateway_voice_cache_hits_total{level=l2}"]
        == before["gateway_voice_cache_hits_total{level=l2}"] + 1
    )
    assert after["gateway_voice_extraction_seconds_count"] == 0  # B never extracted
    assert after["cosy2_cache_hit_ratio"] > 0
    # A second call on B is an L1 hit.
    await speak_pcm(b, voice["id"])
    again = await metrics(b)
    assert again["gateway_voice_cache_hits_total{level=l1}"] >= 1


async def test_voices_survive_a_restart_of_both_gateways(
    pair: list[GatewayProcess], high_ref: bytes
) -> None:
    status, voice = await register(pair[0], high_ref, name="Persistent")
    assert status == 201
    for gw in pair:
        gw.stop()
        gw.start()
    for gw in pair:
        assert len(await speak_pcm(gw, voice["id"])) > 16000


async def test_same_audio_registered_at_once_is_extracted_once(
    pair: list[GatewayProcess], redis: RedisServer
) -> None:
    pcm, rate = espeak_reference("en-us+f2", pitch=60)
    audio = wav_bytes(pcm, rate)
    before = [(await metrics(gw))["gateway_voice_extraction_seconds_count"] for gw in pair]
    results = await asyncio.gather(*(register(gw, audio, name="Twin") for gw in pair))
    assert [status for status, _ in results] == [201, 201]
    after = [(await metrics(gw))["gateway_voice_extraction_seconds_count"] for gw in pair]
    assert sum(after) - sum(before) == 1  # one extraction across the two instances
    keys = [k for k in redis.keys("*}:features:*") if not k.endswith(":lock")]
    audio_keys = redis.keys("*}:audio")
    assert len(keys) == len(audio_keys)  # one features blob per distinct reference
    assert len(redis.keys("*}:users")) == len(audio_keys)  # who uses each reference


async def test_deleting_the_last_voice_of_a_reference_erases_its_audio(
    pair: list[GatewayProcess], redis: RedisServer
) -> None:
    """Reference audio is biometric data: it goes when no voice uses it any more."""
    a, b = pair
    pcm, rate = espeak_reference("en-us+m7", pitch=35)
    audio = wav_bytes(pcm, rate)
    (s1, first), (s2, second) = (
        await register(a, audio, name="One"),
        await register(b, audio, tenant="globex", name="Two"),
    )
    assert s1 == s2 == 201
    ref_keys_before = set(redis.keys("*:ref:*"))
    assert any(k.endswith("}:audio") for k in ref_keys_before)

    async def delete(gw: GatewayProcess, voice_id: str, tenant: str) -> int:
        headers = {"Authorization": f"Bearer {writer_token(gw, tenant)}"}
        async with aiohttp.ClientSession() as http:
            return (await http.delete(f"{gw.base}/v1/voices/{voice_id}", headers=headers)).status

    assert await delete(a, first["id"], "acme") == 204
    # The other tenant's voice from the same audio still speaks, from its own instance.
    assert len(await speak_pcm(b, second["id"], tenant="globex")) > 16000
    assert set(redis.keys("*:ref:*")) == ref_keys_before
    assert await delete(b, second["id"], "globex") == 204
    erased = ref_keys_before - set(redis.keys("*:ref:*"))
    sha_tags = {k.split("}")[0] for k in erased}
    assert len(sha_tags) == 1  # exactly this reference's keys, all of them
    (ref,) = sha_tags
    assert not [k for k in redis.keys("*:ref:*") if k.startswith(ref + "}")]
    assert {k[len(ref) + 1 :] for k in erased} >= {":audio", ":users", ":variants"}
    assert any(k.startswith(ref + "}:features:") for k in erased)


@pytest.mark.realtime  # refused within 2 s: runs alone (Makefile)
async def test_a_voice_deleted_on_one_gateway_stops_on_the_other_at_once(
    pair: list[GatewayProcess], high_ref: bytes
) -> None:
    """B has the voice's record cached (it just spoke with it); A deletes it; B refuses it
    at once, not after its 10 s record lifetime: the deletion was announced."""
    a, b = pair
    status, voice = await register(a, high_ref, name="Leaving")
    assert status == 201
    assert len(await speak_pcm(b, voice["id"])) > 16000
    headers = {"Authorization": f"Bearer {writer_token(a)}"}
    async with aiohttp.ClientSession() as http:
        assert (
            await http.delete(f"{a.base}/v1/voices/{voice['id']}", headers=headers)
        ).status == 204
    deleted_at = time.monotonic()
    while True:
        client = await NativeClient.connect(b.ws_url, b.token(tenant="acme"))
        try:
            await client.send(type="start", voice=voice["id"], format="mulaw_8000")
            try:
                await client.wait_event("ready")
            except AssertionError:  # the harness: closed before "ready"
                (refused,) = client.got.of_type("error")
                break
        finally:
            await client.aclose()
        assert time.monotonic() - deleted_at < 2.0, "B still speaks a deleted voice"
        await asyncio.sleep(0.05)
    assert refused["code"] == "unknown_voice"


@pytest.mark.parametrize(
    "case,code,status",
    [
        ("junk", "invalid_audio", 400),
        ("short", "audio_too_short", 400),
        ("long", "audio_too_long", 400),
        ("silence", "no_speech", 400),
        ("clipped", "audio_clipped", 400),
        ("huge", "audio_too_large", 413),
    ],
)
async def test_bad_uploads_get_their_code_and_store_nothing(
    pair: list[GatewayProcess], redis: RedisServer, case: str, code: str, status: int
) -> None:
    speech, rate = espeak_reference("en-us", pitch=50, seconds=1.0)
    if case == "junk":
        audio = b"this is not audio at all" * 50
    elif case == "short":
        audio = wav_bytes(speech[: int(rate * 2)], rate)
    elif case == "long":
        long_pcm, _ = espeak_reference("en-us", pitch=50, seconds=36.0)
        audio = wav_bytes(long_pcm[: rate * 36], rate)
    elif case == "silence":
        audio = wav_bytes(np.zeros(rate * 5, dtype=np.int16), rate)
    elif case == "clipped":
        loud, _ = espeak_reference("en-us", pitch=50, seconds=5.0)
        audio = wav_bytes((loud.astype(np.int32) * 8).clip(-32768, 32767).astype(np.int16), rate)
    else:
        audio = bytes(11 * 2**20)
    records_before = len(redis.keys("*:voice:*"))
    got_status, body = await register(pair[0], audio)
    assert (got_status, body["error"]["code"]) == (status, code)
    assert len(redis.keys("*:voice:*")) == records_before


async def test_tenants_never_see_each_others_voices(
    pair: list[GatewayProcess], high_ref: bytes
) -> None:
    a = pair[0]
    status, voice = await register(a, high_ref, tenant="acme")
    assert status == 201
    other = {"Authorization": f"Bearer {writer_token(a, 'globex')}"}
    async with aiohttp.ClientSession() as http:
        assert (await http.get(f"{a.base}/v1/voices/{voice['id']}", headers=other)).status == 404
        assert (await http.delete(f"{a.base}/v1/voices/{voice['id']}", headers=other)).status == 404
        listed = await (await http.get(a.base + "/v1/voices", headers=other)).json()
        assert voice["id"] not in {v["id"] for v in listed["voices"]}
        reader = {"Authorization": f"Bearer {a.token(tenant='acme')}"}
        r = await http.post(a.base + "/v1/voices", headers=reader, data=b"x")
        assert r.status == 403  # registering needs voices:write
    client = await NativeClient.connect(a.ws_url, a.token(tenant="globex"))
    try:
        await client.send(type="start", voice=voice["id"], format="mulaw_8000")
        assert (await client.wait_event("error"))["code"] == "unknown_voice"
    finally:
        await client.aclose()
    # The owner still has it, and can delete it.
    owner = {"Authorization": f"Bearer {writer_token(a, 'acme')}"}
    async with aiohttp.ClientSession() as http:
        assert (await http.get(f"{a.base}/v1/voices/{voice['id']}", headers=owner)).status == 200
        assert (await http.delete(f"{a.base}/v1/voices/{voice['id']}", headers=owner)).status == 204
        assert (await http.get(f"{a.base}/v1/voices/{voice['id']}", headers=owner)).status == 404


async def test_a_voice_profile_audibly_changes_the_pitch(
    pair: list[GatewayProcess], high_ref: bytes, low_ref: bytes
) -> None:
    a = pair[0]
    (s1, high), (s2, low) = await register(a, high_ref), await register(a, low_ref)
    assert s1 == s2 == 201
    high_f0 = median_f0(await speak_pcm(a, high["id"]))
    low_f0 = median_f0(await speak_pcm(a, low["id"]))
    plain_f0 = median_f0(await speak_pcm(a, "en-us"))
    assert high_f0 > 1.3 * low_f0, (high_f0, low_f0)
    assert high_f0 > plain_f0 > low_f0 * 0.95, (high_f0, plain_f0, low_f0)


async def test_redis_outage_l1_still_serves_and_registration_refuses(
    pair: list[GatewayProcess], redis: RedisServer, high_ref: bytes
) -> None:
    a = pair[0]
    status, voice = await register(a, high_ref, name="Outage")
    assert status == 201
    await speak_pcm(a, voice["id"])  # warm L1 on A
    records_before = len(redis.keys("*:voice:*"))
    redis.stop()
    try:
        assert len(await speak_pcm(a, voice["id"])) > 16000  # served from L1
        pcm, rate = espeak_reference("en-us+f4", pitch=40)
        status, body = await register(a, wav_bytes(pcm, rate))
        assert (status, body["error"]["code"]) == (503, "storage_unavailable")
        assert records_before >= 1
    finally:
        redis.start()  # (empty: this Redis keeps nothing on disk)
