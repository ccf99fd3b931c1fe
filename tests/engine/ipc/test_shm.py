"""Tests for engine.ipc.shm: SharedRegion lifecycle and SlotArena geometry/isolation."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from engine.ipc.ring import HEADER_SIZE, RingError, SpscRing
from engine.ipc.shm import (
    BOUNDARY_CAPACITY,
    DEFAULT_SHM_DIR,
    RING_ALIGNMENT,
    ArenaError,
    RegionError,
    SharedRegion,
    SlotArena,
    SlotIndexError,
)


def unique_name() -> str:
    return f"shm-test-{uuid.uuid4().hex}"


@pytest.fixture
def region_dir(tmp_path: Path) -> str:
    return str(tmp_path)


@pytest.fixture
def arena_region(region_dir: str) -> Iterator[SharedRegion]:
    size = SlotArena.region_size(4, 1000, 300)
    region = SharedRegion.create(unique_name(), size, region_dir)
    yield region
    region.close()
    region.unlink()


# ---------------------------------------------------------------- SharedRegion


def test_create_attach_unlink(region_dir: str) -> None:
    name = unique_name()
    owner = SharedRegion.create(name, 10_000, region_dir)
    path = os.path.join(region_dir, name)
    assert owner.name == name
    assert owner.directory == region_dir
    assert owner.path == path
    assert owner.size == 10_000
    assert len(owner.buf) == 10_000
    assert bytes(owner.buf[:16]) == bytes(16)  # zero-filled
    assert os.path.getsize(path) == 10_000
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600

    peer = SharedRegion.attach(name, region_dir)
    assert peer.size == 10_000
    owner.buf[100:105] = b"hello"
    assert bytes(peer.buf[100:105]) == b"hello"
    peer.buf[9_999] = 7
    assert owner.buf[9_999] == 7

    owner.unlink()
    assert not os.path.exists(path)
    owner.unlink()  # idempotent
    # Existing mappings survive the unlink.
    peer.buf[0] = 42
    assert owner.buf[0] == 42
    owner.close()
    peer.close()
    assert owner.closed and peer.closed
    owner.close()  # idempotent


def test_create_existing_name_fails(region_dir: str) -> None:
    name = unique_name()
    with SharedRegion.create(name, 64, region_dir) as region:
        with pytest.raises(FileExistsError):
            SharedRegion.create(name, 64, region_dir)
        region.unlink()


def test_attach_missing_raises_file_not_found(region_dir: str) -> None:
    with pytest.raises(FileNotFoundError):
        SharedRegion.attach(unique_name(), region_dir)


def test_attach_expected_size(region_dir: str) -> None:
    name = unique_name()
    with SharedRegion.create(name, 4096, region_dir) as region:
        with SharedRegion.attach(name, region_dir, expected_size=4096) as peer:
            assert peer.size == 4096
        with pytest.raises(RegionError, match="expected"):
            SharedRegion.attach(name, region_dir, expected_size=8192)
        region.unlink()


def test_attach_empty_file_rejected(region_dir: str) -> None:
    name = unique_name()
    Path(region_dir, name).touch()
    with pytest.raises(RegionError, match="empty"):
        SharedRegion.attach(name, region_dir)


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "x\0y", "n" * 256])
def test_invalid_names(region_dir: str, name: str) -> None:
    with pytest.raises(RegionError):
        SharedRegion.create(name, 64, region_dir)
    with pytest.raises(RegionError):
        SharedRegion.attach(name, region_dir)


@pytest.mark.parametrize("size", [0, -1])
def test_invalid_size(region_dir: str, size: int) -> None:
    name = unique_name()
    with pytest.raises(RegionError):
        SharedRegion.create(name, size, region_dir)
    assert not os.path.exists(os.path.join(region_dir, name))


def test_context_manager_closes_not_unlinks(region_dir: str) -> None:
    name = unique_name()
    with SharedRegion.create(name, 128, region_dir) as region:
        region.buf[0] = 1
    assert region.closed
    with pytest.raises(RegionError, match="closed"):
        _ = region.buf
    assert os.path.exists(os.path.join(region_dir, name))
    with SharedRegion.attach(name, region_dir) as peer:
        assert peer.buf[0] == 1
        peer.unlink()
    assert not os.path.exists(os.path.join(region_dir, name))


def test_close_with_released_ring_unmaps(region_dir: str) -> None:
    with SharedRegion.create(unique_name(), SpscRing.region_size(64), region_dir) as region:
        ring = SpscRing.create(region.buf, 64)
        ring.write(b"abc")
        ring.release()
        mapping = region._mmap
        assert mapping is not None
        region.close()
        assert mapping.closed
        region.unlink()


def test_close_with_live_ring_is_safe(region_dir: str) -> None:
    region = SharedRegion.create(unique_name(), SpscRing.region_size(64), region_dir)
    ring = SpscRing.create(region.buf, 64)
    region.close()  # must not raise; the live ring keeps the mapping alive
    assert region.closed
    assert ring.write(b"still mapped") == 12
    assert ring.read(100) == b"still mapped"
    ring.release()
    region.unlink()


@pytest.mark.skipif(not os.path.isdir(DEFAULT_SHM_DIR), reason="no /dev/shm")
def test_default_directory_is_dev_shm() -> None:
    name = unique_name()
    region = SharedRegion.create(name, 256)
    try:
        assert region.path == os.path.join(DEFAULT_SHM_DIR, name)
        with SharedRegion.attach(name) as peer:
            region.buf[:3] = b"abc"
            assert bytes(peer.buf[:3]) == b"abc"
    finally:
        region.close()
        region.unlink()
    assert not os.path.exists(os.path.join(DEFAULT_SHM_DIR, name))


def _child_attach_and_write(name: str, directory: str) -> None:
    with SharedRegion.attach(name, directory) as region:
        region.buf[:5] = b"child"


def test_attach_in_other_process_does_not_unlink(region_dir: str) -> None:
    name = unique_name()
    with SharedRegion.create(name, 64, region_dir) as region:
        proc = multiprocessing.get_context("fork").Process(
            target=_child_attach_and_write, args=(name, region_dir)
        )
        proc.start()
        proc.join(timeout=30)
        assert proc.exitcode == 0
        assert bytes(region.buf[:5]) == b"child"
        assert os.path.exists(region.path)  # the child's exit did not unlink it
        region.unlink()


# ------------------------------------------------------------------- SlotArena


def test_arena_region_size_and_alignment() -> None:
    out_span = -(-(HEADER_SIZE + 1000) // 64) * 64
    in_span = -(-(HEADER_SIZE + 300) // 64) * 64
    bnd_span = HEADER_SIZE + BOUNDARY_CAPACITY  # both multiples of 64
    assert SlotArena.region_size(4, 1000, 300) == 4 * (out_span + in_span + bnd_span)
    assert SlotArena.region_size(1, 64 - HEADER_SIZE % 64, 1) == 128 + 64 + 192 + bnd_span
    assert SlotArena.region_size(3, 4096 - HEADER_SIZE, 2048 - HEADER_SIZE) == 3 * (6144 + bnd_span)


def test_arena_layout(arena_region: SharedRegion) -> None:
    arena = SlotArena(arena_region, 4, 1000, 300)
    assert arena.slots == 4
    assert arena.out_capacity == 1000
    assert arena.in_capacity == 300
    assert arena.slot_stride % RING_ALIGNMENT == 0
    assert arena.slot_stride * 4 == SlotArena.region_size(4, 1000, 300)
    spans: list[tuple[int, int]] = []
    for slot in range(arena.slots):
        out_off, in_off, bnd_off = arena.ring_offsets(slot)
        assert out_off % RING_ALIGNMENT == 0
        assert in_off % RING_ALIGNMENT == 0
        assert bnd_off % RING_ALIGNMENT == 0
        spans.append((out_off, out_off + SpscRing.region_size(1000)))
        spans.append((in_off, in_off + SpscRing.region_size(300)))
        spans.append((bnd_off, bnd_off + SpscRing.region_size(BOUNDARY_CAPACITY)))
    spans.sort()
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end <= start  # no overlap
    assert spans[-1][1] <= SlotArena.region_size(4, 1000, 300)
    arena.close()


def test_arena_slots_do_not_overlap(arena_region: SharedRegion) -> None:
    arena = SlotArena(arena_region, 4, 1000, 300)
    arena.reset_all()
    rings = [(arena.outbound(s), 1000) for s in range(4)]
    rings += [(arena.inbound(s), 300) for s in range(4)]
    # Advance each ring differently so the data straddles the wrap point, then fill
    # every ring to exactly full with a distinct pattern.
    for idx, (ring, cap) in enumerate(rings):
        ring.write(bytes(cap // 2 + idx))
        ring.read(cap)
        fill = bytes([idx + 1]) * (cap - 1) + bytes([0xF0 | idx])
        assert ring.write(fill) == cap
    for idx, (ring, cap) in enumerate(rings):
        data = ring.read(cap)
        assert data == bytes([idx + 1]) * (cap - 1) + bytes([0xF0 | idx])
        assert ring.stored_capacity == cap
    arena.close()


def test_arena_rings_are_at_documented_offsets(arena_region: SharedRegion) -> None:
    arena = SlotArena(arena_region, 4, 1000, 300)
    arena.reset_all()
    arena.outbound(2).write(b"OUT")
    arena.inbound(3).write(b"IN")
    out_off, _, _ = arena.ring_offsets(2)
    _, in_off, _ = arena.ring_offsets(3)
    buf = arena_region.buf
    assert int.from_bytes(buf[out_off + 8 : out_off + 12], "little") == 1000
    assert bytes(buf[out_off + HEADER_SIZE : out_off + HEADER_SIZE + 3]) == b"OUT"
    assert int.from_bytes(buf[in_off : in_off + 8], "little") == 2
    assert bytes(buf[in_off + HEADER_SIZE : in_off + HEADER_SIZE + 2]) == b"IN"
    arena.close()


def test_arena_shared_between_attachments(arena_region: SharedRegion, region_dir: str) -> None:
    owner = SlotArena(arena_region, 4, 1000, 300)
    owner.reset_all()
    with SharedRegion.attach(arena_region.name, region_dir) as peer_region:
        peer = SlotArena(peer_region, 4, 1000, 300)
        assert owner.outbound(1).write(b"pcm") == 3
        assert peer.outbound(1).read(10) == b"pcm"
        assert peer.inbound(1).write(b"mic") == 3
        assert owner.inbound(1).read(10) == b"mic"
        assert owner.outbound(1).read_pos == 3
        peer.close()


def test_arena_reset_slot(arena_region: SharedRegion) -> None:
    arena = SlotArena(arena_region, 4, 1000, 300)
    arena.reset_all()
    arena.outbound(0).write(b"stale")
    arena.inbound(0).write(b"stale")
    arena.outbound(1).write(b"keep")
    arena.reset_slot(0)
    assert arena.outbound(0).readable_bytes() == 0
    assert arena.inbound(0).readable_bytes() == 0
    assert arena.outbound(0).write_pos == 0
    assert arena.outbound(1).read(10) == b"keep"
    assert arena.outbound(0) is arena.outbound(0)  # cached
    arena.close()


def test_arena_unreset_slot_fails_attach(arena_region: SharedRegion) -> None:
    arena = SlotArena(arena_region, 4, 1000, 300)
    with pytest.raises(RingError, match="mismatch"):
        arena.outbound(0)
    arena.reset_slot(0)
    assert arena.outbound(0).capacity == 1000
    with pytest.raises(RingError):
        arena.inbound(1)
    arena.close()


def test_arena_geometry_mismatch_detected(arena_region: SharedRegion) -> None:
    owner = SlotArena(arena_region, 4, 1000, 300)
    owner.reset_all()
    other = SlotArena(arena_region, 2, 1000, 200)
    with pytest.raises(RingError, match="mismatch"):
        other.inbound(0)
    other.close()
    owner.close()


@pytest.mark.parametrize("slot", [-1, 4, 100])
def test_arena_slot_bounds(arena_region: SharedRegion, slot: int) -> None:
    arena = SlotArena(arena_region, 4, 1000, 300)
    arena.reset_all()
    with pytest.raises(SlotIndexError):
        arena.outbound(slot)
    with pytest.raises(SlotIndexError):
        arena.inbound(slot)
    with pytest.raises(SlotIndexError):
        arena.reset_slot(slot)
    with pytest.raises(SlotIndexError):
        arena.ring_offsets(slot)
    assert issubclass(SlotIndexError, IndexError)
    arena.close()


def test_arena_region_too_small(region_dir: str) -> None:
    need = SlotArena.region_size(4, 1000, 300)
    with SharedRegion.create(unique_name(), need - 1, region_dir) as region:
        with pytest.raises(ArenaError, match="too small"):
            SlotArena(region, 4, 1000, 300)
        region.unlink()


@pytest.mark.parametrize(
    ("slots", "out_cap", "in_cap"), [(0, 10, 10), (-1, 10, 10), (1, 0, 10), (1, 10, -5)]
)
def test_arena_invalid_geometry(slots: int, out_cap: int, in_cap: int) -> None:
    with pytest.raises(ArenaError):
        SlotArena.region_size(slots, out_cap, in_cap)
    with pytest.raises(ArenaError):
        SlotArena(memoryview(bytearray(4096)), slots, out_cap, in_cap)


def test_arena_misaligned_buffer_rejected(arena_region: SharedRegion) -> None:
    with pytest.raises(ArenaError, match="aligned"):
        SlotArena(arena_region.buf[8:], 1, 64, 64)


def test_arena_over_plain_buffer() -> None:
    size = SlotArena.region_size(2, 64, 64)
    raw = np.zeros(size + 64, dtype=np.uint8)
    offset = (-raw.ctypes.data) % 64
    with SlotArena(raw[offset : offset + size].data, 2, 64, 64) as arena:
        arena.reset_all()
        assert arena.outbound(1).write(b"x" * 100) == 64


def test_arena_close_allows_region_close(region_dir: str) -> None:
    size = SlotArena.region_size(3, 256, 256)
    region = SharedRegion.create(unique_name(), size, region_dir)
    arena = SlotArena(region, 3, 256, 256)
    arena.reset_all()
    for s in range(3):
        arena.outbound(s).write(b"abc")
        arena.inbound(s).read(1)
    mapping = region._mmap
    assert mapping is not None
    arena.close()
    arena.close()  # idempotent
    with pytest.raises(ArenaError, match="closed"):
        arena.outbound(0)
    region.close()
    assert mapping.closed  # nothing kept the mapping exported
    region.unlink()
