"""The backend set's shared rules: style instructions only for backends that follow
them, and device memory only from a backend that runs on a GPU."""

from __future__ import annotations

import pytest

from engine.backends.base import BackendError, VoiceSettings
from engine.backends.routing import BackendSet
from engine.backends.synthetic import SyntheticBackend


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
