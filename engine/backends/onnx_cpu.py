"""ONNX Runtime sessions on the CPU, as the engine's model backends run them."""

from __future__ import annotations

from typing import Any


def cpu_session(model: str | bytes, threads: int = 1, *, spin: bool = True) -> Any:
    """An ``onnxruntime.InferenceSession`` for ``model`` (a file path or a serialized
    model) on the CPU provider: ``threads`` intra-op threads, operators run one after
    another (so that N sessions' calls use N cores, not N times all of them). ``spin``
    False: the intra-op threads sleep between operators rather than spin (a session used
    now and then, beside others, should not burn a core while it waits)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
