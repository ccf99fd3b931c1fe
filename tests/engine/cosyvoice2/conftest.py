"""The tiny CosyVoice2 model directory (written once per test process) and a backend on
it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.backends.cosyvoice2 import upstream
from engine.backends.cosyvoice2.backend import CosyVoice2Backend, CosyVoice2Settings
from tests.engine.cosyvoice2.tiny_model import write_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    missing = upstream.missing_packages()
    if missing:  # `make test` installs them (make cosyvoice2); a bare pytest may not
        pytest.skip(f"the cosyvoice2 extra is not installed (missing {', '.join(missing)})")
    return write_tiny_model(tmp_path_factory.mktemp("cosyvoice2") / "CosyVoice2-tiny")


@pytest.fixture(scope="session")
def cosyvoice2(tiny_model_dir: Path) -> Iterator[CosyVoice2Backend]:
    backend = CosyVoice2Backend(CosyVoice2Settings(model_dir=tiny_model_dir, max_streams=8))
    yield backend
    backend.close()
