"""A CosyVoice2 model directory in the official layout, loaded with the upstream classes.

The layout (``CosyVoice2-0.5B`` as published): ``cosyvoice2.yaml`` (HyperPyYAML that names
the upstream classes and their sizes), ``llm.pt``, ``flow.pt``, ``hift.pt`` (state dicts),
``campplus.onnx`` (speaker embedding), ``speech_tokenizer_v2.onnx`` (speech tokens) and
``CosyVoice-BlankEN/`` (the Qwen2 configuration, weights and tokenizer the LLM is built
on); ``spk2info.pt`` (built-in speakers) is optional. Nothing is fetched from a hub: a
directory that lacks a file is refused with the file's name.

Only the ``llm``, ``flow`` and ``hift`` sections of the yaml (and its plain top-level
values) are built: the official file also describes training (a GAN discriminator that
imports torchaudio, data pipelines), which inference never needs, and its ``!apply``
seeding lines would reseed the process's global generators.

The model's version (:func:`model_version`) is a digest of the yaml, and of each weight
file's size and first and last MiB: it changes when any file is replaced, and costs
milliseconds rather than hashing 3 GB at every start. Voice features are stored under it,
so replacing the model invalidates them.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import torch

from engine.backends.cosyvoice2 import upstream

log = logging.getLogger(__name__)

YAML_NAME: Final = "cosyvoice2.yaml"
BLANK_EN: Final = "CosyVoice-BlankEN"
WEIGHT_FILES: Final = ("llm.pt", "flow.pt", "hift.pt", "campplus.onnx", "speech_tokenizer_v2.onnx")
REQUIRED: Final = (YAML_NAME, *WEIGHT_FILES, BLANK_EN)
SPEAKERS_FILE: Final = "spk2info.pt"
MODEL_SECTIONS: Final = ("llm", "flow", "hift")
DIGEST_SPAN: Final = 1 << 20
_TOP_LEVEL = re.compile(r"^([A-Za-z_][\w]*)\s*:(.*)$")


class ModelDirError(ValueError):
    """The directory is not a usable CosyVoice2 model directory."""


@dataclass
class SamplingParams:
    """Repetition-aware sampling (the yaml's ``ras_sampling`` arguments)."""

    top_p: float = 0.8
    top_k: int = 25
    win_size: int = 10
    tau_r: float = 0.1


@dataclass
class LoadedModel:
    """The modules of one model directory, on one device, in eval mode."""

    directory: Path
    version: str
    device: torch.device
    dtype: torch.dtype
    llm: Any  # cosyvoice.llm.llm.Qwen2LM
    flow: Any  # cosyvoice.flow.flow.CausalMaskedDiffWithXvec
    hift: Any  # cosyvoice.hifigan.generator.HiFTGenerator
    tokenizer: Any  # cosyvoice.tokenizer.tokenizer.QwenTokenizer
    sampling: SamplingParams
    sample_rate: int
    speakers: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)

    @property
    def speech_token_size(self) -> int:
        return int(self.llm.speech_token_size)


def check_layout(directory: Path) -> None:
    """Raise :class:`ModelDirError` naming what is missing."""
    if not directory.is_dir():
        raise ModelDirError(f"COSYVOICE2_MODEL_DIR {directory} is not a directory")
    missing = [name for name in REQUIRED if not (directory / name).exists()]
    if missing:
        legacy = (
            " (cosyvoice.yaml is CosyVoice 1's name)"
            if (directory / "cosyvoice.yaml").exists()
            else ""
        )
        raise ModelDirError(
            f"{directory} is not a CosyVoice2 model directory: missing {', '.join(missing)}{legacy}"
        )


def model_version(directory: Path) -> str:
    """A digest that changes whenever the yaml or a weight file changes."""
    digest = hashlib.blake2b(digest_size=12)
    digest.update((directory / YAML_NAME).read_bytes())
    for name in WEIGHT_FILES:
        path = directory / name
        size = path.stat().st_size
        digest.update(f"{name}:{size}".encode())
        with path.open("rb") as handle:
            digest.update(handle.read(DIGEST_SPAN))
            if size > DIGEST_SPAN:
                handle.seek(max(DIGEST_SPAN, size - DIGEST_SPAN))
                digest.update(handle.read(DIGEST_SPAN))
    blank_config = directory / BLANK_EN / "config.json"
    if blank_config.exists():
        digest.update(blank_config.read_bytes())
    return f"cosyvoice2-{digest.hexdigest()}"


def inference_yaml(text: str) -> str:
    """The yaml's plain top-level values and its model sections, nothing else."""
    kept: list[str] = []
    keep_block = False
    for line in text.splitlines():
        match = _TOP_LEVEL.match(line)
        if match:
            key, value = match.group(1), match.group(2).strip()
            plain = bool(value) and not value.startswith(("!new:", "!apply:", "!name:", "["))
            keep_block = key in MODEL_SECTIONS or (plain and not key.startswith("__"))
        elif line and not line[0].isspace() and not line.startswith("#"):
            keep_block = False
        if keep_block:
            kept.append(line)
    return "\n".join(kept) + "\n"


def _sampling_params(partial: Any) -> SamplingParams:
    keywords = dict(getattr(partial, "keywords", {}) or {})
    defaults = SamplingParams()
    return SamplingParams(
        top_p=float(keywords.get("top_p", defaults.top_p)),
        top_k=int(keywords.get("top_k", defaults.top_k)),
        win_size=int(keywords.get("win_size", defaults.win_size)),
        tau_r=float(keywords.get("tau_r", defaults.tau_r)),
    )


def _load_state(module: torch.nn.Module, path: Path, device: torch.device, strip: str = "") -> None:
    state = torch.load(path, map_location=device, weights_only=True)
    if strip:
        state = {key.removeprefix(strip): value for key, value in state.items()}
    module.load_state_dict(state, strict=True)


def load(
    directory: Path,
    device: torch.device,
    dtype: torch.dtype,
    *,
    llm_dtype: torch.dtype = torch.float32,
) -> LoadedModel:
    """Build the modules from the yaml and load their weights (upstream classes); the
    flow model in ``dtype``, the LLM in ``llm_dtype``."""
    check_layout(directory)
    upstream.require()
    from cosyvoice.tokenizer.tokenizer import QwenTokenizer
    from hyperpyyaml import load_hyperpyyaml

    blank_en = str(directory / BLANK_EN)
    text = inference_yaml((directory / YAML_NAME).read_text())
    try:
        config = load_hyperpyyaml(text, overrides={"qwen_pretrain_path": blank_en})
    except Exception as exc:
        raise ModelDirError(f"{directory / YAML_NAME}: cannot build the model: {exc}") from exc
    missing = [name for name in MODEL_SECTIONS if name not in config]
    if missing:
        raise ModelDirError(f"{directory / YAML_NAME} has no {', '.join(missing)} section")
    llm, flow, hift = config["llm"], config["flow"], config["hift"]
    try:
        _load_state(llm, directory / "llm.pt", device)
        _load_state(flow, directory / "flow.pt", device)
        # The published hift.pt keys carry the GAN wrapper's "generator." prefix.
        _load_state(hift, directory / "hift.pt", device, strip="generator.")
    except (RuntimeError, KeyError) as exc:
        raise ModelDirError(f"{directory}: weights do not fit {YAML_NAME}: {exc}") from exc
    llm.to(device=device, dtype=llm_dtype).eval()
    flow.to(device=device, dtype=dtype).eval()
    hift.to(device).eval()  # the vocoder stays float32: its source module is not fp16-safe
    speakers: dict[str, dict[str, torch.Tensor]] = {}
    speakers_path = directory / SPEAKERS_FILE
    if speakers_path.exists():
        speakers = torch.load(speakers_path, map_location="cpu", weights_only=True)
    return LoadedModel(
        directory=directory,
        version=model_version(directory),
        device=device,
        dtype=dtype,
        llm=llm,
        flow=flow,
        hift=hift,
        tokenizer=QwenTokenizer(blank_en, skip_special_tokens=True),
        sampling=_sampling_params(llm.sampling),
        sample_rate=int(config.get("sample_rate", 24000)),
        speakers=speakers,
    )
