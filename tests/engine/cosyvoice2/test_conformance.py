"""The engine against upstream's own inference code on the same model directory (tiny
sizes, random weights): the speech tokens its step loop decodes, token for token, and
the waveform it streams. The reference and what is set around it (the seeded draws, the
transformers 4.51.3 mask, the zero HiFT source noise) are in ``upstream_reference``."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine.backends.base import SynthesisJob, VoiceSettings
from engine.backends.cosyvoice2.backend import (
    BASE_VOICE,
    CosyVoice2Backend,
    CosyVoice2Settings,
    CosyVoice2Voice,
)
from engine.backends.cosyvoice2.streaming import HopSchedule
from tests.engine.cosyvoice2 import upstream_reference as ref
from tests.engine.cosyvoice2.tiny_model import SPEAKER, reference_audio

ENGLISH = "Your balance is twelve dollars."
CHINESE = "您好，请问有什么可以帮您？"
MIXED = "请输入您的PIN码, then press pound."
# Over 150 text tokens: at least 300 speech tokens, past the 25 + 50 + 100 + 100 tokens
# of the first four hops.
LONG = (
    "Thank you for calling the billing line. Your call may be recorded for training. "
    "To hear your balance, press one. To pay a bill, press two. For anything else, stay."
)
UPSTREAM_HOPS = HopSchedule(min_first=25, growth=(1,))  # CosyVoice2Model.tts's schedule


@dataclass
class Decoded:
    text: str
    voice: CosyVoice2Voice
    seed: int
    tokens: list[int]
    audio: np.ndarray  # int16, the stream's chunks joined


@pytest.fixture(scope="module")
def backend(tiny_model_dir: Path) -> Iterator[CosyVoice2Backend]:
    """A backend of its own: the tests change its hop schedule."""
    engine = CosyVoice2Backend(CosyVoice2Settings(model_dir=tiny_model_dir, max_streams=8))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def frontend(backend: CosyVoice2Backend) -> Any:
    return ref.upstream_frontend(backend.model)


@pytest.fixture(scope="module")
def cloned(backend: CosyVoice2Backend) -> CosyVoice2Voice:
    """A zero-shot voice as the gateway's registry hands it to the engine: the blob
    ``prepare_voice`` made, passed back as the session's profile."""
    pcm = (reference_audio(2.3, pitch_hz=120.0).numpy() * 32767).astype("<i2").tobytes()
    blob = backend.prepare_voice(pcm, None, "This is my voice.")
    return backend.resolve_voice(VoiceSettings(BASE_VOICE, profile=blob))


def decode_in_engine(
    backend: CosyVoice2Backend,
    jobs: list[tuple[str, CosyVoice2Voice]],
    monkeypatch: pytest.MonkeyPatch,
    *,
    join_after_steps: list[int] | None = None,
    audio: bool = False,
) -> list[Decoded]:
    """Run each job through ``synthesize_batch`` (one call per job, on its own thread, as
    the scheduler does), the i-th joining once the loop has run ``join_after_steps[i]``
    steps; returns what each stream decoded and streamed. Without ``audio`` the vocoder
    returns no samples (the step loop, its hops and its decode steps run as they do; the
    tiny flow model costs seconds a chunk on a loaded CPU, and tokens do not depend on
    it)."""
    if not audio:
        monkeypatch.setattr(
            backend.vocoder,
            "chunks_audio",
            lambda requests: [np.zeros(0, dtype=np.int16) for _ in requests],
        )
    opened: dict[str, Any] = {}
    real_open = backend._open

    def spy(job: SynthesisJob, emit: Any) -> Any:
        stream = real_open(job, emit)
        opened[job.text] = stream
        return stream

    monkeypatch.setattr(backend, "_open", spy)
    pieces: dict[int, list[np.ndarray]] = {i: [np.zeros(0, np.int16)] for i in range(len(jobs))}
    errors: list[BaseException] = []
    joins = join_after_steps or [0] * len(jobs)
    start = backend._loop.steps

    def run(index: int, text: str, voice: CosyVoice2Voice) -> None:
        while backend._loop.steps - start < joins[index]:
            threading.Event().wait(0.0005)
        try:
            backend.synthesize_batch(
                [SynthesisJob(text, voice, leading=True)],
                lambda _i, pcm: pieces[index].append(pcm) or True,
            )
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [
        threading.Thread(target=run, args=(i, text, voice)) for i, (text, voice) in enumerate(jobs)
    ]
    with ref.zero_source_noise():
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
    assert not errors, errors
    return [
        Decoded(
            text,
            voice,
            opened[text].llm.generator.initial_seed(),
            list(opened[text].llm.tokens),
            np.concatenate(pieces[i]),
        )
        for i, (text, voice) in enumerate(jobs)
    ]


def reference_tokens(backend: CosyVoice2Backend, frontend: Any, decoded: Decoded) -> list[int]:
    inputs = ref.model_input(
        frontend, decoded.text, decoded.voice.features, instruct=decoded.voice.instruct
    )
    return ref.upstream_tokens(backend.model, inputs, decoded.seed)


def test_the_reference_decode_step_attends_to_the_whole_cache(
    backend: CosyVoice2Backend,
) -> None:
    # What the mask shim restores: upstream's decode step (prefill, then one token with
    # a cache) gives the hidden state a full forward pass without a cache gives.
    llm = backend.model.llm
    embeds = torch.randn(1, 9, llm.llm_input_size, generator=torch.Generator().manual_seed(3))
    causal = torch.tril(torch.ones(1, 8, 8, dtype=torch.bool))
    with torch.inference_mode(), ref.transformers_451_masks(backend.model):
        _, cache = llm.llm.forward_one_step(embeds[:, :8], masks=causal, cache=None)
        step, _ = llm.llm.forward_one_step(
            embeds[:, 8:], masks=torch.ones(1, 1, 1, dtype=torch.bool), cache=cache
        )
        whole, _ = llm.llm.forward_one_step(
            embeds, masks=torch.tril(torch.ones(1, 9, 9, dtype=torch.bool)), cache=None
        )
    torch.testing.assert_close(step[0, -1], whole[0, -1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("voice_name", "text"),
    [
        ("speaker", ENGLISH),
        ("speaker", CHINESE),
        ("cloned", MIXED),
        ("cloned", ENGLISH),
        ("base", CHINESE),
        ("instruct", ENGLISH),
        ("instruct", CHINESE),
    ],
)
def test_the_engine_decodes_upstream_s_tokens(
    backend: CosyVoice2Backend,
    frontend: Any,
    cloned: CosyVoice2Voice,
    monkeypatch: pytest.MonkeyPatch,
    voice_name: str,
    text: str,
) -> None:
    voices = {
        "speaker": backend.resolve_voice(VoiceSettings(f"{BASE_VOICE}-{SPEAKER}")),
        "cloned": cloned,
        "base": backend.resolve_voice(VoiceSettings(BASE_VOICE)),
        "instruct": backend.resolve_voice(
            VoiceSettings(f"{BASE_VOICE}-{SPEAKER}", instruct="用开心的语气说")
        ),
    }
    (decoded,) = decode_in_engine(backend, [(text, voices[voice_name])], monkeypatch)
    expected = reference_tokens(backend, frontend, decoded)
    # Upstream's minimum is 2 steps per text token; steps that draw a fill token (ids
    # above EOS) give none, so a little fewer tokens than that.
    assert len(decoded.tokens) >= frontend._extract_text_token(text)[0].shape[1]
    assert decoded.tokens == expected


def test_a_text_longer_than_one_hop_schedule_decodes_upstream_s_tokens(
    backend: CosyVoice2Backend, frontend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    speaker = backend.resolve_voice(VoiceSettings(f"{BASE_VOICE}-{SPEAKER}"))
    (decoded,) = decode_in_engine(backend, [(LONG, speaker)], monkeypatch)
    assert len(decoded.tokens) > 25 + 50 + 100 + 100
    assert decoded.tokens == reference_tokens(backend, frontend, decoded)


def test_streams_joining_a_running_batch_decode_upstream_s_tokens(
    backend: CosyVoice2Backend,
    frontend: Any,
    cloned: CosyVoice2Voice,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    speaker = backend.resolve_voice(VoiceSettings(f"{BASE_VOICE}-{SPEAKER}"))
    instructed = backend.resolve_voice(VoiceSettings(BASE_VOICE, instruct="Speak slowly."))
    jobs = [(ENGLISH, speaker), (MIXED, cloned), (CHINESE, instructed), ("Goodbye.", cloned)]
    widest = backend._loop.widest
    backend._loop.widest = 0
    try:
        decoded = decode_in_engine(backend, jobs, monkeypatch, join_after_steps=[0, 3, 17, 40])
        assert backend._loop.widest >= 3  # they did share steps
    finally:
        backend._loop.widest = max(widest, backend._loop.widest)
    for stream in decoded:
        assert stream.tokens == reference_tokens(backend, frontend, stream), stream.text


def pcm16(speech: np.ndarray) -> np.ndarray:
    return np.clip(np.round(speech * 32767.0), -32768, 32767).astype(np.int16)
