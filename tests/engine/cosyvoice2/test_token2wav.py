"""The flow model batched across streams gives each chunk what upstream's
``flow.inference`` gives it alone, and the vocoder's caches are each stream's own."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.backends.base import VoiceSettings
from engine.backends.cosyvoice2.backend import BASE_VOICE, CosyVoice2Backend
from engine.backends.cosyvoice2.token2wav import ChunkRequest
from engine.backends.cosyvoice2.voice import decode
from tests.engine.cosyvoice2.tiny_model import reference_audio


def upstream_mel(backend: CosyVoice2Backend, request: ChunkRequest) -> torch.Tensor:
    flow, voice = backend.model.flow, request.voice
    token = torch.tensor([list(request.tokens)], dtype=torch.int32)
    mel, _ = flow.inference(
        token=token,
        token_len=torch.tensor([token.shape[1]], dtype=torch.int32),
        prompt_token=voice.speech_token,
        prompt_token_len=torch.tensor([voice.speech_token.shape[1]], dtype=torch.int32),
        prompt_feat=voice.speech_feat,
        prompt_feat_len=torch.tensor([voice.speech_feat.shape[1]], dtype=torch.int32),
        embedding=voice.embedding,
        streaming=True,
        finalize=request.final,
    )
    new: torch.Tensor = mel[:, :, request.offset * flow.token_mel_ratio :]
    return new


def test_batched_flow_equals_upstream_per_stream(cosyvoice2: CosyVoice2Backend) -> None:
    base = cosyvoice2.resolve_voice(VoiceSettings(BASE_VOICE)).features
    pcm = (reference_audio(2.3).numpy() * 32767).astype("<i2").tobytes()
    cloned = decode(cosyvoice2.prepare_voice(pcm, None, "My voice."), cosyvoice2.version)
    rng = np.random.default_rng(7)
    speech_tokens = cosyvoice2.model.speech_token_size
    requests = [
        ChunkRequest("a", rng.integers(0, speech_tokens, 28).tolist(), base, 0, False),
        ChunkRequest("b", rng.integers(0, speech_tokens, 53).tolist(), cloned, 25, False),
        ChunkRequest("c", rng.integers(0, speech_tokens, 61).tolist(), cloned, 50, True),
        ChunkRequest("d", rng.integers(0, speech_tokens, 40).tolist(), base, 25, True),
    ]
    batched = cosyvoice2.vocoder.mels(requests)
    for request, mel in zip(requests, batched, strict=True):
        alone = upstream_mel(cosyvoice2, request)
        assert mel.shape == alone.shape, request.stream_id
        torch.testing.assert_close(mel, alone, atol=1e-4, rtol=1e-4)


def test_each_stream_keeps_its_own_vocoder_cache(cosyvoice2: CosyVoice2Backend) -> None:
    base = cosyvoice2.resolve_voice(VoiceSettings(BASE_VOICE)).features
    tokens = list(range(1, 29))
    vocoder = cosyvoice2.vocoder
    for stream_id in ("x", "y"):
        vocoder.open(stream_id)
    try:
        first = vocoder.chunks_audio(
            [ChunkRequest("x", tokens, base, 0, False), ChunkRequest("y", tokens, base, 0, False)]
        )
        assert [len(p) for p in first] == [25 * 960 - 3840] * 2
        # y's next chunk follows its own first; x is closed (cancelled) and forgotten.
        vocoder.close("x")
        more = tokens + list(range(2, 27))
        (second,) = vocoder.chunks_audio([ChunkRequest("y", more, base, 25, False)])
        assert len(second) == 25 * 960
        assert vocoder.open_streams() == 1
    finally:
        vocoder.close("y")
    assert vocoder.open_streams() == 0


def test_chunks_of_the_same_shape_share_a_vocoder_call_and_get_what_they_get_alone(
    cosyvoice2: CosyVoice2Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # HiFT's source module draws random phases and noise: draw zeros, so that a stream's
    # audio alone and in a batch can be compared sample by sample.
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.zeros(*a, **k))
    monkeypatch.setattr(torch, "randn_like", lambda x, **k: torch.zeros_like(x, **k))
    base = cosyvoice2.resolve_voice(VoiceSettings(BASE_VOICE)).features
    rng = np.random.default_rng(11)
    tokens = [rng.integers(0, cosyvoice2.model.speech_token_size, 28).tolist() for _ in range(3)]
    vocoder = cosyvoice2.vocoder
    calls = {"n": 0}
    real = vocoder.hift.inference

    def counting(**kwargs: torch.Tensor) -> object:
        calls["n"] += 1
        return real(**kwargs)

    monkeypatch.setattr(vocoder.hift, "inference", counting)
    requests = [ChunkRequest(f"s{i}", t, base, 0, False) for i, t in enumerate(tokens)]
    ragged = ChunkRequest("r", tokens[0][:26], base, 0, True)  # another shape: its own call
    for request in (*requests, ragged):
        vocoder.open(request.stream_id)
    try:
        together = vocoder.chunks_audio([*requests, ragged])
        assert calls["n"] == 2
        for request, audio in zip(requests, together[: len(requests)], strict=True):
            vocoder.close(request.stream_id)
            vocoder.open(request.stream_id)
            (alone,) = vocoder.chunks_audio([request])
            np.testing.assert_allclose(audio.astype(float), alone.astype(float), atol=2)
    finally:
        for request in (*requests, ragged):
            vocoder.close(request.stream_id)
