"""The ``cosyvoice2`` backend (docs/cosyvoice2.md). Importing this package imports nothing
heavy: torch, transformers and the upstream code load only when an engine creates it."""

from __future__ import annotations

import os

from engine.backends.base import Backend


def create() -> Backend:
    """The engine's CosyVoice2 backend (engine/backends/table.py), from its settings."""
    from engine.backends.cosyvoice2.backend import CosyVoice2Backend, CosyVoice2Settings

    return CosyVoice2Backend(CosyVoice2Settings.from_env(os.environ))
