"""Sans-I/O Ogg Opus stream writer (RFC 7845 encapsulation in RFC 3533 Ogg pages).

The writer only builds bytes; the caller sends or stores them. Each call returns
whole Ogg pages:

* ``header_pages()``: the identification header page (``OpusHead``, beginning-of-
  stream flag set) followed by the comment header page (``OpusTags``), both with
  granule position 0 (RFC 7845 section 3 and 5);
* ``packet(packet, samples_48k)``: one page carrying one Opus packet (a packet of
  255 * 255 bytes or more continues on further pages). Its granule
  position is the total number of 48 kHz samples produced by all packets so far,
  pre-skip included (RFC 7845 section 4);
* ``end()``: the final page, with the end-of-stream flag set.

Pages carry a CRC-32 computed here over the whole page with the checksum field
zeroed, with generator polynomial 0x04C11DB7, initial value 0, no bit reflection and
no final XOR (RFC 3533 section 6).
"""

from __future__ import annotations

import secrets
import struct
from typing import Final

__all__ = ["OggOpusWriter", "ogg_crc32"]

_OGG_CRC_POLY: Final = 0x04C11DB7
_VENDOR: Final = b"ivr-voice-gateway"

# Ogg page header_type flags (RFC 3533 section 6).
_FLAG_CONTINUED: Final = 0x01
_FLAG_BOS: Final = 0x02
_FLAG_EOS: Final = 0x04

_NO_PACKET_GRANULE: Final = -1  # granule of a page on which no packet ends


def _crc_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        reg = byte << 24
        for _ in range(8):
            reg = ((reg << 1) ^ _OGG_CRC_POLY) if reg & 0x80000000 else reg << 1
        table.append(reg & 0xFFFFFFFF)
    return tuple(table)


_CRC_TABLE: Final = _crc_table()


def ogg_crc32(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """Ogg's CRC-32 of ``data`` (polynomial 0x04C11DB7, MSB first, init 0, no final XOR).

    ``crc`` continues a checksum over earlier bytes.
    """
    table = _CRC_TABLE
    for byte in bytes(data):
        crc = ((crc << 8) & 0xFFFFFFFF) ^ table[(crc >> 24) ^ byte]
    return crc


def _lacing(length: int) -> bytes:
    """Lacing values for one packet of ``length`` bytes (possibly more than 255 of them).

    A packet is a run of 255s followed by one value below 255 (0 when the length is
    a multiple of 255, including the empty packet).
    """
    return bytes([255] * (length // 255) + [length % 255])


class OggOpusWriter:
    """Build the pages of one mono Ogg Opus logical stream.

    ``input_sample_rate`` is informational (``OpusHead`` field "Input Sample Rate");
    decoders output 48 kHz regardless. ``pre_skip`` is the number of 48 kHz samples
    the decoder discards at the start (the encoder's lookahead; 312 for libopus).
    ``serial`` is the stream serial number, random when ``None``.

    Contract: call ``header_pages()`` once, first; then ``packet()`` for each Opus
    packet in order; then ``end()`` once. ``packet(..., eos=True)`` puts the
    end-of-stream flag on that packet's page, after which ``end()`` returns ``b""``.
    Calls out of this order raise RuntimeError.
    """

    def __init__(
        self,
        input_sample_rate: int,
        pre_skip: int = 312,
        serial: int | None = None,
        output_gain_q8: int = 0,
    ) -> None:
        if not 0 < input_sample_rate < 2**32:
            raise ValueError(f"input sample rate out of range: {input_sample_rate}")
        if not 0 <= pre_skip < 2**16:
            raise ValueError(f"pre-skip must fit in 16 bits, got {pre_skip}")
        if not -(2**15) <= output_gain_q8 < 2**15:
            raise ValueError(f"output gain must fit in signed 16 bits, got {output_gain_q8}")
        if serial is None:
            serial = secrets.randbits(32)
        if not 0 <= serial < 2**32:
            raise ValueError(f"serial must fit in 32 bits, got {serial}")
        self._input_sample_rate: Final = input_sample_rate
        self._pre_skip: Final = pre_skip
        self._output_gain_q8: Final = output_gain_q8
        self._serial: Final = serial
        self._sequence = 0
        self._granule = 0
        self._headers_written = False
        self._ended = False

    @property
    def serial(self) -> int:
        """The logical stream's serial number."""
        return self._serial

    @property
    def pre_skip(self) -> int:
        """Samples at 48 kHz the decoder discards at the start of the stream."""
        return self._pre_skip

    @property
    def granule_position(self) -> int:
        """Granule position of the last page written (48 kHz samples, pre-skip included)."""
        return self._granule

    @property
    def pages_written(self) -> int:
        """Number of pages produced so far (the next page's sequence number)."""
        return self._sequence

    @property
    def ended(self) -> bool:
        """True once the end-of-stream page has been produced."""
        return self._ended

    def opus_head(self) -> bytes:
        """The 19-byte identification header (RFC 7845 section 5.1), mapping family 0."""
        return struct.pack(
            "<8sBBHIhB",
            b"OpusHead",
            1,  # version
            1,  # output channel count: mono
            self._pre_skip,
            self._input_sample_rate,
            self._output_gain_q8,
            0,  # channel mapping family 0: mono/stereo, no mapping table
        )

    @staticmethod
    def opus_tags(comments: tuple[str, ...] = ()) -> bytes:
        """The comment header (RFC 7845 section 5.2) with our vendor string."""
        parts = [b"OpusTags", struct.pack("<I", len(_VENDOR)), _VENDOR]
        parts.append(struct.pack("<I", len(comments)))
        for comment in comments:
            encoded = comment.encode("utf-8")
            parts += [struct.pack("<I", len(encoded)), encoded]
        return b"".join(parts)

    def header_pages(self, comments: tuple[str, ...] = ()) -> bytes:
        """Both header pages: ``OpusHead`` (beginning of stream) then ``OpusTags``.

        ``comments`` are ``"NAME=value"`` user comments for ``OpusTags``.
        """
        if self._headers_written:
            raise RuntimeError("Ogg Opus header pages already written")
        self._headers_written = True
        head = self._page(self.opus_head(), granule=0, flags=_FLAG_BOS)
        tags = self._page(self.opus_tags(comments), granule=0, flags=0)
        return head + tags

    def packet(
        self, packet: bytes, samples_48k: int, *, eos: bool = False, end_trim_48k: int = 0
    ) -> bytes:
        """One page carrying ``packet``, which decodes to ``samples_48k`` samples at 48 kHz.

        ``eos=True`` marks this page as the last of the stream. ``end_trim_48k`` (only
        with ``eos``) tells the decoder to drop that many samples from the end of the
        stream, e.g. padding added to complete the final frame (RFC 7845 section 4.4).
        """
        if not self._headers_written:
            raise RuntimeError("header_pages() must come before any audio packet")
        if self._ended:
            raise RuntimeError("Ogg Opus stream already ended")
        if not packet:
            raise ValueError("empty Opus packet")
        if samples_48k <= 0:
            raise ValueError(f"samples_48k must be positive, got {samples_48k}")
        if end_trim_48k and not eos:
            raise ValueError("end_trim_48k is only meaningful on the end-of-stream page")
        if not 0 <= end_trim_48k <= samples_48k:
            raise ValueError(f"end trim must be within the last packet, got {end_trim_48k}")
        self._granule += samples_48k
        granule = self._granule - end_trim_48k
        if eos:
            self._ended = True
        return self._page(packet, granule=granule, flags=_FLAG_EOS if eos else 0)

    def end(self) -> bytes:
        """The final page with the end-of-stream flag; ``b""`` if the stream already ended.

        The page carries no packet, so by RFC 3533 its granule position is -1; the
        stream's duration is given by the preceding page.
        """
        if not self._headers_written:
            raise RuntimeError("header_pages() must come before end()")
        if self._ended:
            return b""
        self._ended = True
        return self._page(None, granule=_NO_PACKET_GRANULE, flags=_FLAG_EOS)

    def _page(self, packet: bytes | None, *, granule: int, flags: int) -> bytes:
        """Serialise ``packet`` (or no packet) as one page, or several if it needs to.

        A packet needing more than 255 lacing values continues on further pages: every
        page but the last has granule position -1 (no packet ends there), every page
        but the first has the continued-packet flag. ``flags`` beginning-of-stream goes
        on the first page only and end-of-stream on the last page only.
        """
        if packet is None:
            return self._one_page(b"", b"", granule=granule, flags=flags)
        lacing = _lacing(len(packet))
        pages = []
        offset = 0
        for first in range(0, len(lacing), 255):
            segments = lacing[first : first + 255]
            size = sum(segments)
            last = first + 255 >= len(lacing)
            page_flags = 0 if first == 0 else _FLAG_CONTINUED
            if first == 0:
                page_flags |= flags & _FLAG_BOS
            if last:
                page_flags |= flags & _FLAG_EOS
            pages.append(
                self._one_page(
                    segments,
                    packet[offset : offset + size],
                    granule=granule if last else _NO_PACKET_GRANULE,
                    flags=page_flags,
                )
            )
            offset += size
        return b"".join(pages)

    def _one_page(self, segments: bytes, body: bytes, *, granule: int, flags: int) -> bytes:
        header = struct.pack(
            "<4sBBqIIIB",
            b"OggS",
            0,  # stream structure version
            flags,
            granule,
            self._serial,
            self._sequence,
            0,  # CRC placeholder
            len(segments),
        )
        page = bytearray(header + segments + body)
        struct.pack_into("<I", page, 22, ogg_crc32(page))
        self._sequence += 1
        return bytes(page)
