"""Utterance boundaries, published in shared memory next to the audio they delimit.

The engine writes utterance after utterance into one outbound ring. The gateway must
know where one ends before it reads bytes of the next, and a control message cannot
guarantee that: the ring is visible at once, the socket is not. So before the engine
writes the first byte of a later utterance, it appends a record to the slot's
*boundaries* ring (see :class:`engine.ipc.shm.SlotArena`)::

    record = u64 utterance seq, u64 end position in the outbound ring   (little-endian)

Reading rule (consumer): load the outbound ring's ``write_pos`` first, then
:meth:`BoundaryReader.drain`. Every byte up to that ``write_pos`` that belongs to a
later utterance was written after its predecessor's record, so the record is visible
(stores are not reordered with stores, nor loads with loads, on x86-64; see
:mod:`engine.ipc.ring` for other architectures).
"""

from __future__ import annotations

import struct
from typing import Final

from engine.ipc.ring import SpscRing

RECORD: Final = struct.Struct("<QQ")


class BoundaryWriter:
    """Producer side; never writes a partial record."""

    def __init__(self, ring: SpscRing) -> None:
        self._ring = ring

    def append(self, seq: int, end_pos: int) -> bool:
        """Publish that utterance ``seq`` ends at ``end_pos``; False if the ring is full."""
        if self._ring.free_bytes() < RECORD.size:
            return False
        written = self._ring.write(RECORD.pack(seq, end_pos))
        assert written == RECORD.size
        return True


class BoundaryReader:
    """Consumer side."""

    def __init__(self, ring: SpscRing) -> None:
        self._ring = ring

    def drain(self) -> list[tuple[int, int]]:
        """Every complete record published so far, oldest first, as (seq, end_pos)."""
        available = self._ring.readable_bytes()
        whole = available - available % RECORD.size
        if not whole:
            return []
        data = self._ring.read(whole)
        return [RECORD.unpack_from(data, i) for i in range(0, whole, RECORD.size)]
