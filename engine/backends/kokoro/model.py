"""Kokoro-82M v1.0 (int8 ONNX) on ONNX Runtime: phoneme tokens to 24 kHz audio.

The graph's interface: ``tokens`` int64 [1, n] (ids wrapped in the pad 0, at most 510),
``style`` float32 [1, 256] (row n-1 of a voice pack, n the ids without pads), ``speed``
float32 [1]; output ``audio`` float32 in [-1, 1]. At load time the graph is given one more
output: the duration predictor's frames per id (the input of the encoder's ``CumSum``, the
rounded durations that build the alignment), which times words; an id's frame is
:attr:`KokoroModel.hop` samples (measured on the warm-up run: 600).

Cost (one core, this export): the decoder (iSTFTNet generator) is about 96 % of a call
(ONNX Runtime's profiler on a 5.6 s Mandarin sentence: text encoder and BERT 3 %,
prosody predictor under 1 %, decoder 96 %).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from engine.backends.kokoro.g2p import Token
from engine.backends.kokoro.pieces import Features, phase_slice
from engine.backends.kokoro.vocab import MAX_TOKENS, PAD_ID, VOCAB
from engine.backends.onnx_cpu import cpu_session

SAMPLE_RATE: Final = 24_000
OUTPUT_GAIN: Final = 32767.0
WARM_UP: Final = (Token("Hello", "həlˈO"), Token("", "."))
MAX_IDS: Final = MAX_TOKENS - 2  # two pads


@dataclass(frozen=True)
class Tokenized:
    """Ids of one call, and each timed word's first and last id index (in ``ids``)."""

    ids: list[int]
    words: list[tuple[str, int, int]]


def tokenize(tokens: Sequence[Token]) -> list[Tokenized]:
    """Ids of ``tokens`` (symbols without an id dropped, runs of spaces as one), cut into
    calls of at most :data:`MAX_IDS` ids, at a word boundary where there is one."""
    calls: list[Tokenized] = []
    ids: list[int] = []
    words: list[tuple[str, int, int]] = []
    last_break = 0  # ids before the latest word boundary in the current call
    space = VOCAB[" "]
    for token in tokens:
        mapped = [VOCAB[ch] for ch in token.phonemes if ch in VOCAB]
        mapped = [i for n, i in enumerate(mapped) if not (i == space and n and mapped[n - 1] == i)]
        if mapped and mapped[0] == space and (not ids or ids[-1] == space):
            mapped = mapped[1:]
        if len(ids) + len(mapped) > MAX_IDS and ids:
            cut = last_break or len(ids)
            head = ids[:cut]
            while head and head[-1] == space:
                head.pop()
            while cut < len(ids) and ids[cut] == space:
                cut += 1
            calls.append(Tokenized(head, [w for w in words if w[2] < len(head)]))
            ids = ids[cut:]
            words = [(w, s - cut, e - cut) for w, s, e in words if s >= cut]
            last_break = 0
        mapped = mapped[: MAX_IDS - len(ids)]
        if token.word and mapped:
            words.append((token.word, len(ids), len(ids) + len(mapped) - 1))
        ids += mapped
        if not token.word:
            last_break = len(ids)
    while ids and ids[-1] == space:
        ids.pop()
    if ids:
        calls.append(Tokenized(ids, words))
    return calls


def durations_output(graph: Any) -> str | None:
    """The tensor of frames per id: the input of the encoder's one ``CumSum``."""
    sums = [n for n in graph.node if n.op_type == "CumSum" and n.name.startswith("/encoder/")]
    return str(sums[0].input[0]) if len(sums) == 1 else None


class KokoroModel:
    """One ONNX Runtime session of the model, shared by the worker threads."""

    def __init__(self, model: bytes, threads: int = 1) -> None:
        import onnx

        proto = onnx.load_from_string(model)
        self.durations_name = durations_output(proto.graph)
        if self.durations_name is not None:
            proto.graph.output.append(
                onnx.helper.make_tensor_value_info(
                    self.durations_name, onnx.TensorProto.INT64, None
                )
            )
        self._session = cpu_session(proto.SerializeToString(), threads)
        self.hop = 0
        style = np.zeros((1, 256), dtype=np.float32)
        call = tokenize(WARM_UP)[0]
        audio, frames = self.run(call.ids, style, 1.0)
        if frames is not None and frames.sum() > 0:
            self.hop = round(audio.size / float(frames.sum()))

    def run(
        self, ids: Sequence[int], style: npt.NDArray[np.float32], speed: float
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64] | None]:
        """Audio (float, 24 kHz) of ``ids`` (without pads), and the frames of each id
        (pads included: index 0 is the leading pad), or None."""
        feed = {
            "tokens": np.array([[PAD_ID, *ids, PAD_ID]], dtype=np.int64),
            "style": np.ascontiguousarray(style, dtype=np.float32).reshape(1, 256),
            "speed": np.array([speed], dtype=np.float32),
        }
        outputs = self._session.run(None, feed)
        audio = np.asarray(outputs[0], dtype=np.float32).reshape(-1)
        frames = (
            np.asarray(outputs[1], dtype=np.int64).reshape(-1)
            if self.durations_name is not None
            else None
        )
        return audio, frames


def to_int16(audio: npt.NDArray[np.float32]) -> npt.NDArray[np.int16]:
    return np.asarray(np.clip(audio * OUTPUT_GAIN, -32768, 32767), dtype=np.int16)


class SplitModel:
    """The model as two ONNX Runtime sessions (:func:`engine.backends.kokoro.graph.split`):
    the front, run once per call, and the decoder, run once per piece; shared by the
    worker threads (``run`` is thread-safe), each run on ``threads`` intra-op threads."""

    def __init__(self, model: Any, threads: int = 1) -> None:
        from engine.backends.kokoro import graph as graphs

        parts = graphs.split(model)
        self.norms = parts.norms
        self.durations_name = parts.durations
        self._front = cpu_session(parts.front.SerializeToString(), threads)
        self._decoder_bytes: bytes | None = parts.decoder.SerializeToString()
        self._decoder = cpu_session(self._decoder_bytes, threads)
        self._given_names = [n for norm in self.norms for n in (norm.mean_input, norm.var_input)]
        self._none = [np.zeros((1, 1, 1), dtype=np.float32)] * len(self._given_names)
        self.hop = 0
        call = tokenize(WARM_UP)[0]
        frames, features = self.front(call.ids, np.zeros((1, 256), np.float32), 1.0)
        audio, _ = self.decode(features, 0, features.frames, None)
        if frames.sum() > 0:
            self.hop = round(audio.size / float(frames.sum()))
        self._warm_up = features
        # the decoder's pace on this machine, one thread, from a second (warm) run: where
        # a schedule of pieces starts before any segment was timed
        self.warm_pace = self.measure_pace(None, untimed=0)

    def measure_pace(self, session: Any, runs: int = 3, untimed: int = 1) -> float:
        """Audio seconds per second of decoding the warm-up phrase whole on ``session``
        (None: the shared decoder): the median of ``runs`` timed decodes after
        ``untimed`` ones (a new session's first run also allocates; one timing alone
        varied by a third between loads); 0.0 where it could not be timed."""
        paces: list[float] = []
        for run in range(max(0, untimed) + max(1, runs)):
            started = time.perf_counter()
            audio, _ = self.decode(self._warm_up, 0, self._warm_up.frames, None, session)
            seconds = time.perf_counter() - started
            if run >= untimed and seconds > 0:
                paces.append(audio.size / SAMPLE_RATE / seconds)
        return float(np.median(paces)) if paces else 0.0

    def decoder_session(self, threads: int) -> Any:
        """Another session of the decoder graph, on ``threads`` intra-op threads."""
        if self._decoder_bytes is None:
            raise RuntimeError("the decoder graph was released")
        return cpu_session(self._decoder_bytes, threads, spin=False)

    def release_graph(self) -> None:
        """Forget the decoder graph's bytes (no more :meth:`decoder_session`)."""
        self._decoder_bytes = None

    def front(
        self, ids: Sequence[int], style: npt.NDArray[np.float32], speed: float
    ) -> tuple[npt.NDArray[np.int64], Features]:
        """The frames of each id (index 0: the leading pad) and the decoder's features."""
        from engine.backends.kokoro import graph as graphs

        row = np.ascontiguousarray(style, dtype=np.float32).reshape(1, 256)
        feed = {
            "tokens": np.array([[PAD_ID, *ids, PAD_ID]], dtype=np.int64),
            "style": row,
            "speed": np.array([speed], dtype=np.float32),
        }
        frames, aligned, f0, energy, phase = self._front.run(
            [self.durations_name, graphs.ALIGNED, graphs.F0, graphs.ENERGY, graphs.PHASE], feed
        )
        features = Features(
            np.asarray(aligned, dtype=np.float32),
            np.asarray(f0, dtype=np.float32),
            np.asarray(energy, dtype=np.float32),
            np.asarray(phase, dtype=np.float32),
            row,
        )
        return np.asarray(frames, dtype=np.int64).reshape(-1), features

    def decode(
        self,
        features: Features,
        lo: int,
        hi: int,
        given: Sequence[npt.NDArray[np.float32]] | None,
        session: Any = None,
        flags: Sequence[bool] | None = None,
    ) -> tuple[npt.NDArray[np.float32], list[npt.NDArray[np.float32]]]:
        """Audio of frames ``lo`` .. ``hi`` (float, ``hop`` samples a frame) and the
        statistics its normalizations used (given ones, or its own when ``given`` is None)."""
        from engine.backends.kokoro import graph as graphs

        feed: dict[str, Any] = {
            graphs.ALIGNED: features.aligned[:, :, lo:hi],
            graphs.F0: features.f0[:, 2 * lo : 2 * hi],
            graphs.ENERGY: features.energy[:, 2 * lo : 2 * hi],
            "style": features.style,
            graphs.PHASE: phase_slice(features.phase, 2 * lo, 2 * hi),
            graphs.STATS_GIVEN_FLAG: np.full(len(self.norms), given is not None)
            if flags is None
            else np.asarray(flags, dtype=bool),
        }
        feed.update(zip(self._given_names, self._none if given is None else given, strict=True))
        outputs = (session or self._decoder).run(None, feed)
        audio = np.asarray(outputs[0], dtype=np.float32).reshape(-1)
        return audio, list(outputs[1:]) if given is None or flags is not None else list(given)
