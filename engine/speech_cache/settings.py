"""The speech cache's settings (``ENGINE_SPEECH_CACHE*``; the engine inherits the
gateway's environment, so ``GATEWAY_REDIS_URL`` reaches it too)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from engine.ipc.env import ConfigError, env_int
from engine.speech_cache.private import MIN_SECRET_BYTES

SHARED_CHOICES = ("auto", "redis", "directory", "off")
# The Redis level's key prefix (v2: scoped keys, sealed entries).
DEFAULT_PREFIX: Final = "speechcache:v2:"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_APP = "ivr-gateway"


def _home_dir(environ: Mapping[str, str], xdg: str, fallback: str) -> Path:
    configured = environ.get(xdg)
    if configured and os.path.isabs(configured):
        return Path(configured)
    home = environ.get("HOME") or ""
    if not home or home == "/":
        raise ConfigError(
            f"no home directory for the speech cache (HOME is {home!r}): set "
            "ENGINE_SPEECH_CACHE_DIR and ENGINE_SPEECH_CACHE_SECRET_FILE"
        )
    return Path(home) / fallback


def default_directory(environ: Mapping[str, str] | None = None) -> str:
    """``$XDG_CACHE_HOME/ivr-gateway/speech-cache`` (``~/.cache/...``): a place of this
    user's, not a predictable path in a folder every user may write."""
    env = os.environ if environ is None else environ
    return str(_home_dir(env, "XDG_CACHE_HOME", ".cache") / _APP / "speech-cache")


def default_secret_file(environ: Mapping[str, str] | None = None) -> str:
    """``$XDG_STATE_HOME/ivr-gateway/speech-cache.secret`` (``~/.local/state/...``)."""
    env = os.environ if environ is None else environ
    return str(_home_dir(env, "XDG_STATE_HOME", ".local/state") / _APP / "speech-cache.secret")


@dataclass(frozen=True)
class SpeechCacheSettings:
    enabled: bool = True  # ENGINE_SPEECH_CACHE
    memory_mb: int = 256  # ENGINE_SPEECH_CACHE_MEMORY_MB: the in-process level's budget
    shared: str = "auto"  # ENGINE_SPEECH_CACHE_SHARED: auto, redis, directory, off
    directory: str = ""  # ENGINE_SPEECH_CACHE_DIR ("" -> default_directory())
    shared_mb: int = 2048  # ENGINE_SPEECH_CACHE_SHARED_MB: the directory's budget
    ttl_s: int = 604_800  # ENGINE_SPEECH_CACHE_TTL_S: an entry's lifetime, every level
    timeout_ms: int = 50  # ENGINE_SPEECH_CACHE_TIMEOUT_MS: one shared lookup
    # ENGINE_SPEECH_CACHE_TENANT_PERCENT: one tenant's share of each level's budget
    # (Redis: of ENGINE_SPEECH_CACHE_SHARED_MB); beyond it, its own oldest entries go.
    tenant_percent: int = 25
    secret: str = ""  # ENGINE_SPEECH_CACHE_SECRET: names and seals shared entries
    secret_file: str = ""  # ENGINE_SPEECH_CACHE_SECRET_FILE ("" -> default_secret_file())
    redis_url: str | None = None  # GATEWAY_REDIS_URL
    redis_prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        if self.shared not in SHARED_CHOICES:
            raise ConfigError(
                f"ENGINE_SPEECH_CACHE_SHARED must be one of {', '.join(SHARED_CHOICES)}, "
                f"got {self.shared!r}"
            )
        if self.shared == "redis" and not self.redis_url:
            raise ConfigError("ENGINE_SPEECH_CACHE_SHARED=redis needs GATEWAY_REDIS_URL")
        if self.secret and len(self.secret.encode()) < MIN_SECRET_BYTES:
            raise ConfigError(
                f"ENGINE_SPEECH_CACHE_SECRET must be at least {MIN_SECRET_BYTES} bytes"
            )

    @property
    def shared_store(self) -> str | None:
        """The shared level's store: "redis", "directory" or None (no shared level)."""
        if self.shared == "off":
            return None
        if self.shared == "auto":
            return "redis" if self.redis_url else "directory"
        return self.shared

    @property
    def cache_directory(self) -> str:
        return self.directory or default_directory()

    @property
    def secret_path(self) -> str:
        return self.secret_file or default_secret_file()

    def tenant_quota(self, budget_bytes: int) -> int:
        """One tenant's bytes at most in a level of ``budget_bytes``."""
        return budget_bytes * self.tenant_percent // 100

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> SpeechCacheSettings:
        raw = (environ.get("ENGINE_SPEECH_CACHE") or "1").strip().lower()
        if raw not in _TRUE + _FALSE:
            raise ConfigError(f"ENGINE_SPEECH_CACHE must be 1 or 0, got {raw!r}")
        return cls(
            enabled=raw in _TRUE,
            memory_mb=env_int(environ, "ENGINE_SPEECH_CACHE_MEMORY_MB", 256, minimum=0),
            shared=(environ.get("ENGINE_SPEECH_CACHE_SHARED") or "auto").strip().lower(),
            directory=environ.get("ENGINE_SPEECH_CACHE_DIR") or "",
            shared_mb=env_int(environ, "ENGINE_SPEECH_CACHE_SHARED_MB", 2048, minimum=1),
            ttl_s=env_int(environ, "ENGINE_SPEECH_CACHE_TTL_S", 604_800, minimum=1),
            timeout_ms=env_int(
                environ, "ENGINE_SPEECH_CACHE_TIMEOUT_MS", 50, minimum=1, maximum=10_000
            ),
            tenant_percent=env_int(
                environ, "ENGINE_SPEECH_CACHE_TENANT_PERCENT", 25, minimum=1, maximum=100
            ),
            secret=environ.get("ENGINE_SPEECH_CACHE_SECRET") or "",
            secret_file=environ.get("ENGINE_SPEECH_CACHE_SECRET_FILE") or "",
            redis_url=environ.get("GATEWAY_REDIS_URL") or None,
        )
