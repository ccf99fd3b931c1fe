"""The one table of formats and rates (telephony/codecs/formats.py) and those that read it."""

from __future__ import annotations

from engine.server import SUPPORTED_RATES
from gateway.formats import FORMATS, INPUT_FORMATS, format_of
from gateway.speech_formats import SPEECH_FORMATS
from telephony.asterisk import CODECS
from telephony.audiosocket import AudioSocketConnection
from telephony.codecs import opus
from telephony.codecs.formats import (
    ENGINE_RATES,
    OPUS_RATES,
    PCM_RATES,
    WIRE_FORMATS,
    AudioSpec,
    Codec,
    pcm,
)
from telephony.freeswitch import FreeSwitchConnection
from telephony.jambonz import JambonzConnection


def test_the_wire_formats_keep_their_design_names() -> None:
    assert list(FORMATS) == [
        "mulaw_8000", "alaw_8000", "pcm_8000", "pcm_16000", "pcm_24000", "pcm_48000",
        "opus_48000", "opus_24000", "opus_16000",
    ]  # fmt: skip
    assert {"mulaw_8000", "alaw_8000", "pcm_8000", "pcm_16000",
                             "pcm_24000", "pcm_48000"} == INPUT_FORMATS  # fmt: skip
    for spec in WIRE_FORMATS:
        fmt = format_of(spec)
        assert (fmt.codec, fmt.sample_rate) == (spec.codec.value, spec.sample_rate)


def test_every_part_reads_its_rates_from_the_table() -> None:
    assert SUPPORTED_RATES is ENGINE_RATES
    assert opus.SUPPORTED_RATES is OPUS_RATES
    assert {s.sample_rate for s in WIRE_FORMATS} <= ENGINE_RATES
    assert {s.sample_rate for s in WIRE_FORMATS if s.codec is Codec.OPUS} <= OPUS_RATES
    assert PCM_RATES == (8000, 16000, 24000, 48000)
    assert {f.engine_format.name for f in SPEECH_FORMATS.values()} == {"pcm_24000", "pcm_48000"}


def test_vendor_cores_describe_their_audio_as_codec_and_rate() -> None:
    assert CODECS["ulaw"].audio == AudioSpec(Codec.MULAW, 8000)
    assert CODECS["alaw"].audio == AudioSpec(Codec.ALAW, 8000)
    assert CODECS["slin16"].audio == pcm(16000)
    assert JambonzConnection.audio_spec(24000) == pcm(24000)
    assert AudioSocketConnection.audio_spec(48000) == pcm(48000)
    assert FreeSwitchConnection.format_name(8000) == pcm(8000).name == "pcm_8000"
    # and every one of them is a format the gateway has
    specs = [c.audio for c in CODECS.values()] + [pcm(rate) for rate in PCM_RATES]
    assert all(spec in WIRE_FORMATS for spec in specs)
