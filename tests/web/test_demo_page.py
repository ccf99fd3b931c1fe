"""The demo page (web-demo/) in headless Chromium against a real gateway and engine.

Chromium is Debian's (``/usr/bin/chromium``), driven by Playwright with its executable
path: Playwright cannot download its own browsers here. The page exposes live counters
on ``window.__demo`` (see web-demo/app.js); the tests read them, press the page's
buttons and keys like a person would, and save screenshots to ``artifacts/``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import io
import json
import math
import re
import struct
import threading
import time
import urllib.error
import urllib.request
import uuid
import wave
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.integration.harness import GatewayProcess, NativeClient

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"

if not CHROMIUM.exists():
    pytest.skip(
        "Debian's chromium is not installed (/usr/bin/chromium): apt-get install chromium",
        allow_module_level=True,
    )
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="the playwright package is not installed (.[test] extra)"
)

if TYPE_CHECKING:
    from playwright.sync_api import Browser, ConsoleMessage, Page  # type: ignore[import-not-found, unused-ignore]

LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",
    # A fake microphone (a beep) that needs no permission prompt, for MediaRecorder.
    "--use-fake-device-for-media-stream",
    "--use-fake-ui-for-media-stream",
]
OPUS_FRAME_SAMPLES = 960  # 20 ms at 48 kHz: the AudioContext's rate
EN_PROMPT = "Thank you for calling. Please hold."
ZH_PROMPT = "请输入您的十六位银行卡号，并以井号键结束。"
LONG_PROMPT = (
    "Thank you for calling Acme Bank. For account balances, press 1. To report a lost "
    "or stolen card, press 2. To speak with an agent, press 0. To hear these options "
    "again, press the star key."
)


# ---- fixtures ----------------------------------------------------------------------------------


@dataclass
class Gateways:
    main: GatewayProcess
    one_slot: GatewayProcess  # ENGINE_SLOTS=1: a second session gets `overloaded`
    one_slot_started: concurrent.futures.Future[None]


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateways]:
    """The module's real gateways, each with its real espeak engine; registered voices go
    to temporary directories. The one-slot gateway starts in the background, while the
    first tests run."""
    tmp = tmp_path_factory.mktemp("gateway")
    main = GatewayProcess(tmp / "gateway.log", GATEWAY_VOICE_DIR=str(tmp / "voices"))
    one_slot = GatewayProcess(
        tmp / "gateway-1-slot.log", ENGINE_SLOTS="1", GATEWAY_VOICE_DIR=str(tmp / "voices-1")
    )
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        try:
            main.start()
            yield Gateways(main, one_slot, pool.submit(one_slot.start))
        finally:
            main.stop()
            pool.shutdown(wait=True)
            one_slot.stop()


@pytest.fixture(scope="module")
def gateway(gateways: Gateways) -> GatewayProcess:
    return gateways.main


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_api.sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def token(gateway: GatewayProcess) -> str:
    return gateway.token(scopes=["tts:stream", "voices:write"])


@dataclass
class DemoPage:
    """A browser tab on the demo page, with what it logged."""

    page: Page
    base: str
    console_errors: list[str] = field(default_factory=list)
    foreign_requests: list[str] = field(default_factory=list)

    def open(self, token: str | None) -> None:
        self.page.goto(self.base + "/" + (f"#token={token}" if token is not None else ""))
        self.wait("window.__demo && window.__demo.state !== 'starting'")

    def demo(self) -> dict[str, Any]:
        # Spread: the player's counters are getters.
        result: dict[str, Any] = self.page.evaluate("({...window.__demo})")
        return result

    def wait(self, expression: str, timeout: float = 10.0) -> None:
        """Poll a JavaScript expression (the page's CSP rules out wait_for_function's eval)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.page.evaluate(expression):
                return
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {expression}; __demo = {self.demo()}")

    def text(self, selector: str) -> str:
        return str(self.page.locator(selector).inner_text())

    def assert_clean(self, allowed: str | None = None) -> None:
        """No console errors or page errors (but the browser's notes about `allowed`)."""
        errors = [e for e in self.console_errors if not (allowed and re.search(allowed, e))]
        assert errors == [], errors
        assert self.foreign_requests == [], "the page must not load anything from elsewhere"


@contextlib.contextmanager
def open_context(
    browser: Browser, gateway: GatewayProcess, init_script: str | None = None, **options: Any
) -> Iterator[DemoPage]:
    """A fresh browser context (own storage) with one tab that records console errors."""
    options.setdefault("viewport", {"width": 1366, "height": 900})
    context = browser.new_context(**options)
    if init_script:
        context.add_init_script(init_script)
    page = context.new_page()
    dp = DemoPage(page, gateway.base)

    def on_console(msg: ConsoleMessage) -> None:
        if msg.type == "error":
            dp.console_errors.append(msg.text)

    def on_request(request: Any) -> None:
        url = str(request.url)
        if not url.startswith((gateway.base, gateway.ws_url, "data:", "blob:")):
            dp.foreign_requests.append(url)

    page.on("console", on_console)
    page.on("pageerror", lambda exc: dp.console_errors.append(f"page error: {exc}"))
    page.on("request", on_request)
    try:
        yield dp
    finally:
        context.close()


@pytest.fixture
def demo_page(browser: Browser, gateway: GatewayProcess) -> Iterator[DemoPage]:
    with open_context(browser, gateway) as dp:
        yield dp


def screenshot(page: Page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=True)
    # A PNG (signature, IHDR) as wide as the page in device pixels, with something on it.
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width = struct.unpack(">I", data[16:20])[0]
    assert width == round(page.evaluate("innerWidth * devicePixelRatio"))
    assert len(data) > 30_000
    return path


# ---- speaking ------------------------------------------------------------------------------------


def test_speaks_english_and_chinese_with_opus(demo_page: DemoPage, token: str) -> None:
    dp = demo_page
    dp.open(token)
    dp.wait("window.__demo.voices.length > 0")
    demo = dp.demo()
    assert {"en-us", "zh", "yue"} <= set(demo["voices"])
    assert demo["opus"] is True, "Chromium decodes Opus with WebCodecs on a localhost page"
    assert dp.page.locator("#format").input_value() == "opus_48000"
    assert dp.page.locator("#voice").input_value() == "en-us"
    assert dp.text("#status") == "Ready"

    # English, with the Speak button.
    dp.page.fill("#text", EN_PROMPT)
    dp.page.click("#speak")
    dp.wait("window.__demo.utterancesDone >= 1 && window.__demo.lastFirstAudioMs !== null")
    dp.wait("window.__demo.packetsDecoded === window.__demo.packetsReceived")
    demo = dp.demo()
    assert demo["output"] == "worklet" and demo["audioContext"] == "running"
    assert demo["packetsReceived"] >= 50  # about 2 s of 20 ms packets
    assert demo["samplesScheduled"] >= demo["packetsDecoded"] * OPUS_FRAME_SAMPLES * 0.95
    assert 0 <= demo["lastFirstAudioMs"] < 5000
    assert demo["lastServerFirstAudioMs"] is not None
    # Real audio reached the output: the analyser saw speech, the worklet played it.
    dp.wait("window.__demo.maxLevel > 0.05 && window.__demo.samplesPlayed > 24000")
    assert re.fullmatch(r"\d+ ms", dp.text("#latency"))
    assert "gateway" in dp.text("#latency-server")
    assert "WebCodecs Opus → AudioWorklet" in dp.text("#stat-path")
    log = dp.text("#log")
    for event in ("ready", "utterance_started", "utterance_done", "mark"):
        assert event in log
    assert dp.page.locator("#utt-u1 .badge").inner_text().lower() == "done"

    # Chinese: the example picks a Mandarin voice; Ctrl+Enter speaks (a new session).
    before = dp.demo()
    dp.page.get_by_role("button", name="输入卡号").click()
    assert dp.page.locator("#text").input_value() == ZH_PROMPT
    assert dp.page.locator("#voice").input_value() == "zh"
    dp.page.keyboard.press("Control+Enter")
    dp.wait("window.__demo.utterancesStarted >= 2 && window.__demo.queuedMs > 300")
    time.sleep(0.6)  # let the waveform fill in before the screenshot
    screenshot(dp.page, "demo-page.png")
    dp.wait("window.__demo.utterancesDone >= 2")
    dp.wait("window.__demo.packetsDecoded === window.__demo.packetsReceived")
    demo = dp.demo()
    assert demo["sessionsOpened"] == 2
    assert demo["packetsDecoded"] - before["packetsDecoded"] >= 100  # about 3 s
    assert demo["samplesScheduled"] > before["samplesScheduled"]
    assert demo["lastFirstAudioMs"] is not None and demo["errorsShown"] == 0
    assert dp.page.locator("#utt-u2 .badge").inner_text().lower() == "done"
    dp.assert_clean()


# What a page on plain http from another host gets: no WebCodecs, no AudioWorklet.
INSECURE_CONTEXT = """
delete window.AudioDecoder;
delete window.EncodedAudioChunk;
delete window.AudioWorkletNode;
"""


@pytest.mark.realtime  # cleared within 2 s: runs alone (Makefile)
def test_pcm_path_without_webcodecs_or_worklet(
    browser: Browser, gateway: GatewayProcess, token: str
) -> None:
    with open_context(browser, gateway, init_script=INSECURE_CONTEXT) as dp:
        dp.open(token)
        dp.wait("window.__demo.voices.length > 0")
        assert dp.demo()["opus"] is False
        assert dp.page.locator("#format").input_value() == "pcm_48000"
        assert dp.page.locator("#format option[value=opus_48000]").is_disabled()
        assert "WebCodecs" in dp.text("#format-note")
        dp.page.fill("#text", LONG_PROMPT)
        dp.page.click("#speak")
        dp.wait("window.__demo.queuedMs > 800")
        demo = dp.demo()
        assert demo["output"] == "buffer-source" and demo["packetsReceived"] >= 50
        assert demo["samplesScheduled"] == demo["packetsDecoded"] * OPUS_FRAME_SAMPLES
        # The stats panel is redrawn at most every 100 ms, on an animation frame.
        dp.wait("!document.getElementById('stat-path').textContent.includes('not started')")
        assert "PCM → AudioBufferSource" in dp.text("#stat-path")
        dp.wait("window.__demo.maxLevel > 0.05")
        dp.page.click("#clear")
        dp.wait("window.__demo.queuedMs === 0 && window.__demo.clearedAcks === 1", timeout=2)
        dp.assert_clean()


@pytest.mark.parametrize("fmt", ["pcm_16000", "mulaw_8000"])
def test_telephony_formats_are_resampled_for_playback(
    demo_page: DemoPage, token: str, fmt: str
) -> None:
    dp = demo_page
    dp.open(token)
    dp.wait("window.__demo.voices.length > 0")
    dp.page.select_option("#format", fmt)
    dp.page.fill("#text", EN_PROMPT)
    dp.page.click("#speak")
    dp.wait("window.__demo.utterancesDone >= 1")
    dp.wait("window.__demo.packetsDecoded === window.__demo.packetsReceived")
    demo = dp.demo()
    assert demo["format"] == fmt and demo["packetsReceived"] >= 50
    # Every 20 ms frame becomes 960 samples at 48 kHz (the interpolator starts 5 short).
    expected = demo["packetsReceived"] * OPUS_FRAME_SAMPLES
    assert expected - 6 <= demo["samplesScheduled"] <= expected
    dp.wait("window.__demo.maxLevel > 0.05")
    dp.assert_clean()


@pytest.mark.realtime  # flushed within 1 s: runs alone (Makefile)
def test_clear_stops_playback(demo_page: DemoPage, token: str) -> None:
    dp = demo_page
    dp.open(token)
    dp.wait("window.__demo.voices.length > 0")
    dp.page.fill("#text", LONG_PROMPT)
    dp.page.click("#speak")
    dp.wait("window.__demo.queuedMs > 800")  # the gateway sends up to 2 s ahead (burst)
    assert dp.demo()["state"] == "speaking"
    dp.page.keyboard.press("Escape")  # same as the Clear button
    # The worklet's queue is flushed at once and the gateway confirms with `cleared`.
    dp.wait("window.__demo.queuedMs === 0 && window.__demo.state === 'idle'", timeout=1.0)
    dp.wait("window.__demo.clearedAcks === 1")
    scheduled = dp.demo()["samplesScheduled"]
    time.sleep(0.5)
    demo = dp.demo()
    assert demo["samplesScheduled"] == scheduled, "nothing is scheduled after a clear"
    assert demo["queuedMs"] == 0 and demo["clears"] == 1
    assert dp.page.locator("#utt-u1 .badge").inner_text().lower() == "cleared"
    assert "dropped by clear" in dp.text("#log")  # the mark after the utterance
    # The session is still usable.
    dp.page.fill("#text", EN_PROMPT)
    dp.page.click("#clear")  # nothing playing: harmless
    dp.page.click("#speak")
    dp.wait("document.querySelector('#utt-u2 .badge').textContent === 'done'")
    assert dp.demo()["sessionsOpened"] == 1  # the same session, after the clear
    dp.assert_clean()


# ---- errors --------------------------------------------------------------------------------------

BROWSER_HTTP_NOTE = r"Failed to load resource: the server responded with a status of 40[1345]"


def test_bad_token_shows_an_error(demo_page: DemoPage, gateway: GatewayProcess) -> None:
    dp = demo_page
    dp.open("not-a-jwt")
    dp.wait("window.__demo.errorsShown >= 1")
    assert dp.page.locator("#alert").is_visible()
    assert "access token" in dp.text("#alert").lower()
    assert dp.demo()["state"] == "error"
    # Speaking anyway: the socket opens, the gateway sends an error and closes (1008).
    shown = dp.demo()["errorsShown"]
    dp.page.click("#speak")
    dp.wait(f"window.__demo.errorsShown > {shown}")
    demo = dp.demo()
    assert demo["lastErrorCode"] == "token_malformed" and demo["packetsReceived"] == 0
    assert "not valid" in dp.text("#alert-title")
    screenshot(dp.page, "demo-page-error.png")

    # An expired token says so in plain words.
    dp.page.goto("about:blank")
    dp.open(gateway.token(ttl_s=-60))
    dp.wait("window.__demo.errorsShown >= 1")
    assert "expired" in dp.text("#alert").lower()
    assert dp.demo()["lastErrorCode"] == "token_expired"
    dp.assert_clean(allowed=BROWSER_HTTP_NOTE)


def test_unknown_voice_is_explained(demo_page: DemoPage, token: str) -> None:
    dp = demo_page
    dp.open(token)
    dp.wait("window.__demo.voices.length > 0")
    # A voice that went away after the list was loaded.
    dp.page.evaluate(
        "document.getElementById('voice').append(new Option('Gone (gone)', 'no-such-voice'))"
    )
    dp.page.select_option("#voice", "no-such-voice")
    dp.page.click("#speak")
    dp.wait("window.__demo.lastErrorCode === 'unknown_voice'")
    assert dp.text("#alert-title") == "Unknown voice"
    assert dp.demo()["state"] == "error"
    # The list was reloaded: the stale entry is gone, and speaking works again.
    dp.wait("!document.querySelector('#voice option[value=no-such-voice]')")
    dp.page.select_option("#voice", "en-gb")
    dp.page.fill("#text", EN_PROMPT)
    dp.page.click("#speak")
    dp.wait("window.__demo.utterancesDone >= 1")
    assert dp.page.locator("#alert").is_hidden()
    dp.assert_clean()


def test_overloaded_gateway_is_explained(browser: Browser, gateways: Gateways, token: str) -> None:
    """With one engine slot, a second tab is told the gateway is busy (1013)."""
    gateways.one_slot_started.result(timeout=60)
    small = gateways.one_slot
    with open_context(browser, small) as first, open_context(browser, small) as second:
        first.open(token)
        first.wait("window.__demo.voices.length > 0")
        first.page.click("#speak")  # its session keeps the only slot
        first.wait("window.__demo.sessionsOpened === 1")
        second.open(token)
        second.wait("window.__demo.voices.length > 0")
        second.page.click("#speak")
        second.wait("window.__demo.errorsShown >= 1")
        assert second.demo()["lastErrorCode"] == "overloaded"
        assert second.text("#alert-title") == "The gateway is busy"
        assert second.demo()["state"] == "error"
        first.assert_clean()
        second.assert_clean()


def test_without_token_the_page_says_how_to_sign_in(demo_page: DemoPage) -> None:
    dp = demo_page
    dp.open(None)
    dp.wait("window.__demo.errorsShown >= 1")
    assert dp.demo()["state"] == "signed-out"
    assert "make run" in dp.text("#alert")
    assert dp.text("#status") == "Not signed in"
    dp.assert_clean()


def test_phone_layout(browser: Browser, gateway: GatewayProcess, token: str) -> None:
    phone = {"width": 390, "height": 844}
    with open_context(
        browser, gateway, viewport=phone, device_scale_factor=2, is_mobile=True, has_touch=True
    ) as dp:
        dp.open(token)
        dp.wait("window.__demo.voices.length > 0")
        dp.page.fill("#text", EN_PROMPT)
        dp.page.click("#speak")
        dp.wait("window.__demo.utterancesDone >= 1")
        # Nothing wider than the screen.
        assert dp.page.evaluate("document.documentElement.scrollWidth") <= phone["width"]
        screenshot(dp.page, "demo-page-phone.png")
        dp.assert_clean()


# ---- voices: recording, registration -------------------------------------------------------------


def registry_status(gateway: GatewayProcess, token: str) -> int:
    """The status of an empty `POST /v1/voices`: 404/405 when the registry does not exist."""
    request = urllib.request.Request(
        gateway.base + "/v1/voices",
        data=b"",
        method="POST",
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "multipart/form-data; boundary=x",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def tone_wav(seconds: float, rate: int = 24000) -> bytes:
    """A 16-bit mono WAV of a voiced-like buzz (harmonics of 140 Hz with a slow envelope)."""
    frames = bytearray()
    for i in range(int(seconds * rate)):
        t = i / rate
        env = 0.5 + 0.5 * math.sin(2 * math.pi * 3 * t)
        s = sum(math.sin(2 * math.pi * 140 * k * t) / k for k in range(1, 6)) * 0.2 * env
        frames += struct.pack("<h", int(max(-1.0, min(1.0, s)) * 32767))
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(bytes(frames))
    return out.getvalue()


def speech_wav(gateway: GatewayProcess, text: str) -> bytes:
    """Real speech from the gateway itself (pcm_24000), as WAV.

    Run on its own thread: Playwright's sync API owns this thread's event loop.
    """

    async def synthesize() -> bytes:
        client = await NativeClient.connect(gateway.ws_url, gateway.token())
        try:
            await client.start("en-us", "pcm_24000", pacing="burst")
            await client.send(type="speak", text=text)
            await client.send(type="close")
            await client.wait_closed(20)
            return b"".join(frame for _, frame in client.got.frames)
        finally:
            await client.aclose()

    result: list[bytes] = []
    thread = threading.Thread(target=lambda: result.append(asyncio.run(synthesize())))
    thread.start()
    thread.join(30)
    assert result, "the gateway did not synthesize the voice sample"
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(24000)
        w.writeframes(result[0])
    return out.getvalue()


@pytest.mark.realtime  # a 3.5 s recording between two clicks: runs alone
def test_microphone_recording(demo_page: DemoPage, gateway: GatewayProcess, token: str) -> None:
    """Record 3.5 s from Chromium's fake microphone (MediaRecorder); without a registry on
    the gateway, registering says so in plain words."""
    dp = demo_page
    dp.open(token)
    dp.wait("window.__demo.voices.length > 0")
    dp.page.click("#record")
    dp.wait("document.getElementById('record').getAttribute('aria-pressed') === 'true'")
    time.sleep(3.5)
    dp.page.click("#record")  # stop
    dp.wait("!document.getElementById('register').disabled")
    assert "Sample ready: 3." in dp.text("#voice-status")
    assert dp.page.locator("#voice-preview").is_visible()
    # A recording of the suggested sentence: that sentence is its transcript.
    script = dp.text("#voice-script")
    assert dp.page.locator("#voice-transcript").input_value() == script
    status = registry_status(gateway, token)
    if status in (404, 405):
        dp.page.fill("#voice-name", "Agent Lee")
        dp.page.click("#register")
        dp.wait("window.__demo.registry === 'unavailable'")
        message = dp.text("#voice-status")
        assert "no voice registry" in message and f"answered {status}" in message
    dp.assert_clean(allowed=BROWSER_HTTP_NOTE)


def test_registration_ui_follows_the_registry_contract(
    demo_page: DemoPage, token: str, tmp_path: Path
) -> None:
    """The page's side of `POST /v1/voices`, against a stand-in for the registry.

    The stand-in answers as the contract says (201, {id, name, language, duration_ms,
    kind: "cloned"}); the real registry is tested below, when the gateway has one.
    """
    uploads: list[bytes] = []

    def registry(route: Any) -> None:
        request = route.request
        if request.method != "POST":
            route.fallback()
            return
        uploads.append(request.post_data_buffer or b"")
        assert request.headers["authorization"] == f"Bearer {token}"
        body = {
            "id": "cloned-test-1",
            "name": "Agent Lee",
            "language": "zh-CN",
            "duration_ms": 4000,
            "kind": "cloned",
        }
        route.fulfill(status=201, content_type="application/json", body=json.dumps(body))

    sample = tmp_path / "agent.wav"
    sample.write_bytes(tone_wav(4.0))
    dp = demo_page
    dp.page.route("**/v1/voices", registry)
    dp.open(token)
    dp.wait("window.__demo.voices.length > 0")
    dp.page.set_input_files("#voice-file", str(sample))
    dp.wait("!document.getElementById('register').disabled")
    assert "4.0 s" in dp.text("#voice-status")
    dp.page.fill("#voice-name", "Agent Lee")
    dp.page.fill("#voice-transcript", "Hello from agent Lee")
    dp.page.select_option("#voice-language", "zh-CN")
    dp.page.click("#register")
    dp.wait("window.__demo.voicesRegistered === 1")
    # The upload: multipart with the WAV in `audio`, and `name` and `language`.
    body = uploads[0]
    assert b'name="audio"; filename="agent.wav"' in body and b"RIFF" in body and b"WAVE" in body
    assert b'name="name"\r\n\r\nAgent Lee' in body
    assert b'name="language"\r\n\r\nzh-CN' in body
    assert b'name="transcript"\r\n\r\nHello from agent Lee' in body
    # It is in the picker, under "Your voices", and selected.
    dp.wait("document.getElementById('voice').value === 'cloned-test-1'")
    group = dp.page.locator("#voice option[value=cloned-test-1]").locator("xpath=..")
    assert group.get_attribute("label") == "Your voices"
    assert "registered" in dp.text("#voice-status")
    assert dp.page.locator("#register").is_disabled()
    dp.assert_clean()

    # Too short a sample is refused before anything is sent.
    short = tmp_path / "short.wav"
    short.write_bytes(tone_wav(1.5))
    dp.page.set_input_files("#voice-file", str(short))
    dp.wait("document.getElementById('voice-status').textContent.includes('at least 3')")
    assert dp.page.locator("#register").is_disabled()
    assert len(uploads) == 1


def test_registered_voice_appears_in_the_picker(
    demo_page: DemoPage, gateway: GatewayProcess, token: str, tmp_path: Path
) -> None:
    status = registry_status(gateway, token)
    if status in (404, 405):
        pytest.skip(f"POST /v1/voices is not available on this gateway (it answered {status})")
    said = "Hello, this is my voice. I am recording a short sample for the demo."
    sample = tmp_path / "my-voice.wav"
    sample.write_bytes(speech_wav(gateway, said))
    dp = demo_page
    dp.open(token)
    dp.wait("window.__demo.voices.length > 0")
    name = f"Test voice {uuid.uuid4().hex[:6]}"
    dp.page.set_input_files("#voice-file", str(sample))
    dp.wait("!document.getElementById('register').disabled")
    dp.page.fill("#voice-name", name)
    dp.page.fill("#voice-transcript", said)
    dp.page.click("#register")
    dp.wait(
        "window.__demo.voicesRegistered === 1 || "
        "['error', 'warn'].includes(document.getElementById('voice-status').dataset.kind)",
        timeout=30,
    )
    assert dp.demo()["voicesRegistered"] == 1, dp.text("#voice-status")
    voice_id = dp.page.locator("#voice").input_value()
    assert dp.page.locator("#voice option:checked").inner_text().startswith(name)
    assert voice_id in dp.demo()["voices"]
    # And it speaks.
    dp.page.fill("#text", EN_PROMPT)
    dp.page.click("#speak")
    dp.wait("window.__demo.utterancesDone >= 1", timeout=30)
    assert dp.demo()["packetsDecoded"] > 0
    dp.assert_clean()


def test_static_files_are_served_without_external_references(gateway: GatewayProcess) -> None:
    """No CDN at run time: every script and stylesheet is the gateway's own."""
    with urllib.request.urlopen(gateway.base + "/", timeout=5) as response:
        html = response.read().decode()
    assert response.headers.get("Cache-Control") == "no-cache"
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)
    web_demo = ROOT / "web-demo"
    for path in sorted(web_demo.glob("*.js")):
        source = path.read_text()
        assert not re.search(r"""import[^;]*from\s+["'](https?:)?//""", source), path.name
        with urllib.request.urlopen(f"{gateway.base}/static/{path.name}", timeout=5) as r:
            assert r.status == 200 and "javascript" in r.headers["Content-Type"]
