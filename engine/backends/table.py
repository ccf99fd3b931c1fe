"""Every backend the engine can run: its name (``ENGINE_BACKEND``) and where its factory
is, as ``"module:factory"``. A backend's module is imported only when an engine creates
it, so its heavy dependencies (ONNX Runtime, torch) load only when chosen; nothing here
imports a backend. Adding a backend: its own folder (or module) with a factory and a
declared :class:`~engine.ipc.schema.Capabilities` record, and one row here
(docs/architecture.md, "Adding a backend")."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:  # no import at run time: base.py re-exports this module's functions
    from engine.backends.base import Backend

BACKENDS: Final[Mapping[str, str]] = {
    "cosyvoice2": "engine.backends.cosyvoice2:create",
    "espeak": "engine.backends.espeak:EspeakBackend",
    "kokoro": "engine.backends.kokoro:create",
    "piper": "engine.backends.piper:create",
    "synthetic": "engine.backends.synthetic:SyntheticBackend",
}


#: What an engine serves when ``ENGINE_BACKEND`` is unset: these backends in this order,
#: each only when its probe (``"module:function"``, imported when asked; None: always)
#: says it can run here.
DEFAULT_BACKENDS: Final[tuple[tuple[str, str | None], ...]] = (
    ("piper", "engine.backends.piper:installed"),
    ("kokoro", "engine.backends.kokoro:installed"),
    ("espeak", None),
)


def _load(target: str) -> Callable[[], object]:
    module_name, _, name = target.partition(":")
    found: Callable[[], object] = getattr(importlib.import_module(module_name), name)
    return found


def _runs_here(probe: str | None) -> bool:
    if probe is None:
        return True
    try:
        return bool(_load(probe)())
    except ImportError:  # a dependency of the backend's module is not installed
        return False


def default_backends() -> str:
    """The backends of :data:`DEFAULT_BACKENDS` that can run here, comma-separated."""
    return ",".join(name for name, probe in DEFAULT_BACKENDS if _runs_here(probe))


def backend_names() -> list[str]:
    return sorted(BACKENDS)


def create_backend(name: str) -> Backend:
    """Instantiate backend ``name``; raises KeyError listing the known names."""
    try:
        target = BACKENDS[name]
    except KeyError:
        known = ", ".join(backend_names())
        raise KeyError(f"unknown engine backend {name!r} (known: {known})") from None
    factory: Callable[[], Backend] = getattr(
        importlib.import_module(target.partition(":")[0]), target.partition(":")[2]
    )
    return factory()
