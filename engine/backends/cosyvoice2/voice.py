"""A CosyVoice2 voice: the features of a reference recording (the seed's "reference
feature cache"), computed once, stored as a versioned blob, reused by every stream.

:class:`VoiceFeatures` holds what upstream's ``frontend_zero_shot`` produces and
``spk2info.pt`` stores: the reference transcript's text tokens, the reference's speech
tokens (``speech_tokenizer_v2.onnx`` on Whisper log-mel), its 24 kHz mel frames (two per
speech token, trimmed to match) and its speaker embedding (``campplus.onnx`` on Kaldi
fbank). :class:`FrontEnd` computes them (:mod:`engine.backends.cosyvoice2.features`);
:func:`encode` / :func:`decode` make the blob the voice registry stores in memory and
Redis under the backend's version, so a session with a registered voice starts with no
feature extraction at all.
"""

from __future__ import annotations

import io
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import soxr
import torch

from engine.backends.cosyvoice2 import features
from engine.backends.onnx_cpu import cpu_session

BLOB_MAGIC: Final = b"CV2V1\n"
MAX_REFERENCE_S: Final = 30.0  # the speech tokenizer's limit (upstream asserts it)
MIN_REFERENCE_S: Final = 0.5


class VoiceFeatureError(ValueError):
    """A reference recording or a stored blob cannot be used."""


@dataclass(frozen=True)
class VoiceFeatures:
    prompt_text: torch.Tensor  # [1, Tp] int32 text tokens of the reference transcript
    speech_token: torch.Tensor  # [1, N] int32, 25 Hz
    speech_feat: torch.Tensor  # [1, 2N, 80] float32, 50 Hz
    embedding: torch.Tensor  # [1, 192] float32
    model_version: str

    @classmethod
    def from_spk2info(cls, entry: dict[str, Any], model_version: str) -> VoiceFeatures:
        """A speaker of ``spk2info.pt`` (upstream's frontend dict)."""
        prompt_text = entry.get("prompt_text", torch.zeros(1, 0, dtype=torch.int32))
        return cls(
            prompt_text=prompt_text.to(torch.int32).cpu(),
            speech_token=entry["flow_prompt_speech_token"].to(torch.int32).cpu(),
            speech_feat=entry["prompt_speech_feat"].float().cpu(),
            embedding=entry["flow_embedding"].float().cpu(),
            model_version=model_version,
        )

    def as_spk2info(self) -> dict[str, torch.Tensor]:
        """Upstream's frontend dict for this voice (what ``spk2info.pt`` holds)."""
        n = self.speech_token.shape[1]
        return {
            "prompt_text": self.prompt_text,
            "prompt_text_len": torch.tensor([self.prompt_text.shape[1]], dtype=torch.int32),
            "llm_prompt_speech_token": self.speech_token,
            "llm_prompt_speech_token_len": torch.tensor([n], dtype=torch.int32),
            "flow_prompt_speech_token": self.speech_token,
            "flow_prompt_speech_token_len": torch.tensor([n], dtype=torch.int32),
            "prompt_speech_feat": self.speech_feat,
            "prompt_speech_feat_len": torch.tensor([self.speech_feat.shape[1]], dtype=torch.int32),
            "llm_embedding": self.embedding,
            "flow_embedding": self.embedding,
        }


def encode(voice: VoiceFeatures) -> bytes:
    """The versioned blob (magic, a JSON header line, then an ``.npz`` of the arrays)."""
    arrays = io.BytesIO()
    np.savez(
        arrays,
        prompt_text=voice.prompt_text.numpy(),
        speech_token=voice.speech_token.numpy(),
        speech_feat=voice.speech_feat.numpy(),
        embedding=voice.embedding.numpy(),
    )
    header = json.dumps({"model_version": voice.model_version}).encode() + b"\n"
    return BLOB_MAGIC + header + arrays.getvalue()


def decode(blob: bytes, model_version: str) -> VoiceFeatures:
    """Parse a blob from :func:`encode`; raises :class:`VoiceFeatureError` when it is not
    one or was made by another model version (its features would be wrong)."""
    if not blob.startswith(BLOB_MAGIC):
        raise VoiceFeatureError("not a CosyVoice2 voice profile")
    header_end = blob.find(b"\n", len(BLOB_MAGIC))
    if header_end < 0:
        raise VoiceFeatureError("truncated CosyVoice2 voice profile")
    try:
        header = json.loads(blob[len(BLOB_MAGIC) : header_end])
        with np.load(io.BytesIO(blob[header_end + 1 :]), allow_pickle=False) as arrays:
            parts = {name: torch.from_numpy(arrays[name].copy()) for name in arrays.files}
        voice = VoiceFeatures(
            prompt_text=parts["prompt_text"].to(torch.int32),
            speech_token=parts["speech_token"].to(torch.int32),
            speech_feat=parts["speech_feat"].float(),
            embedding=parts["embedding"].float(),
            model_version=str(header["model_version"]),
        )
    except (ValueError, KeyError, OSError) as exc:
        raise VoiceFeatureError(f"corrupt CosyVoice2 voice profile: {exc}") from exc
    if voice.model_version != model_version:
        raise VoiceFeatureError(
            f"voice profile made by {voice.model_version}, this engine runs {model_version}"
        )
    return voice


class FrontEnd:
    """Computes :class:`VoiceFeatures` from 16 kHz PCM and its transcript (CPU: the ONNX
    models run on the CPU provider, as upstream runs campplus)."""

    def __init__(self, directory: Path, tokenizer: Any, model_version: str) -> None:
        self._speech_tokenizer = cpu_session(str(directory / "speech_tokenizer_v2.onnx"))
        self._campplus = cpu_session(str(directory / "campplus.onnx"))
        self._tokenizer = tokenizer
        # Hugging Face's fast tokenizers are not safe to call from several threads at
        # once ("Already borrowed"); the scheduler's worker threads open streams at once.
        self._tokenizer_lock = threading.Lock()
        self.model_version = model_version

    def text_tokens(self, text: str) -> torch.Tensor:
        """[1, T] int32 text tokens."""
        with self._tokenizer_lock:
            ids = self._tokenizer.encode(text)
        return torch.tensor([ids], dtype=torch.int32).reshape(1, -1)

    def speech_tokens(self, audio16k: torch.Tensor) -> torch.Tensor:
        mel = features.whisper_log_mel(audio16k)
        inputs = self._speech_tokenizer.get_inputs()
        tokens = self._speech_tokenizer.run(
            None,
            {
                inputs[0].name: mel.numpy(),
                inputs[1].name: np.array([mel.shape[2]], dtype=np.int32),
            },
        )[0]
        return torch.from_numpy(np.asarray(tokens).reshape(1, -1).astype(np.int32))

    def embedding(self, audio16k: torch.Tensor) -> torch.Tensor:
        fbank = features.kaldi_fbank(audio16k)
        fbank = fbank - fbank.mean(dim=0, keepdim=True)
        name = self._campplus.get_inputs()[0].name
        out = self._campplus.run(None, {name: fbank.unsqueeze(0).numpy()})[0]
        return torch.from_numpy(np.asarray(out, dtype=np.float32).reshape(1, -1))

    def prepare(self, pcm16k: np.ndarray, transcript: str) -> VoiceFeatures:
        """Features of a reference (int16 mono PCM at 16 kHz) and what it says."""
        seconds = len(pcm16k) / features.WHISPER_RATE
        if not MIN_REFERENCE_S <= seconds <= MAX_REFERENCE_S:
            raise VoiceFeatureError(
                f"reference audio must last {MIN_REFERENCE_S}-{MAX_REFERENCE_S:.0f} s, "
                f"got {seconds:.1f} s"
            )
        audio16k = torch.from_numpy(pcm16k.astype(np.float32) / 32768.0)
        audio24k = soxr.resample(audio16k.numpy(), features.WHISPER_RATE, features.PROMPT_RATE)
        speech_feat = features.prompt_mel(torch.from_numpy(np.ascontiguousarray(audio24k)))
        speech_token = self.speech_tokens(audio16k)
        # Two mel frames per speech token, as upstream trims them for CosyVoice2.
        n = min(speech_feat.shape[1] // 2, speech_token.shape[1])
        if n == 0:
            raise VoiceFeatureError("reference audio too short for a speech token")
        return VoiceFeatures(
            prompt_text=self.text_tokens(transcript),
            speech_token=speech_token[:, :n].contiguous(),
            speech_feat=speech_feat[:, : 2 * n].contiguous(),
            embedding=self.embedding(audio16k),
            model_version=self.model_version,
        )
