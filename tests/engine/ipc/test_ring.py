"""Tests for engine.ipc.ring.SpscRing: semantics, wrap-around, misuse, cross-process."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import time
import uuid
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.ipc.ring import HEADER_SIZE, MAX_CAPACITY, RingError, SpscRing
from engine.ipc.shm import SharedRegion

# --------------------------------------------------------------------------- helpers


def aligned_buffer(size: int) -> memoryview:
    """A writable, 64-byte-aligned byte buffer of *size* bytes."""
    raw = np.zeros(size + 64, dtype=np.uint8)
    offset = (-raw.ctypes.data) % 64
    return raw[offset : offset + size].data


def make_ring(capacity: int) -> SpscRing:
    return SpscRing.create(aligned_buffer(SpscRing.region_size(capacity)), capacity)


def pattern(n: int, seed: int = 0) -> bytes:
    return bytes((seed + i * 7) % 251 for i in range(n))


# ------------------------------------------------------------------------- geometry


def test_region_size() -> None:
    assert HEADER_SIZE == 128
    assert SpscRing.region_size(1) == 129
    assert SpscRing.region_size(4096) == 128 + 4096


@pytest.mark.parametrize("capacity", [0, -1, MAX_CAPACITY + 1])
def test_invalid_capacity(capacity: int) -> None:
    with pytest.raises(RingError):
        SpscRing.region_size(capacity)
    with pytest.raises(RingError):
        SpscRing(aligned_buffer(256), capacity)


def test_region_too_small() -> None:
    with pytest.raises(RingError, match="too small"):
        SpscRing(aligned_buffer(128 + 15), 16)


def test_readonly_buffer_rejected() -> None:
    with pytest.raises(RingError, match="writable"):
        SpscRing(memoryview(bytes(256)), 16)


def test_misaligned_buffer_rejected() -> None:
    buf = aligned_buffer(512)
    with pytest.raises(RingError, match="aligned"):
        SpscRing(buf[4:], 16)


def test_header_layout() -> None:
    buf = aligned_buffer(SpscRing.region_size(100))
    buf[:] = b"\xff" * len(buf)
    ring = SpscRing.create(buf, 100)
    assert ring.write(b"abc") == 3
    assert ring.read(2) == b"ab"
    hdr = bytes(buf[:HEADER_SIZE])
    assert int.from_bytes(hdr[0:8], "little") == 3  # write_pos
    assert int.from_bytes(hdr[8:12], "little") == 100  # capacity
    assert int.from_bytes(hdr[64:72], "little") == 2  # read_pos
    assert hdr[12:64] == bytes(52)
    assert hdr[72:128] == bytes(56)
    assert bytes(buf[HEADER_SIZE : HEADER_SIZE + 3]) == b"abc"


def test_bytearray_buffer_accepted() -> None:
    ring = SpscRing.create(bytearray(SpscRing.region_size(8)), 8)
    assert ring.write(b"xy") == 2
    assert ring.read(8) == b"xy"
    ring.release()


# ------------------------------------------------------------------------ semantics


def test_empty_ring_reads_nothing() -> None:
    ring = make_ring(64)
    assert ring.readable_bytes() == 0
    assert ring.free_bytes() == 64
    assert ring.read(10) == b""
    out = bytearray(b"zzzz")
    assert ring.read_into(out) == 0
    assert out == b"zzzz"
    assert ring.read_pos == 0
    assert ring.write_pos == 0


def test_zero_sized_operations() -> None:
    ring = make_ring(16)
    assert ring.write(b"") == 0
    assert ring.write(b"hello") == 5
    assert ring.read(0) == b""
    assert ring.read_into(bytearray()) == 0
    assert ring.read(5) == b"hello"


def test_fill_exactly_then_full_never_overwrites() -> None:
    ring = make_ring(32)
    data = pattern(32)
    assert ring.write(data[:20]) == 20
    assert ring.write(data[20:]) == 12
    assert ring.free_bytes() == 0
    assert ring.readable_bytes() == 32
    assert ring.write(b"X") == 0
    assert ring.write(b"XXXXXXXX") == 0
    assert ring.write_pos == 32
    assert ring.read(100) == data
    assert ring.free_bytes() == 32


def test_partial_write_when_nearly_full() -> None:
    ring = make_ring(10)
    assert ring.write(b"0123456") == 7
    assert ring.write(b"abcdef") == 3
    assert ring.read(10) == b"0123456abc"
    assert ring.write(b"") == 0


def test_read_more_than_available() -> None:
    ring = make_ring(16)
    ring.write(b"abc")
    assert ring.read(1000) == b"abc"
    assert ring.read(1000) == b""


@pytest.mark.parametrize("capacity", [1, 2, 7, 64, 100])
@pytest.mark.parametrize("size", ["one", "cap-1", "cap", "odd"])
def test_wrap_around_many_times(capacity: int, size: str) -> None:
    ring = make_ring(capacity)
    step = {
        "one": 1,
        "cap-1": max(capacity - 1, 1),
        "cap": capacity,
        "odd": max(capacity // 2 + 1, 1),
    }[size]
    stream = pattern(step * 9 * max(capacity, 3), seed=capacity)
    written = read = 0
    out = bytearray()
    view = memoryview(stream)
    turn = 0
    while read < len(stream):
        # Alternate the accepted input types and both read flavours.
        piece: bytes | bytearray | memoryview
        if turn % 3 == 0:
            piece = stream[written : written + step]
        elif turn % 3 == 1:
            piece = bytearray(stream[written : written + step])
        else:
            piece = view[written : written + step]
        written += ring.write(piece)
        if turn % 2:
            chunk = ring.read(step)
        else:
            buf = bytearray(step)
            chunk = bytes(buf[: ring.read_into(buf)])
        out += chunk
        read += len(chunk)
        turn += 1
    assert bytes(out) == stream
    assert ring.write_pos == ring.read_pos == len(stream)


def test_wrap_straddles_end_with_read_into() -> None:
    ring = make_ring(10)
    assert ring.write(b"0123456") == 7
    assert ring.read(6) == b"012345"  # read_pos = 6, one byte left at index 6
    assert ring.write(b"abcdefghi") == 9  # occupies 7..9 then 0..5
    out = bytearray(20)
    assert ring.read_into(out) == 10
    assert bytes(out[:10]) == b"6abcdefghi"
    assert out[10:] == bytes(10)


def test_read_into_partial_and_memoryview() -> None:
    ring = make_ring(16)
    ring.write(b"abcdefgh")
    out = bytearray(b"........")
    view = memoryview(out)[2:5]
    assert ring.read_into(view) == 3
    assert out == b"..abc..."
    assert ring.read(100) == b"defgh"


def test_read_into_non_byte_format() -> None:
    ring = make_ring(16)
    ring.write(bytes(range(8)))
    out = np.zeros(2, dtype=np.uint32)
    assert ring.read_into(out.data) == 8
    assert out.tobytes() == bytes(range(8))


def test_read_into_readonly_rejected() -> None:
    ring = make_ring(16)
    ring.write(b"abc")
    with pytest.raises(RingError):
        ring.read_into(memoryview(b"xxx"))
    assert ring.readable_bytes() == 3


def test_write_accepts_non_byte_memoryview() -> None:
    ring = make_ring(16)
    samples = np.arange(4, dtype=np.int16)
    assert ring.write(samples.data) == 8
    assert ring.read(8) == samples.tobytes()
    assert ring.write(bytearray(b"ba")) == 2
    assert ring.write(memoryview(b"0123456789")[3:6]) == 3
    assert ring.read(10) == b"ba345"


def test_negative_sizes_rejected() -> None:
    ring = make_ring(16)
    ring.write(b"abc")
    with pytest.raises(RingError):
        ring.read(-1)
    with pytest.raises(RingError):
        ring.discard_until(-1)
    assert ring.read(3) == b"abc"


def test_discard_until() -> None:
    ring = make_ring(16)
    ring.write(b"0123456789")
    ring.discard_until(4)
    assert ring.read_pos == 4
    assert ring.read(2) == b"45"
    ring.discard_until(3)  # behind read_pos: no-op
    assert ring.read_pos == 6
    ring.discard_until(1_000)  # clamped to write_pos
    assert ring.read_pos == ring.write_pos == 10
    assert ring.readable_bytes() == 0
    assert ring.free_bytes() == 16
    ring.write(b"abcdefghijkl")  # wraps
    ring.discard_until(ring.write_pos - 3)
    assert ring.read(10) == b"jkl"


def test_discard_cancelled_audio_frees_space() -> None:
    ring = make_ring(8)
    assert ring.write(b"ABCDEFGH") == 8
    assert ring.write(b"x") == 0
    ring.discard_until(ring.write_pos)
    assert ring.write(b"new") == 3
    assert ring.read(8) == b"new"


def test_positions_monotonic() -> None:
    ring = make_ring(13)
    rng = np.random.default_rng(1)
    last_w = last_r = 0
    for _ in range(2_000):
        op = int(rng.integers(0, 4))
        n = int(rng.integers(0, 20))
        if op == 0:
            ring.write(bytes(n))
        elif op == 1:
            ring.read(n)
        elif op == 2:
            ring.read_into(bytearray(n))
        else:
            ring.discard_until(ring.read_pos + n // 4)
        w, r = ring.write_pos, ring.read_pos
        assert w >= last_w
        assert r >= last_r
        assert 0 <= w - r <= 13
        last_w, last_r = w, r
    assert last_w > 1_000


def test_positions_never_wrap_to_zero() -> None:
    ring = make_ring(7)
    total = 0
    for _ in range(100):
        total += ring.write(b"1234567")
        ring.read(7)
    assert ring.write_pos == ring.read_pos == total == 700


# ----------------------------------------------------------------- attach / reset


def test_attach_same_memory_shares_state() -> None:
    buf = aligned_buffer(SpscRing.region_size(32))
    producer = SpscRing.create(buf, 32)
    consumer = SpscRing.attach(buf, 32)
    assert consumer.stored_capacity == 32
    assert producer.write(b"hello") == 5
    assert consumer.readable_bytes() == 5
    assert consumer.read(5) == b"hello"
    assert producer.free_bytes() == 32
    assert producer.read_pos == 5


def test_attach_capacity_mismatch() -> None:
    buf = aligned_buffer(SpscRing.region_size(64))
    SpscRing.create(buf, 32)
    with pytest.raises(RingError, match="mismatch"):
        SpscRing.attach(buf, 64)
    with pytest.raises(RingError, match="mismatch"):
        SpscRing.attach(buf, 16)
    assert SpscRing.attach(buf, 32).capacity == 32


def test_attach_uninitialised_header_fails() -> None:
    with pytest.raises(RingError, match="mismatch"):
        SpscRing.attach(aligned_buffer(SpscRing.region_size(32)), 32)


def test_reset_clears_positions() -> None:
    ring = make_ring(8)
    ring.write(b"abcdef")
    ring.read(2)
    ring.reset()
    assert ring.write_pos == ring.read_pos == 0
    assert ring.readable_bytes() == 0
    assert ring.stored_capacity == 8


def test_corrupt_header_detected() -> None:
    buf = aligned_buffer(SpscRing.region_size(8))
    ring = SpscRing.create(buf, 8)
    buf[0:8] = (100).to_bytes(8, "little")  # write_pos far ahead of read_pos
    with pytest.raises(RingError, match="inconsistent"):
        ring.read(1)
    with pytest.raises(RingError, match="inconsistent"):
        ring.write(b"x")
    with pytest.raises(RingError, match="inconsistent"):
        SpscRing.attach(buf, 8)


def test_release() -> None:
    ring = make_ring(8)
    ring.release()
    ring.release()  # idempotent
    assert ring.released
    with pytest.raises(RingError, match="released"):
        ring.write(b"x")
    with pytest.raises(RingError, match="released"):
        ring.read(1)
    with pytest.raises(RingError, match="released"):
        _ = ring.write_pos
    assert "released" in repr(ring)


# ---------------------------------------------------------------- property test

operation = st.one_of(
    st.tuples(st.just("write"), st.binary(min_size=0, max_size=40)),
    st.tuples(st.just("read"), st.integers(min_value=0, max_value=40)),
    st.tuples(st.just("read_into"), st.integers(min_value=0, max_value=40)),
)


@settings(max_examples=300, deadline=None)
@given(
    capacity=st.integers(min_value=1, max_value=24),
    ops=st.lists(operation, max_size=80),
)
def test_property_fifo_no_overwrite(capacity: int, ops: list[tuple[str, object]]) -> None:
    ring = make_ring(capacity)
    accepted = bytearray()
    got = bytearray()
    for kind, arg in ops:
        if kind == "write":
            assert isinstance(arg, bytes)
            free = ring.free_bytes()
            n = ring.write(arg)
            assert n == min(len(arg), free)
            assert n <= free
            accepted += arg[:n]
        else:
            assert isinstance(arg, int)
            readable = ring.readable_bytes()
            if kind == "read":
                chunk = ring.read(arg)
            else:
                out = bytearray(arg)
                chunk = bytes(out[: ring.read_into(out)])
            assert len(chunk) == min(arg, readable)
            got += chunk
        assert bytes(got) == bytes(accepted[: len(got)])
        assert ring.write_pos == len(accepted)
        assert ring.read_pos == len(got)
        assert 0 <= ring.readable_bytes() <= capacity
    got += ring.read(capacity)
    assert bytes(got) == bytes(accepted)


@settings(max_examples=200, deadline=None)
@given(
    capacity=st.integers(min_value=1, max_value=16),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("write"), st.binary(max_size=20)),
            st.tuples(st.just("read"), st.integers(0, 20)),
            st.tuples(st.just("discard"), st.integers(0, 40)),
        ),
        max_size=60,
    ),
)
def test_property_discard_model(capacity: int, ops: list[tuple[str, object]]) -> None:
    ring = make_ring(capacity)
    stream = bytearray()  # everything accepted by writes
    consumed = 0  # model read_pos
    for kind, arg in ops:
        if kind == "write":
            assert isinstance(arg, bytes)
            n = ring.write(arg)
            assert n == min(len(arg), capacity - (len(stream) - consumed))
            stream += arg[:n]
        elif kind == "read":
            assert isinstance(arg, int)
            chunk = ring.read(arg)
            assert chunk == bytes(stream[consumed : consumed + arg])
            consumed += len(chunk)
        else:
            assert isinstance(arg, int)
            ring.discard_until(arg)
            consumed = max(consumed, min(arg, len(stream)))
        assert ring.read_pos == consumed
        assert ring.write_pos == len(stream)


# ------------------------------------------------------------------ cross-process

STREAM_BYTES = 8 * 1024 * 1024
CROSS_CAPACITY = 4096
STREAM_TIMEOUT_S = 30.0


def stream_bytes(seed: int) -> bytes:
    return np.random.default_rng(seed).bytes(STREAM_BYTES)


def start_process(
    method: str, target: Callable[..., None], args: tuple[object, ...]
) -> BaseProcess:
    """Start a daemon child process with the given multiprocessing start method."""
    if method == "spawn":
        proc: BaseProcess = multiprocessing.get_context("spawn").Process(
            target=target, args=args, daemon=True
        )
    else:
        proc = multiprocessing.get_context("fork").Process(target=target, args=args, daemon=True)
    proc.start()
    return proc


def _producer_main(name: str, directory: str, seed: int) -> None:
    """Child process: attach the region by name and stream the payload into the ring."""
    payload = memoryview(stream_bytes(seed))
    chunk_sizes = [1, 160, 1920, 4095, 4096, 333, 7]
    deadline = time.monotonic() + STREAM_TIMEOUT_S
    with SharedRegion.attach(name, directory) as region:
        ring = SpscRing.attach(region.buf, CROSS_CAPACITY)
        sent = 0
        i = 0
        while sent < len(payload):
            size = chunk_sizes[i % len(chunk_sizes)]
            n = ring.write(payload[sent : sent + size])
            sent += n
            if n:
                i += 1
            elif time.monotonic() > deadline:
                raise TimeoutError(f"producer stalled at {sent}")
        ring.release()


@pytest.mark.parametrize("method", ["spawn", "fork"])
@pytest.mark.realtime  # 8 MiB in under 10 s, two spinning processes: runs alone (Makefile)
def test_cross_process_streaming(tmp_path: Path, method: str) -> None:
    seed = 1234
    name = f"ring-test-{uuid.uuid4().hex}"
    directory = str(tmp_path)
    region = SharedRegion.create(name, SpscRing.region_size(CROSS_CAPACITY), directory)
    ring = SpscRing.create(region.buf, CROSS_CAPACITY)
    proc: BaseProcess | None = None
    try:
        start = time.monotonic()
        proc = start_process(method, _producer_main, (name, directory, seed))
        received = bytearray(STREAM_BYTES)
        view = memoryview(received)
        got = 0
        read_sizes = [4096, 1, 160, 1920, 999]
        i = 0
        deadline = start + STREAM_TIMEOUT_S
        while got < STREAM_BYTES:
            size = min(read_sizes[i % len(read_sizes)], STREAM_BYTES - got)
            n = ring.read_into(view[got : got + size])
            got += n
            if n:
                i += 1
            elif time.monotonic() > deadline:
                pytest.fail(f"consumer stalled at {got} bytes")
            elif not proc.is_alive() and ring.readable_bytes() == 0:
                pytest.fail(f"producer died (exit {proc.exitcode}) at {got} bytes")
        elapsed = time.monotonic() - start
        proc.join(timeout=10)
        assert proc.exitcode == 0
        assert ring.readable_bytes() == 0
        assert ring.write_pos == ring.read_pos == STREAM_BYTES
        expected = stream_bytes(seed)
        assert hashlib.sha256(received).digest() == hashlib.sha256(expected).digest()
        assert received == expected
        assert elapsed < 10.0, f"streaming took {elapsed:.2f}s"
        view.release()
    finally:
        if proc is not None and proc.is_alive():
            proc.kill()
            proc.join()
        ring.release()
        region.close()
        region.unlink()
    assert not os.path.exists(os.path.join(directory, name))
