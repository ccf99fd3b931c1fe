"""The one place the upstream CosyVoice code is imported.

The PyPI package ``cosyvoice-minicpmo`` (Apache-2.0) carries the FunAudioLLM CosyVoice
sources (import name ``cosyvoice``) and Matcha-TTS (``matcha``). It is installed without
its declared dependencies (``make cosyvoice2``: they pull torchaudio, onnxruntime-gpu,
openai-whisper and modelscope), and the modules this backend uses import three things at
module level that the inference path never calls:

- ``torchaudio``: ``cosyvoice.utils.file_utils`` imports it for ``load_wav`` (reading
  files; the engine gets PCM), and PyPI's torchaudio wheels do not load against the CPU
  build of torch here;
- ``whisper``: ``cosyvoice.tokenizer.tokenizer`` imports it for CosyVoice 1's tokenizer
  (CosyVoice2 uses the Qwen tokenizer of the same module);
- ``matcha.utils``: its package ``__init__`` imports training tools (hydra, lightning,
  rich) to give ``matcha.models.components.flow_matching`` one logger.

So before the first import, :func:`install_stand_ins` registers a module for each that
has what the import statements need and nothing else: any other attribute of a stand-in,
and calling any name it lends, raises :class:`StandInTouched`. The tests run the real
loading and inference code with these stand-ins and would fail on any use; a real module
already importable is left alone. ``matcha.utils.pylogger.get_pylogger`` is the one name
that works: it returns a :mod:`logging` logger, which is all Matcha's own does besides
rank-zero filtering for distributed training.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import threading
import types
import warnings
from collections.abc import Callable
from typing import Any, Final


class StandInTouched(RuntimeError):
    """Code used a module this backend replaced: a code path the backend must not take."""


class UpstreamUnavailable(ImportError):
    """The CosyVoice sources (or a package their inference path imports) are missing."""


# Module -> names an upstream ``from <module> import <name>`` statement needs.
_STAND_INS: Final[dict[str, tuple[str, ...]]] = {
    "torchaudio": ("compliance", "transforms", "functional", "load", "save"),
    "torchaudio.compliance": ("kaldi",),
    "torchaudio.compliance.kaldi": ("fbank",),
    "torchaudio.transforms": ("Spectrogram", "Resample", "MelSpectrogram"),
    "whisper": ("tokenizer", "log_mel_spectrogram"),
    "whisper.tokenizer": ("Tokenizer", "get_tokenizer", "LANGUAGES"),
}
_MATCHA_UTILS: Final = ("matcha.utils", "matcha.utils.pylogger")
# The packages the inference path imports (the ``cosyvoice2`` extra in pyproject.toml).
REQUIRED_PACKAGES: Final = (
    "cosyvoice",
    "matcha",
    "transformers",
    "conformer",
    "diffusers",
    "einops",
    "hyperpyyaml",
    "omegaconf",
    "scipy",
)

_lock = threading.Lock()
_installed: list[str] = []


class _Unavailable:
    """A name a stand-in lends so that ``from m import name`` works; using it raises."""

    def __init__(self, qualified: str) -> None:
        self._qualified = qualified

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise StandInTouched(f"{self._qualified} was called: not available in this engine")

    def __getattr__(self, name: str) -> Any:
        raise StandInTouched(f"{self._qualified}.{name} was used: not available in this engine")


class _StandInModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise StandInTouched(f"{self.__name__}.{name} was used: not available in this engine")


def _stand_in(name: str, lends: tuple[str, ...]) -> types.ModuleType:
    module = _StandInModule(name, "stand-in registered by engine.backends.cosyvoice2.upstream")
    module.__spec__ = importlib.util.spec_from_loader(name, loader=None)
    module.__path__ = []  # a package: submodules resolve through sys.modules
    for attr in lends:
        child = f"{name}.{attr}"
        setattr(module, attr, sys.modules.get(child) or _Unavailable(child))
    return module


def _logger_utils() -> dict[str, types.ModuleType]:
    package = types.ModuleType("matcha.utils", "logger-only stand-in for Matcha's utils")
    package.__spec__ = importlib.util.spec_from_loader("matcha.utils", loader=None)
    package.__path__ = []
    pylogger = types.ModuleType("matcha.utils.pylogger")
    pylogger.__spec__ = importlib.util.spec_from_loader("matcha.utils.pylogger", loader=None)
    get_pylogger: Callable[[str], logging.Logger] = logging.getLogger
    pylogger.get_pylogger = get_pylogger  # type: ignore[attr-defined]
    package.pylogger = pylogger  # type: ignore[attr-defined]
    return {"matcha.utils": package, "matcha.utils.pylogger": pylogger}


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def install_stand_ins() -> list[str]:
    """Register the stand-ins (once; modules that really import are left alone) and
    return the names registered."""
    with _lock:
        if _installed:
            return list(_installed)
        # Deepest first, so that a parent lends its registered child module.
        for name in sorted(_STAND_INS, key=lambda n: -n.count(".")):
            top = name.split(".", 1)[0]
            if name in sys.modules or _real_module_works(top):
                continue
            sys.modules[name] = _stand_in(name, _STAND_INS[name])
            _installed.append(name)
        if "matcha.utils" not in sys.modules:
            sys.modules.update(_logger_utils())
            _installed.extend(_MATCHA_UTILS)
        return list(_installed)


def _real_module_works(top: str) -> bool:
    if not _importable(top):
        return False
    try:
        importlib.import_module(top)
    except Exception:  # a broken install (torchaudio against another torch) is absent
        return False
    return True


def missing_packages() -> list[str]:
    """The packages of :data:`REQUIRED_PACKAGES` that cannot be found."""
    return [name for name in REQUIRED_PACKAGES if not _importable(name)]


# Deprecation notices the upstream code triggers on every engine start or chunk, about
# its own calls (diffusers' LoRACompatibleLinear, torch.cuda.amp.autocast): not actionable
# by an operator, so kept out of the engine's log.
_UPSTREAM_NOTICES: Final = (r".*LoRACompatibleLinear.*", r".*torch\.cuda\.amp\.autocast.*")


def require() -> None:
    """Raise :class:`UpstreamUnavailable`, naming what to install, unless every package
    the inference path imports is there; then register the stand-ins."""
    missing = missing_packages()
    if missing:
        raise UpstreamUnavailable(
            "the cosyvoice2 backend needs the CosyVoice sources and their inference "
            f"dependencies; missing: {', '.join(missing)} (install with `make cosyvoice2`)"
        )
    for pattern in _UPSTREAM_NOTICES:
        warnings.filterwarnings("ignore", message=pattern, category=FutureWarning)
    install_stand_ins()
