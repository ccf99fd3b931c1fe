"""Tests for gateway.voices.reference_audio: decode, check and normalize voice reference uploads.

Every fixture is generated here, in memory: a speech-like synthetic signal (a harmonic
tone on a gliding pitch, shaped by a syllable-rate envelope), real speech from espeak-ng
(in a child process; skipped where it cannot run), noise, hum and junk bytes, encoded
with soundfile (libsndfile) to WAV, FLAC, OGG (Opus, Vorbis) and MP3.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import math
import struct
import zlib

import numpy as np
import numpy.typing as npt
import pytest
import soundfile as sf  # type: ignore[import-untyped]

from gateway.voices.reference_audio import (
    CLIP_RUN_MAX_MS,
    MAX_DECODE_S,
    MAX_DURATION_S,
    MAX_UPLOAD_BYTES,
    MIN_SPEECH_S,
    PEAK_LIMIT_DBFS,
    TARGET_LOUDNESS_DBFS,
    TARGET_RATE,
    ReferenceAudio,
    ReferenceAudioError,
    check_upload_size,
    process_reference,
)

Signal = npt.NDArray[np.float64]


def speechlike(seconds: float, rate: int, *, level: float = 0.3, seed: int = 0) -> Signal:
    """Speech-like audio: harmonics of a 120-160 Hz pitch under a syllable envelope.

    Syllables of 120-250 ms (Hann-shaped, random strength) with 30-120 ms gaps, about
    4-5 syllables a second; harmonics with 1/k amplitudes up to 90 % of Nyquist; the
    peak is ``level``. A fresh array each call (the cached original is not shared).
    """
    return _speechlike(seconds, rate, seed) * level


@functools.lru_cache(maxsize=64)
def _speechlike(seconds: float, rate: int, seed: int) -> Signal:
    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    envelope = np.zeros(n)
    pos = 0
    while pos < n:
        length = int(rng.uniform(0.12, 0.25) * rate)
        take = min(length, n - pos)
        envelope[pos : pos + take] = np.hanning(length)[:take] * rng.uniform(0.5, 1.0)
        pos += length + int(rng.uniform(0.03, 0.12) * rate)
    # One period of the harmonic tone as a wavetable, read at a gliding pitch.
    table_size = 4096
    cycle = np.arange(table_size) * (2 * np.pi / table_size)
    harmonics = range(1, int(0.45 * rate / 160.0) + 1)
    table = sum(np.sin(k * cycle) / k for k in harmonics)
    table = table / np.abs(table).max()
    f0 = 140.0 + 20.0 * np.sin(2 * np.pi * 0.7 * np.arange(n) / rate)
    index = (np.cumsum(f0) * (table_size / rate)).astype(np.int64) % table_size
    out: Signal = table[index] * envelope
    out.flags.writeable = False
    return out


def silence(seconds: float, rate: int) -> Signal:
    return np.zeros(int(seconds * rate))


def noise(seconds: float, rate: int, dbfs: float, seed: int = 1) -> Signal:
    """White noise with an RMS of ``dbfs``."""
    rng = np.random.default_rng(seed)
    out: Signal = rng.standard_normal(int(seconds * rate)) * 10 ** (dbfs / 20)
    return out


def encode(
    samples: npt.NDArray[np.float64],
    rate: int,
    fmt: str = "WAV",
    subtype: str = "PCM_16",
) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def padded_speech(rate: int, speech_s: float = 4.0, pad_s: float = 2.0) -> Signal:
    return np.concatenate([silence(pad_s, rate), speechlike(speech_s, rate), silence(pad_s, rate)])


def reject(data: bytes, **kwargs: int) -> ReferenceAudioError:
    with pytest.raises(ReferenceAudioError) as info:
        process_reference(data, **kwargs)
    return info.value


def assert_normalized(ref: ReferenceAudio) -> None:
    """16 kHz mono 16-bit PCM at the target loudness (or peak-limited), fields consistent."""
    assert ref.sample_rate == TARGET_RATE
    assert len(ref.pcm) % 2 == 0
    samples = np.frombuffer(ref.pcm, dtype="<i2")
    assert ref.duration_ms == samples.size * 1000 // TARGET_RATE
    assert ref.sha256 == hashlib.sha256(ref.pcm).hexdigest()
    peak = int(np.abs(samples.astype(np.int32)).max())
    assert ref.peak_dbfs == pytest.approx(20 * math.log10(peak / 32768), abs=0.01)
    assert ref.peak_dbfs <= PEAK_LIMIT_DBFS
    # At the target, unless the peak limit held the gain back.
    assert ref.loudness_dbfs <= TARGET_LOUDNESS_DBFS + 0.05
    if ref.peak_dbfs < PEAK_LIMIT_DBFS - 0.05:
        assert ref.loudness_dbfs == pytest.approx(TARGET_LOUDNESS_DBFS, abs=0.05)
    assert ref.speech_ms <= ref.duration_ms


# --- formats, rates, channels ---------------------------------------------------------

FORMATS = [
    ("WAV", "PCM_16", 16000),
    ("WAV", "PCM_24", 48000),
    ("WAV", "PCM_U8", 8000),
    ("WAV", "FLOAT", 44100),
    ("WAV", "ULAW", 8000),
    ("WAV", "ALAW", 8000),
    ("WAVEX", "PCM_16", 22050),
    ("FLAC", "PCM_16", 44100),
    ("FLAC", "PCM_24", 96000),
    ("OGG", "OPUS", 48000),
    ("OGG", "OPUS", 16000),
    ("OGG", "VORBIS", 44100),
    ("MP3", "MPEG_LAYER_III", 44100),
    ("MP3", "MPEG_LAYER_III", 8000),
]


def test_libsndfile_has_the_codecs():
    assert tuple(int(p) for p in sf.__libsndfile_version__.split(".")[:2]) >= (1, 1)
    assert {"WAV", "FLAC", "OGG", "MP3"} <= set(sf.available_formats())
    assert "OPUS" in sf.available_subtypes("OGG")
    assert "MPEG_LAYER_III" in sf.available_subtypes("MP3")


@pytest.mark.parametrize(("fmt", "subtype", "rate"), FORMATS, ids=lambda v: str(v))
def test_each_format_decodes_trims_and_normalizes(fmt: str, subtype: str, rate: int):
    data = encode(padded_speech(rate), rate, fmt, subtype)
    ref = process_reference(data)
    assert_normalized(ref)
    assert ref.source_format == {"WAVEX": "WAV"}.get(fmt, fmt)
    assert ref.source_rate == rate
    assert ref.source_channels == 1
    # 2 s silence + 4 s speech + 2 s silence: about 4 s plus 2 x 100 ms padding are kept.
    assert 3900 <= ref.duration_ms <= 4400
    assert 3700 <= ref.speech_ms <= 4100


@pytest.mark.parametrize("rate", [8000, 11025, 16000, 22050, 32000, 44100, 48000])
def test_sample_rates_resample_to_16k(rate: int):
    ref = process_reference(encode(speechlike(4.0, rate), rate))
    assert_normalized(ref)
    assert ref.source_rate == rate
    assert 3900 <= ref.duration_ms <= 4100


def test_same_signal_at_other_rates_has_the_same_length_and_level():
    refs = [process_reference(encode(speechlike(4.0, r), r)) for r in (8000, 16000, 44100)]
    assert max(r.duration_ms for r in refs) - min(r.duration_ms for r in refs) <= 40
    assert max(r.speech_ms for r in refs) - min(r.speech_ms for r in refs) <= 60
    assert len({r.sha256 for r in refs}) == 3  # resampling gives other samples: that's fine


def test_stereo_channels_are_averaged():
    x = speechlike(4.0, 44100)
    stereo = np.stack([x, np.zeros_like(x)], axis=1)
    # Halving is exact in binary floating point: the averaged stereo and the mono
    # half-level file decode to identical samples, so the results must be identical.
    from_stereo = process_reference(encode(stereo, 44100, "WAV", "FLOAT"))
    from_mono = process_reference(encode(x / 2, 44100, "WAV", "FLOAT"))
    assert from_stereo.source_channels == 2
    assert from_mono.source_channels == 1
    assert from_stereo.pcm == from_mono.pcm
    assert from_stereo.sha256 == from_mono.sha256


def test_stereo_in_antiphase_averages_to_silence():
    x = speechlike(4.0, 16000)
    with pytest.raises(ReferenceAudioError) as info:
        process_reference(encode(np.stack([x, -x], axis=1), 16000))
    assert info.value.code == "no_speech"


@pytest.mark.parametrize(
    ("fmt", "subtype", "rate"),
    [("FLAC", "PCM_16", 44100), ("MP3", "MPEG_LAYER_III", 48000), ("OGG", "OPUS", 48000)],
)
def test_stereo_in_every_container(fmt: str, subtype: str, rate: int):
    x = padded_speech(rate, pad_s=1.0)
    ref = process_reference(encode(np.stack([x, 0.5 * x], axis=1), rate, fmt, subtype))
    assert_normalized(ref)
    assert ref.source_channels == 2
    assert 3900 <= ref.duration_ms <= 4400


# --- trimming, loudness ---------------------------------------------------------------


def test_leading_and_trailing_silence_is_trimmed_with_padding():
    rate = 16000
    ref = process_reference(encode(padded_speech(rate), rate))
    samples = np.frombuffer(ref.pcm, dtype="<i2")
    assert 4000 <= ref.duration_ms <= 4300
    # About 100 ms of (near) silence is kept at each end.
    assert np.abs(samples[:800]).max() < 100
    assert np.abs(samples[-800:]).max() < 100


def test_silence_over_background_noise_is_trimmed():
    rate = 16000
    x = padded_speech(rate, pad_s=3.0) + noise(10.0, rate, -60.0)
    ref = process_reference(encode(x, rate))
    assert 4000 <= ref.duration_ms <= 4300


def test_pauses_inside_speech_are_kept():
    rate = 16000
    x = np.concatenate([speechlike(2.0, rate), silence(1.0, rate), speechlike(2.0, rate, seed=4)])
    ref = process_reference(encode(x, rate))
    assert 4900 <= ref.duration_ms <= 5200
    assert 3700 <= ref.speech_ms <= 4100  # the 1 s pause is not speech


def test_audio_without_leading_silence_is_kept_whole():
    ref = process_reference(encode(speechlike(5.0, 16000), 16000))
    assert 4900 <= ref.duration_ms <= 5000


@pytest.mark.parametrize("level", [0.03, 0.1, 0.5, 0.99])
def test_loudness_is_normalized_from_any_level(level: float):
    ref = process_reference(encode(speechlike(4.0, 16000, level=level), 16000))
    assert_normalized(ref)
    assert ref.loudness_dbfs == pytest.approx(TARGET_LOUDNESS_DBFS, abs=0.1)


def test_peak_limit_wins_over_loudness_target():
    rate = 16000
    x = speechlike(4.0, rate, level=0.05)
    x[rate::rate] = 0.9  # a few sharp spikes far above the speech peaks
    ref = process_reference(encode(x, rate))
    assert_normalized(ref)
    assert ref.peak_dbfs == pytest.approx(PEAK_LIMIT_DBFS, abs=0.01)
    assert ref.loudness_dbfs < TARGET_LOUDNESS_DBFS - 3


def test_loud_float_audio_above_full_scale_is_scaled_down_not_clipped():
    x = speechlike(4.0, 16000, level=2.5)
    ref = process_reference(encode(x, 16000, "WAV", "FLOAT"))
    assert_normalized(ref)


def test_dc_offset_is_removed():
    rate = 16000
    x = padded_speech(rate, pad_s=1.0) + 0.2
    ref = process_reference(encode(x, rate))
    samples = np.frombuffer(ref.pcm, dtype="<i2")
    assert abs(float(samples.mean())) < 50
    assert 4000 <= ref.duration_ms <= 4300


# --- rejections -----------------------------------------------------------------------


def png_bytes() -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body)
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00\xff\x00\x00")
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


@functools.cache
def junk_inputs() -> dict[str, bytes]:
    wav = encode(speechlike(4.0, 16000), 16000)
    flac = encode(speechlike(4.0, 16000), 16000, "FLAC")
    opus = encode(speechlike(4.0, 16000), 16000, "OGG", "OPUS")
    mp3 = encode(speechlike(4.0, 16000), 16000, "MP3", "MPEG_LAYER_III")
    return {
        "empty": b"",
        "text": b"This is a text file, not a recording.\n" * 20,
        "json": b'{"audio": "hello.wav"}',
        "random": np.random.default_rng(9).integers(0, 256, 4000, dtype=np.uint8).tobytes(),
        "png": png_bytes(),
        "wav_header_only_truncated": wav[:30],
        "wav_riff_tag_only": wav[:12],
        "flac_truncated": flac[:60],
        "flac_half": flac[: len(flac) // 2],
        "ogg_truncated": opus[:200],
        "mp3_truncated": mp3[:100],
        "mp3_bad_middle": mp3[:1500] + bytes(3000) + b"\xff" * 500 + mp3[5000:],
    }


@pytest.mark.parametrize("name", sorted(junk_inputs()))
def test_not_audio_is_invalid_audio(name: str):
    error = reject(junk_inputs()[name])
    assert error.code == "invalid_audio"
    assert error.http_status == 400
    assert "BytesIO" not in error.message and "0x" not in error.message


def test_header_without_samples_is_invalid_audio():
    error = reject(encode(np.zeros(0), 16000))
    assert error.code == "invalid_audio"
    assert "no samples" in error.message


def test_other_containers_are_invalid_audio():
    error = reject(encode(speechlike(4.0, 16000), 16000, "AIFF", "PCM_16"))
    assert error.code == "invalid_audio"
    assert "AIFF" in error.message


def test_unsupported_rate_and_channels_are_invalid_audio():
    assert "sample rate" in reject(encode(speechlike(4.0, 4000), 4000)).message
    many = np.tile(speechlike(4.0, 16000)[:, None], (1, 12))
    assert "channels" in reject(encode(many, 16000)).message


def test_non_finite_samples_are_invalid_audio():
    x = speechlike(4.0, 16000)
    x[1000] = np.nan
    error = reject(encode(x, 16000, "WAV", "FLOAT"))
    assert error.code == "invalid_audio"


def test_two_seconds_of_speech_is_too_short():
    rate = 16000
    x = np.concatenate([silence(1.0, rate), speechlike(2.0, rate), silence(3.0, rate)])
    error = reject(encode(x, rate))
    assert error.code == "audio_too_short"
    assert error.http_status == 400
    assert f"{MIN_SPEECH_S:g} s" in error.message
    assert "quiet" not in error.message


def test_too_short_says_when_the_recording_is_very_quiet():
    x = speechlike(4.0, 16000, level=0.01)  # speech frames straddle the -50 dBFS floor
    error = reject(encode(x, 16000))
    assert error.code == "audio_too_short"
    assert "quiet" in error.message


def test_thirty_five_seconds_of_speech_is_too_long():
    error = reject(encode(speechlike(35.0, 16000), 16000, "FLAC"))
    assert error.code == "audio_too_long"
    assert f"{MAX_DURATION_S:g} s" in error.message


def test_duration_limit_applies_after_trimming():
    rate = 8000
    x = np.concatenate([silence(20.0, rate), speechlike(4.0, rate), silence(15.0, rate)])
    ref = process_reference(encode(x, rate, "FLAC"))  # 39 s decoded, about 4 s kept
    assert 3900 <= ref.duration_ms <= 4300


def test_absurdly_long_input_is_refused_early():
    rate = 8000
    x = np.concatenate([speechlike(4.0, rate), silence(MAX_DECODE_S + 10, rate)])
    error = reject(encode(x, rate, "FLAC"))
    assert error.code == "audio_too_long"
    assert f"{MAX_DECODE_S:g} s" in error.message


@pytest.mark.parametrize(
    "signal",
    ["silence", "noise_-70", "noise_-40", "noise_-20", "hum", "brown_noise"],
)
def test_no_speech(signal: str):
    rate, n = 16000, 16000 * 6
    t = np.arange(n) / rate
    rng = np.random.default_rng(2)
    brown = np.cumsum(rng.standard_normal(n))
    brown -= np.convolve(brown, np.ones(400) / 400, "same")
    x = {
        "silence": np.zeros(n),
        "noise_-70": noise(6.0, rate, -70.0),
        "noise_-40": noise(6.0, rate, -40.0),
        "noise_-20": noise(6.0, rate, -20.0),
        "hum": 0.1 * np.sin(2 * np.pi * 50 * t) + 0.05 * np.sin(2 * np.pi * 150 * t),
        "brown_noise": 0.05 * brown / brown.std(),
    }[signal]
    error = reject(encode(x, rate))
    assert error.code == "no_speech"
    assert error.http_status == 400


def test_a_click_is_no_speech():
    rate = 16000
    x = silence(6.0, rate)
    x[rate : rate + 400] = 0.5  # 25 ms bump
    assert reject(encode(x, rate)).code == "no_speech"


@pytest.mark.parametrize(
    ("fmt", "subtype", "rate"),
    [
        ("WAV", "PCM_16", 16000),
        ("WAV", "PCM_24", 48000),
        ("WAV", "ULAW", 8000),
        ("FLAC", "PCM_16", 44100),
        ("OGG", "OPUS", 48000),
        ("MP3", "MPEG_LAYER_III", 44100),
    ],
)
def test_heavily_clipped_recording_is_rejected(fmt: str, subtype: str, rate: int):
    x = np.clip(speechlike(5.0, rate, level=4.0), -1.0, 1.0)  # 12 dB overdriven
    error = reject(encode(x, rate, fmt, subtype))
    assert error.code == "audio_clipped"
    assert error.http_status == 400


def test_clipping_is_judged_on_the_speech_not_the_silence_around_it():
    rate = 16000
    # 6 dB overdriven: a few % of the speech at the rail, under 1 % of the whole file.
    clipped = np.clip(speechlike(4.0, rate, level=2.0), -1.0, 1.0)
    x = np.concatenate([silence(12.0, rate), clipped, silence(12.0, rate)])
    assert np.count_nonzero(np.abs(x) >= 1.0) < 0.01 * x.size
    assert reject(encode(x, rate)).code == "audio_clipped"


def test_long_flat_run_at_full_scale_is_clipping():
    rate = 16000
    x = speechlike(5.0, rate)
    run = int(rate * CLIP_RUN_MAX_MS / 1000) + 2
    x[rate : rate + run] = 1.0  # one stuck-at-rail burst; well under 1 % of the frames
    assert reject(encode(x, rate)).code == "audio_clipped"


def test_peaks_just_touching_full_scale_are_accepted():
    rate = 44100
    x = speechlike(5.0, rate)
    x = x / np.abs(x).max()  # normalized to 0 dBFS, as editors do: a few samples at the rail
    ref = process_reference(encode(x, rate))
    assert_normalized(ref)


def test_upload_over_the_limit_is_413():
    error = reject(bytes(MAX_UPLOAD_BYTES + 1))
    assert error.code == "audio_too_large"
    assert error.http_status == 413
    assert "10.0 MiB" in error.message
    small = reject(encode(speechlike(4.0, 16000), 16000), max_bytes=1000)
    assert small.code == "audio_too_large"
    assert small.http_status == 413


def test_check_upload_size():
    check_upload_size(MAX_UPLOAD_BYTES)
    with pytest.raises(ReferenceAudioError) as info:
        check_upload_size(MAX_UPLOAD_BYTES + 1)
    assert (info.value.code, info.value.http_status) == ("audio_too_large", 413)
    check_upload_size(5, max_bytes=5)
    with pytest.raises(ReferenceAudioError):
        check_upload_size(6, max_bytes=5)


def test_error_is_a_value_error_with_code_and_message():
    error = reject(b"not audio")
    assert isinstance(error, ValueError)
    assert str(error) == f"{error.code}: {error.message}"
    assert error.__cause__ is not None  # the decoder's own error, for the server log


# --- determinism, purity, robustness --------------------------------------------------


def test_same_bytes_give_the_same_result():
    data = encode(padded_speech(44100), 44100, "MP3", "MPEG_LAYER_III")
    first, second = process_reference(data), process_reference(data)
    assert first == second
    assert first.pcm == second.pcm
    assert first.sha256 == second.sha256


def test_input_is_not_mutated_and_result_is_frozen():
    data = encode(padded_speech(16000), 16000)
    buffer = bytearray(data)
    ref = process_reference(buffer)
    assert buffer == data
    assert ref == process_reference(data) == process_reference(memoryview(data))
    with pytest.raises(dataclasses.FrozenInstanceError):
        ref.sha256 = "x"  # type: ignore[misc]
    assert "pcm" not in repr(ref)


def test_a_failure_leaves_nothing_behind():
    data = encode(padded_speech(16000), 16000)
    before = process_reference(data)
    for bad in (b"", b"junk", encode(silence(5.0, 16000), 16000)):
        with pytest.raises(ReferenceAudioError):
            process_reference(bad)
    assert process_reference(data) == before


@pytest.mark.parametrize(
    ("fmt", "subtype", "rate"),
    [
        ("WAV", "PCM_16", 16000),
        ("FLAC", "PCM_16", 22050),
        ("OGG", "OPUS", 48000),
        ("MP3", "MPEG_LAYER_III", 44100),
    ],
)
def test_corrupted_uploads_only_raise_reference_audio_errors(fmt: str, subtype: str, rate: int):
    base = encode(speechlike(4.0, rate), rate, fmt, subtype)
    rng = np.random.default_rng(11)
    for i in range(24):
        data = bytearray(base)
        if i % 3 == 0:  # damage the header region
            for _ in range(int(rng.integers(1, 20))):
                data[int(rng.integers(0, 300))] = int(rng.integers(0, 256))
        elif i % 3 == 1:  # damage anywhere
            for _ in range(int(rng.integers(1, 50))):
                data[int(rng.integers(0, len(data)))] = int(rng.integers(0, 256))
        else:  # cut short
            data = data[: int(rng.integers(0, len(data)))]
        try:
            assert_normalized(process_reference(bytes(data)))
        except ReferenceAudioError as error:
            assert error.http_status == 400


# --- real speech (espeak-ng) ----------------------------------------------------------


@pytest.fixture(scope="module")
def espeak_8k() -> Signal:
    """About 6 s of real speech at 8 kHz, as float in [-1, 1)."""
    try:
        from tests.integration.caller_audio import espeak_speech

        pcm = espeak_speech(
            "The quick brown fox jumps over the lazy dog. "
            "Please hold while I connect you to the next available agent."
        )
    except Exception as exc:  # espeak-ng missing or not runnable here
        pytest.skip(f"espeak-ng speech unavailable: {exc}")
    out: Signal = pcm.astype(np.float64) / 32768
    return out


def test_real_speech_is_accepted(espeak_8k: Signal):
    rate = 8000
    x = np.concatenate([silence(1.5, rate), espeak_8k, silence(1.5, rate)])
    ref = process_reference(encode(x, rate, "WAV", "PCM_16"))
    assert_normalized(ref)
    length_ms = espeak_8k.size * 1000 // rate
    assert length_ms - 300 <= ref.duration_ms <= length_ms + 200
    assert 0.75 * length_ms <= ref.speech_ms <= length_ms


def test_real_speech_cropped_tight_and_with_line_noise(espeak_8k: Signal):
    rate = 8000
    ref = process_reference(encode(espeak_8k, rate, "MP3", "MPEG_LAYER_III"))
    assert_normalized(ref)
    noisy = espeak_8k + noise(espeak_8k.size / rate, rate, -45.0)
    assert_normalized(process_reference(encode(noisy, rate, "OGG", "OPUS")))


def test_one_real_sentence_is_too_short(espeak_8k: Signal):
    rate = 8000
    error = reject(encode(espeak_8k[: int(2.0 * rate)], rate))
    assert error.code == "audio_too_short"
