"""The host directory store: one file per segment, shared by every engine on the host.

Layout: ``<root>/<scope label>/<voice label>/<first 2 hex of name>/<name>``; the labels
and names are keyed hashes (sealing.py), so the tree says nothing of the texts or
tenants. The root is a private folder (private.py: this user's, 0700, refused at start
when squatted); every folder below it is created 0700 and every file 0600. Writes are
atomic (a temporary file in the same folder, then ``os.replace``), so an engine never
reads a torn file written by another. An entry older than the TTL (by mtime; the sealed
value carries its own write time too, checked on every read) is a miss and is deleted.

Budgets: ``scope_quota`` bytes per scope (the shared scope, ``shared_label``, is exempt)
and ``budget_bytes`` in all. When the bytes this engine tracks pass either (or every
``rescan_s``), :meth:`maintain` rescans the tree: it deletes expired entries, then the
least recently used (atime, which a hit refreshes) of each scope over its quota until it
is under ``sweep_to`` of it, then, while the tree is over ``sweep_to`` of the budget, the
least recently used of the largest scope. A sweep runs when the store opens, so entries
that expired while no engine ran are gone before the first lookup.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import os
import shutil
import stat
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from engine.speech_cache.private import private_directory
from engine.speech_cache.shared import Address
from engine.speech_cache.value import MAX_ENCODED_BYTES

log = logging.getLogger(__name__)

_TMP_SUFFIX = ".tmp"
_TRASH_PREFIX = ".trash-"
_STALE_TMP_S = 120.0  # a temporary file this old belongs to a writer that died
_ATIME_REFRESH_S = 60.0  # a hit refreshes atime at most this often (one utime per minute)
_HEX = frozenset("0123456789abcdef")
_MAX_SEALED_BYTES = MAX_ENCODED_BYTES + 1024


def _label_ok(label: str) -> bool:
    return label == "_" or (0 < len(label) <= 64 and set(label) <= _HEX)


@dataclass
class _Live:
    """A scope's live entries found by a sweep: (last use, size, path), and their bytes."""

    entries: list[tuple[float, int, str]] = field(default_factory=list)
    bytes: int = 0


class DirectoryStore:
    name = "directory"

    def __init__(
        self,
        root: str | Path,
        *,
        budget_bytes: int,
        ttl_s: float,
        scope_quota: int | None = None,
        shared_label: str = "",
        rescan_s: float = 300.0,
        sweep_to: float = 0.9,
    ) -> None:
        self.root = private_directory(root)
        self.budget_bytes = budget_bytes
        self.scope_quota = budget_bytes if scope_quota is None else scope_quota
        self.shared_label = shared_label
        self.ttl_s = ttl_s
        self.rescan_s = rescan_s
        self.sweep_to = sweep_to
        self._lock = threading.Lock()
        self._entries = 0  # as of the last scan, plus this engine's writes since
        self._bytes = 0
        self._scope_bytes: dict[str, int] = {}
        self._evictions = 0
        self._last_scan = -float("inf")
        self.sweep(time.monotonic())  # what expired while no engine ran goes now

    # ------------------------------------------------------------------ paths

    def _folder(self, address: Address) -> Path:
        if not (_label_ok(address.scope) and _label_ok(address.voice)):
            raise ValueError(f"not a store label: {address.scope!r}/{address.voice!r}")
        if len(address.name) != 64 or not set(address.name) <= _HEX:
            raise ValueError(f"not an entry name: {address.name!r}")
        return self.root / address.scope / address.voice / address.name[:2]

    def path(self, address: Address) -> Path:
        return self._folder(address) / address.name

    # ------------------------------------------------------------------ entries

    def get(self, address: Address) -> bytes | None:
        path = self.path(address)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            st = os.fstat(fd)
            now = time.time()
            if now - st.st_mtime > self.ttl_s or st.st_size > _MAX_SEALED_BYTES:
                self._unlink(path, address.scope, st.st_size)
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

    def contains(self, address: Address) -> bool:
        try:
            st = self.path(address).stat()
        except FileNotFoundError:
            return False
        return time.time() - st.st_mtime <= self.ttl_s

    def set(self, address: Address, data: bytes) -> None:
        folder = self._folder(address)
        self._make_folder(folder)
        target = folder / address.name
        fd, tmp = tempfile.mkstemp(prefix=f".{address.name[:12]}-", suffix=_TMP_SUFFIX,
                                   dir=folder)  # fmt: skip
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
        grown = len(data) - max(0, replaced)
        with self._lock:
            self._entries += replaced < 0
            self._bytes += grown
            self._scope_bytes[address.scope] = self._scope_bytes.get(address.scope, 0) + grown

    def _make_folder(self, folder: Path) -> None:
        """``folder`` and the folders between it and the root, each 0700."""
        missing: list[Path] = []
        at = folder
        while at != self.root and not at.is_dir():
            missing.append(at)
            at = at.parent
        for part in reversed(missing):
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o700)
                os.chmod(part, 0o700)  # whatever the umask

    def delete(self, address: Address) -> None:
        path = self.path(address)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return
        self._unlink(path, address.scope, size)

    def forget_voice(self, scope: str, voice: str) -> int:
        """Remove a voice's subtree (renamed away first, so no reader sees it half gone)."""
        if not (_label_ok(scope) and _label_ok(voice)):
            return 0
        return self._remove_tree(self.root / scope / voice, scope)

    def purge_scope(self, scope: str) -> int:
        """Remove a scope's whole subtree (a tenant's erasure); returns the entries."""
        if not _label_ok(scope):
            return 0
        removed = self._remove_tree(self.root / scope, scope)
        with self._lock:
            self._scope_bytes.pop(scope, None)
        return removed

    def _remove_tree(self, folder: Path, scope: str) -> int:
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
            if scope in self._scope_bytes:
                self._scope_bytes[scope] = max(0, self._scope_bytes[scope] - size)
        return files

    def usage(self) -> tuple[int, int, int]:
        """(entries, bytes, evictions): the whole tree as of the last scan, plus this
        engine's writes since; evictions are the files this engine's sweeps deleted."""
        with self._lock:
            return self._entries, self._bytes, self._evictions

    def scope_bytes(self, scope: str) -> int:
        with self._lock:
            return self._scope_bytes.get(scope, 0)

    # ------------------------------------------------------------------ maintenance

    def due(self, now: float) -> bool:
        with self._lock:
            if self._bytes > self.budget_bytes or now - self._last_scan >= self.rescan_s:
                return True
            return any(
                size > self.scope_quota
                for scope, size in self._scope_bytes.items()
                if scope != self.shared_label
            )

    def maintain(self, now: float) -> None:
        """Rescan when due: drop expired entries, then the least recently used of each
        scope over its quota, then of the largest scopes over the budget."""
        if self.due(now):
            self.sweep(now)

    def sweep(self, now: float) -> None:
        scopes = self._scan(time.time())
        for live in scopes.values():
            live.entries.sort(reverse=True)  # the least recently used last: pop()
        evicted = 0
        target = self.scope_quota * self.sweep_to
        for label, live in scopes.items():
            if label == self.shared_label or live.bytes <= self.scope_quota:
                continue
            while live.entries and live.bytes > target:
                evicted += self._evict(live)
        total = sum(live.bytes for live in scopes.values())
        if total > self.budget_bytes:
            heap = [(-live.bytes, label) for label, live in scopes.items() if live.entries]
            heapq.heapify(heap)
            while heap and total > self.budget_bytes * self.sweep_to:
                _, label = heapq.heappop(heap)
                live = scopes[label]
                before = live.bytes
                evicted += self._evict(live)
                total -= before - live.bytes
                if live.entries:
                    heapq.heappush(heap, (-live.bytes, label))
        with self._lock:
            self._entries = sum(len(live.entries) for live in scopes.values())
            self._bytes = total
            self._scope_bytes = {label: live.bytes for label, live in scopes.items()}
            self._evictions += evicted
            self._last_scan = now
        if evicted:
            log.info("speech cache directory: %d entries evicted for the budgets", evicted)

    def _evict(self, live: _Live) -> int:
        """Delete the least recently used of ``live`` (sorted most recent first)."""
        _, size, path = live.entries.pop()
        live.bytes -= size
        return int(_remove(path))

    def _scan(self, wall: float) -> dict[str, _Live]:
        """Every scope's live entries; expired entries, stale temporary files and
        anything that is not an entry are deleted on the way."""
        scopes: dict[str, _Live] = {}
        for scope in _scandir(self.root):
            if scope.name.startswith(_TRASH_PREFIX):
                shutil.rmtree(scope.path, ignore_errors=True)
                continue
            if not scope.is_dir(follow_symlinks=False):
                continue
            live = scopes.setdefault(scope.name, _Live())
            for voice in _scandir(scope.path):
                if not voice.is_dir(follow_symlinks=False):
                    continue
                for shard in _scandir(voice.path):
                    if not shard.is_dir(follow_symlinks=False):
                        continue
                    for item in _scandir(shard.path):
                        self._scan_item(item, wall, live)
        return scopes

    def _scan_item(self, item: os.DirEntry[str], wall: float, live: _Live) -> None:
        try:
            st = item.stat(follow_symlinks=False)
        except FileNotFoundError:
            return
        if item.name.endswith(_TMP_SUFFIX):
            if wall - st.st_mtime > _STALE_TMP_S:
                _remove(item.path)
            return
        if wall - st.st_mtime > self.ttl_s or not stat.S_ISREG(st.st_mode):
            _remove(item.path)
            return
        live.entries.append((max(st.st_atime, st.st_mtime), st.st_size, item.path))
        live.bytes += st.st_size

    def close(self) -> None:
        pass

    def _unlink(self, path: Path, scope: str, size: int) -> None:
        if _remove(str(path)):
            with self._lock:
                self._entries = max(0, self._entries - 1)
                self._bytes = max(0, self._bytes - size)
                if scope in self._scope_bytes:
                    self._scope_bytes[scope] = max(0, self._scope_bytes[scope] - size)


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
