"""``/v1/voices`` at the HTTP boundary: upload limits, malformed bodies, voice ids.

The routes run in a real aiohttp server with a real registry (file store), a stand-in
engine and, except where the real process pool is the subject, stand-in upload workers.
"""

from __future__ import annotations

import asyncio
import io
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import aiohttp
import numpy as np
import pytest
import soundfile as sf  # type: ignore[import-untyped]
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.auth import AuthSettings, mint_token
from gateway.config import GatewaySettings
from gateway.engine_supervisor import EngineSupervisor, SupervisorSettings
from gateway.state import STATE_KEY, GatewayState
from gateway.voices import api as voices_api
from gateway.voices.reference_audio import MAX_UPLOAD_BYTES, ReferenceAudio, ReferenceAudioError
from gateway.voices.registry import BackendInfo, is_voice_id
from gateway.voices.store import FileVoiceStore
from gateway.voices.upload_worker import UploadWorkerError, UploadWorkers
from tests.gateway.voices.test_reference_audio import encode, padded_speech

SECRET = "voices-api-test-secret-0123456789-abcdefgh"
BACKEND = BackendInfo(name="test", version="1", cloning=True, voices={"en-us": "en-US"})
LONG_ID = "vc_" + "a" * 5000


@dataclass
class Prepared:
    features: bytes
    seconds: float = 0.001


class FakeEngine:
    transcripts: ClassVar[list[str | None]] = []  # every extraction's, in order

    async def prepare_voice(
        self, pcm16k: bytes, *, language: str | None = None, transcript: str | None = None
    ) -> Prepared:
        FakeEngine.transcripts.append(transcript)
        return Prepared(features=f"features:{transcript}:".encode() + pcm16k[:16])


def reference(pcm: bytes = b"\x01\x00" * 16000) -> ReferenceAudio:
    return ReferenceAudio(
        pcm=pcm,
        duration_ms=4000,
        speech_ms=3500,
        source_format="WAV",
        source_rate=16000,
        source_channels=1,
        peak_dbfs=-1.0,
        loudness_dbfs=-20.0,
        sha256="ab" * 32,
    )


@dataclass
class FakeWorkers(UploadWorkers):
    """Upload workers that record what they were handed and may hold it."""

    seen: list[bytes] = field(default_factory=list)
    paths: list[Path] = field(default_factory=list)
    hold: asyncio.Event | None = None
    entered: asyncio.Queue[None] = field(default_factory=asyncio.Queue)

    def __post_init__(self) -> None:
        super().__init__(1)

    async def process(self, path: Path) -> ReferenceAudio:
        self.paths.append(path)
        self.seen.append(path.read_bytes())
        self.entered.put_nowait(None)
        if self.hold is not None:
            await self.hold.wait()
        if self.seen[-1].startswith(b"junk"):
            raise ReferenceAudioError("invalid_audio", "not audio")
        return reference()


def make_app(tmp_path: Path, workers: UploadWorkers, **settings: Any) -> web.Application:
    config = GatewaySettings(
        auth=AuthSettings(secret=SECRET, public_key_path=None, audience=None, issuer=None),
        voice_dir=tmp_path,
        **settings,
    )
    state = GatewayState.create(
        config,
        supervisor=EngineSupervisor(SupervisorSettings(socket_path=str(tmp_path / "no-engine"))),
        store=FileVoiceStore(tmp_path / "voices"),
    )
    state.engine.client = lambda: FakeEngine()  # type: ignore[assignment,method-assign,return-value]
    state.engine.backend = BACKEND
    app = web.Application()
    app[STATE_KEY] = state
    app[voices_api.UPLOAD_WORKERS_KEY] = workers
    voices_api.add_routes(app, state)
    return app


Client = TestClient[web.Request, web.Application]
MakeClient = Callable[..., Awaitable[Client]]


@pytest.fixture
async def make_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[MakeClient]:
    """Clients of fresh apps; afterwards no spooled upload may be left behind."""
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spool_dir))
    clients: list[Client] = []

    async def make(workers: UploadWorkers, **settings: Any) -> Client:
        client: Client = TestClient(TestServer(make_app(tmp_path, workers, **settings)))
        await client.start_server()
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()
    assert list(spool_dir.iterdir()) == []


def auth(scopes: tuple[str, ...] = ("tts:stream", "voices:write")) -> dict[str, str]:
    token = mint_token(secret=SECRET, subject="t", tenant="acme", scopes=list(scopes))
    return {"Authorization": f"Bearer {token}"}


def form(audio: bytes = b"RIFF audio", **fields: str) -> aiohttp.FormData:
    data = aiohttp.FormData()
    data.add_field("audio", audio, filename="ref.wav", content_type="audio/wav")
    for key, value in fields.items():
        data.add_field(key, value)
    return data


def multipart(*parts: tuple[str, bytes], preamble: bytes = b"") -> tuple[bytes, dict[str, str]]:
    """A hand-made multipart/form-data body (boundary ``XX``) and its headers."""
    body = preamble
    for name, content in parts:
        body += (
            (b'--XX\r\nContent-Disposition: form-data; name="' + name.encode() + b'"\r\n\r\n')
            + content
            + b"\r\n"
        )
    body += b"--XX--\r\n"
    return body, {**auth(), "Content-Type": "multipart/form-data; boundary=XX"}


async def error_of(response: aiohttp.ClientResponse) -> tuple[int, str, dict[str, Any]]:
    body = await response.json()
    return response.status, body["error"]["code"], body["error"]


# --- registration -----------------------------------------------------------------------------


async def test_audio_goes_to_a_temporary_file_that_is_removed(make_client: MakeClient) -> None:
    workers = FakeWorkers()
    client = await make_client(workers)
    audio = bytes(range(256)) * 4000  # 1 MB: many 64 KiB chunks
    r = await client.post("/v1/voices", data=form(audio, name="Desk"), headers=auth())
    assert r.status == 201, await r.text()
    voice = await r.json()
    assert is_voice_id(voice["id"]) and voice["name"] == "Desk"
    assert workers.seen == [audio]
    assert not workers.paths[0].exists()
    assert workers.paths[0].name.startswith("voice-upload-")


async def test_the_transcript_reaches_the_engine_and_keys_the_features(
    make_client: MakeClient,
) -> None:
    client = await make_client(FakeWorkers())
    FakeEngine.transcripts.clear()
    for transcript in ("Hello, this is Ann.", "Hello, this is Ann.", "Something else."):
        r = await client.post(
            "/v1/voices", data=form(name="Ann", transcript=transcript), headers=auth()
        )
        assert r.status == 201, await r.text()
    # The same audio with the same transcript is extracted once; another transcript
    # (CosyVoice2 conditions on it) is another extraction.
    assert FakeEngine.transcripts == ["Hello, this is Ann.", "Something else."]


async def test_rejected_audio_keeps_its_code_and_leaves_no_file(make_client: MakeClient) -> None:
    workers = FakeWorkers()
    client = await make_client(workers)
    r = await client.post("/v1/voices", data=form(b"junk" * 100), headers=auth())
    assert (await error_of(r))[:2] == (400, "invalid_audio")
    assert not workers.paths[0].exists()


async def test_uploads_beyond_max_uploads_get_429_before_their_body_is_read(
    make_client: MakeClient,
) -> None:
    workers = FakeWorkers(hold=asyncio.Event())
    client = await make_client(workers, max_uploads=2, retry_after_ms=1500)
    busy = [
        asyncio.create_task(client.post("/v1/voices", data=form(), headers=auth()))
        for _ in range(2)
    ]
    for _ in busy:
        await asyncio.wait_for(workers.entered.get(), 5)
    never_sent = asyncio.Event()

    async def body_that_never_ends() -> AsyncIterator[bytes]:
        yield b"--XX\r\n"
        await never_sent.wait()

    r = await asyncio.wait_for(
        client.post(
            "/v1/voices",
            data=body_that_never_ends(),
            headers={**auth(), "Content-Type": "multipart/form-data; boundary=XX"},
        ),
        5,
    )
    status, code, error = await error_of(r)
    assert (status, code, error["retry_after_ms"]) == (429, "too_many_uploads", 1500)
    assert r.headers["Retry-After"] == "2"  # seconds, rounded up
    never_sent.set()
    assert workers.hold is not None
    workers.hold.set()
    assert [(await t).status for t in busy] == [201, 201]
    # The slots are free again.
    r = await client.post("/v1/voices", data=form(), headers=auth())
    assert r.status == 201


async def test_a_client_that_expects_100_continue_is_refused_before_sending_its_body(
    make_client: MakeClient,
) -> None:
    workers = FakeWorkers(hold=asyncio.Event())
    client = await make_client(workers, max_uploads=1)
    busy = asyncio.create_task(client.post("/v1/voices", data=form(), headers=auth()))
    await asyncio.wait_for(workers.entered.get(), 5)
    sent: list[bytes] = []
    body, headers = multipart(("audio", b"RIFF"))

    async def tracked() -> AsyncIterator[bytes]:
        sent.append(body)
        yield body

    r = await client.post("/v1/voices", data=tracked(), headers=headers, expect100=True)
    assert (await error_of(r))[:2] == (429, "too_many_uploads")
    assert sent == []  # the client was never invited to send it
    r = await client.post(
        "/v1/voices", data=tracked(), headers={**headers, **auth(("tts:stream",))}, expect100=True
    )
    assert r.status == 403 and sent == []
    assert workers.hold is not None
    workers.hold.set()
    assert (await busy).status == 201
    r = await client.post("/v1/voices", data=tracked(), headers=headers, expect100=True)
    assert r.status == 201 and sent == [body]


async def test_a_body_that_does_not_arrive_in_time_is_408(make_client: MakeClient) -> None:
    workers = FakeWorkers()
    client = await make_client(workers, upload_timeout_s=0.3)
    stop = asyncio.Event()

    async def slow_body() -> AsyncIterator[bytes]:
        yield b'--XX\r\nContent-Disposition: form-data; name="audio"\r\n\r\nRIFF'
        await stop.wait()

    r = await client.post(
        "/v1/voices",
        data=slow_body(),
        headers={**auth(), "Content-Type": "multipart/form-data; boundary=XX"},
    )
    stop.set()
    assert (await error_of(r))[:2] == (408, "upload_timeout")
    assert workers.seen == []
    # The slot was given back.
    assert (await client.post("/v1/voices", data=form(), headers=auth())).status == 201


# --- the size of the body -----------------------------------------------------------------------


async def test_a_declared_content_length_over_the_limit_is_413_at_once(
    make_client: MakeClient,
) -> None:
    client = await make_client(FakeWorkers())
    r = await client.post("/v1/voices", data=form(bytes(MAX_UPLOAD_BYTES + 1)), headers=auth())
    assert (await error_of(r))[:2] == (413, "audio_too_large")


async def chunked(body: bytes) -> AsyncIterator[bytes]:
    """``body`` without a Content-Length (chunked), as a client may send it."""
    for i in range(0, len(body), 1 << 20):
        yield body[i : i + (1 << 20)]


@pytest.mark.parametrize(
    "case",
    ["audio over the limit", "junk before the first boundary", "name over the limit"],
)
async def test_a_chunked_body_is_cut_off_past_the_limit(make_client: MakeClient, case: str) -> None:
    workers = FakeWorkers()
    client = await make_client(workers)
    if case == "audio over the limit":
        body, headers = multipart(("audio", bytes(MAX_UPLOAD_BYTES + 1)))
        expected = {"audio_too_large", "request_too_large"}
    elif case == "junk before the first boundary":
        line = b"x" * 1000 + b"\r\n"
        preamble = line * (MAX_UPLOAD_BYTES // len(line) + 100)
        body, headers = multipart(("audio", b"RIFF"), preamble=preamble)
        expected = {"request_too_large"}
    else:
        body, headers = multipart(("audio", b"RIFF"), ("name", b"n" * 10_000))
        expected = {"invalid_field"}
    r = await client.post("/v1/voices", data=chunked(body), headers=headers)
    status, code, _ = await error_of(r)
    assert status in (400, 413) and code in expected, (status, code)
    assert workers.seen == []


# --- malformed and unexpected parts -------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"--XX\r\ngarbage",
        b"garbage",
        b'--XX\r\nContent-Disposition: form-data; name="audio"\r\n\r\nRIFF',  # truncated
        b"",
    ],
)
async def test_malformed_multipart_is_400(make_client: MakeClient, body: bytes) -> None:
    workers = FakeWorkers()
    client = await make_client(workers)
    headers = {**auth(), "Content-Type": "multipart/form-data; boundary=XX"}
    r = await client.post("/v1/voices", data=body, headers=headers)
    assert (await error_of(r))[:2] == (400, "invalid_request")
    assert workers.seen == []


async def test_an_unknown_part_is_400_naming_it(make_client: MakeClient) -> None:
    workers = FakeWorkers()
    client = await make_client(workers)
    body, headers = multipart(("junk", b"j" * 100_000), ("audio", b"RIFF"))
    status, code, error = await error_of(
        await client.post("/v1/voices", data=body, headers=headers)
    )
    assert (status, code) == (400, "invalid_request")
    assert "'junk'" in error["message"]
    assert workers.seen == []


@pytest.mark.parametrize("name", ["audio", "name"])
async def test_a_second_part_of_the_same_name_is_400(make_client: MakeClient, name: str) -> None:
    workers = FakeWorkers()
    client = await make_client(workers)
    body, headers = multipart(("audio", b"RIFF"), ("name", b"Desk"), (name, b"again"))
    status, code, error = await error_of(
        await client.post("/v1/voices", data=body, headers=headers)
    )
    assert (status, code) == (400, "invalid_request")
    assert repr(name) in error["message"]
    assert workers.seen == []


async def test_no_audio_part_is_400(make_client: MakeClient) -> None:
    client = await make_client(FakeWorkers())
    body, headers = multipart(("name", b"Desk"))
    r = await client.post("/v1/voices", data=body, headers=headers)
    assert (await error_of(r))[:2] == (400, "invalid_request")


# --- voice ids ----------------------------------------------------------------------------------


def test_voice_id_shape() -> None:
    assert is_voice_id("vc_0123456789abcdef")
    for bad in ("vc_", LONG_ID, "vc_../../etc", "vc_ABCDEF", "vc_a\n", "en-us", "vc_a/b",
                "vc_test", "vc_0123456789abcdeg", "vc_0123456789abcdef0"):  # fmt: skip
        assert not is_voice_id(bad), bad


@pytest.mark.parametrize("method", ["GET", "DELETE"])
@pytest.mark.parametrize("voice_id", [LONG_ID, "vc_%2E%2E%2Fx", "vc_0123456789abcdef"])
async def test_an_ill_formed_or_unknown_voice_id_is_404(
    make_client: MakeClient, method: str, voice_id: str
) -> None:
    client = await make_client(FakeWorkers())
    r = await client.request(method, f"/v1/voices/{voice_id}", headers=auth())
    assert (await error_of(r))[:2] == (404, "unknown_voice")


# --- the real process pool ----------------------------------------------------------------------


def speech_wav() -> bytes:
    return encode(padded_speech(48000), 48000)


async def test_upload_workers_process_in_another_process_and_refuse_junk(tmp_path: Path) -> None:
    workers = UploadWorkers(1, max_tasks_per_child=2)
    good, junk = tmp_path / "good.wav", tmp_path / "junk.bin"
    good.write_bytes(speech_wav())
    junk.write_bytes(b"this is not audio" * 100)
    try:
        for _ in range(3):  # a worker is replaced after two uploads
            ref = await workers.process(good)
            assert ref.source_rate == 48000 and 3000 <= ref.duration_ms <= 8000
        with pytest.raises(ReferenceAudioError) as info:
            await workers.process(junk)
        assert info.value.code == "invalid_audio" and info.value.http_status == 400
    finally:
        await workers.close()
    with pytest.raises(UploadWorkerError):
        await workers.process(good)


async def test_upload_workers_survive_a_dead_worker(tmp_path: Path) -> None:
    """A worker killed mid-upload (what an OOM kill does): that upload gets
    UploadWorkerError, the next one a new pool."""
    import os
    import signal

    workers = UploadWorkers(1)
    good, slow = tmp_path / "good.wav", tmp_path / "slow.flac"
    good.write_bytes(speech_wav())
    tile = np.zeros((96000, 8), dtype=np.int16)  # 100 s of 96 kHz 8-channel silence
    with sf.SoundFile(slow, "w", samplerate=96000, channels=8, format="FLAC") as f:
        for _ in range(100):
            f.write(tile)
    try:
        await workers.process(good)  # the pool is up
        executor = workers._executor
        assert executor is not None
        running = asyncio.create_task(workers.process(slow))
        await asyncio.sleep(0.2)  # submitted; decoding takes longer than that
        for pid in list(executor._processes):
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(UploadWorkerError):
            await running
        assert (await workers.process(good)).duration_ms > 0
        assert workers._executor is not executor
    finally:
        await workers.close()


async def test_a_real_upload_end_to_end(make_client: MakeClient) -> None:
    workers = UploadWorkers(1)
    try:
        client = await make_client(workers)
        r = await client.post(
            "/v1/voices", data=form(speech_wav(), language="en-US"), headers=auth()
        )
        assert r.status == 201, await r.text()
        voice = await r.json()
        assert voice["base_voice"] == "en-us" and 3000 <= voice["duration_ms"] <= 8000
        # A stereo FLAC at 96 kHz, same speech: decoded, mixed and resampled in the worker.
        speech = padded_speech(96000)
        buf = io.BytesIO()
        sf.write(buf, np.stack([speech, speech], axis=1), 96000, format="FLAC")
        r = await client.post("/v1/voices", data=form(buf.getvalue()), headers=auth())
        assert r.status == 201, await r.text()
        r = await client.post("/v1/voices", data=form(b"not audio" * 10), headers=auth())
        assert (await error_of(r))[:2] == (400, "invalid_audio")
    finally:
        await workers.close()
