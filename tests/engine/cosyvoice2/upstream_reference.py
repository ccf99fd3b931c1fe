"""Upstream's own CosyVoice2 inference path, run on a loaded model directory, as the
reference the engine is compared against (tests/engine/cosyvoice2/test_conformance.py,
tests/bench/cosyvoice2_conformance.py).

What runs is upstream's code, unmodified: ``Qwen2LM.inference`` (its prompt layout,
KV cache, ``sampling_ids`` with the yaml's ``ras_sampling``, EOS and fill-token rules),
``CosyVoice2Model.tts`` (its LLM thread, hop schedule, ``token2wav``, HiFT caches and
cross-fades) and ``CosyVoiceFrontEnd`` (its tokenizer calls and its spk2info path). Three
things are set around it, and each is named where it is done:

- **Random draws.** Upstream samples from the global generator; the engine from a
  per-stream ``torch.Generator`` seeded with the stream's seed. :func:`seeded` seeds the
  global generator with that seed before upstream runs, so both sides draw the same
  numbers: ``torch.multinomial`` of one sample takes the same path with or without
  replacement. On a GPU, upstream would draw from the CUDA generator: :func:`draws_on_cpu`
  moves its sampling's scores to the CPU (the engine samples on the CPU too).
- **The attention mask of upstream's decode step** (:func:`transformers_451_masks`).
  ``inference_wrapper`` passes a one-column mask with each decode step. Under upstream's
  pinned transformers 4.51.3 an all-ones mask is dropped (full causal attention over the
  cache); transformers 5 pads a short mask with **zeros**, so upstream's own decode loop
  attends to the first position only and speaks something else. The context manager
  hands ``forward_one_step`` the full-length all-ones mask, which is what 4.51.3 made of
  the short one. Checked against a separate install of transformers 4.51.3 running the
  unmodified code (docs/cosyvoice2.md), and by a test here: the patched decode step
  equals a full forward pass without a cache.
- **HiFT's random source** (:func:`zero_source_noise`): its sine generator draws random
  initial phases and noise from the global generator, on upstream's main thread while
  its LLM thread draws tokens from the same generator; drawing zeros makes the audio a
  function of the tokens (the engine's vocoder is the same upstream module, also
  patched).

``CosyVoice2Model`` in this packaging (``cosyvoice-minicpmo`` 0.1.0) does not keep the
``llm`` it is given (the line is commented out); :func:`upstream_model` sets it, as the
upstream repository's constructor does.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from engine.backends.cosyvoice2 import upstream
from engine.backends.cosyvoice2.model_dir import LoadedModel
from engine.backends.cosyvoice2.voice import VoiceFeatures

ENDOFPROMPT = "<|endofprompt|>"


def _int32(n: int) -> torch.Tensor:
    return torch.tensor([n], dtype=torch.int32)


@contextlib.contextmanager
def transformers_451_masks(model: LoadedModel) -> Iterator[None]:
    """Upstream's decode steps with the mask transformers 4.51.3 made of it (see the
    module docstring)."""
    encoder = model.llm.llm
    original = encoder.forward_one_step

    def forward_one_step(xs: torch.Tensor, masks: torch.Tensor, cache: Any = None) -> Any:
        past = cache.get_seq_length() if cache is not None else 0
        full = torch.ones(1, xs.shape[1], past + xs.shape[1], dtype=torch.bool, device=xs.device)
        return original(xs, full, cache)

    encoder.forward_one_step = forward_one_step
    try:
        yield
    finally:
        del encoder.forward_one_step  # the class's method again


@contextlib.contextmanager
def draws_on_cpu(model: LoadedModel) -> Iterator[None]:
    """Upstream's sampling on CPU scores, so it draws from the CPU generator as the
    engine does, whatever the model's device."""
    llm = model.llm
    original = llm.sampling

    def sampling(scores: torch.Tensor, decoded: list[int], top_k: int) -> torch.Tensor:
        picked: torch.Tensor = original(scores.float().cpu(), decoded, top_k)
        return picked

    llm.sampling = sampling
    try:
        yield
    finally:
        llm.sampling = original


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """The global CPU generator seeded with ``seed`` (its state restored afterwards)."""
    state = torch.get_rng_state()
    torch.manual_seed(seed)
    try:
        yield
    finally:
        torch.set_rng_state(state)


@contextlib.contextmanager
def zero_source_noise() -> Iterator[None]:
    """HiFT's sine source with zero initial phases and zero noise (module docstring)."""
    rand, randn_like = torch.rand, torch.randn_like
    torch.rand = lambda *a, **k: torch.zeros(*a, **k)
    torch.randn_like = lambda x, **k: torch.zeros_like(x, **k)  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.rand, torch.randn_like = rand, randn_like


def upstream_frontend(model: LoadedModel) -> Any:
    """Upstream's ``CosyVoiceFrontEnd`` on the directory's tokenizer and ONNX models
    (its feature extractor is not needed for the paths used here)."""
    if "inflect" not in sys.modules and importlib.util.find_spec("inflect") is None:
        # The module imports inflect for its English number spelling, which is not
        # called here; a stand-in that refuses use, as the engine's stand-ins do.
        sys.modules["inflect"] = upstream._stand_in("inflect", ("engine",))
    from cosyvoice.cli.frontend import CosyVoiceFrontEnd
    from cosyvoice.tokenizer.tokenizer import get_qwen_tokenizer

    directory = model.directory
    frontend = CosyVoiceFrontEnd(
        functools.partial(
            get_qwen_tokenizer,
            token_path=str(directory / "CosyVoice-BlankEN"),
            skip_special_tokens=True,
        ),
        None,
        str(directory / "campplus.onnx"),
        str(directory / "speech_tokenizer_v2.onnx"),
        str(directory / "spk2info.pt"),
        "all",
    )
    return with_engine_rules(frontend)


class _EngineRules:
    """A text-normalization model for upstream's frontend: the engine's rules in place
    of WeText (which this packaging's frontend does not even construct)."""

    def __init__(self, language: str) -> None:
        self.language = language

    def normalize(self, text: str) -> str:
        from engine.normalize import spoken
        from engine.text import normalize

        return spoken(normalize(text), self.language)


def with_engine_rules(frontend: Any) -> Any:
    """Upstream's frontend, its ``text_normalize`` running with the engine's rules as its
    text-normalization models (``use_ttsfrd`` off: upstream's WeText branch), and a
    number speller that refuses use (the rules leave no digits to spell)."""
    frontend.use_ttsfrd = False
    frontend.zh_tn_model = _EngineRules("zh")
    frontend.en_tn_model = _EngineRules("en")
    frontend.inflect_parser = upstream._Unavailable("inflect.engine()")
    return frontend


def upstream_text_tokens(frontend: Any, text: str) -> list[int]:
    """Upstream's token ids for ``text``: ``text_normalize(split=False)``, then its
    ``_extract_text_token``."""
    normalized = frontend.text_normalize(text, split=False, text_frontend=True)
    tokens, _ = frontend._extract_text_token(normalized)
    return [int(t) for t in tokens[0]]


def model_input(
    frontend: Any, text: str, voice: VoiceFeatures, *, instruct: str | None = None
) -> dict[str, torch.Tensor]:
    """Upstream's model input for ``text`` in ``voice``: ``frontend_zero_shot`` with the
    voice stored as a zero-shot speaker (``add_zero_shot_spk``'s dict), and for an
    instruction ``frontend_instruct2``'s layout (the instruction and ``<|endofprompt|>``
    as the prompt text, no LLM prompt speech) as its branch for a fresh reference builds
    it: its branch for a stored speaker keeps the stored transcript instead (a known
    upstream quirk), which is not what instruct2 means."""
    frontend.spk2info["voice"] = {k: v.clone() for k, v in voice.as_spk2info().items()}
    text = frontend.text_normalize(text, split=False, text_frontend=True)
    inputs = dict(frontend.frontend_zero_shot(text, "", None, 24000, "voice"))
    if instruct is not None:
        prompt, prompt_len = frontend._extract_text_token(instruct + ENDOFPROMPT)
        inputs.update(prompt_text=prompt, prompt_text_len=prompt_len)
        del inputs["llm_prompt_speech_token"], inputs["llm_prompt_speech_token_len"]
    return inputs


def upstream_tokens(
    model: LoadedModel,
    inputs: dict[str, torch.Tensor],
    seed: int,
    *,
    max_token_text_ratio: float = 20.0,
) -> list[int]:
    """The speech tokens of upstream's ``Qwen2LM.inference`` for ``inputs``, drawing
    from a generator seeded with ``seed``."""
    device = model.device
    speech = inputs.get("llm_prompt_speech_token", torch.zeros(1, 0, dtype=torch.int32))
    with transformers_451_masks(model), draws_on_cpu(model), seeded(seed):
        return [
            int(token)
            for token in model.llm.inference(
                text=inputs["text"].to(device),
                text_len=_int32(inputs["text"].shape[1]).to(device),
                prompt_text=inputs["prompt_text"].to(device),
                prompt_text_len=_int32(inputs["prompt_text"].shape[1]).to(device),
                prompt_speech_token=speech.to(device),
                prompt_speech_token_len=_int32(speech.shape[1]).to(device),
                embedding=inputs["llm_embedding"].to(device),
                max_token_text_ratio=max_token_text_ratio,
            )
        ]


def upstream_model(model: LoadedModel) -> Any:
    from cosyvoice.cli.model import CosyVoice2Model

    cv2 = CosyVoice2Model(model.llm, model.flow, model.hift, fp16=False)
    cv2.llm = model.llm  # see the module docstring
    cv2.device = model.device
    return cv2


class _Capped:
    """The LLM with upstream's ``max_token_text_ratio`` set (``tts`` passes none)."""

    def __init__(self, llm: Any, ratio: float) -> None:
        self._llm, self._ratio = llm, ratio

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llm, name)

    def inference(self, **kwargs: Any) -> Any:
        return self._llm.inference(**kwargs, max_token_text_ratio=self._ratio)


def upstream_speech(
    model: LoadedModel,
    inputs: dict[str, torch.Tensor],
    seed: int,
    *,
    stream: bool,
    max_ratio: float = 20.0,
) -> list[npt.NDArray[np.float32]]:
    """What upstream's ``CosyVoice2Model.tts`` yields (float in [-1, 1]), with zero
    source noise and tokens drawn from ``seed``."""
    cv2 = upstream_model(model)
    cv2.llm = _Capped(model.llm, max_ratio)
    with transformers_451_masks(model), draws_on_cpu(model), seeded(seed), zero_source_noise():
        return [
            out["tts_speech"].float().numpy().reshape(-1)
            for out in cv2.tts(**dict(inputs), stream=stream)
        ]
