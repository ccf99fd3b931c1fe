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


def backend_names() -> list[str]:
    return sorted(BACKENDS)


def create_backend(name: str) -> Backend:
    """Instantiate backend ``name``; raises KeyError listing the known names."""
    try:
        target = BACKENDS[name]
    except KeyError:
        known = ", ".join(backend_names())
        raise KeyError(f"unknown engine backend {name!r} (known: {known})") from None
    module_name, _, factory_name = target.partition(":")
    factory: Callable[[], Backend] = getattr(importlib.import_module(module_name), factory_name)
    return factory()
