"""Backend ``cosyvoice2``: CosyVoice2-0.5B (or any model in its official layout) from a
local directory, streamed chunk by chunk, many streams batched per LLM step.

Settings: ``COSYVOICE2_MODEL_DIR`` (required), ``ENGINE_DEVICE`` (``cpu``, ``cuda``,
``cuda:N``), ``COSYVOICE2_DTYPE`` (``float32``, ``float16``, ``bfloat16`` for the flow
model; default float16 on a GPU, float32 on the CPU), ``COSYVOICE2_LLM_DTYPE`` (the
LLM's, default float32), ``ENGINE_MAX_BATCH`` (the streams
one decode step advances, default 16 here). ``ENGINE_WORKERS`` does not apply: torch
runs each step on its own threads (CPU) or the device.

Voices: ``cosyvoice2`` (the model with no reference: no prompt speech, a zero speaker
embedding) and one per speaker of the directory's ``spk2info.pt``
(``cosyvoice2-<speaker>``). A registered voice (``POST /v1/voices`` with ``transcript``)
is a profile of :class:`~engine.backends.cosyvoice2.voice.VoiceFeatures` made by
:meth:`CosyVoice2Backend.prepare_voice` and stored under this backend's version, which is
the model directory's digest: a changed model makes stored profiles stale (they are
refused and recomputed from the stored reference audio).

``synthesize_batch`` runs its jobs as streams (:mod:`~engine.backends.cosyvoice2.streaming`)
in the backend's :class:`~engine.backends.cosyvoice2.step_loop.StepLoop`, with the streams
of every other call in progress: each step advances every unfinished stream by one LLM
token; then every stream whose next hop of tokens (plus the flow model's lookahead) is
there gets that chunk's audio, all of them through one flow call
(:mod:`~engine.backends.cosyvoice2.token2wav`), streams still waiting for their first
chunk first; a stream whose ``emit`` returns False (cancelled, barge-in) is dropped at
once with its caches.

Speech cache (:meth:`CosyVoice2Backend.cache_identity`): the model digest is the
directory's version (:func:`~engine.backends.cosyvoice2.model_dir.model_version`: each
weight file's name, size and first and last MiB, not the whole of its gigabytes), with
the dtypes, the device type and the hop schedule (the streamed chunks change the audio).
Its LLM samples (seeded per segment and voice): a cached segment is one valid rendering.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import numpy as np
import torch

from engine.backends.base import (
    BackendError,
    BatchEmit,
    CacheIdentity,
    EmitFn,
    SynthesisJob,
    UnknownVoice,
    VoiceSettings,
)
from engine.backends.cosyvoice2 import model_dir, upstream
from engine.backends.cosyvoice2.step_loop import LoopStream, StepLoop
from engine.backends.cosyvoice2.streaming import (
    ENDOFPROMPT,
    Decoder,
    HopSchedule,
    LlmState,
    StreamError,
    segment_seed,
)
from engine.backends.cosyvoice2.text import model_text
from engine.backends.cosyvoice2.token2wav import ChunkRequest, Vocoder
from engine.backends.cosyvoice2.voice import (
    FrontEnd,
    VoiceFeatureError,
    VoiceFeatures,
    decode,
    encode,
)
from engine.ipc.env import ConfigError
from engine.ipc.schema import MAX_INSTRUCT_CHARS, Capabilities, VoiceInfo
from engine.normalize import spoken
from engine.text import normalize

log = logging.getLogger(__name__)

BASE_VOICE: Final = "cosyvoice2"
# CosyVoice2 reads Chinese (and dialects), English, Japanese, Korean: its voices are
# multilingual, and text is normalized as Chinese when it has Han characters, else English.
LANGUAGE: Final = "mul"
DEFAULT_MAX_STREAMS: Final = 16
MAX_TEXT_CHARS: Final = 400
EMBEDDING_DIM: Final = 192
# Emitted before each step: no audio, but the scheduler's answer says whether the stream
# is still wanted, so a cancel stops its decoding at the next step, not its next chunk.
_NO_AUDIO: Final = np.zeros(0, dtype=np.int16)
DTYPES: Final = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class CosyVoice2Settings:
    model_dir: Path
    device: str = "cpu"
    dtype: str = ""
    max_streams: int = DEFAULT_MAX_STREAMS
    llm_dtype: str = "float32"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> CosyVoice2Settings:
        from engine.config import EngineSettings

        directory = env.get("COSYVOICE2_MODEL_DIR", "")
        if not directory:
            raise ConfigError(
                "ENGINE_BACKEND=cosyvoice2 needs COSYVOICE2_MODEL_DIR (a local model directory)"
            )
        engine = EngineSettings.from_env(env)
        max_streams = engine.max_batch if "ENGINE_MAX_BATCH" in env else DEFAULT_MAX_STREAMS
        return cls(
            model_dir=Path(directory),
            device=engine.device,
            dtype=env.get("COSYVOICE2_DTYPE", ""),
            max_streams=max_streams,
            llm_dtype=env.get("COSYVOICE2_LLM_DTYPE", "float32") or "float32",
        )

    def torch_device(self) -> torch.device:
        if not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise ConfigError(f"ENGINE_DEVICE must be cpu, cuda or cuda:N, not {self.device!r}")
        device = torch.device(self.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"ENGINE_DEVICE={self.device} but torch sees no CUDA device")
        return device

    def torch_dtype(self, device: torch.device) -> torch.dtype:
        name = self.dtype or ("float16" if device.type == "cuda" else "float32")
        if name not in DTYPES:
            raise ConfigError(f"COSYVOICE2_DTYPE must be one of {', '.join(DTYPES)}, not {name!r}")
        if device.type == "cpu" and name != "float32":
            raise ConfigError("COSYVOICE2_DTYPE other than float32 needs a CUDA device")
        return DTYPES[name]

    def torch_llm_dtype(self) -> torch.dtype:
        """The LLM's precision (``COSYVOICE2_LLM_DTYPE``): float32 by default, as
        upstream runs it and as the conformance with upstream is shown; bfloat16 on a GPU
        halves its weights and KV cache (sampling stays float32)."""
        if self.llm_dtype not in DTYPES:
            raise ConfigError(
                f"COSYVOICE2_LLM_DTYPE must be one of {', '.join(DTYPES)}, not {self.llm_dtype!r}"
            )
        return DTYPES[self.llm_dtype]


@dataclass(frozen=True)
class CosyVoice2Voice:
    """A stream's voice: its features, the key its seeds derive from, an instruction."""

    features: VoiceFeatures
    key: str
    instruct: str | None = None


@dataclass(eq=False)
class _Stream:
    """One job of a ``synthesize_batch`` call while it runs in the step loop."""

    emit: EmitFn
    features: VoiceFeatures  # the voice's, with an instruction in place of its transcript
    llm: LlmState
    hops: Iterator[int]
    next_hop: int
    stream_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    offset: int = 0
    chunks: int = 0
    finished: bool = False


def _speaker_voice_id(speaker: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", speaker.lower()).strip("-") or "speaker"
    return f"{BASE_VOICE}-{slug}"


class CosyVoice2Backend:
    """See the module docstring."""

    name = "cosyvoice2"
    max_text_chars = MAX_TEXT_CHARS
    capabilities: Capabilities

    def __init__(self, settings: CosyVoice2Settings) -> None:
        upstream.require()
        device = settings.torch_device()
        self.model = model_dir.load(
            settings.model_dir,
            device,
            settings.torch_dtype(device),
            llm_dtype=settings.torch_llm_dtype(),
        )
        self.version = self.model.version
        self.on_gpu = device.type == "cuda"
        # A step loop batching every stream (calls are not independent); voices cloned
        # from a reference; dialect and emotion by instruction (instruct2).
        self.capabilities = Capabilities(
            batch=True, cloning=True, instruct=True, device="cuda" if self.on_gpu else "cpu"
        )
        self.native_sample_rate = self.model.sample_rate
        # Each scheduler call brings one segment and waits for it in the step loop, so the
        # scheduler hands a segment over as soon as it is ready (its most urgent first)
        # and it joins at the next step; ``threads`` calls: the loop's width.
        self.max_batch = 1
        self.threads = max(1, settings.max_streams)
        self._loop = StepLoop(self._step)
        self.front_end = FrontEnd(settings.model_dir, self.model.tokenizer, self.version)
        self.decoder = Decoder(self.model)
        self.vocoder = Vocoder(self.model)
        # Every stream's chunk sizes (upstream's own, 25 tokens a hop, is
        # ``HopSchedule(min_first=25, growth=(1,))``: the conformance tests use it).
        self.hop_schedule = HopSchedule(chunk=self.vocoder.chunk)
        self._llm_dtype = str(settings.torch_llm_dtype())  # for the speech cache's key
        self._voices: dict[str, VoiceFeatures] = {BASE_VOICE: self._unprompted()}
        self._infos = [
            VoiceInfo(
                id=BASE_VOICE,
                language=LANGUAGE,
                name="CosyVoice2 (no reference)",
                backend=self.name,
            )
        ]
        for speaker, entry in self.model.speakers.items():
            voice_id = _speaker_voice_id(speaker)
            self._voices[voice_id] = VoiceFeatures.from_spk2info(entry, self.version)
            self._infos.append(
                VoiceInfo(
                    id=voice_id, language=LANGUAGE, name=f"CosyVoice2 {speaker}", backend=self.name
                )
            )
        log.info(
            "cosyvoice2: loaded %s (%s, %s) version %s, %d voices",
            settings.model_dir, device, self.model.dtype, self.version, len(self._voices),
        )  # fmt: skip

    def _unprompted(self) -> VoiceFeatures:
        return VoiceFeatures(
            prompt_text=torch.zeros(1, 0, dtype=torch.int32),
            speech_token=torch.zeros(1, 0, dtype=torch.int32),
            speech_feat=torch.zeros(1, 0, 80),
            embedding=torch.zeros(1, EMBEDDING_DIM),
            model_version=self.version,
        )

    # -- Backend -------------------------------------------------------------------------

    def voices(self) -> Sequence[VoiceInfo]:
        return list(self._infos)

    def gpu_memory(self) -> tuple[int, int]:
        """(used, total) bytes of the model's device, as the driver counts them (every
        process's allocations, which is what can run out)."""
        if not self.on_gpu:
            return 0, 0
        free, total = torch.cuda.mem_get_info(self.model.device)
        return total - free, total

    def resolve_voice(self, settings: VoiceSettings) -> CosyVoice2Voice:
        features = self._voices.get(settings.voice_id)
        if features is None:
            raise UnknownVoice(settings.voice_id)
        if settings.speed != 1.0:
            # Upstream changes speed by stretching the whole utterance's mel: not streamable.
            raise BackendError("invalid_speed", "CosyVoice2 streams at speed 1.0 only")
        if settings.instruct is not None and len(settings.instruct) > MAX_INSTRUCT_CHARS:
            raise BackendError("text_too_long", f"instruct over {MAX_INSTRUCT_CHARS} characters")
        key = settings.voice_id
        if settings.profile is not None:
            try:
                features = decode(settings.profile, self.version)
            except VoiceFeatureError as exc:
                raise BackendError("invalid_voice_profile", str(exc)) from exc
            key = "profile:" + hashlib.blake2b(settings.profile, digest_size=12).hexdigest()
        return CosyVoice2Voice(features=features, key=key, instruct=settings.instruct or None)

    def voice_sample_rate(self, voice: object) -> int:
        return self.native_sample_rate

    def cache_identity(self, voice: object) -> CacheIdentity:
        """The model directory's digest (name, size, first and last MiB of each weight
        file: see the module docstring), dtypes, device type and hop schedule; the voice
        (a registered one by its features' digest in the key) and the instruction are in
        the key. Stochastic (the LLM samples)."""
        assert isinstance(voice, CosyVoice2Voice)
        schedule = self.hop_schedule
        extra = (
            ("device", self.model.device.type),
            ("dtype", str(self.model.dtype)),
            ("hops", f"{schedule.chunk}/{schedule.min_first}/{schedule.growth}"),
            ("llm_dtype", self._llm_dtype),
        )
        return CacheIdentity(self.version, extra, stochastic=True)

    def batch_key(self, voice: object) -> object:
        return self.name  # one model: every stream batches with every other

    def synthesize(self, text: str, voice: object, emit: EmitFn) -> None:
        self.synthesize_batch([SynthesisJob(text, voice, leading=True)], lambda _i, pcm: emit(pcm))

    def close(self) -> None:
        self._voices.clear()

    # -- VoicePreparer --------------------------------------------------------------------

    def prepare_voice(
        self, pcm16k: bytes, language: str | None, transcript: str | None = None
    ) -> bytes:
        """Features of a reference recording and its transcript (required: CosyVoice2
        conditions on what the reference says)."""
        if not transcript or not transcript.strip():
            raise BackendError(
                "transcript_required", "CosyVoice2 voices need the reference's transcript"
            )
        if len(transcript) > MAX_TEXT_CHARS:
            raise BackendError("text_too_long", f"transcript over {MAX_TEXT_CHARS} chars")
        pcm = np.frombuffer(pcm16k, dtype="<i2")
        try:
            # Upstream normalizes the reference transcript as it does the text to speak.
            prompt = model_text(spoken(normalize(transcript), LANGUAGE))
            return encode(self.front_end.prepare(pcm, prompt))
        except VoiceFeatureError as exc:
            raise BackendError("invalid_audio", str(exc)) from exc

    # -- BatchSynthesizer -----------------------------------------------------------------

    def _open(self, job: SynthesisJob, emit: EmitFn) -> _Stream:
        voice = job.voice
        assert isinstance(voice, CosyVoice2Voice)
        if len(job.text) > self.max_text_chars:
            raise BackendError("text_too_long", f"segment over {self.max_text_chars} chars")
        features = voice.features
        if voice.instruct:
            # instruct2: the instruction replaces the reference transcript and the LLM
            # hears no reference speech; the flow model keeps the voice.
            prompt = self.front_end.text_tokens(voice.instruct + ENDOFPROMPT)
            features = dataclasses.replace(features, prompt_text=prompt)
        text = self.front_end.text_tokens(model_text(job.text))
        seed = segment_seed(job.text, f"{voice.key}\x00{voice.instruct or ''}")
        state = self.decoder.start(text, features, seed, with_prompt_speech=not voice.instruct)
        hops = self.hop_schedule.hops(features.speech_token.shape[1])
        stream = _Stream(emit, features, state, hops, next(hops))
        self.vocoder.open(stream.stream_id)
        return stream

    def synthesize_batch(self, jobs: Sequence[SynthesisJob], emit: BatchEmit) -> None:
        """Run ``jobs`` in the step loop (joining streams of other calls at the next step)
        and return when they are done or cancelled."""
        streams: list[_Stream] = []
        try:
            for index, job in enumerate(jobs):
                streams.append(self._open(job, functools.partial(emit, index)))
            self._loop.run(streams)
        except StreamError as exc:
            raise BackendError("backend_error", str(exc)) from exc
        except torch.cuda.OutOfMemoryError:
            # Every stream of the failed step gets this error; the engine goes on. What
            # the failed step allocated is given back to the device for the next one.
            if self.on_gpu:
                torch.cuda.empty_cache()
            raise BackendError("cuda_oom", "the GPU ran out of memory for this batch") from None
        finally:
            for stream in streams:
                self.vocoder.close(stream.stream_id)
                if not stream.llm.done:  # the call failed: its cache goes at the next step
                    self.decoder.discard(stream.llm)

    def _step(self, streams: Sequence[LoopStream]) -> None:
        """One step of the loop: a token for every stream still decoding, then one chunk
        of audio for every stream whose next hop is complete (or whose decoding ended),
        all of them through one flow call, streams waiting for their first audio first."""
        live = [s for s in streams if isinstance(s, _Stream)]
        for stream in live:  # cancelled (clear, barge-in) since the last step? stop now
            if not stream.emit(_NO_AUDIO):
                self._drop(stream)
        live = [s for s in live if not s.finished]
        decoding = [s.llm for s in live if not s.llm.done]
        if decoding:
            self.decoder.step(decoding)
        lookahead = self.vocoder.lookahead
        ready: list[tuple[_Stream, ChunkRequest]] = []
        for stream in sorted(live, key=lambda s: s.chunks > 0):
            tokens = stream.llm.tokens
            if len(tokens) - stream.offset >= stream.next_hop + lookahead:
                end = stream.offset + stream.next_hop + lookahead
                request = ChunkRequest(
                    stream.stream_id, tokens[:end], stream.features, stream.offset, False
                )
                ready.append((stream, request))
            elif stream.llm.done:
                request = ChunkRequest(
                    stream.stream_id, list(tokens), stream.features, stream.offset, True
                )
                ready.append((stream, request))
        pieces = self.vocoder.chunks_audio([request for _, request in ready])
        for (stream, request), pcm in zip(ready, pieces, strict=True):
            if request.final:
                self._emit(stream, pcm)
                stream.finished = True
                self.vocoder.close(stream.stream_id)
            else:
                stream.offset += stream.next_hop
                stream.next_hop = next(stream.hops)
                self._emit(stream, pcm)

    def _emit(self, stream: _Stream, pcm: np.ndarray) -> None:
        stream.chunks += 1
        if pcm.size and not stream.emit(pcm):
            self._drop(stream)

    def _drop(self, stream: _Stream) -> None:
        """A cancelled stream: stop decoding it and free its caches now."""
        stream.finished = True
        stream.llm.done = True
        self.decoder.release(stream.llm)
        self.vocoder.close(stream.stream_id)
