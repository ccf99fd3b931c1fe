"""Engine settings from the environment (``ENGINE_*``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from engine.backends.table import default_backends
from engine.ipc.env import (
    DEFAULT_SHM_DIR,
    ConfigError,
    default_socket_path,
    env_int,
    shm_directory,
)

__all__ = ["ConfigError", "EngineSettings", "env_int"]


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class EngineSettings:
    backend: str = "espeak"  # one backend or a comma-separated list (ENGINE_BACKEND)
    socket_path: str = ""
    slots: int = 512
    out_ring_kib: int = 128
    in_ring_kib: int = 32
    shm_directory: str = DEFAULT_SHM_DIR
    memory_budget_mb: int = 4096
    memory_reject_percent: int = 85
    workers: int = 1  # model workers for backends that run on several threads
    max_batch: int = 1  # segments per model call for backends that batch
    device: str = "cpu"  # where model backends run (ENGINE_DEVICE: cpu, cuda, cuda:N)
    # How long a new utterance may wait for the engine to start it (ENGINE_START_TIMEOUT_MS)
    start_timeout_ms: int = 10_000

    @property
    def backends(self) -> list[str]:
        return [name.strip() for name in self.backend.split(",") if name.strip()]

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> EngineSettings:
        return cls(
            backend=env.get("ENGINE_BACKEND") or default_backends(),
            socket_path=env.get("ENGINE_SOCKET") or default_socket_path(),
            slots=env_int(env, "ENGINE_SLOTS", 512, minimum=1),
            out_ring_kib=env_int(env, "ENGINE_OUT_RING_KIB", 128, minimum=4),
            in_ring_kib=env_int(env, "ENGINE_IN_RING_KIB", 32, minimum=4),
            shm_directory=shm_directory(env),
            memory_budget_mb=env_int(env, "ENGINE_MEMORY_BUDGET_MB", 4096, minimum=1),
            memory_reject_percent=env_int(env, "ENGINE_MEMORY_REJECT_PERCENT", 85, minimum=1),
            workers=env_int(env, "ENGINE_WORKERS", available_cores(), minimum=1),
            max_batch=env_int(env, "ENGINE_MAX_BATCH", 1, minimum=1),
            device=env.get("ENGINE_DEVICE") or "cpu",
            start_timeout_ms=env_int(env, "ENGINE_START_TIMEOUT_MS", 10_000, minimum=1),
        )
