"""Environment settings both processes read, and the helpers that parse them.

The gateway and the engine agree on a few ``ENGINE_*`` names: ``ENGINE_SOCKET`` (the
control socket) and ``ENGINE_SHM_DIR`` (where the shared-memory region lives: the engine
creates it, the gateway's supervisor removes a killed engine's). Both parse integers the
same way (:func:`env_int`) and report bad values as :class:`ConfigError`.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping

DEFAULT_SHM_DIR = "/dev/shm"


class ConfigError(ValueError):
    """A setting has a value the process cannot run with."""


def env_int(
    env: Mapping[str, str], name: str, default: int, *, minimum: int = 0, maximum: int | None = None
) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name} must be at most {maximum}, got {value}")
    return value


def default_socket_path() -> str:
    runtime = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return os.path.join(runtime, f"ivr-engine-{os.getuid()}.sock")


def shm_directory(env: Mapping[str, str]) -> str:
    """``ENGINE_SHM_DIR``, or :data:`DEFAULT_SHM_DIR`."""
    return env.get("ENGINE_SHM_DIR") or DEFAULT_SHM_DIR
