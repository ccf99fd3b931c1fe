"""Engine settings from the environment (``ENGINE_*``)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass


class ConfigError(ValueError):
    """A setting has a value the process cannot run with."""


def env_int(env: Mapping[str, str], name: str, default: int, *, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value}")
    return value


def default_socket_path() -> str:
    runtime = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return os.path.join(runtime, f"ivr-engine-{os.getuid()}.sock")


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
            shm_directory=env.get("ENGINE_SHM_DIR", "/dev/shm") or "/dev/shm",
            memory_budget_mb=env_int(env, "ENGINE_MEMORY_BUDGET_MB", 4096, minimum=1),
            memory_reject_percent=env_int(env, "ENGINE_MEMORY_REJECT_PERCENT", 85, minimum=1),
        )
