"""``python -m engine.speech_cache``: a tenant's purge and the sweep without an engine,
run as an operator runs them (a subprocess with the engines' environment)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from engine.speech_cache import tenant_scope
from engine.speech_cache.directory import DirectoryStore
from tests.engine.speech_cache.conftest import TEST_SECRET, address, make_key, make_segment, sealed

REPO = Path(__file__).resolve().parents[3]


def run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {
        **os.environ,
        "ENGINE_SPEECH_CACHE_SHARED": "directory",
        "ENGINE_SPEECH_CACHE_DIR": str(tmp_path / "cache"),
        "ENGINE_SPEECH_CACHE_SECRET": TEST_SECRET,
        "ENGINE_SPEECH_CACHE_TTL_S": "60",
        **env,
    }
    return subprocess.run(
        [sys.executable, "-m", "engine.speech_cache", *args],
        env=environ, cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_purge_and_sweep(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path / "cache", budget_bytes=1 << 30, ttl_s=60)
    acme = [make_key(f"acme {i}", scope=tenant_scope("acme")) for i in range(3)]
    other = make_key("other", scope=tenant_scope("other"))
    old = make_key("old", scope=tenant_scope("other"))
    for key in (*acme, other, old):
        store.set(address(key), sealed(key, make_segment(0.1)))
    long_ago = time.time() - 3600
    os.utime(store.path(address(old)), (long_ago, long_ago))
    done = run(tmp_path, "purge", "--tenant", "acme")
    assert done.returncode == 0, done.stderr
    assert "3 entries of tenant 'acme' deleted" in done.stdout
    assert not any(store.contains(address(k)) for k in acme) and store.contains(address(other))
    done = run(tmp_path, "sweep")
    assert done.returncode == 0, done.stderr
    assert not store.path(address(old)).exists() and store.path(address(other)).exists()
    bad = run(tmp_path, "purge", "--tenant", "acme", ENGINE_SPEECH_CACHE_SECRET="short")
    assert bad.returncode == 2 and "ENGINE_SPEECH_CACHE_SECRET" in bad.stderr
