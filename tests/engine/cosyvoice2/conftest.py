"""The tiny CosyVoice2 model directory (written once per test process) and a backend on
it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.backends.cosyvoice2 import upstream
from engine.backends.cosyvoice2.backend import CosyVoice2Backend, CosyVoice2Settings
from tests.engine.cosyvoice2.tiny_model import write_tiny_model


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """The tiny model's steps are thousands of small operations: with torch's default of
    one thread per core each waits at a barrier for a second thread, and on cores that are
    busy (`make test` runs three workers and mypy on two) one took 120 s, the timeout,
    against 2.5 s alone. With one thread: 7 s beside three busy loops (96 s with two),
    and this package's 92 tests in 25 s alone (test_backend.py's 18 took 74 s). The
    engine's VAD sets the same for its process (engine/vad.py)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_model_dir(one_torch_thread: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    missing = upstream.missing_packages()
    if missing:  # `make test` installs them (make cosyvoice2); a bare pytest may not
        pytest.skip(f"the cosyvoice2 extra is not installed (missing {', '.join(missing)})")
    return write_tiny_model(tmp_path_factory.mktemp("cosyvoice2") / "CosyVoice2-tiny")


@pytest.fixture(scope="session")
def cosyvoice2(tiny_model_dir: Path) -> Iterator[CosyVoice2Backend]:
    backend = CosyVoice2Backend(CosyVoice2Settings(model_dir=tiny_model_dir, max_streams=8))
    yield backend
    backend.close()
