"""The host directory store: one file per segment, shared by every engine on the host.

Layout: ``<root>/<voice label>/<first 2 hex of digest>/<digest>`` (voice label: "_" for
built-in voices). Writes are atomic (a temporary file in the same folder, then
``os.replace``), so an engine never reads a torn file written by another. An entry older
than the TTL (by mtime: when it was written) is a miss and is deleted. When the size this
engine tracks passes the budget (or every ``rescan_s``), :meth:`maintain` rescans the tree
and deletes expired entries, then the least recently used (atime, which a hit refreshes)
until the tree is under ``sweep_to`` of the budget. The root is created 0700 and must
belong to this user.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import tempfile
import threading
import time
import uuid
from pathlib import Path

from engine.speech_cache.key import voice_label
from engine.speech_cache.value import MAX_ENCODED_BYTES

log = logging.getLogger(__name__)

_TMP_SUFFIX = ".tmp"
_TRASH_PREFIX = ".trash-"
_STALE_TMP_S = 120.0  # a temporary file this old belongs to a writer that died
_ATIME_REFRESH_S = 60.0  # a hit refreshes atime at most this often (one utime per minute)


def prepare_root(root: Path) -> None:
    """Create ``root`` 0700, or check an existing one is a directory of this user."""
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = root.lstat()
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(f"speech cache directory {root} is not a directory")
    if st.st_uid != os.getuid():
        raise OSError(f"speech cache directory {root} belongs to uid {st.st_uid}")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(root, 0o700)


class DirectoryStore:
    name = "directory"

    def __init__(
        self,
        root: str | Path,
        *,
        budget_bytes: int,
        ttl_s: float,
        rescan_s: float = 300.0,
        sweep_to: float = 0.9,
    ) -> None:
        self.root = Path(root)
        prepare_root(self.root)
        self.budget_bytes = budget_bytes
        self.ttl_s = ttl_s
        self.rescan_s = rescan_s
        self.sweep_to = sweep_to
        self._lock = threading.Lock()
        self._entries = 0  # as of the last scan, plus this engine's writes since
        self._bytes = 0
        self._evictions = 0
        self._last_scan = -float("inf")

    # ------------------------------------------------------------------ paths

    def _folder(self, voice_digest: str, digest: str) -> Path:
        if len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
            raise ValueError(f"not a key digest: {digest!r}")
        return self.root / voice_label(voice_digest) / digest[:2]

    def path(self, voice_digest: str, digest: str) -> Path:
        return self._folder(voice_digest, digest) / digest

    # ------------------------------------------------------------------ entries

    def get(self, voice_digest: str, digest: str) -> bytes | None:
        path = self.path(voice_digest, digest)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            st = os.fstat(fd)
            now = time.time()
            if now - st.st_mtime > self.ttl_s or st.st_size > MAX_ENCODED_BYTES:
                self._unlink(path, st.st_size)
                return None
            chunks: list[bytes] = []
            remaining = st.st_size
            while remaining > 0:
                chunk = os.read(fd, remaining)
                if not chunk:
                    break
                chunks.append(chunk)
                remaining -= len(chunk)
            if now - st.st_atime > _ATIME_REFRESH_S:
                with contextlib.suppress(OSError):
                    os.utime(fd, times=(now, st.st_mtime))
            return b"".join(chunks)
        finally:
            os.close(fd)

    def contains(self, voice_digest: str, digest: str) -> bool:
        try:
            st = self.path(voice_digest, digest).stat()
        except FileNotFoundError:
            return False
        return time.time() - st.st_mtime <= self.ttl_s

    def set(self, voice_digest: str, digest: str, data: bytes) -> None:
        folder = self._folder(voice_digest, digest)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        target = folder / digest
        fd, tmp = tempfile.mkstemp(prefix=f".{digest[:12]}-", suffix=_TMP_SUFFIX, dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            try:
                replaced = target.stat().st_size
            except FileNotFoundError:
                replaced = -1
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        with self._lock:
            if replaced >= 0:
                self._bytes += len(data) - replaced
            else:
                self._entries += 1
                self._bytes += len(data)

    def delete(self, voice_digest: str, digest: str) -> None:
        path = self.path(voice_digest, digest)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return
        self._unlink(path, size)

    def forget_voice(self, voice_digest: str) -> int:
        """Remove the voice's subtree (renamed away first, so no reader sees it half gone)."""
        folder = self.root / voice_label(voice_digest)
        trash = self.root / f"{_TRASH_PREFIX}{uuid.uuid4().hex}"
        try:
            os.rename(folder, trash)
        except FileNotFoundError:
            return 0
        files, size = _tree_usage(trash)
        shutil.rmtree(trash, ignore_errors=True)
        with self._lock:
            self._entries = max(0, self._entries - files)
            self._bytes = max(0, self._bytes - size)
        return files

    def usage(self) -> tuple[int, int, int]:
        """(entries, bytes, evictions): the whole tree as of the last scan, plus this
        engine's writes since; evictions are the files this engine's sweeps deleted."""
        with self._lock:
            return self._entries, self._bytes, self._evictions

    # ------------------------------------------------------------------ maintenance

    def due(self, now: float) -> bool:
        with self._lock:
            return self._bytes > self.budget_bytes or now - self._last_scan >= self.rescan_s

    def maintain(self, now: float) -> None:
        """Rescan when due: drop expired entries, then the least recently used over budget."""
        if self.due(now):
            self.sweep(now)

    def sweep(self, now: float) -> None:
        wall = time.time()
        live: list[tuple[float, int, str]] = []  # (last use, size, path)
        total = 0
        for entry in _scandir(self.root):
            if entry.name.startswith(_TRASH_PREFIX):
                shutil.rmtree(entry.path, ignore_errors=True)
                continue
            if not entry.is_dir(follow_symlinks=False):
                continue
            for shard in _scandir(entry.path):
                if not shard.is_dir(follow_symlinks=False):
                    continue
                for item in _scandir(shard.path):
                    try:
                        st = item.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if item.name.endswith(_TMP_SUFFIX):
                        if wall - st.st_mtime > _STALE_TMP_S:
                            _remove(item.path)
                        continue
                    if wall - st.st_mtime > self.ttl_s or not stat.S_ISREG(st.st_mode):
                        _remove(item.path)
                        continue
                    live.append((max(st.st_atime, st.st_mtime), st.st_size, item.path))
                    total += st.st_size
        evicted = 0
        if total > self.budget_bytes:
            target = self.budget_bytes * self.sweep_to
            live.sort()
            kept = len(live)
            for _, size, path in live:
                if total <= target:
                    break
                if _remove(path):
                    evicted += 1
                total -= size
                kept -= 1
            entries = kept
        else:
            entries = len(live)
        with self._lock:
            self._entries = entries
            self._bytes = total
            self._evictions += evicted
            self._last_scan = now
        if evicted:
            log.info("speech cache directory: %d entries evicted for the budget", evicted)

    def close(self) -> None:
        pass

    def _unlink(self, path: Path, size: int) -> None:
        if _remove(str(path)):
            with self._lock:
                self._entries = max(0, self._entries - 1)
                self._bytes = max(0, self._bytes - size)


def _scandir(path: str | Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _remove(path: str) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def _tree_usage(folder: Path) -> tuple[int, int]:
    files = size = 0
    for dirpath, _, names in os.walk(folder):
        for name in names:
            if name.endswith(_TMP_SUFFIX):
                continue
            with contextlib.suppress(OSError):
                size += os.lstat(os.path.join(dirpath, name)).st_size
                files += 1
    return files, size
