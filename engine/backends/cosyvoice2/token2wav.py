"""Tokens to audio for many streams at once: the flow model batched across streams, the
vocoder with each stream's own cache.

Upstream's ``CosyVoice2Model.token2wav`` serves one stream per call: its flow model
asserts a batch of one and its classifier-free-guidance buffers are fixed at two rows. Here
each stream's chunk goes through the upstream flow's encoder alone (its lookahead context
is written for one stream; it is a small share of the work), then the flow-matching
solver runs **once for every chunk of the step**: the encoder outputs are padded on the
right to the longest, each stream's frames beyond its own length masked, and the upstream
estimator is called with 2B rows (each chunk with its conditions, then unconditioned:
classifier-free guidance as upstream weighs it). The estimator's convolutions are causal
and its normalizations per frame, so a stream's frames do not see the padding: a chunk's
mel equals what upstream's ``flow.inference`` gives it alone (tested). The noise is the
flow's fixed noise, as upstream uses it (each stream gets its prefix).

The vocoder (HiFT) then runs with upstream's per-stream caching, as ``token2wav`` does:
the last 8 mel frames and 3840 source samples carried into the next chunk, the first
3840 samples cross-faded with the held-back end of the previous chunk, and 160 ms held
back until the next chunk (all of it on the final one). Its convolutions are not causal,
so padding would change a stream's last samples: chunks are batched by bucket instead,
those with the same number of mel frames and of cached source samples in one call (the
hop schedule puts streams at the same stage of their utterance in the same bucket: 25,
50 and 100-token hops), without padding, so each gets what it gets alone.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F

from engine.backends.cosyvoice2.model_dir import LoadedModel
from engine.backends.cosyvoice2.voice import VoiceFeatures

N_TIMESTEPS: Final = 10  # upstream's flow.inference
MEL_CACHE_FRAMES: Final = 8  # CosyVoice2Model: mel_cache_len
SOURCE_CACHE_SAMPLES: Final = MEL_CACHE_FRAMES * 480  # one mel frame is 480 samples at 24 kHz


@dataclass(frozen=True)
class ChunkRequest:
    """One chunk of one stream: audio for ``tokens[offset:]`` (all of ``tokens`` is
    context; unless ``final``, the last ``lookahead`` tokens only look ahead)."""

    stream_id: str
    tokens: Sequence[int]
    voice: VoiceFeatures
    offset: int
    final: bool


@dataclass
class _Encoded:
    mu: torch.Tensor  # [80, T]
    cond: torch.Tensor  # [80, T]
    spks: torch.Tensor  # [80]
    prompt_frames: int


def to_pcm16(speech: torch.Tensor) -> npt.NDArray[np.int16]:
    """Upstream's float speech ([1, n], within ±0.99) as int16."""
    samples = speech.detach().float().cpu().numpy().reshape(-1)
    return np.clip(np.round(samples * 32767.0), -32768, 32767).astype(np.int16)


class Vocoder:
    """See the module docstring. ``open`` a stream before its first chunk and ``close``
    it after its last (or when it is cancelled): that frees its cache."""

    def __init__(self, model: LoadedModel) -> None:
        from cosyvoice.utils.common import fade_in_out
        from cosyvoice.utils.mask import make_pad_mask

        self.model = model
        self.flow: Any = model.flow
        self.hift: Any = model.hift
        self._fade_in_out = fade_in_out
        self._make_pad_mask = make_pad_mask
        self._window = np.hamming(2 * SOURCE_CACHE_SAMPLES)
        self._caches: dict[str, dict[str, torch.Tensor] | None] = {}
        self._lock = threading.Lock()
        self.lookahead = int(self.flow.pre_lookahead_len)
        self.chunk = int(self.flow.input_frame_rate)

    def open(self, stream_id: str) -> None:
        with self._lock:
            self._caches[stream_id] = None

    def close(self, stream_id: str) -> None:
        with self._lock:
            self._caches.pop(stream_id, None)

    def open_streams(self) -> int:
        with self._lock:
            return len(self._caches)

    @torch.inference_mode()
    def chunks_audio(self, requests: Sequence[ChunkRequest]) -> list[npt.NDArray[np.int16]]:
        """Every request's audio, the flow model run once for all of them."""
        if not requests:
            return []
        return self._vocode(requests, self.mels(requests))

    @torch.inference_mode()
    def mels(self, requests: Sequence[ChunkRequest]) -> list[torch.Tensor]:
        """Each request's new mel frames ([1, 80, frames]), as upstream's
        ``flow.inference(streaming=True)`` gives them, cut at its offset."""
        encoded = [self._encode(r) for r in requests]
        longest = max(e.mu.shape[1] for e in encoded)
        device, dtype = encoded[0].mu.device, encoded[0].mu.dtype
        batch = len(encoded)
        mu = torch.zeros(batch, 80, longest, device=device, dtype=dtype)
        cond = torch.zeros_like(mu)
        mask = torch.zeros(batch, 1, longest, device=device, dtype=dtype)
        spks = torch.stack([e.spks for e in encoded])
        for row, e in enumerate(encoded):
            frames = e.mu.shape[1]
            mu[row, :, :frames] = e.mu
            cond[row, :, :frames] = e.cond
            mask[row, :, :frames] = 1
        feat = self._solve(mu, mask, spks, cond)
        mels = []
        for row, (request, e) in enumerate(zip(requests, encoded, strict=True)):
            frames = e.mu.shape[1]
            new = feat[row : row + 1, :, e.prompt_frames : frames].float()
            mels.append(new[:, :, request.offset * self.flow.token_mel_ratio :])
        return mels

    def _encode(self, request: ChunkRequest) -> _Encoded:
        """Upstream ``flow.inference`` up to its decoder call, for one stream."""
        flow, voice = self.flow, request.voice
        device, dtype = self.model.device, self.model.dtype
        embedding = F.normalize(voice.embedding.to(device, dtype), dim=1)
        embedding = flow.spk_embed_affine_layer(embedding)
        token = torch.tensor([list(request.tokens)], dtype=torch.int32, device=device)
        prompt_token = voice.speech_token.to(device)
        token = torch.cat([prompt_token, token], dim=1)
        token_len = torch.tensor([token.shape[1]], dtype=torch.int32, device=device)
        pad_mask = (~self._make_pad_mask(token_len)).unsqueeze(-1).to(embedding)
        token = flow.input_embedding(torch.clamp(token, min=0)) * pad_mask
        if request.final:
            h, _ = flow.encoder(token, token_len, streaming=True)
        else:
            token, context = token[:, : -self.lookahead], token[:, -self.lookahead :]
            h, _ = flow.encoder(token, token_len, context=context, streaming=True)
        prompt_frames = voice.speech_feat.shape[1]
        h = flow.encoder_proj(h)
        cond = torch.zeros(h.shape[1], 80, device=device, dtype=h.dtype)
        cond[:prompt_frames] = voice.speech_feat[0].to(device, h.dtype)
        return _Encoded(h[0].transpose(0, 1), cond.transpose(0, 1), embedding[0], prompt_frames)

    def _solve(
        self, mu: torch.Tensor, mask: torch.Tensor, spks: torch.Tensor, cond: torch.Tensor
    ) -> torch.Tensor:
        """Upstream's Euler solver with classifier-free guidance, for B rows at once."""
        decoder = self.flow.decoder
        frames = mu.shape[2]
        x = decoder.rand_noise[:, :, :frames].to(mu.device, mu.dtype).expand(mu.shape[0], -1, -1)
        t_span = torch.linspace(0, 1, N_TIMESTEPS + 1, device=mu.device, dtype=mu.dtype)
        if decoder.t_scheduler == "cosine":
            t_span = 1 - torch.cos(t_span * 0.5 * torch.pi)
        rate = decoder.inference_cfg_rate
        t, dt = t_span[0], t_span[1] - t_span[0]
        mask_in = torch.cat([mask, mask])
        mu_in = torch.cat([mu, torch.zeros_like(mu)])
        spks_in = torch.cat([spks, torch.zeros_like(spks)])
        cond_in = torch.cat([cond, torch.zeros_like(cond)])
        for step in range(1, len(t_span)):
            t_in = t.reshape(1).expand(2 * mu.shape[0])
            dphi = decoder.forward_estimator(
                torch.cat([x, x]), mask_in, mu_in, t_in, spks_in, cond_in, True
            )
            guided, unconditioned = torch.split(dphi, [mu.shape[0], mu.shape[0]], dim=0)
            x = x + dt * ((1.0 + rate) * guided - rate * unconditioned)
            t = t + dt
            if step < len(t_span) - 1:
                dt = t_span[step + 1] - t
        solved: torch.Tensor = x
        return solved

    def _vocode(
        self, requests: Sequence[ChunkRequest], mels: Sequence[torch.Tensor]
    ) -> list[npt.NDArray[np.int16]]:
        """Upstream ``token2wav``'s vocoder half for each request, with its stream's
        cache; requests whose inputs have the same shapes run in one call."""
        inputs: list[tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor] | None]] = []
        with self._lock:
            caches = [self._caches.get(r.stream_id) for r in requests]
        for mel, cache in zip(mels, caches, strict=True):
            if cache is not None:
                inputs.append((torch.cat([cache["mel"], mel], dim=2), cache["source"], cache))
            else:
                inputs.append((mel, torch.zeros(1, 1, 0, device=mel.device), None))
        buckets: dict[tuple[int, int], list[int]] = {}
        for index, (mel, source, _) in enumerate(inputs):
            buckets.setdefault((mel.shape[2], source.shape[2]), []).append(index)
        speech: list[torch.Tensor] = [torch.empty(0)] * len(requests)
        sources: list[torch.Tensor] = [torch.empty(0)] * len(requests)
        for indices in buckets.values():
            batch_mel = torch.cat([inputs[i][0] for i in indices])
            batch_source = torch.cat([inputs[i][1] for i in indices])
            out, out_source = self.hift.inference(speech_feat=batch_mel, cache_source=batch_source)
            for row, index in enumerate(indices):
                speech[index], sources[index] = out[row : row + 1], out_source[row : row + 1]
        pieces = []
        for request, (mel, _, cache), wave, source in zip(
            requests, inputs, speech, sources, strict=True
        ):
            if cache is not None:
                wave = self._fade_in_out(wave, cache["speech"], self._window)
            if not request.final:
                kept = {
                    "mel": mel[:, :, -MEL_CACHE_FRAMES:],
                    "source": source[:, :, -SOURCE_CACHE_SAMPLES:],
                    "speech": wave[:, -SOURCE_CACHE_SAMPLES:],
                }
                with self._lock:
                    if request.stream_id in self._caches:  # not closed meanwhile
                        self._caches[request.stream_id] = kept
                wave = wave[:, :-SOURCE_CACHE_SAMPLES]
            pieces.append(to_pcm16(wave))
        return pieces
