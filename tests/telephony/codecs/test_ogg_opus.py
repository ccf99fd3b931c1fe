"""OggOpusWriter: page structure, CRC, lacing, and decoding by the opusdec CLI."""

from __future__ import annotations

import shutil
import struct
import subprocess
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from telephony.codecs import opus
from telephony.codecs.ogg_opus import OggOpusWriter, ogg_crc32
from telephony.codecs.opus import OpusEncoder


def reference_crc(data: bytes) -> int:
    """Bit-at-a-time CRC-32, polynomial 0x04C11DB7, MSB first, init 0, no final XOR."""
    crc = 0
    for byte in data:
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) if crc & 0x80000000 else crc << 1
            crc &= 0xFFFFFFFF
    return crc


@dataclass
class Page:
    flags: int
    granule: int
    serial: int
    sequence: int
    crc: int
    lacing: bytes
    body: bytes
    raw: bytes


def parse_pages(data: bytes) -> list[Page]:
    pages = []
    pos = 0
    while pos < len(data):
        assert data[pos : pos + 4] == b"OggS", f"no capture pattern at {pos}"
        version, flags, granule, serial, seq, crc, nseg = struct.unpack_from(
            "<BBqIIIB", data, pos + 4
        )
        assert version == 0
        lacing = data[pos + 27 : pos + 27 + nseg]
        end = pos + 27 + nseg + sum(lacing)
        assert end <= len(data)
        body = data[pos + 27 + nseg : end]
        pages.append(Page(flags, granule, serial, seq, crc, lacing, body, data[pos:end]))
        pos = end
    return pages


def reassemble(pages: list[Page]) -> list[bytes]:
    """Packets as an Ogg demuxer would extract them (continued flag honoured)."""
    packets: list[bytes] = []
    partial = b""
    for page in pages:
        assert bool(page.flags & 0x01) == bool(partial), "continued flag mismatch"
        offset = 0
        for value in page.lacing:
            partial += page.body[offset : offset + value]
            offset += value
            if value < 255:
                packets.append(partial)
                partial = b""
    assert partial == b""
    return packets


def zero_crc(raw: bytes) -> bytes:
    return raw[:22] + b"\x00\x00\x00\x00" + raw[26:]


# First page of a file written by `opusenc --serial 42` (opus-tools 0.2, libopus 1.3.1,
# libogg): OpusHead, pre-skip 312, input rate 48000, with libogg's CRC.
OPUSENC_HEAD_PAGE = bytes.fromhex(
    "4f676753000200000000000000002a00000000000000c9dbf75e01134f707573486561640101380180bb0000000000"
)


def test_crc_known_vectors() -> None:
    # CRC-32/POSIX (same polynomial, init 0, xorout 0xFFFFFFFF) of "123456789" is
    # 0x765E7680, so Ogg's variant (no final XOR) is its complement.
    assert ogg_crc32(b"123456789") == 0x765E7680 ^ 0xFFFFFFFF == 0x89A1897F
    assert reference_crc(b"123456789") == 0x89A1897F
    assert ogg_crc32(b"") == 0
    (stored,) = struct.unpack_from("<I", OPUSENC_HEAD_PAGE, 22)
    assert ogg_crc32(zero_crc(OPUSENC_HEAD_PAGE)) == stored == 0x5EF7DBC9
    rng = np.random.default_rng(3)
    for n in (1, 2, 3, 100, 1000):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert ogg_crc32(data) == reference_crc(data)
        assert ogg_crc32(data[n // 2 :], ogg_crc32(data[: n // 2])) == reference_crc(data)


def test_head_page_matches_opusenc_byte_for_byte() -> None:
    writer = OggOpusWriter(48000, pre_skip=312, serial=42)
    assert writer.header_pages()[: len(OPUSENC_HEAD_PAGE)] == OPUSENC_HEAD_PAGE


def test_header_pages_structure() -> None:
    writer = OggOpusWriter(16000, pre_skip=312, serial=0xDEADBEEF)
    pages = parse_pages(writer.header_pages(comments=("TITLE=ivr",)))
    assert len(pages) == 2
    head, tags = pages
    assert head.flags == 0x02 and tags.flags == 0
    assert (head.granule, tags.granule) == (0, 0)
    assert (head.sequence, tags.sequence) == (0, 1)
    assert head.serial == tags.serial == writer.serial == 0xDEADBEEF
    assert head.body == struct.pack("<8sBBHIhB", b"OpusHead", 1, 1, 312, 16000, 0, 0)
    assert tags.body.startswith(b"OpusTags")
    (vendor_len,) = struct.unpack_from("<I", tags.body, 8)
    count, comment_len = struct.unpack_from("<II", tags.body, 12 + vendor_len)
    assert count == 1
    assert tags.body[20 + vendor_len : 20 + vendor_len + comment_len] == b"TITLE=ivr"
    for page in pages:
        assert reference_crc(zero_crc(page.raw)) == page.crc


def test_audio_pages_granules_sequence_and_eos() -> None:
    writer = OggOpusWriter(8000, pre_skip=312, serial=7)
    stream = writer.header_pages()
    sizes = [1, 100, 254, 255, 256, 509, 510, 511, 1275]
    for i, size in enumerate(sizes):
        stream += writer.packet(bytes([i]) * size, 960)
    stream += writer.end()
    assert writer.end() == b""  # idempotent
    pages = parse_pages(stream)
    audio = pages[2:-1]
    assert [p.sequence for p in pages] == list(range(len(pages)))
    assert [p.granule for p in audio] == [960 * (i + 1) for i in range(len(sizes))]
    assert all(p.flags == 0 for p in audio)
    last = pages[-1]
    assert last.flags == 0x04 and last.lacing == b"" and last.body == b""
    assert last.granule == -1  # no packet completes on the EOS page
    assert reassemble(pages[2:]) == [bytes([i]) * s for i, s in enumerate(sizes)]
    for page in pages:
        assert reference_crc(zero_crc(page.raw)) == page.crc
    with pytest.raises(RuntimeError, match="ended"):
        writer.packet(b"x", 960)


@pytest.mark.parametrize("size", [254 * 255, 255 * 255 - 1, 255 * 255, 255 * 255 + 300])
def test_lacing_for_large_packets(size: int) -> None:
    writer = OggOpusWriter(48000, serial=1)
    writer.header_pages()
    packet = bytes(range(256)) * (size // 256) + bytes(size % 256)
    pages = parse_pages(writer.packet(packet, 960))
    assert all(len(p.lacing) <= 255 for p in pages)
    assert reassemble(pages) == [packet]
    assert pages[-1].granule == 960
    assert all(p.granule == -1 for p in pages[:-1])
    if size < 255 * 255:
        assert len(pages) == 1 and pages[0].lacing[-1] == size % 255
    else:
        assert len(pages) == 2 and pages[1].flags & 0x01


def test_eos_on_last_packet_with_end_trim() -> None:
    writer = OggOpusWriter(16000, serial=9)
    writer.header_pages()
    writer.packet(b"\x01", 960)
    pages = parse_pages(writer.packet(b"\x02", 960, eos=True, end_trim_48k=500))
    assert pages[0].flags == 0x04 and pages[0].granule == 2 * 960 - 500
    assert writer.ended and writer.end() == b""


def test_call_order_is_enforced() -> None:
    writer = OggOpusWriter(16000)
    with pytest.raises(RuntimeError, match="header_pages"):
        writer.packet(b"\x01", 960)
    writer.header_pages()
    with pytest.raises(RuntimeError, match="already"):
        writer.header_pages()
    with pytest.raises(ValueError, match="end_trim"):
        writer.packet(b"\x01", 960, end_trim_48k=10)
    with pytest.raises(ValueError):
        OggOpusWriter(16000, pre_skip=70000)


def _dominant_frequency(samples: np.ndarray, rate: int) -> float:
    windowed = samples.astype(np.float64) * np.hanning(len(samples))
    spectrum = np.abs(np.fft.rfft(windowed))
    return float(np.fft.rfftfreq(len(samples), 1 / rate)[int(np.argmax(spectrum))])


@pytest.mark.skipif(not opus.opus_available(), reason="libopus not loadable")
@pytest.mark.parametrize("rate", [16000, 24000, 48000])
def test_opusdec_decodes_the_stream(rate: int, tmp_path: Path) -> None:
    if shutil.which("opusdec") is None:
        pytest.skip("opusdec (opus-tools) is not on PATH")
    encoder = OpusEncoder(rate, frame_ms=20)
    writer = OggOpusWriter(rate, pre_skip=encoder.pre_skip_48k, serial=rate)
    t = np.arange(rate) / rate  # 1 s
    pcm = np.round(np.sin(2 * np.pi * 440 * t) * 10000).astype("<i2").tobytes()
    chunks = [writer.header_pages()]
    for i in range(0, len(pcm), encoder.frame_bytes):
        chunks.append(writer.packet(encoder.encode(pcm[i : i + encoder.frame_bytes]), 960))
    chunks.append(writer.end())
    ogg = tmp_path / "tone.ogg"
    out = tmp_path / "tone.wav"
    ogg.write_bytes(b"".join(chunks))

    result = subprocess.run(
        ["opusdec", "--quiet", "--rate", "48000", "--force-wav", str(ogg), str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    if shutil.which("opusinfo") is not None:  # a second, stricter stream validator
        info = subprocess.run(
            ["opusinfo", str(ogg)], capture_output=True, text=True, timeout=60, check=False
        )
        assert info.returncode == 0, info.stdout + info.stderr
        assert "WARNING" not in info.stdout + info.stderr, info.stdout + info.stderr

    with wave.open(str(out), "rb") as wav:
        assert wav.getnchannels() == 1
        assert wav.getsampwidth() == 2
        out_rate = wav.getframerate()
        decoded = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
    assert out_rate == 48000
    assert abs(len(decoded) / out_rate - 1.0) <= 0.020
    assert abs(_dominant_frequency(decoded, out_rate) - 440) <= 2
    rms = np.sqrt(np.mean(decoded[4800:-4800].astype(np.float64) ** 2))
    assert 0.8 < rms / (10000 / np.sqrt(2)) < 1.2
