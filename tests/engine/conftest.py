"""Shared fixtures for the engine tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine.backends.espeak import EspeakBackend


@pytest.fixture(scope="session")
def espeak_backend() -> Iterator[EspeakBackend]:
    """The process's one espeak-ng backend.

    espeak-ng keeps global state and :class:`EspeakBackend` refuses a second instance
    per process, so every test that needs it (test_espeak.py, test_scheduler.py) shares
    this one. Tests must not call ``close()`` on it.
    """
    backend = EspeakBackend()
    yield backend
    backend.close()
