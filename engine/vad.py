"""Voice activity detection on caller audio, batched across every duplex stream.

One :class:`VadWorker` thread per engine. Every 32 ms it reads each duplex stream's
inbound ring (caller audio the gateway wrote), resamples it to 8 kHz when needed, cuts it
into 256-sample windows and runs the Silero VAD model (shipped in the ``silero-vad``
package, run with ONNX Runtime) **once for all streams**: the windows are stacked into one batch
and each stream's recurrent state is gathered from and scattered back to one state
tensor indexed by slot. Each stream's probabilities go through a :class:`SpeechDetector`
(hysteresis plus a minimum speech duration, against clicks and noise), whose onsets and
ends re-arm the detector; starts become ``SpeechStarted`` events for the gateway.

The model is loaded lazily, in the worker thread, the first time a duplex stream opens.
"""

from __future__ import annotations

import enum
import importlib.util
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

from engine.ipc.heap import freeze_startup_heap
from engine.ipc.ring import SpscRing
from engine.ipc.schema import Message, SpeechStarted
from telephony.codecs.resample import StreamingResampler

log = logging.getLogger(__name__)

VAD_RATE = 8000
WINDOW = 256  # samples at 8 kHz: 32 ms (the 8 kHz Silero model's only window size)
WINDOW_S = WINDOW / VAD_RATE
CONTEXT = 32  # samples of the previous window the 8 kHz model sees
STATE_SIZE = 128
MAX_BACKLOG_WINDOWS = 16  # a stream further behind than this skips ahead (overload)

FloatArray = npt.NDArray[np.float32]


class VadModel(Protocol):
    """One batched step: windows (B, CONTEXT+WINDOW) float32 and state (2, B, 128)."""

    def step(self, windows: FloatArray, state: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Returns (speech probabilities (B,), new state (2, B, 128))."""
        ...


def silero_onnx_path() -> Path:
    """The ONNX model the ``silero-vad`` package ships, found without importing the
    package (its ``__init__`` imports torch: a second of every engine start)."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("silero-vad is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "silero_vad.onnx"
    if not path.is_file():
        raise FileNotFoundError(f"no Silero VAD model at {path}")
    return path


class SileroVad:
    """The Silero VAD network from the ``silero-vad`` package (its ONNX export, the 8 kHz
    branch), driven statelessly on one ONNX Runtime thread.

    The package's wrapper keeps one hidden state per batch position and resets it when
    the batch size changes; streams come and go, so the recurrent state is kept outside
    (per slot) and passed in on every call. The ONNX graph gives the TorchScript model's
    probabilities to 1e-6, loads in tens of milliseconds without importing torch (which
    took about 2 s of every engine start) and runs a step about 15 times faster.
    """

    def __init__(self) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(
            str(silero_onnx_path()), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._rate = np.array(8000, dtype=np.int64)
        freeze_startup_heap("loading the VAD model")

    def step(self, windows: FloatArray, state: FloatArray) -> tuple[FloatArray, FloatArray]:
        probabilities, new_state = self._session.run(
            None, {"input": windows, "state": state, "sr": self._rate}
        )
        return np.asarray(probabilities[:, 0], dtype=np.float32), np.asarray(
            new_state, dtype=np.float32
        )


class SpeechState(enum.Enum):
    SILENCE = "silence"
    MAYBE_SPEECH = "maybe_speech"
    SPEECH = "speech"


@dataclass
class SpeechDetector:
    """Hysteresis over per-window probabilities (sans-I/O).

    Speech starts after ``min_speech_windows`` consecutive windows at or above
    ``threshold`` (default 3 windows: 96 ms, which rejects clicks), and ends after
    ``min_silence_windows`` consecutive windows below ``threshold - 0.15``.
    ``feed`` returns "start", "end" or None.
    """

    threshold: float = 0.5
    min_speech_windows: int = 3
    min_silence_windows: int = 10
    state: SpeechState = SpeechState.SILENCE
    _run: int = 0

    def feed(self, probability: float) -> str | None:
        if self.state is SpeechState.SPEECH:
            if probability < self.threshold - 0.15:
                self._run += 1
                if self._run >= self.min_silence_windows:
                    self.state, self._run = SpeechState.SILENCE, 0
                    return "end"
            else:
                self._run = 0
            return None
        if probability >= self.threshold:
            self._run += 1
            if self._run >= self.min_speech_windows:
                self.state, self._run = SpeechState.SPEECH, 0
                return "start"
            self.state = SpeechState.MAYBE_SPEECH
        else:
            self.state, self._run = SpeechState.SILENCE, 0
        return None


@dataclass
class _DuplexStream:
    slot: int
    stream_id: int
    owner: object
    ring: SpscRing
    resampler: StreamingResampler | None
    detector: SpeechDetector = field(default_factory=SpeechDetector)
    samples: FloatArray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    context: FloatArray = field(default_factory=lambda: np.zeros(CONTEXT, dtype=np.float32))
    audio_windows: int = 0  # windows analysed so far (caller-audio clock)


EventSink = Callable[[object, Message], None]


@dataclass
class VadStats:
    streams: int = 0
    steps: int = 0
    windows: int = 0
    step_seconds: float = 0.0
    dropped_windows: int = 0


class VadWorker:
    """The batched VAD thread; see the module docstring.

    ``add``/``remove`` are called from the event-loop thread; they only queue changes.
    """

    def __init__(
        self,
        on_event: EventSink,
        *,
        slots: int,
        on_released: Callable[[int], None] = lambda _slot: None,
        model_factory: Callable[[], VadModel] = SileroVad,
        period_s: float = WINDOW_S,
    ) -> None:
        self._on_event = on_event
        self._on_released = on_released
        self._model_factory = model_factory
        self._model: VadModel | None = None
        self._period_s = period_s
        self._state = np.zeros((2, slots, STATE_SIZE), dtype=np.float32)
        self._streams: dict[int, _DuplexStream] = {}
        self._changes: list[tuple[str, _DuplexStream | int]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.stats = VadStats()
        self.load_error: str | None = None

    def add(
        self, *, slot: int, stream_id: int, owner: object, ring: SpscRing, sample_rate: int
    ) -> None:
        resampler = None if sample_rate == VAD_RATE else StreamingResampler(sample_rate, VAD_RATE)
        stream = _DuplexStream(slot, stream_id, owner, ring, resampler)
        with self._lock:
            self._changes.append(("add", stream))
        self._wake.set()

    @property
    def ready(self) -> bool:
        """The model is loaded: caller audio is being analysed."""
        return self._model is not None

    def load(self) -> None:
        """Load the model now (blocking; tens of milliseconds). Without this
        the worker thread loads it when it starts. A failure is kept in
        :attr:`load_error`: duplex streams then work without VAD."""
        if self._model is None and self.load_error is None:
            try:
                self._model = self._model_factory()
            except Exception as exc:  # onnxruntime or the model missing
                self.load_error = repr(exc)
                log.error("VAD model could not be loaded: %r", exc)

    def start(self) -> None:
        """Start the worker thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="engine-vad", daemon=True)
            self._thread.start()

    def remove(self, slot: int) -> None:
        """Stop reading ``slot``; ``on_released(slot)`` is called (worker thread) once
        the worker no longer touches its ring."""
        with self._lock:
            self._changes.append(("remove", slot))
        self._wake.set()
        if self._thread is None or not self._thread.is_alive():
            self._apply_changes()  # no worker: nothing is reading

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    # --- worker thread -----------------------------------------------------------------

    def _apply_changes(self) -> None:
        with self._lock:
            changes, self._changes = self._changes, []
        for kind, item in changes:
            if kind == "add":
                assert isinstance(item, _DuplexStream)
                self._streams[item.slot] = item
                self._state[:, item.slot, :] = 0.0
            else:
                assert isinstance(item, int)
                self._streams.pop(item, None)
                self._on_released(item)
        self.stats.streams = len(self._streams)

    def _run(self) -> None:
        self.load()
        if self._model is None:  # no VAD: duplex streams still work
            while not self._stopping:  # keep releasing slots so nothing leaks
                self._apply_changes()
                self._streams.clear()
                self._wake.wait(0.5)
                self._wake.clear()
            return
        next_tick = time.monotonic()
        while not self._stopping:
            self._apply_changes()
            if not self._streams:
                self._wake.wait(0.5)
                self._wake.clear()
                next_tick = time.monotonic()
                continue
            self.process_available()
            next_tick += self._period_s
            delay = next_tick - time.monotonic()
            if delay < -self._period_s:  # overloaded: do not try to make up ticks
                next_tick = time.monotonic()
            elif delay > 0:
                time.sleep(delay)

    def process_available(self) -> int:
        """Read every stream's new audio and run batched steps until none has a full
        window left; returns the number of model steps. (Called by the worker thread,
        or directly by tests and benchmarks with the thread not started.)"""
        if self._model is None:
            self._model = self._model_factory()
        self._apply_changes()
        for stream in self._streams.values():
            self._read(stream)
        steps = 0
        while True:
            ready = [s for s in self._streams.values() if len(s.samples) >= WINDOW]
            if not ready:
                return steps
            self._step(ready)
            steps += 1

    def _read(self, stream: _DuplexStream) -> None:
        available = stream.ring.readable_bytes()
        if available < 2:
            return
        data = stream.ring.read(available - available % 2)
        if stream.resampler is not None:
            data = stream.resampler.process(data)
        pcm = np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
        samples = np.concatenate((stream.samples, pcm)) if len(stream.samples) else pcm
        backlog = len(samples) // WINDOW
        if backlog > MAX_BACKLOG_WINDOWS:  # far behind (overload): keep the newest audio
            skipped = backlog - MAX_BACKLOG_WINDOWS
            self.stats.dropped_windows += skipped
            stream.audio_windows += skipped
            samples = samples[skipped * WINDOW :]
        stream.samples = samples

    def _step(self, ready: list[_DuplexStream]) -> None:
        assert self._model is not None
        slots = np.fromiter((s.slot for s in ready), dtype=np.intp, count=len(ready))
        windows = np.empty((len(ready), CONTEXT + WINDOW), dtype=np.float32)
        for row, stream in enumerate(ready):
            windows[row, :CONTEXT] = stream.context
            windows[row, CONTEXT:] = stream.samples[:WINDOW]
        started = time.perf_counter()
        probabilities, new_state = self._model.step(windows, self._state[:, slots, :])
        self.stats.step_seconds += time.perf_counter() - started
        self.stats.steps += 1
        self.stats.windows += len(ready)
        self._state[:, slots, :] = new_state
        for row, stream in enumerate(ready):
            stream.context = windows[row, -CONTEXT:].copy()
            stream.samples = stream.samples[WINDOW:]
            stream.audio_windows += 1
            change = stream.detector.feed(float(probabilities[row]))
            if change is None:
                continue
            at_ms = round(stream.audio_windows * WINDOW_S * 1000)
            if change == "start":  # the end only re-arms the detector: nobody needs it
                self._on_event(
                    stream.owner, SpeechStarted(stream_id=stream.stream_id, audio_ms=at_ms)
                )
