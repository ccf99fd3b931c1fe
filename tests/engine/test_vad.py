"""VAD: the detector's hysteresis, batching across streams, and the real Silero model on
speech, noise and DTMF."""

from __future__ import annotations

import numpy as np
import pytest

from engine.ipc.ring import SpscRing
from engine.ipc.schema import Message, SpeechStarted
from engine.vad import CONTEXT, WINDOW, SileroVad, SpeechDetector, VadWorker
from tests.integration import caller_audio


def ring(capacity: int = 1 << 16) -> SpscRing:
    return SpscRing.create(bytearray(SpscRing.region_size(capacity)), capacity)


# --- detector (sans-I/O) -----------------------------------------------------------------


def test_detector_needs_three_windows_of_speech():
    d = SpeechDetector()
    assert [d.feed(p) for p in (0.9, 0.9, 0.1, 0.9, 0.9)] == [None] * 5  # a click
    assert d.feed(0.9) == "start"  # third in a row
    assert d.feed(0.9) is None


def test_detector_ends_after_a_silence_run_with_hysteresis():
    d = SpeechDetector(min_speech_windows=1, min_silence_windows=3)
    assert d.feed(0.8) == "start"
    assert [d.feed(p) for p in (0.4, 0.4, 0.4)] == [None] * 3  # above threshold - 0.15
    assert [d.feed(p) for p in (0.2, 0.2)] == [None, None]
    assert d.feed(0.9) is None  # speech again resets the silence run
    assert [d.feed(0.1) for _ in range(3)] == [None, None, "end"]


# --- batching ---------------------------------------------------------------------------


class RecordingModel:
    """Speech when loud; state counts the windows each row has seen (checks scatter)."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    def step(self, windows: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.batches.append(len(windows))
        assert windows.shape[1] == CONTEXT + WINDOW
        rms = np.sqrt((windows[:, CONTEXT:] ** 2).mean(axis=1))
        return (rms > 0.05).astype(np.float32), state + 1.0


def test_one_model_step_serves_every_stream():
    model = RecordingModel()
    events: list[tuple[object, Message]] = []
    worker = VadWorker(lambda o, m: events.append((o, m)), slots=8, model_factory=lambda: model)
    rings = [ring() for _ in range(5)]
    for slot, r in enumerate(rings):
        worker.add(slot=slot, stream_id=slot + 100, owner=f"conn{slot}", ring=r, sample_rate=8000)
    loud = (np.sin(np.arange(WINDOW * 4) / 3) * 12000).astype("<i2").tobytes()
    quiet = bytes(WINDOW * 2 * 4)
    for slot, r in enumerate(rings):
        r.write(loud if slot % 2 == 0 else quiet)
    steps = worker.process_available()
    assert steps == 4 and model.batches == [5, 5, 5, 5]  # 4 windows each, all batched
    started = [(o, m) for o, m in events if isinstance(m, SpeechStarted)]
    assert sorted(str(o) for o, _ in started) == ["conn0", "conn2", "conn4"]
    assert all(m.audio_ms == 96 for _, m in started)
    # Each stream's recurrent state went back to its own slot, and only there.
    state = worker._state
    assert np.all(state[:, :5, :] == 4.0) and np.all(state[:, 5:, :] == 0.0)


def test_streams_with_less_than_a_window_wait_and_resampled_input_is_accepted():
    model = RecordingModel()
    worker = VadWorker(lambda o, m: None, slots=4, model_factory=lambda: model)
    r8, r16 = ring(), ring()
    worker.add(slot=0, stream_id=1, owner=None, ring=r8, sample_rate=8000)
    worker.add(slot=1, stream_id=2, owner=None, ring=r16, sample_rate=16000)
    r8.write(bytes(2 * (WINDOW - 1)))
    r16.write(bytes(2 * 2 * WINDOW * 8))  # 8 windows at 8 kHz, less the resampler delay
    steps = worker.process_available()
    assert steps >= 5 and set(model.batches) == {1}  # only the 16 kHz stream had windows
    assert r8.readable_bytes() == 0  # read, waiting for one more sample


def test_removed_stream_is_released_and_no_longer_read():
    released: list[int] = []
    worker = VadWorker(
        lambda o, m: None, slots=2, model_factory=RecordingModel, on_released=released.append
    )
    r = ring()
    worker.add(slot=1, stream_id=1, owner=None, ring=r, sample_rate=8000)
    worker.process_available()
    worker.remove(1)
    assert released == [1]
    r.write(bytes(2 * WINDOW))
    worker.process_available()
    assert r.readable_bytes() == 2 * WINDOW


# --- the real Silero model ------------------------------------------------------------


@pytest.fixture(scope="module")
def silero() -> SileroVad:
    return SileroVad()


def detect(model: SileroVad, pcm: np.ndarray) -> list[Message]:
    """Feed ``pcm`` (8 kHz) in 20 ms frames, as it arrives on a call."""
    events: list[Message] = []
    worker = VadWorker(lambda _o, m: events.append(m), slots=2, model_factory=lambda: model)
    r = ring()
    worker.add(slot=0, stream_id=1, owner=None, ring=r, sample_rate=8000)
    for frame in caller_audio.frames(pcm):
        assert r.write(frame.tobytes()) == len(frame) * 2
        worker.process_available()
    return events


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    return caller_audio.espeak_speech()


def test_silero_detects_speech_onset_within_200_ms(silero, speech):
    events = detect(silero, np.concatenate([caller_audio.silence(1.0), speech]))
    assert isinstance(events[0], SpeechStarted)
    assert 1000 <= events[0].audio_ms <= 1200  # speech begins at 1000 ms


@pytest.mark.parametrize("rms", [300.0, 1000.0, 3000.0])
def test_white_noise_is_not_speech(silero, rms):
    assert detect(silero, caller_audio.white_noise(4.0, rms)) == []


def test_dtmf_tones_are_not_speech(silero):
    tones = np.concatenate([caller_audio.dtmf("1234567890*#"), caller_audio.dtmf("5", tone_s=1.0)])
    assert detect(silero, tones) == []
