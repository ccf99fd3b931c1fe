"""Bad input ends only the offending session or request, never disturbs the others.

Every case runs while a healthy session streams realtime audio; afterwards that session's
audio must be complete and on time.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from collections.abc import Awaitable, Callable

import aiohttp
import numpy as np
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from gateway.auth import mint_token
from tests.integration.conftest import Connect
from tests.integration.harness import GatewayProcess, NativeClient
from tests.integration.pacing import assert_on_time, lateness

# About 7 s of speech: the healthy call plays on through all the cases (33 ms of them
# here) and for seconds after; six times this (20 s) only made the test wait.
LONG = " ".join(["Please listen carefully, as our menu options have changed."] * 2)


def _b64(obj: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()


def alg_none_token() -> str:
    header = _b64({"alg": "none", "typ": "JWT"})
    payload = _b64({"sub": "mallory", "exp": 4102444800, "scope": "tts:stream"})
    return f"{header}.{payload}."


async def expect_error(client: NativeClient, code: str, close: int | None) -> None:
    event = await client.wait_event("error", timeout=10)
    assert event["code"] == code, event
    assert "Traceback" not in event["message"]
    if close is not None:
        assert await client.wait_closed() == close


async def case_invalid_json(connect: Connect) -> None:
    c = await connect()
    await c.start()
    await c.ws.send_str("{not json")
    await expect_error(c, "invalid_json", None)
    await c.send(type="speak", text="Still here.")  # the session goes on
    await c.wait_event("utterance_done")


async def case_unknown_type(connect: Connect) -> None:
    c = await connect()
    await c.start()
    await c.send(type="dance")
    await expect_error(c, "unknown_type", None)


async def case_invalid_field(connect: Connect) -> None:
    c = await connect()
    await c.start()
    await c.send(type="speak", text=42)
    await expect_error(c, "invalid_message", None)


async def case_before_start(connect: Connect) -> None:
    c = await connect()
    await c.send(type="speak", text="hello")
    await expect_error(c, "not_started", 1008)


async def case_binary_before_start(connect: Connect) -> None:
    c = await connect()
    await c.ws.send_bytes(b"\x00" * 320)
    await expect_error(c, "not_started", 1008)


async def case_unknown_voice(connect: Connect) -> None:
    c = await connect()
    await c.send(type="start", voice="klingon", format="mulaw_8000")
    await expect_error(c, "unknown_voice", 1008)


async def case_unknown_format(connect: Connect) -> None:
    c = await connect()
    await c.send(type="start", voice="en-us", format="mp3_44100")
    await expect_error(c, "unsupported_format", 1008)


async def case_text_too_long(connect: Connect) -> None:
    c = await connect()
    await c.start()
    await c.send(type="speak", text="a" * 2001, utterance_id="big")
    event = await c.wait_event("error")
    assert event["code"] == "text_too_long" and event["utterance_id"] == "big"


async def case_message_too_big(connect: Connect) -> None:
    c = await connect()
    await c.start()
    await c.ws.send_str(json.dumps({"type": "speak", "text": "x" * 70_000}))
    assert await c.wait_closed() == 1009


async def case_start_twice(connect: Connect) -> None:
    c = await connect()
    await c.start()
    await c.send(type="start", voice="en-us", format="mulaw_8000")
    await expect_error(c, "already_started", None)


async def case_missing_token(connect: Connect) -> None:
    c = await connect(None)
    await expect_error(c, "token_missing", 1008)


async def case_expired_token(gateway: GatewayProcess, connect: Connect) -> None:
    c = await connect(gateway.token(ttl_s=-120))
    await expect_error(c, "token_expired", 1008)


async def case_wrong_key(connect: Connect) -> None:
    c = await connect(mint_token(secret="another-secret-of-at-least-32-bytes!!", subject="x"))
    await expect_error(c, "token_invalid", 1008)


def rs256_token() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return mint_token(private_key_pem=pem, algorithm="RS256", subject="x")


# Made before the healthy session starts: key generation would stall this test's own loop.
RS256_TOKEN = rs256_token()


async def case_rs256_token_not_accepted(connect: Connect) -> None:
    c = await connect(RS256_TOKEN)
    await expect_error(c, "token_invalid", 1008)


async def case_alg_none(connect: Connect) -> None:
    c = await connect(alg_none_token())
    await expect_error(c, "token_invalid", 1008)


async def case_wrong_scope(gateway: GatewayProcess, connect: Connect) -> None:
    c = await connect(gateway.token(scopes=["voices:write"]))
    await expect_error(c, "insufficient_scope", 1008)


async def case_query_token_works(gateway: GatewayProcess, connect: Connect) -> None:
    c = await connect(gateway.token(), query_token=True)
    await c.start()
    await c.send(type="close")
    assert await c.wait_closed() == 1000  # the access log line is written at the end


CASES: dict[str, Callable[..., Awaitable[None]]] = {
    f.__name__.removeprefix("case_"): f
    for f in (
        case_invalid_json,
        case_unknown_type,
        case_invalid_field,
        case_before_start,
        case_binary_before_start,
        case_unknown_voice,
        case_unknown_format,
        case_text_too_long,
        case_message_too_big,
        case_start_twice,
        case_missing_token,
        case_expired_token,
        case_wrong_key,
        case_rs256_token_not_accepted,
        case_alg_none,
        case_wrong_scope,
        case_query_token_works,
    )
}


@pytest.mark.realtime  # frame timing under load: run alone (see the Makefile)
async def test_bad_input_never_disturbs_a_healthy_session(
    gateway: GatewayProcess, connect: Connect
) -> None:
    healthy = await connect()
    await healthy.start("en-us", "mulaw_8000")
    await healthy.send(type="speak", text=LONG, utterance_id="healthy")
    await healthy.wait_event("utterance_started")
    ran: list[tuple[str, float]] = []
    for name, case in CASES.items():
        args = [gateway, connect] if "gateway" in case.__code__.co_varnames[:2] else [connect]
        try:
            await case(*args)
        except Exception as exc:
            raise AssertionError(f"case {name} failed: {exc!r}") from exc
        ran.append((name, asyncio.get_running_loop().time()))
    done = await healthy.wait_event("utterance_done", timeout=60)
    times = np.array([t for t, _ in healthy.got.frames])
    worst = int(lateness(times).argmax())
    after = [n for n, t in ran if t <= times[worst]]
    assert_on_time(times, done["audio_ms"], context=f"after case {after[-1:]}")
    assert abs(np.diff(times).mean() - 0.020) < 0.0005
    assert healthy.got.of_type("error") == []
    # Tokens never reach the log, not even the one passed as a query parameter.
    await asyncio.sleep(0.2)
    log = gateway.log_text()
    assert gateway.token()[:40] not in log
    assert "access_token=[redacted]" in log


async def test_http_endpoints_reject_bad_tokens(gateway: GatewayProcess) -> None:
    async with aiohttp.ClientSession() as http:
        for token, code, status in [
            (None, "token_missing", 401),
            ("garbage", "token_malformed", 401),
            (alg_none_token(), "token_invalid", 401),
            (gateway.token(scopes=["other"]), "insufficient_scope", 403),
        ]:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            r = await http.get(gateway.base + "/v1/voices", headers=headers)
            assert r.status == status
            assert (await r.json())["error"]["code"] == code


@pytest.mark.parametrize("path", ["/v1/stream"])
async def test_plain_http_on_the_websocket_path_is_refused(
    gateway: GatewayProcess, path: str
) -> None:
    async with aiohttp.ClientSession() as http:
        r = await http.get(gateway.base + path)
        assert r.status == 426


async def test_token_command_mints_an_accepted_token(gateway: GatewayProcess) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        "token",
        "--sub",
        "ivr-app",
        "--tenant",
        "acme",
        "--ttl",
        "60",
        env={**gateway.env},
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0
    client = await NativeClient.connect(gateway.ws_url, out.decode().strip())
    try:
        assert (await client.start())["type"] == "ready"
    finally:
        await client.aclose()
