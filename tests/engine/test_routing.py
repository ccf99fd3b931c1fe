"""The backend set's shared rules: style instructions only for backends that follow
them, and device memory only from a backend that runs on a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine.backends.base import BackendError, VoiceSettings
from engine.backends.routing import BackendSet
from engine.backends.synthetic import SyntheticBackend

ROOT = Path(__file__).resolve().parents[2]


class GpuTones(SyntheticBackend):
    """Test tones from a backend that reports device memory (a GPU model's shape)."""

    follows_instructions = True

    def __init__(self, on_gpu: bool) -> None:
        super().__init__()
        self.on_gpu = on_gpu

    def gpu_memory(self) -> tuple[int, int]:
        return (3 << 30, 8 << 30)


def test_device_memory_counts_only_from_a_backend_on_a_gpu() -> None:
    assert BackendSet([GpuTones(on_gpu=False)]).gpu() is None
    on_gpu = GpuTones(on_gpu=True)
    reporter = BackendSet([on_gpu]).gpu()
    assert reporter is on_gpu and reporter.gpu_memory() == (3 << 30, 8 << 30)


def test_instructions_go_only_to_backends_that_follow_them() -> None:
    plain = BackendSet([SyntheticBackend()])
    with pytest.raises(BackendError) as refused:
        plain.resolve_voice(VoiceSettings("tone", instruct="开心"))
    assert refused.value.code == "instruct_unsupported"
    routed = BackendSet([GpuTones(on_gpu=False)]).resolve_voice(
        VoiceSettings("tone", instruct="开心")
    )
    assert routed.settings.instruct == "开心"


def test_knowing_the_backends_loads_no_model_library() -> None:
    # An espeak or synthetic engine with its VAD off never imports torch: registering the
    # cosyvoice2 backend must not either (its memory counts against the engine's budget).
    probe = (
        "import sys; from engine.backends.base import backend_names; "
        "names = backend_names(); "
        "print(','.join(names), 'torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.split()
    assert "cosyvoice2" in out[0].split(",")
    assert out[1:] == ["False", "False"]
