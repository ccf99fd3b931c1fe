"""The ``cosyvoice2`` backend (docs/cosyvoice2.md). Registering it imports nothing heavy:
torch, transformers and the upstream code load only when an engine creates it."""

from __future__ import annotations

import os

from engine.backends.base import Backend, register_backend


def register() -> None:
    def create() -> Backend:
        from engine.backends.cosyvoice2.backend import CosyVoice2Backend, CosyVoice2Settings

        return CosyVoice2Backend(CosyVoice2Settings.from_env(os.environ))

    register_backend("cosyvoice2", create)
