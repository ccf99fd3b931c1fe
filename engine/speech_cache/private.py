"""Private places on disk for the speech cache: its directory and its secret.

A folder is private when this user owns it, it is no link, and nobody else may enter it
(mode 0700); every folder above it must belong to this user or to root and be writable
by nobody else unless it is sticky (``/tmp``, ``/var/tmp``), so that no other user can
swap a component for one of theirs. :func:`private_directory` creates what is missing,
one level at a time with mode 0700 (whatever the umask), and refuses with
:class:`PrivatePathError` (a :class:`ConfigError`: the engine and the gateway exit at
start, naming the path) a path another user created first (squatted), a link, or a
folder above it that another user may change.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

from engine.ipc.env import ConfigError


class PrivatePathError(ConfigError):
    """A path the speech cache must keep private is not, and cannot be made so."""


def _check_ancestor(path: Path, st: os.stat_result) -> None:
    if not stat.S_ISDIR(st.st_mode):
        raise PrivatePathError(f"{path} is not a directory")
    if st.st_uid not in (0, os.getuid()):
        raise PrivatePathError(f"{path} belongs to uid {st.st_uid}, not to this user or root")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise PrivatePathError(f"{path} may be changed by other users (mode {st.st_mode:o})")


def _check_own(path: Path, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise PrivatePathError(f"{path} is a symbolic link")
    if not stat.S_ISDIR(st.st_mode):
        raise PrivatePathError(f"{path} is not a directory")
    if st.st_uid != os.getuid():
        raise PrivatePathError(
            f"{path} belongs to uid {st.st_uid}: another user created it first; remove it "
            "or choose another path"
        )


def private_directory(path: str | Path) -> Path:
    """``path`` (absolute) as a private folder: created 0700 level by level where
    missing, checked where it exists (an existing one of this user with a looser mode is
    set to 0700). Raises :class:`PrivatePathError`."""
    target = Path(os.path.abspath(path))
    parts = [target, *target.parents]
    parts.reverse()  # "/" first
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        try:
            st = os.lstat(part)
        except FileNotFoundError:
            try:
                os.mkdir(part, 0o700)
            except FileExistsError:
                pass  # created meanwhile by another engine: checked below
            except OSError as exc:
                raise PrivatePathError(f"cannot create {part}: {exc.strerror}") from None
            st = os.lstat(part)
            _check_own(part, st)
            if stat.S_IMODE(st.st_mode) != 0o700:
                os.chmod(part, 0o700)
            continue
        if last:
            _check_own(part, st)
            if stat.S_IMODE(st.st_mode) != 0o700:
                os.chmod(part, 0o700)
        elif stat.S_ISLNK(st.st_mode):
            resolved = Path(os.path.realpath(part))
            _check_ancestor(part, os.stat(resolved))
        else:
            _check_ancestor(part, st)
    return target


MIN_SECRET_BYTES = 32


def read_or_create_secret(path: str | Path) -> tuple[bytes, bool]:
    """The secret kept in ``path`` (its folder made private), created with 32 random
    bytes (hex) and mode 0600 when missing: (secret, whether it was created now). Two
    processes starting at once agree (the file appears whole, by a link, or not at all).
    Raises :class:`PrivatePathError` for a file that is not this user's, is readable by
    others, or holds fewer than :data:`MIN_SECRET_BYTES` bytes."""
    target = Path(os.path.abspath(path))
    private_directory(target.parent)
    created = False
    if not target.exists():
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, secrets.token_hex(MIN_SECRET_BYTES).encode("ascii") + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, target)  # fails if another process made it first: theirs wins
            created = True
        except FileExistsError:
            pass
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise PrivatePathError(f"cannot read the speech cache secret {target}: {exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            raise PrivatePathError(f"{target} is not a file of this user")
        if st.st_mode & 0o077:
            raise PrivatePathError(f"{target} may be read by others: chmod 600 it")
        secret = os.read(fd, 4096).strip()
    finally:
        os.close(fd)
    if len(secret) < MIN_SECRET_BYTES:
        raise PrivatePathError(f"{target} holds fewer than {MIN_SECRET_BYTES} bytes")
    return secret, created
