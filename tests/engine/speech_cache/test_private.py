"""Private places for the speech cache: the secret file and its folder."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from engine.speech_cache.private import PrivatePathError, read_or_create_secret


def test_the_secret_is_created_once_private_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "state" / "ivr-gateway" / "speech-cache.secret"
    secret, created = read_or_create_secret(path)
    assert created and len(secret) >= 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    again, created_again = read_or_create_secret(path)
    assert (again, created_again) == (secret, False)


def test_engines_starting_at_once_agree_on_one_secret(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    got: list[bytes] = []
    threads = [
        threading.Thread(target=lambda: got.append(read_or_create_secret(path)[0]))
        for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(got)) == 1 and len(got) == 8
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_secret_others_may_read_or_too_short_is_refused(tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.write_bytes(b"x" * 64)
    os.chmod(loose, 0o644)
    with pytest.raises(PrivatePathError, match="chmod 600"):
        read_or_create_secret(loose)
    short = tmp_path / "short"
    short.write_bytes(b"x" * 8)
    os.chmod(short, 0o600)
    with pytest.raises(PrivatePathError, match="fewer than"):
        read_or_create_secret(short)
