"""The LLM's precision is a setting (``COSYVOICE2_LLM_DTYPE``): bfloat16 weights and KV
cache, float32 sampling; float32 (upstream's, and the conformance's) by default."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from engine.backends.base import VoiceSettings
from engine.backends.cosyvoice2.backend import BASE_VOICE, CosyVoice2Backend, CosyVoice2Settings
from engine.ipc.env import ConfigError


def test_the_llm_runs_in_bfloat16_when_asked(tiny_model_dir: Path) -> None:
    settings = CosyVoice2Settings.from_env(
        {"COSYVOICE2_MODEL_DIR": str(tiny_model_dir), "COSYVOICE2_LLM_DTYPE": "bfloat16"}
    )
    backend = CosyVoice2Backend(settings)
    try:
        assert {p.dtype for p in backend.model.llm.parameters()} == {torch.bfloat16}
        assert {p.dtype for p in backend.model.flow.parameters()} == {torch.float32}
        backend.decoder.max_token_text_ratio = 3  # random weights: a short utterance
        voice = backend.resolve_voice(VoiceSettings(BASE_VOICE))
        audio: list[int] = []

        def emit(pcm: np.ndarray) -> bool:
            audio.append(len(pcm))
            return True

        backend.synthesize("Press one.", voice, emit)
        assert sum(audio) > 0 and sum(audio) % 960 == 0
        assert backend.decoder.pool is not None
        assert backend.decoder.pool.dtype == torch.bfloat16
        assert backend.decoder.pool.used == 0  # every slot given back
    finally:
        backend.close()


def test_the_llm_precision_defaults_to_float32_and_is_checked(tiny_model_dir: Path) -> None:
    env = {"COSYVOICE2_MODEL_DIR": str(tiny_model_dir)}
    assert CosyVoice2Settings.from_env(env).torch_llm_dtype() == torch.float32
    with pytest.raises(ConfigError, match="COSYVOICE2_LLM_DTYPE"):
        CosyVoice2Settings.from_env({**env, "COSYVOICE2_LLM_DTYPE": "int8"}).torch_llm_dtype()
