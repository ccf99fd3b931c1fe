"""The ``kokoro`` backend: Kokoro-82M voices, Mandarin and English, on the CPU.

Voices (:data:`VOICES`): each pinned voice pack of ``kokoro-js`` 1.2.1 is one voice, id
``<language>-<name>`` (``zm_yunxi`` is ``zh-yunxi``, ``af_heart`` is ``en-us-heart``,
``bf_emma`` is ``en-gb-emma``). ``ENGINE_KOKORO_VOICES`` chooses the packs loaded (pack
names or voice ids, comma-separated, or ``all``); by default every pinned pack except
``zf_xiaoni``, which measured badly (through mu-law, Whisper base: a character error rate
of 0.58 over 5 prompts where the others measured 0.19-0.40, docs/benchmarks.md).

Like Piper (:mod:`engine.backends.piper`), a batch synthesizer of one segment per call
(``max_batch`` 1: the model takes one sequence and one style row), ``threads`` calls at
once on one shared session, each single-threaded (``independent_calls``: the scheduler's
capacity admission and start deadline apply); words are timed by the model's predicted
durations (``times_words``). Text arrives normalized (:mod:`engine.normalize`, run by
the segment splitter); :mod:`engine.backends.kokoro.g2p` turns it into phonemes.

The graph (``ENGINE_KOKORO_GRAPH``, :func:`chosen_graph`): ``float``, the int8 model
rebuilt in float32 with its 1-D convolutions as 2-D ones (built once by ``make
kokoro-voices`` or at the first load, checked against its pinned sha256:
:mod:`engine.backends.kokoro.assets`), or ``int8``, the model as shipped; ``auto`` (the
default) runs int8 on a CPU with VNNI (int8 dot-product instructions: AVX512-VNNI,
AVX-VNNI), where it measured faster, and float elsewhere (docs/kokoro.md). Either is run
split in two (:mod:`engine.backends.kokoro.graph`): the front (text to frames) and the
decoder.

Pieces (``ENGINE_KOKORO_PIECES``): ``off`` decodes each model call's frames in one
decoder run, with the statistics of its instance normalizations over all of them, as the
model was trained; ``on`` decodes them in pieces, each emitted when it is decoded
(:mod:`engine.backends.kokoro.pieces`: first audio after the front and a 1 s first
piece), each piece normalized over its own frames (the statistics of the whole are known
only once all of it is decoded), which moves levels and steps at joins (docs/kokoro.md);
``leading`` (the default) decodes in pieces only the first model call of an utterance's
first segment (``leading``), the one a caller is waiting on, and everything after it
whole: first audio within half a second, at most one piece's join in an utterance.

Threads: ``threads`` calls at once on one shared decoder session, one core each. With
two workers or more, a second decoder session on :data:`IDLE_THREADS` threads decodes a
synthesis that runs alone, every piece of it, so that a lone caller's audio uses both
cores: the backend declares ``lone_calls``, and the scheduler says which job is alone
(``SynthesisJob.alone``) and starts nothing beside it (a call decoded beside a lone one
slows both past their plans: docs/kokoro.md, "Stop 43"); a caller that does not say gets
the idle session while no other call runs (:meth:`idle`).

A leading segment in pieces goes out only once the rest of it can follow (``_plan``:
:func:`engine.backends.kokoro.pieces.release_after`), so the backend declares
``paced_leading``: the scheduler then counts all of such a segment's audio as playing
from its first frame, and lets an utterance held for its later segments go as soon as
they can follow that audio (not once the first segment is done).

Speech cache (:meth:`KokoroBackend.cache_identity`): keyed by the sha256 of the graph that
runs (the int8 model's or the float graph's, both checked against their pins when they
load), the voice pack's, the leading-silence cut and how frames are decoded (whole or the
piece schedule); the model does not sample, so a cached segment is its audio (to float
rounding: a segment decoded on two threads sums in another order).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

import msgspec
import numpy as np
import numpy.typing as npt

from engine.backends.base import (
    BackendError,
    BatchEmit,
    BatchWords,
    CacheIdentity,
    Checkpoint,
    EmitFn,
    SynthesisJob,
    UnknownVoice,
    VoiceSettings,
    WordTiming,
)
from engine.backends.kokoro import assets, pieces
from engine.backends.kokoro.g2p import MandarinG2P, Token, english
from engine.backends.kokoro.model import SAMPLE_RATE, KokoroModel, SplitModel, to_int16, tokenize
from engine.backends.kokoro.pieces import PLAN_PACE, PaceMeter
from engine.ipc.schema import Capabilities, VoiceInfo
from engine.text import SENTENCE_END

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VoiceSpec:
    pack: str  # kokoro-js voice pack name
    voice_id: str
    language: str  # BCP 47
    name: str
    gender: str


def _spec(pack: str, name: str) -> VoiceSpec:
    prefix = {"z": ("zh", "zh-CN", "Mandarin"), "a": ("en-us", "en-US", "English, US")}.get(
        pack[0], ("en-gb", "en-GB", "English, UK")
    )
    gender = "female" if pack[1] == "f" else "male"
    short = pack.split("_", 1)[1]
    return VoiceSpec(pack, f"{prefix[0]}-{short}", prefix[1], f"{name} ({prefix[2]})", gender)


VOICES: Final = tuple(
    _spec(pack, name)
    for pack, name in (
        ("zm_yunxi", "Yunxi"),
        ("zm_yunxia", "Yunxia"),
        ("zm_yunjian", "Yunjian"),
        ("zm_yunyang", "Yunyang"),
        ("zf_xiaoxiao", "Xiaoxiao"),
        ("zf_xiaoyi", "Xiaoyi"),
        ("zf_xiaobei", "Xiaobei"),
        ("zf_xiaoni", "Xiaoni"),
        ("af_heart", "Heart"),
        ("af_bella", "Bella"),
        ("am_michael", "Michael"),
        ("bf_emma", "Emma"),
        ("bm_george", "George"),
    )
)
NOT_BY_DEFAULT: Final = frozenset({"zf_xiaoni"})  # measured badly (see the docstring)
# The Mandarin voice the demo and the examples pick: the lowest character error rate through
# mu-law (Whisper base, 12 prompts: 0.158, next zh-yunxi 0.201; docs/benchmarks.md).
DEFAULT_MANDARIN_VOICE: Final = "zh-xiaoyi"


def chosen_voices(env: Mapping[str, str] | None = None) -> list[VoiceSpec]:
    """The voices ``ENGINE_KOKORO_VOICES`` names (pack names or voice ids, or ``all``),
    by default every voice but those :data:`NOT_BY_DEFAULT`. Raises ValueError for a
    name that is neither."""
    env = os.environ if env is None else env
    setting = (env.get("ENGINE_KOKORO_VOICES") or "").strip()
    if not setting:
        return [v for v in VOICES if v.pack not in NOT_BY_DEFAULT]
    if setting == "all":
        return list(VOICES)
    by_name = {v.pack: v for v in VOICES} | {v.voice_id: v for v in VOICES}
    chosen: list[VoiceSpec] = []
    for name in (n.strip() for n in setting.split(",")):
        if not name:
            continue
        if name not in by_name:
            known = ", ".join(v.voice_id for v in VOICES)
            raise ValueError(f"ENGINE_KOKORO_VOICES: unknown voice {name!r} (known: {known})")
        if by_name[name] not in chosen:
            chosen.append(by_name[name])
    return chosen


# The model's leading pad lasts 15-20 frames (0.4-0.5 s) of silence before speech, whose
# onset (breath, attack) begins 3-5 frames before the pad ends: all but its last
# LEAD_KEEP_FRAMES frames are cut, so that a segment's audio does not open with half a
# second of silence (every segment: the first audio of an utterance comes sooner, and the
# joins between segments have no extra pause). The trailing pause (the final punctuation's
# and the pad's frames) is kept: it is the pause between sentences.
LEAD_KEEP_FRAMES: Final = 8


def leading_cut(frames: npt.NDArray[np.int64] | None) -> int:
    """Frames of silence to cut from the start of a call's audio."""
    return 0 if frames is None or not len(frames) else max(0, int(frames[0]) - LEAD_KEEP_FRAMES)


# A segment that does not end its sentence (the words before an amount or a code, kept by
# the speech cache and joined to the rest; a clause cut for first audio) continues after a
# clause's pause, not a sentence's. The model ends every call with its silence all the
# same: 0.8-1 s in Mandarin (0.2-0.4 s in English), which joined a cached "您的验证码是" to
# its code with a 1.1 s hole (the recognizer's CER of such sentences 0.255 against 0.118
# whole: tests/bench/composed.py). Such a call's trailing quiet is cut to
# TRAIL_KEEP_FRAMES, found on the front's energy curve before anything is decoded.
TRAIL_KEEP_FRAMES: Final = 6
# Quiet: the front's energy (a log scale: the loudest frames 8-9.5, digital silence about
# -9.6) this far below the segment's loudest, about 40 dB down in the decoded audio.
QUIET_BELOW_PEAK: Final = 7.0


# A sentence's end as the engine's segments write it (normalized: ASCII), and as text
# given to the backend directly may (full-width and ideographic forms, an ellipsis).
_SENTENCE_ENDS: Final = SENTENCE_END | frozenset("。！？；…")


def continues_sentence(text: str) -> bool:
    """Whether the segment ``text`` stops before its sentence's end."""
    end = text.rstrip(" \t\n\"'”’」』)）")[-1:]
    return bool(end) and end not in _SENTENCE_ENDS


def trailing_end(loudness: npt.NDArray[np.floating], begin: int) -> int:
    """The frame to decode up to for a segment that continues its sentence: the last frame
    boundary that is not quiet (``loudness``, one value per boundary:
    :func:`engine.backends.kokoro.pieces.boundary_loudness`), plus TRAIL_KEEP_FRAMES."""
    frames = len(loudness) - 1
    loud = np.nonzero(loudness > float(np.max(loudness)) - QUIET_BELOW_PEAK)[0]
    last = int(loud[-1]) if len(loud) else frames
    return max(begin + 1, min(frames, last + TRAIL_KEEP_FRAMES))


def trailing_samples(audio: npt.NDArray[np.floating], hop: int, floor: float = 1e-3) -> int:
    """The same for a whole-graph call's decoded audio (no energy curve): samples up to
    the last frame whose peak is above ``floor``, plus TRAIL_KEEP_FRAMES."""
    frames = len(audio) // hop
    if frames == 0:
        return len(audio)
    peaks = np.abs(audio[: frames * hop]).reshape(frames, hop).max(axis=1)
    loud = np.nonzero(peaks > floor)[0]
    last = int(loud[-1]) + 1 if len(loud) else frames
    return min(len(audio), (last + TRAIL_KEEP_FRAMES) * hop)


GRAPHS: Final = ("auto", "float", "int8")
IDLE_THREADS: Final = 2  # threads of the decoder session for a lone synthesis
VNNI_FLAGS: Final = frozenset({"avx512_vnni", "avx_vnni"})


def cpu_has_vnni(cpuinfo: str | None = None) -> bool:
    """Whether the CPU (``/proc/cpuinfo``'s flags, or ``cpuinfo``'s) has int8 dot-product
    instructions (:data:`VNNI_FLAGS`); False where they cannot be read."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return bool(VNNI_FLAGS & set(line.split(":", 1)[-1].split()))
    return False


def chosen_graph(env: Mapping[str, str] | None = None, cpuinfo: str | None = None) -> str:
    """``float`` or ``int8``: ``ENGINE_KOKORO_GRAPH``, ``auto`` (the default) by the CPU
    (:func:`cpu_has_vnni`: int8, else float). Raises ValueError for another value."""
    env = os.environ if env is None else env
    setting = (env.get("ENGINE_KOKORO_GRAPH") or "auto").strip().lower()
    if setting not in GRAPHS:
        raise ValueError(f"ENGINE_KOKORO_GRAPH: {setting!r} is not one of {', '.join(GRAPHS)}")
    if setting == "auto":
        return "int8" if cpu_has_vnni(cpuinfo) else "float"
    return setting


PIECES_CHOICES: Final = ("off", "leading", "on")


def declared(base: Capabilities, *, idle_session: bool, pieces: str) -> Capabilities:
    """What a loaded backend declares beyond ``base``: ``lone_calls`` with an idle
    session (a lone call decodes on every core), ``paced_leading`` when it decodes a
    leading segment in pieces (``pieces`` not ``off``: its first audio goes out once the
    rest can follow, :func:`engine.backends.kokoro.pieces.release_after`)."""
    return msgspec.structs.replace(
        base, lone_calls=base.lone_calls or idle_session,
        paced_leading=base.paced_leading or pieces != "off",
    )  # fmt: skip


def pieces_setting(env: Mapping[str, str] | None = None) -> str:
    """``ENGINE_KOKORO_PIECES``: ``leading`` (the default) decodes an utterance's first
    segment in pieces, ``on`` every segment, ``off`` none."""
    env = os.environ if env is None else env
    setting = (env.get("ENGINE_KOKORO_PIECES") or "leading").strip().lower()
    if setting not in PIECES_CHOICES:
        raise ValueError(f"ENGINE_KOKORO_PIECES: {setting!r} is not one of {PIECES_CHOICES}")
    return setting


@dataclass(frozen=True, eq=False)  # hashed by identity (the pack is an array)
class KokoroVoice:
    """A resolved voice: its style pack, its speed."""

    spec: VoiceSpec
    pack: npt.NDArray[np.float32]
    speed: float


class KokoroBackend:
    """Kokoro voices: ``threads`` calls at once, one segment each."""

    name = "kokoro"
    # One ONNX Runtime run per worker thread, one core each (the capacity replay applies);
    # synthesize_batch reports words from the duration predictor.
    capabilities = Capabilities(independent_calls=True, batch=True, word_timings=True)
    max_text_chars = 5000
    native_sample_rate = SAMPLE_RATE
    max_batch = 1

    def __init__(
        self,
        *,
        threads: int = 1,
        voices: Sequence[VoiceSpec] | None = None,
        directory: os.PathLike[str] | str | None = None,
        graph: str | None = None,
        split: bool = True,
        pieces: str | None = None,
        idle_threads: int = IDLE_THREADS,
    ) -> None:
        """``graph``: ``float`` or ``int8`` (None: :func:`chosen_graph`); ``split`` False
        runs the exported graph whole in one session (the path before the split: words
        and audio as before, no pieces, no idle session); ``pieces``: off, leading or on
        (None: :func:`pieces_setting`); ``idle_threads`` below 2 makes no idle session."""
        import onnx

        base = assets.asset_dir() if directory is None else Path(directory)
        specs = chosen_voices() if voices is None else list(voices)
        if not specs:
            raise RuntimeError("ENGINE_KOKORO_VOICES names no voice")
        self.threads = max(1, threads)
        self._packs = {s.voice_id: assets.load_pack(s.pack, base / "voices") for s in specs}
        self._specs = {s.voice_id: s for s in specs}
        self.graph = chosen_graph() if graph is None else graph
        if self.graph not in ("float", "int8"):
            raise ValueError(f"graph {self.graph!r} is not float or int8")
        chosen = pieces_setting() if pieces is None else pieces
        if chosen not in PIECES_CHOICES:
            raise ValueError(f"pieces {chosen!r} is not one of {PIECES_CHOICES}")
        self.pieces = chosen if split else "off"
        data = assets.float_bytes(base) if self.graph == "float" else assets.model_bytes(base)
        self.digest = assets.FLOAT_SHA256 if self.graph == "float" else assets.MODEL_SHA256
        self.exported: KokoroModel | None = None
        self.model: SplitModel | None = None
        self._idle_session: Any = None
        if split:
            proto = onnx.load_from_string(data)
            del data
            self.model = SplitModel(proto)
            del proto
            if self.threads >= 2 and idle_threads >= 2:
                self._idle_session = self.model.decoder_session(idle_threads)
            self.model.release_graph()
            self.hop = self.model.hop
        else:
            self.exported = KokoroModel(data)
            self.hop = self.exported.hop
        # each decoder session's pace on this machine, timed at load: the shared one's (one
        # thread) and the idle one's (its threads: seeded with the shared one's pace, a
        # lone synthesis planned its pieces as if it had one core and held its first
        # audio for pieces it could have played, 0.8-2.3 s on an idle machine)
        warm = self.model.warm_pace if self.model is not None else 0.0
        self.pace = PaceMeter(warm if warm > 0.0 else PLAN_PACE)
        idle = warm
        if self.model is not None and self._idle_session is not None:
            idle = max(warm, self.model.measure_pace(self._idle_session))
        self.idle_pace = PaceMeter(idle if idle > 0.0 else PLAN_PACE)
        self._active = 0
        self._lock = threading.Lock()
        decoding = self._decoding().split("/")[0]
        # ("clause-tail": a segment that continues its sentence ends after a clause's
        # pause, TRAIL_KEEP_FRAMES; entries made before that are not served)
        self.version = f"kokoro/{self.digest[:12]}/{decoding}/clause-tail/" + ",".join(
            s.pack for s in specs
        )
        self._mandarin = MandarinG2P()
        if any(s.language.startswith("zh") for s in specs):
            self._mandarin.load()  # about 1 s (jieba): not on a caller's first audio
        self.capabilities = declared(
            self.capabilities, idle_session=self._idle_session is not None, pieces=self.pieces
        )
        log.info(
            "kokoro: %d voices, %s graph (%s), decoded %s, hop %d%s",
            len(specs), self.graph, self.digest[:12], decoding, self.hop,
            f", {idle_threads} threads for a lone synthesis" if self._idle_session else "",
        )  # fmt: skip

    def voices(self) -> Sequence[VoiceInfo]:
        return [
            VoiceInfo(id=s.voice_id, language=s.language, name=s.name, backend=self.name,
                      gender=s.gender)
            for s in self._specs.values()
        ]  # fmt: skip

    def resolve_voice(self, settings: VoiceSettings) -> KokoroVoice:
        spec = self._specs.get(settings.voice_id)
        if spec is None:
            raise UnknownVoice(settings.voice_id)
        if settings.profile is not None:
            raise BackendError("voice_cloning_unsupported", "Kokoro voices cannot be cloned")
        if not 0.25 <= settings.speed <= 4.0:
            raise BackendError("invalid_speed", "speed must be between 0.25 and 4.0")
        return KokoroVoice(spec, self._packs[spec.voice_id], settings.speed)

    def voice_sample_rate(self, voice: object) -> int:
        return SAMPLE_RATE

    def cache_identity(self, voice: object) -> CacheIdentity:
        """The running graph's sha256 (checked when it loaded), the voice pack's, the lead
        cut, how frames are decoded (whole, or the piece schedule)."""
        assert isinstance(voice, KokoroVoice)
        extra = (
            ("decode", self._decoding()),
            ("lead_keep_frames", str(LEAD_KEEP_FRAMES)),
            ("pack", assets.VOICE_PACKS[voice.spec.pack]),
        )
        return CacheIdentity(self.digest, extra)

    def _decoding(self) -> str:
        if self.model is None:
            return "exported"
        if self.pieces == "off":
            return "whole"
        # (in-room: a piece sized by the pace no longer grows past its room to take a
        # short rest, pieces.schedule; entries cut the old way are not served)
        return (
            f"{'pieces' if self.pieces == 'on' else 'leading-pieces'}"
            f"/first{pieces.FIRST_PIECE}/steady{pieces.STEADY_PIECE}/pace-measured/context"
            f"{pieces.LEFT_CONTEXT},{pieces.RIGHT_CONTEXT}/snap{pieces.SNAP_FRAMES}"
            f"/crossfade{pieces.CROSSFADE}/own/in-room"
        )

    def idle(self) -> bool:
        """Whether no synthesis runs now."""
        with self._lock:
            return self._active == 0

    def batch_key(self, voice: object) -> object:
        assert isinstance(voice, KokoroVoice)
        return voice.spec.voice_id

    def phonemes(self, text: str, voice: KokoroVoice) -> list[Token]:
        if voice.spec.language.startswith("zh"):
            return self._mandarin(text)
        return english(text, british=voice.spec.language == "en-GB")

    def synthesize_batch(
        self, jobs: Sequence[SynthesisJob], emit: BatchEmit, words: BatchWords | None = None
    ) -> None:
        """Each job in turn (``max_batch`` is 1), its audio emitted per model call (one per
        508 phoneme ids; in pieces, per piece as each is decoded), then its words timed by
        the predicted durations. ``emit`` returning False stops the job: no further piece
        or call is decoded."""
        with self._lock:
            self._active += 1
            alone = self._active == 1
        try:
            for index, job in enumerate(jobs):
                voice = job.voice
                assert isinstance(voice, KokoroVoice)
                if len(job.text) > self.max_text_chars:
                    raise BackendError("text_too_long", f"segment over {self.max_text_chars} chars")
                # the scheduler's word when it gave one (it starts nothing beside a lone
                # job), else what runs now
                lone = alone and job.alone is not False
                session = self._idle_session if lone else None
                timed = self._synthesize_job(index, job, voice, emit, session)
                if timed is not None and words is not None and timed:
                    words(index, timed)
        finally:
            with self._lock:
                self._active -= 1

    def _synthesize_job(
        self, index: int, job: SynthesisJob, voice: KokoroVoice, emit: BatchEmit, session: Any
    ) -> list[WordTiming] | None:
        """One job's audio, emitted; its words, or None when ``emit`` stopped it."""
        timed: list[WordTiming] = []
        offset_s = 0.0
        calls = tokenize(self.phonemes(job.text, voice))
        clause, last_call = continues_sentence(job.text), len(calls) - 1
        for number, call in enumerate(calls):
            style = voice.pack[min(len(call.ids), assets.PACK_ROWS) - 1]
            if self.model is None:
                assert self.exported is not None
                audio, frames = self.exported.run(call.ids, style, voice.speed)
                lead = leading_cut(frames) * self.hop
                audio = audio[lead:]
                if clause and number == last_call:
                    audio = audio[: trailing_samples(audio, self.hop)]
                if not emit(index, to_int16(audio)):
                    return None
                samples = audio.size
            else:
                frames, features = self.model.front(call.ids, style, voice.speed)
                lead = leading_cut(frames) * self.hop
                samples = 0
                in_pieces = self.pieces == "on" or (
                    self.pieces == "leading" and job.leading and number == 0
                )
                begin = leading_cut(frames)
                end = features.frames
                quiet = pieces.boundary_loudness(features.energy)
                if clause and number == last_call:
                    end = trailing_end(quiet, begin)
                plan, release, narrows = self._plan(
                    begin, end, quiet, session, in_pieces, job.narrowed is not None
                )
                narrowed = job.narrowed if narrows else None
                decoding = self._decode(features, plan, release, session, narrowed, job.checkpoint)
                try:
                    for chunk in decoding:
                        samples += chunk.size
                        if not emit(index, to_int16(chunk)):
                            return None
                except _Unwanted:
                    return None
                if narrowed is not None:
                    session = None  # its later calls (if any) on one core too
            if frames is not None and self.hop:
                # (a word's end stays within the audio its call kept)
                ends = offset_s + samples / SAMPLE_RATE
                words = self._word_times(call.words, frames, offset_s - lead / SAMPLE_RATE)
                timed += [w if w.end_s <= ends else replace(w, end_s=ends) for w in words]
            offset_s += samples / SAMPLE_RATE
        return timed

    def _meter(self, session: Any) -> pieces.PaceMeter:
        return self.pace if session is None else self.idle_pace

    def _plan(
        self, begin: int, end: int, quiet: Any, session: Any, in_pieces: bool, narrow: bool
    ) -> tuple[list[pieces.Piece], int, bool]:
        """The pieces of frames ``begin`` .. ``end`` (one unless ``in_pieces``), at the
        pace ``session`` measured, the one after which the first audio goes out, and
        whether the pieces after it go on one core. ``narrow``: they may, when
        ``session`` is the idle one (a lone call's) and pieces sized for the shared
        session's pace let the first audio go no later (a lone call that holds both
        cores to its end makes a newcomer wait for all of it: 0.2-1.8 s for a
        20-character Mandarin sentence on machine I)."""
        if not in_pieces:
            return [pieces.Piece(begin, end, 0, end)], 0, False
        with self._lock:
            pace = self._meter(session).plan_pace()
            shared = self.pace.plan_pace()
        loudness = quiet[: end + 1]
        plan = pieces.schedule(end, begin, pieces.FIRST_PIECE, pace, quiet=loudness)
        release = pieces.release_after(plan, pace)
        if narrow and session is not None:
            one = pieces.schedule(end, begin, pieces.FIRST_PIECE, shared, quiet=loudness)
            at = pieces.release_after(one, shared)
            if at < len(one) - 1 and _held_frames(one, at) <= _held_frames(plan, release):
                return one, at, True
        return plan, release, False

    def _decode(
        self,
        features: pieces.Features,
        plan: list[pieces.Piece],
        release: int,
        session: Any,
        narrowed: Callable[[], None] | None = None,
        checkpoint: Checkpoint | None = None,
    ) -> Any:
        """The audio of the pieces of ``plan``, one array per piece as it is decoded (those
        up to ``release`` at once); ``session``: the decoder session (None: the shared
        one). ``narrowed``: the pieces after the release go on the shared session, and
        this is called before the first of them (the released audio is out by then).
        ``checkpoint`` (SynthesisJob's) is called before each piece after the release
        (after ``narrowed``); it may wait; False raises :class:`_Unwanted`."""
        model = self.model
        assert model is not None
        decoded_pieces = 0

        def decoder(lo: int, hi: int, given: Any) -> Any:
            nonlocal decoded_pieces, session
            if narrowed is not None and decoded_pieces == release + 1:
                session = None
                narrowed()
            meter = self._meter(session)
            if checkpoint is not None and decoded_pieces > release:
                out_s = (plan[decoded_pieces - 1].end - plan[0].start) * self.hop / SAMPLE_RATE
                with self._lock:
                    next_s = (hi - lo) * self.hop / SAMPLE_RATE / meter.pace
                if not checkpoint(out_s, next_s):
                    raise _Unwanted
            decoded_pieces += 1
            started = time.perf_counter()
            decoded = model.decode(features, lo, hi, given, session)
            seconds = time.perf_counter() - started
            with self._lock:
                meter.observe((hi - lo) * self.hop / SAMPLE_RATE, seconds)
            return decoded

        return pieces.decode(plan, decoder, self.hop, "own", release)

    def _word_times(
        self, spans: Sequence[tuple[str, int, int]], frames: npt.NDArray[np.int64], at: float
    ) -> list[WordTiming]:
        """Words timed from the frames of each id (``frames[0]``: the leading pad)."""
        seconds = np.concatenate([[0], np.cumsum(frames)]) * (self.hop / SAMPLE_RATE)
        return [
            WordTiming(word, at + float(seconds[first + 1]), at + float(seconds[last + 2]))
            for word, first, last in spans
        ]

    def synthesize(self, text: str, voice: object, emit: EmitFn) -> None:
        """One segment (the per-segment form, for tools and tests)."""
        self.synthesize_batch([SynthesisJob(text, voice, leading=True)], lambda _i, c: emit(c))

    def close(self) -> None:
        self._packs.clear()


class _Unwanted(Exception):
    """The job's checkpoint said it is no longer wanted: no further piece is decoded."""


def _held_frames(plan: Sequence[pieces.Piece], release: int) -> int:
    """The frames decoded before ``plan``'s first audio goes (``release``: its index)."""
    return sum(piece.hi - piece.lo for piece in plan[: release + 1])


def installed(env: Mapping[str, str] | None = None) -> bool:
    """Whether the backend can start here: misaki, the model parts and the voice packs
    are installed (their hashes are checked when it starts)."""
    import importlib.util

    needed = ("onnxruntime", "onnx", "misaki", *assets.MODEL_PARTS)
    return all(importlib.util.find_spec(n) is not None for n in needed) and (
        assets.packs_installed(env)
    )
