"""The one table of audio formats and sample rates: what each part of the project speaks,
as a codec and a rate (:class:`AudioSpec`), and the name a format has on the gateway's
wire (``<codec>_<rate>``, fixed by DESIGN.md section 3).

Read by the vendor cores (``telephony/*.py`` describe their audio as an ``AudioSpec``),
the gateway's formats (``gateway/formats.py``: the native protocol, the telephony legs,
SIP; ``gateway/speech_formats.py``: the HTTP endpoint), Opus (:mod:`.opus`) and the engine
(``engine/server.py``: the rates it resamples to). Adding a format: a row in
:data:`WIRE_FORMATS` (and, for a new codec, its encoder and decoder in
``gateway/formats.py``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final


class Codec(enum.StrEnum):
    MULAW = "mulaw"  # G.711 mu-law, one byte a sample
    ALAW = "alaw"  # G.711 A-law, one byte a sample
    PCM = "pcm"  # 16-bit signed little-endian
    OPUS = "opus"  # one Opus packet per frame


@dataclass(frozen=True, slots=True)
class AudioSpec:
    """Mono audio: its codec and sample rate."""

    codec: Codec
    sample_rate: int

    @property
    def name(self) -> str:
        """The format's name on the gateway's wire (``pcm_16000``)."""
        return f"{self.codec}_{self.sample_rate}"


#: G.711's one rate.
G711_RATE: Final = 8000
#: Sample rates libopus accepts for encoding and decoding, in Hz.
OPUS_RATES: Final = frozenset({8000, 12000, 16000, 24000, 48000})
#: Rates the engine resamples a stream's audio to (OpenStream's sample rates).
ENGINE_RATES: Final = frozenset({8000, 12000, 16000, 22050, 24000, 44100, 48000})

#: The formats of the gateway's wire: the native protocol's ``format``, the telephony
#: legs and SIP; every one a rate the engine produces.
WIRE_FORMATS: Final[tuple[AudioSpec, ...]] = (
    AudioSpec(Codec.MULAW, G711_RATE),
    AudioSpec(Codec.ALAW, G711_RATE),
    AudioSpec(Codec.PCM, 8000),
    AudioSpec(Codec.PCM, 16000),
    AudioSpec(Codec.PCM, 24000),
    AudioSpec(Codec.PCM, 48000),
    AudioSpec(Codec.OPUS, 48000),
    AudioSpec(Codec.OPUS, 24000),
    AudioSpec(Codec.OPUS, 16000),
)
#: Rates of the 16-bit PCM formats (what a leg carrying raw PCM may offer).
PCM_RATES: Final = tuple(s.sample_rate for s in WIRE_FORMATS if s.codec is Codec.PCM)


def pcm(sample_rate: int) -> AudioSpec:
    """16-bit PCM at ``sample_rate``."""
    return AudioSpec(Codec.PCM, sample_rate)
