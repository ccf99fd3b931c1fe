"""Engine settings from the environment (``ENGINE_*``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from engine.ipc.env import DEFAULT_SHM_DIR, ConfigError, default_socket_path, env_int

__all__ = ["ConfigError", "EngineSettings", "env_int"]


@dataclass(frozen=True)
class EngineSettings:
    backend: str = "espeak"
    socket_path: str = ""
    slots: int = 512
    out_ring_kib: int = 128
    in_ring_kib: int = 32
    shm_directory: str = "/dev/shm"
    memory_budget_mb: int = 4096
    memory_reject_percent: int = 85

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> EngineSettings:
        return cls(
            backend=env.get("ENGINE_BACKEND", "espeak") or "espeak",
            socket_path=env.get("ENGINE_SOCKET") or default_socket_path(),
            slots=env_int(env, "ENGINE_SLOTS", 512, minimum=1),
            out_ring_kib=env_int(env, "ENGINE_OUT_RING_KIB", 128, minimum=4),
            in_ring_kib=env_int(env, "ENGINE_IN_RING_KIB", 32, minimum=4),
            shm_directory=env.get("ENGINE_SHM_DIR") or DEFAULT_SHM_DIR,
            memory_budget_mb=env_int(env, "ENGINE_MEMORY_BUDGET_MB", 4096, minimum=1),
            memory_reject_percent=env_int(env, "ENGINE_MEMORY_REJECT_PERCENT", 85, minimum=1),
        )
