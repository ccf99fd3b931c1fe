"""Single-producer single-consumer (SPSC) byte ring buffer over caller-supplied memory.

The ring lives inside a writable, C-contiguous buffer supplied by the caller -- in
production a ``memoryview`` over an ``mmap`` of a shared-memory file (see
:mod:`engine.ipc.shm`) that the gateway process and the TTS engine process both map.
Exactly one process (or thread) is the *producer* and exactly one is the *consumer*
of a given ring at any time.

Memory layout (a cross-process contract; do not change without changing both sides)
-----------------------------------------------------------------------------------
All integers are native-endian, which is little-endian on the supported targets
(x86-64, aarch64). The region starts at offset 0 of the buffer given to
:class:`SpscRing` and must be at least 8-byte aligned (64-byte alignment is
recommended so the two position fields sit on separate cache lines; the
:class:`engine.ipc.shm.SlotArena` guarantees it)::

    offset  size      field
    ------  --------  ----------------------------------------------------------
    0       8         write_pos  u64  total bytes ever published by the producer
    8       4         capacity   u32  number of data bytes (written by reset(),
                                      checked on attach)
    12      52        reserved, zero
    64      8         read_pos   u64  total bytes ever consumed by the consumer
    72      56        reserved, zero
    128     capacity  data bytes

``HEADER_SIZE`` is 128, so a ring occupies ``region_size(capacity) == 128 + capacity``
bytes.

Position rules
--------------
* ``write_pos`` and ``read_pos`` are monotonic byte counters; they never wrap
  (a u64 at 10 GB/s lasts ~58 years). The data index of a position is
  ``pos % capacity``; ``capacity`` need not be a power of two.
* ``readable = write_pos - read_pos`` and ``free = capacity - readable``;
  the invariant ``0 <= readable <= capacity`` always holds. A violation means the
  header was corrupted or reset under an active peer and raises :class:`RingError`.
* Only the producer ever stores ``write_pos``; only the consumer ever stores
  ``read_pos``. Each side merely loads the other side's position.
* Publish order: the producer copies the payload into the data area *first* and
  stores the new ``write_pos`` *afterwards*; the consumer copies bytes out *first*
  and stores the new ``read_pos`` *afterwards*. Hence the consumer never sees a
  position covering bytes that are not yet written, and the producer never
  overwrites bytes that the consumer has not finished copying. The producer never
  overwrites unread data: :meth:`SpscRing.write` accepts at most ``free`` bytes.

Memory-model assumptions
------------------------
Positions are accessed through a numpy ``uint64`` view of the header, so each load
(``ndarray.item``) and store (``ndarray.__setitem__``) is a single aligned 8-byte
machine access. This relies on:

* aligned 8-byte loads and stores being single-copy atomic, which holds on x86-64
  and aarch64 (so a peer never observes a torn position);
* neither CPython nor numpy reordering the payload copy and the position store:
  they are separate C calls with the store issued after the copy returns;
* the hardware making those stores visible in program order. x86-64 is TSO
  (stores are not reordered with older stores, loads not with older loads), so the
  publish order above is safe there. aarch64 is weakly ordered and gives no such
  guarantee without barriers; running the two sides on different cores of an
  aarch64 host would need a store-release/load-acquire primitive (e.g. a small C
  extension) in place of the plain numpy accesses.

Both sides poll; there is no blocking or notification in this module.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

__all__ = [
    "HEADER_SIZE",
    "MAX_CAPACITY",
    "RingError",
    "SpscRing",
]

HEADER_SIZE: Final = 128
"""Bytes of header preceding the data area."""

MAX_CAPACITY: Final = 0xFFFF_FFFF
"""Largest capacity representable in the u32 header field."""

_WRITE_POS_OFFSET: Final = 0
_CAPACITY_OFFSET: Final = 8
_READ_POS_OFFSET: Final = 64

# Indices into the uint64 / uint32 numpy views of the header.
_WPOS: Final = _WRITE_POS_OFFSET // 8
_RPOS: Final = _READ_POS_OFFSET // 8
_CAP32: Final = _CAPACITY_OFFSET // 4


class RingError(ValueError):
    """Misuse of a ring or an inconsistent ring header.

    Raised for invalid capacities or sizes, a buffer that is too small, read-only,
    non-contiguous or misaligned, a capacity mismatch on attach, operations on a
    released ring, and headers whose positions violate ``0 <= readable <= capacity``.
    """


def _check_capacity(capacity: int) -> None:
    if isinstance(capacity, bool) or not isinstance(capacity, int):
        raise RingError(f"capacity must be an int, got {type(capacity).__name__}")
    if not 1 <= capacity <= MAX_CAPACITY:
        raise RingError(f"capacity must be in [1, {MAX_CAPACITY}], got {capacity}")


def _as_byte_view(obj: memoryview | bytearray | bytes, *, writable: bool) -> memoryview:
    """Return a 1-D unsigned-byte view of *obj* (no copy)."""
    view = obj if isinstance(obj, memoryview) else memoryview(obj)
    if writable and view.readonly:
        raise RingError("buffer must be writable")
    if view.format != "B" or view.ndim != 1:
        if not view.c_contiguous:
            raise RingError("buffer must be C-contiguous")
        view = view.cast("B")
    return view


def _corrupt(write_pos: int, read_pos: int, capacity: int) -> RingError:
    return RingError(
        f"ring header inconsistent: write_pos={write_pos} read_pos={read_pos} "
        f"capacity={capacity} (reset under an active peer or memory corruption)"
    )


class SpscRing:
    """A single-producer single-consumer byte ring inside a caller-supplied buffer.

    The object keeps no cached positions; every operation loads the positions from
    the shared header, so any number of ``SpscRing`` objects (in any processes) may
    view the same memory, provided only one of them acts as producer and one as
    consumer at a time. Producer methods: :meth:`free_bytes`, :meth:`write`,
    :attr:`write_pos`. Consumer methods: :meth:`readable_bytes`, :meth:`read`,
    :meth:`read_into`, :meth:`discard_until`, :attr:`read_pos`.

    The constructor validates the buffer but neither initialises nor checks the
    header; use :meth:`create` (constructor + :meth:`reset`) on the side that owns
    the memory and :meth:`attach` (constructor + capacity check) on the peer.

    Args:
        buf: writable, C-contiguous buffer, at least ``region_size(capacity)`` bytes,
            whose start is 8-byte aligned. Only the first ``region_size(capacity)``
            bytes are used. The ring keeps views of it until :meth:`release`.
        capacity: number of data bytes, ``1 <= capacity <= MAX_CAPACITY``.

    Raises:
        RingError: invalid capacity, or an unsuitable buffer.
    """

    __slots__ = ("_cap32", "_capacity", "_data", "_hdr", "_region")

    def __init__(self, buf: memoryview | bytearray, capacity: int) -> None:
        _check_capacity(capacity)
        view = _as_byte_view(buf, writable=True)
        need = HEADER_SIZE + capacity
        if view.nbytes < need:
            raise RingError(
                f"buffer too small: {view.nbytes} bytes, ring of capacity {capacity} needs {need}"
            )
        region = view[:need]
        hdr: npt.NDArray[np.uint64] = np.frombuffer(region, dtype=np.uint64, count=HEADER_SIZE // 8)
        address: int = hdr.ctypes.data
        if address % 8 != 0:
            del hdr
            region.release()
            raise RingError(f"ring header must be 8-byte aligned (address {address:#x})")
        self._region: memoryview = region
        self._hdr: npt.NDArray[np.uint64] | None = hdr
        self._cap32: npt.NDArray[np.uint32] | None = np.frombuffer(
            region, dtype=np.uint32, count=HEADER_SIZE // 4
        )
        self._data: memoryview = region[HEADER_SIZE:]
        self._capacity: int = capacity

    # ------------------------------------------------------------------ lifecycle

    @staticmethod
    def region_size(capacity: int) -> int:
        """Bytes needed for a ring of *capacity* data bytes (``HEADER_SIZE + capacity``).

        Raises:
            RingError: *capacity* outside ``[1, MAX_CAPACITY]``.
        """
        _check_capacity(capacity)
        return HEADER_SIZE + capacity

    @classmethod
    def create(cls, buf: memoryview | bytearray, capacity: int) -> SpscRing:
        """Construct a ring over *buf* and :meth:`reset` it (owner side)."""
        ring = cls(buf, capacity)
        ring.reset()
        return ring

    @classmethod
    def attach(cls, buf: memoryview | bytearray, capacity: int) -> SpscRing:
        """Construct a ring over an already-initialised header and verify it.

        Raises:
            RingError: the stored capacity differs from *capacity* (e.g. the header
                was never reset, or the peer uses a different geometry), or the
                stored positions are inconsistent.
        """
        ring = cls(buf, capacity)
        try:
            ring.check()
        except RingError:
            ring.release()
            raise
        return ring

    def check(self) -> None:
        """Verify the stored capacity and the position invariant.

        Raises:
            RingError: capacity mismatch or ``readable`` outside ``[0, capacity]``.
        """
        stored = self.stored_capacity
        if stored != self._capacity:
            raise RingError(
                f"ring capacity mismatch: header says {stored}, expected {self._capacity}"
            )
        hdr = self._header()
        wpos: int = hdr.item(_WPOS)
        rpos: int = hdr.item(_RPOS)
        if not 0 <= wpos - rpos <= self._capacity:
            raise _corrupt(wpos, rpos, self._capacity)

    def reset(self) -> None:
        """Zero the header, set both positions to 0 and store the capacity.

        Only call when neither a producer nor a consumer is active on this ring
        (e.g. when a slot is handed to a new call); the peer must not be mid-
        operation. Data bytes are left as they are.
        """
        hdr = self._header()
        cap32 = self._cap32
        assert cap32 is not None  # released together with _hdr
        hdr[:] = 0
        cap32[_CAP32] = self._capacity

    def release(self) -> None:
        """Drop this object's views of the buffer so the mapping can be closed.

        Idempotent. Any later operation raises :class:`RingError`. The shared header
        and data are untouched.
        """
        if self._hdr is None:
            return
        self._hdr = None
        self._cap32 = None
        self._data.release()
        self._region.release()

    @property
    def released(self) -> bool:
        """Whether :meth:`release` has been called."""
        return self._hdr is None

    @property
    def capacity(self) -> int:
        """Number of data bytes (as given to the constructor)."""
        return self._capacity

    @property
    def stored_capacity(self) -> int:
        """The capacity field currently stored in the shared header."""
        self._header()
        cap32 = self._cap32
        assert cap32 is not None
        stored: int = cap32.item(_CAP32)
        return stored

    def _header(self) -> npt.NDArray[np.uint64]:
        hdr = self._hdr
        if hdr is None:
            raise RingError("ring has been released")
        return hdr

    # ------------------------------------------------------------------- producer

    @property
    def write_pos(self) -> int:
        """Total bytes ever published (monotonic; one atomic load)."""
        pos: int = self._header().item(_WPOS)
        return pos

    def free_bytes(self) -> int:
        """Bytes the producer can write now without overwriting unread data.

        Exact for the producer; may only grow until its next :meth:`write`.
        """
        hdr = self._header()
        wpos: int = hdr.item(_WPOS)
        rpos: int = hdr.item(_RPOS)
        cap = self._capacity
        readable = wpos - rpos
        if not 0 <= readable <= cap:
            raise _corrupt(wpos, rpos, cap)
        return cap - readable

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Producer: append as many leading bytes of *data* as fit; return that count.

        Never overwrites unread data: returns ``min(len(data), free_bytes())`` and 0
        when the ring is full or *data* is empty. The bytes are copied (at most two
        slice copies when wrapping) before ``write_pos`` is published. The caller
        retries the unaccepted tail ``data[n:]`` later.

        Raises:
            RingError: released ring or inconsistent header.
        """
        hdr = self._hdr
        if hdr is None:
            raise RingError("ring has been released")
        if isinstance(data, memoryview):
            if data.format != "B" or data.ndim != 1:
                data = _as_byte_view(data, writable=False)
        elif type(data) is not bytes and type(data) is not bytearray:
            data = _as_byte_view(data, writable=False)
        want = len(data)
        if want == 0:
            return 0
        wpos: int = hdr.item(_WPOS)
        rpos: int = hdr.item(_RPOS)
        cap = self._capacity
        readable = wpos - rpos
        if not 0 <= readable <= cap:
            raise _corrupt(wpos, rpos, cap)
        n = cap - readable
        if n == 0:
            return 0
        if want < n:
            n = want
        start = wpos % cap
        tail = cap - start
        dst = self._data
        if n <= tail:
            # bytes/bytearray/memoryview all assign straight into the slice.
            dst[start : start + n] = data if n == want else memoryview(data)[:n]
        else:
            src = memoryview(data)
            dst[start:] = src[:tail]
            dst[: n - tail] = src[tail:n]
        hdr[_WPOS] = wpos + n  # publish after the copy
        return n

    # ------------------------------------------------------------------- consumer

    @property
    def read_pos(self) -> int:
        """Total bytes ever consumed or discarded (monotonic; one atomic load)."""
        pos: int = self._header().item(_RPOS)
        return pos

    def readable_bytes(self) -> int:
        """Bytes the consumer can read now. Exact for the consumer; may only grow."""
        hdr = self._header()
        wpos: int = hdr.item(_WPOS)
        rpos: int = hdr.item(_RPOS)
        readable = wpos - rpos
        if not 0 <= readable <= self._capacity:
            raise _corrupt(wpos, rpos, self._capacity)
        return readable

    def read(self, max_bytes: int) -> bytes:
        """Consumer: remove and return up to *max_bytes* bytes (``b""`` when empty).

        Returns ``min(max_bytes, readable_bytes())`` bytes in FIFO order. The bytes
        are copied out before ``read_pos`` is published.

        Raises:
            RingError: negative *max_bytes*, released ring or inconsistent header.
        """
        if max_bytes < 0:
            raise RingError(f"max_bytes must be >= 0, got {max_bytes}")
        hdr = self._hdr
        if hdr is None:
            raise RingError("ring has been released")
        wpos: int = hdr.item(_WPOS)
        rpos: int = hdr.item(_RPOS)
        cap = self._capacity
        n = wpos - rpos
        if not 0 <= n <= cap:
            raise _corrupt(wpos, rpos, cap)
        if max_bytes < n:
            n = max_bytes
        if n == 0:
            return b""
        start = rpos % cap
        tail = cap - start
        src = self._data
        if n <= tail:
            out = src[start : start + n].tobytes()
        else:
            out = b"".join((src[start:], src[: n - tail]))
        hdr[_RPOS] = rpos + n  # publish after the copy
        return out

    def read_into(self, out: memoryview | bytearray) -> int:
        """Consumer: fill the front of *out* with up to ``len(out)`` bytes; return count.

        *out* must be writable (a ``bytearray`` or a writable memoryview; non-byte
        formats are viewed as raw bytes). Bytes past the returned count are left
        untouched.

        Raises:
            RingError: read-only or non-contiguous *out*, released ring or
                inconsistent header.
        """
        hdr = self._hdr
        if hdr is None:
            raise RingError("ring has been released")
        dst = out if type(out) is bytearray else _as_byte_view(out, writable=True)
        wpos: int = hdr.item(_WPOS)
        rpos: int = hdr.item(_RPOS)
        cap = self._capacity
        n = wpos - rpos
        if not 0 <= n <= cap:
            raise _corrupt(wpos, rpos, cap)
        room = len(dst)
        if room < n:
            n = room
        if n == 0:
            return 0
        start = rpos % cap
        tail = cap - start
        src = self._data
        if n <= tail:
            dst[:n] = src[start : start + n]
        else:
            dst[:tail] = src[start:]
            dst[tail:n] = src[: n - tail]
        hdr[_RPOS] = rpos + n  # publish after the copy
        return n

    def discard_until(self, pos: int) -> None:
        """Consumer: drop unread bytes so that ``read_pos`` becomes ``min(pos, write_pos)``.

        Used to drop cancelled audio. A *pos* at or behind the current ``read_pos``
        is a no-op (positions never move backwards).

        Raises:
            RingError: negative *pos*, released ring or inconsistent header.
        """
        if pos < 0:
            raise RingError(f"pos must be >= 0, got {pos}")
        hdr = self._header()
        wpos: int = hdr.item(_WPOS)
        rpos: int = hdr.item(_RPOS)
        if not 0 <= wpos - rpos <= self._capacity:
            raise _corrupt(wpos, rpos, self._capacity)
        target = pos if pos < wpos else wpos
        if target > rpos:
            hdr[_RPOS] = target

    def __repr__(self) -> str:
        if self._hdr is None:
            return f"SpscRing(capacity={self._capacity}, released)"
        return (
            f"SpscRing(capacity={self._capacity}, write_pos={self.write_pos}, "
            f"read_pos={self.read_pos})"
        )
