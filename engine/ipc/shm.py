"""Shared-memory regions (files in ``/dev/shm`` mapped with ``mmap``) and slot arenas.

:class:`SharedRegion` deliberately avoids :mod:`multiprocessing.shared_memory`: on
Python 3.11 its ``resource_tracker`` registers every segment a process *attaches*
to and unlinks it when that process exits, destroying segments owned by the other
process. Here only the creator ever unlinks, and only when asked.

:class:`SlotArena` carves one region into a fixed pool of per-call slots. Each slot
owns three :class:`engine.ipc.ring.SpscRing` regions:

* *outbound* (engine -> gateway synthesized PCM), ``out_capacity`` data bytes;
* *inbound* (gateway -> engine caller audio), ``in_capacity`` data bytes;
* *boundaries* (engine -> gateway utterance ends, see :mod:`engine.ipc.boundaries`),
  ``BOUNDARY_CAPACITY`` data bytes.

Arena layout (a cross-process contract; both processes must use identical
``slots``, ``out_capacity`` and ``in_capacity``)::

    out_span    = align64(HEADER_SIZE + out_capacity)
    in_span     = align64(HEADER_SIZE + in_capacity)
    bnd_span    = align64(HEADER_SIZE + BOUNDARY_CAPACITY)
    slot_stride = out_span + in_span + bnd_span

    slot i outbound   ring at  i * slot_stride
    slot i inbound    ring at  i * slot_stride + out_span
    slot i boundaries ring at  i * slot_stride + out_span + in_span
    region_size = slots * slot_stride

The region base is page-aligned (``mmap``), so every ring starts on a 64-byte
boundary and each ring's ``write_pos``/``read_pos`` fields occupy distinct cache
lines. The arena does not know which slots are in use: allocation bookkeeping
(which call owns which slot, and telling the peer) lives elsewhere. The owner calls
:meth:`SlotArena.reset_all` after creating the region and :meth:`SlotArena.reset_slot`
whenever a slot is (re)assigned while neither side is using it.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from types import TracebackType
from typing import Final, Self

import numpy as np

from engine.ipc.env import DEFAULT_SHM_DIR
from engine.ipc.ring import HEADER_SIZE, RingError, SpscRing

__all__ = [
    "BOUNDARY_CAPACITY",
    "DEFAULT_SHM_DIR",
    "RING_ALIGNMENT",
    "ArenaError",
    "RegionError",
    "SharedRegion",
    "SlotArena",
    "SlotIndexError",
]

"""Default directory for region files (a tmpfs on Linux)."""

RING_ALIGNMENT: Final = 64
"""Alignment, in bytes, of every ring region inside a :class:`SlotArena`."""

BOUNDARY_CAPACITY: Final = 4096
"""Data bytes of each slot's boundaries ring (256 records of 16 bytes)."""

_NAME_MAX: Final = 255


class RegionError(ValueError):
    """Invalid region name or size, or an unusable region file."""


class ArenaError(ValueError):
    """Invalid arena geometry or a region/buffer that cannot hold the arena."""


class SlotIndexError(IndexError):
    """Slot index outside ``[0, slots)``."""


def _validate_name(name: str) -> None:
    if not isinstance(name, str) or not name:
        raise RegionError("region name must be a non-empty str")
    if name in (".", "..") or "/" in name or "\0" in name:
        raise RegionError(f"region name must be a single path component, got {name!r}")
    if len(name.encode()) > _NAME_MAX:
        raise RegionError(f"region name longer than {_NAME_MAX} bytes")


def _map(fd: int, size: int) -> mmap.mmap:
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    return mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)


class SharedRegion:
    """A named shared-memory file mapped read-write into this process.

    Obtain one with :meth:`create` (owner) or :meth:`attach` (peer); the constructor
    is internal. The file lives at ``os.path.join(directory, name)``. Closing unmaps
    this process's view only; :meth:`unlink` removes the name (the memory stays
    valid for every process that still has it mapped). Used as a context manager,
    ``__exit__`` calls :meth:`close` (never :meth:`unlink`).
    """

    __slots__ = ("_buf", "_directory", "_mmap", "_name", "_size")

    def __init__(self, name: str, directory: str, mapping: mmap.mmap, size: int) -> None:
        self._name = name
        self._directory = directory
        self._size = size
        self._mmap: mmap.mmap | None = mapping
        self._buf: memoryview | None = memoryview(mapping)

    @classmethod
    def create(cls, name: str, size: int, directory: str = DEFAULT_SHM_DIR) -> SharedRegion:
        """Create a new zero-filled region file of *size* bytes and map it.

        The file is opened with ``O_CREAT | O_EXCL`` and mode ``0600`` and sized with
        ``ftruncate``; its pages are pre-faulted where ``MAP_POPULATE`` exists.

        Raises:
            RegionError: invalid *name* or ``size <= 0``.
            FileExistsError: a file of that name already exists in *directory*.
            OSError: any other failure (the partially created file is removed).
        """
        _validate_name(name)
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise RegionError(f"size must be a positive int, got {size!r}")
        path = os.path.join(directory, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.fchmod(fd, 0o600)  # independent of the umask
            os.ftruncate(fd, size)
            mapping = _map(fd, size)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        os.close(fd)  # the mapping stays valid without the descriptor
        return cls(name, directory, mapping, size)

    @classmethod
    def attach(
        cls,
        name: str,
        directory: str = DEFAULT_SHM_DIR,
        *,
        expected_size: int | None = None,
    ) -> SharedRegion:
        """Map an existing region file; its size is the file's current size.

        Raises:
            RegionError: invalid *name*, an empty file (its creator has not sized it
                yet), or a size different from *expected_size* when that is given.
            FileNotFoundError: no such region.
        """
        _validate_name(name)
        path = os.path.join(directory, name)
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            if size <= 0:
                raise RegionError(f"region {path!r} is empty")
            if expected_size is not None and size != expected_size:
                raise RegionError(f"region {path!r} has {size} bytes, expected {expected_size}")
            mapping = _map(fd, size)
        finally:
            os.close(fd)
        return cls(name, directory, mapping, size)

    @property
    def name(self) -> str:
        """The region's file name (a single path component)."""
        return self._name

    @property
    def directory(self) -> str:
        """The directory holding the region file."""
        return self._directory

    @property
    def path(self) -> str:
        """``os.path.join(directory, name)``."""
        return os.path.join(self._directory, self._name)

    @property
    def size(self) -> int:
        """Mapped size in bytes."""
        return self._size

    @property
    def buf(self) -> memoryview:
        """Writable byte view of the whole mapping.

        Raises:
            RegionError: the region has been closed.
        """
        buf = self._buf
        if buf is None:
            raise RegionError(f"region {self._name!r} is closed")
        return buf

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._buf is None

    def close(self) -> None:
        """Unmap this process's view. Idempotent; never unlinks.

        Release rings and arenas built on this region first (``SpscRing.release`` /
        ``SlotArena.close``) so the mapping is unmapped immediately. If views derived
        from :attr:`buf` are still alive, the region drops its own references and the
        mapping is unmapped when the last such view is garbage-collected, so no
        dangling access is possible.
        """
        buf, mapping = self._buf, self._mmap
        self._buf = None
        self._mmap = None
        if buf is not None:
            # Fails only if something exported this view; that keeps the mapping alive.
            with contextlib.suppress(BufferError):
                buf.release()
        if mapping is not None:
            # Fails while derived views live; the mapping is unmapped when they are freed.
            with contextlib.suppress(BufferError):
                mapping.close()

    def unlink(self) -> None:
        """Remove the region's name. Idempotent (a missing file is not an error).

        Only the creator should call this. Mappings in every process stay valid.
        """
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"SharedRegion(name={self._name!r}, size={self._size}, {state})"


def _align(n: int, alignment: int = RING_ALIGNMENT) -> int:
    return (n + alignment - 1) // alignment * alignment


def _address(view: memoryview) -> int:
    addr: int = np.frombuffer(view, dtype=np.uint8, count=1).ctypes.data
    return addr


class SlotArena:
    """A fixed pool of ``slots`` slots, each with an outbound and an inbound ring.

    See the module docstring for the layout. The constructor validates geometry and
    reads/writes nothing in the shared memory. Ring objects are created lazily and
    cached per slot; :meth:`outbound` / :meth:`inbound` return rings whose stored
    capacity has been verified (so a slot must have been reset by the owner first).
    The arena is not thread-safe and tracks no slot ownership.

    Args:
        region: a :class:`SharedRegion` or a writable, C-contiguous byte buffer whose
            start is 64-byte aligned and which holds at least
            ``region_size(slots, out_capacity, in_capacity)`` bytes.
        slots: number of slots, ``>= 1``.
        out_capacity: data bytes of each outbound (engine -> gateway) ring.
        in_capacity: data bytes of each inbound (gateway -> engine) ring.

    Raises:
        ArenaError: invalid geometry, or an unsuitable region/buffer.
    """

    __slots__ = (
        "_bnd_rings",
        "_in_capacity",
        "_in_rings",
        "_in_span",
        "_out_capacity",
        "_out_rings",
        "_out_span",
        "_slot_stride",
        "_slots",
        "_view",
    )

    def __init__(
        self,
        region: SharedRegion | memoryview,
        slots: int,
        out_capacity: int,
        in_capacity: int,
    ) -> None:
        need = SlotArena.region_size(slots, out_capacity, in_capacity)
        buf = region.buf if isinstance(region, SharedRegion) else region
        if buf.readonly:
            raise ArenaError("arena buffer must be writable")
        if buf.format != "B" or buf.ndim != 1:
            if not buf.c_contiguous:
                raise ArenaError("arena buffer must be C-contiguous")
            buf = buf.cast("B")
        if buf.nbytes < need:
            raise ArenaError(
                f"region too small: {buf.nbytes} bytes, arena of {slots} slots needs {need}"
            )
        view = buf[:need]
        address = _address(view)
        if address % RING_ALIGNMENT != 0:
            view.release()
            raise ArenaError(
                f"arena base must be {RING_ALIGNMENT}-byte aligned (address {address:#x})"
            )
        self._view: memoryview | None = view
        self._slots = slots
        self._out_capacity = out_capacity
        self._in_capacity = in_capacity
        self._out_span = _align(HEADER_SIZE + out_capacity)
        self._in_span = _align(HEADER_SIZE + in_capacity)
        self._slot_stride = self._out_span + self._in_span + _align(HEADER_SIZE + BOUNDARY_CAPACITY)
        self._out_rings: list[SpscRing | None] = [None] * slots
        self._in_rings: list[SpscRing | None] = [None] * slots
        self._bnd_rings: list[SpscRing | None] = [None] * slots

    @staticmethod
    def region_size(slots: int, out_capacity: int, in_capacity: int) -> int:
        """Bytes an arena of this geometry occupies: ``slots * slot_stride``.

        Raises:
            ArenaError: ``slots < 1`` or a capacity outside ``[1, MAX_CAPACITY]``.
        """
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ArenaError(f"slots must be an int >= 1, got {slots!r}")
        try:
            out_region = SpscRing.region_size(out_capacity)
            in_region = SpscRing.region_size(in_capacity)
        except RingError as exc:
            raise ArenaError(str(exc)) from exc
        bnd_region = SpscRing.region_size(BOUNDARY_CAPACITY)
        return slots * (_align(out_region) + _align(in_region) + _align(bnd_region))

    @property
    def slots(self) -> int:
        """Number of slots."""
        return self._slots

    @property
    def out_capacity(self) -> int:
        """Data bytes of each outbound ring."""
        return self._out_capacity

    @property
    def in_capacity(self) -> int:
        """Data bytes of each inbound ring."""
        return self._in_capacity

    @property
    def slot_stride(self) -> int:
        """Bytes between the starts of consecutive slots (a multiple of 64)."""
        return self._slot_stride

    def ring_offsets(self, slot: int) -> tuple[int, int, int]:
        """Byte offsets of *slot*'s (outbound, inbound, boundaries) rings in the arena.

        Raises:
            SlotIndexError: *slot* outside ``[0, slots)``.
        """
        self._check_slot(slot)
        base = slot * self._slot_stride
        return base, base + self._out_span, base + self._out_span + self._in_span

    def outbound(self, slot: int) -> SpscRing:
        """The engine -> gateway ring of *slot* (cached; capacity verified once).

        Raises:
            SlotIndexError: *slot* outside ``[0, slots)``.
            RingError: the slot's header does not hold ``out_capacity`` (not reset
                yet, or a geometry mismatch between the processes).
        """
        ring = self._out_rings[self._check_slot(slot)]
        if ring is None:
            offset = slot * self._slot_stride
            ring = SpscRing.attach(self._ring_view(offset), self._out_capacity)
            self._out_rings[slot] = ring
        return ring

    def inbound(self, slot: int) -> SpscRing:
        """The gateway -> engine ring of *slot* (cached; capacity verified once).

        Raises:
            SlotIndexError: *slot* outside ``[0, slots)``.
            RingError: the slot's header does not hold ``in_capacity``.
        """
        ring = self._in_rings[self._check_slot(slot)]
        if ring is None:
            offset = slot * self._slot_stride + self._out_span
            ring = SpscRing.attach(self._ring_view(offset), self._in_capacity)
            self._in_rings[slot] = ring
        return ring

    def boundaries(self, slot: int) -> SpscRing:
        """The engine -> gateway utterance-boundary ring of *slot* (cached).

        Raises:
            SlotIndexError: *slot* outside ``[0, slots)``.
            RingError: the slot's header does not hold ``BOUNDARY_CAPACITY``.
        """
        ring = self._bnd_rings[self._check_slot(slot)]
        if ring is None:
            offset = slot * self._slot_stride + self._out_span + self._in_span
            ring = SpscRing.attach(self._ring_view(offset), BOUNDARY_CAPACITY)
            self._bnd_rings[slot] = ring
        return ring

    def reset_slot(self, slot: int) -> None:
        """Reset every ring of *slot* (positions 0, capacity stored).

        Only while neither the producer nor the consumer of either ring is active.

        Raises:
            SlotIndexError: *slot* outside ``[0, slots)``.
        """
        self._check_slot(slot)
        base = slot * self._slot_stride
        out_ring = self._out_rings[slot]
        if out_ring is None:
            out_ring = SpscRing(self._ring_view(base), self._out_capacity)
            self._out_rings[slot] = out_ring
        in_ring = self._in_rings[slot]
        if in_ring is None:
            in_ring = SpscRing(self._ring_view(base + self._out_span), self._in_capacity)
            self._in_rings[slot] = in_ring
        bnd_ring = self._bnd_rings[slot]
        if bnd_ring is None:
            offset = base + self._out_span + self._in_span
            bnd_ring = SpscRing(self._ring_view(offset), BOUNDARY_CAPACITY)
            self._bnd_rings[slot] = bnd_ring
        out_ring.reset()
        in_ring.reset()
        bnd_ring.reset()

    def reset_all(self) -> None:
        """:meth:`reset_slot` every slot (owner, right after creating the region)."""
        for slot in range(self._slots):
            self.reset_slot(slot)

    def close(self) -> None:
        """Release every cached ring and the arena's view. Idempotent.

        Afterwards the underlying :class:`SharedRegion` can be closed (unmapped).
        """
        for rings in (self._out_rings, self._in_rings, self._bnd_rings):
            for i, ring in enumerate(rings):
                if ring is not None:
                    ring.release()
                    rings[i] = None
        view = self._view
        self._view = None
        if view is not None:
            view.release()

    def _check_slot(self, slot: int) -> int:
        if not 0 <= slot < self._slots:
            raise SlotIndexError(f"slot {slot} out of range [0, {self._slots})")
        if self._view is None:
            raise ArenaError("arena is closed")
        return slot

    def _ring_view(self, offset: int) -> memoryview:
        view = self._view
        assert view is not None  # checked by _check_slot
        return view[offset:]

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"SlotArena(slots={self._slots}, out_capacity={self._out_capacity}, "
            f"in_capacity={self._in_capacity}, slot_stride={self._slot_stride})"
        )
