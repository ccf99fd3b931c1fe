"""Voice matching (not cloning): F0 and rate estimators, profile blobs, and the espeak
backend's prepare_voice / resolve_voice, judged by measuring the pitch of what espeak
says (never by comparing bytes). One espeak backend per process: see conftest.py."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt
import pytest
import soxr

from engine.backends.base import BackendError, VoiceSettings
from engine.backends.espeak import (
    CALIBRATION_PITCHES,
    CALIBRATION_RANGES,
    DEFAULT_RATE_WPM,
    FEMALE_VARIANTS,
    MALE_VARIANTS,
    CalibrationPoint,
    EspeakBackend,
    EspeakCalibration,
    EspeakVoice,
    RateCalibration,
    RatePoint,
    base_voice_for_language,
)
from engine.voice_profile import (
    PROFILE_VERSION,
    SAMPLE_RATE,
    EspeakProfile,
    ProfileError,
    estimate_f0,
    f0_stats,
    speaking_rate,
)

TEXT = (
    "Your appointment is confirmed for Tuesday morning at nine thirty. "
    "If you need to change it, please call us back during office hours."
)
OTHER_TEXT = "Thank you for your patience. An agent will be with you in a moment."

# --------------------------------------------------------------------------- helpers


def tone(freq: float, seconds: float = 1.0, harmonics: int = 1) -> npt.NDArray[np.int16]:
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    x = sum(0.7**k * np.sin(2 * np.pi * freq * (k + 1) * t + k) for k in range(harmonics))
    x = np.asarray(x, dtype=np.float64)
    return np.asarray(0.5 * 32767 * x / np.abs(x).max(), dtype=np.int16)


def median_f0(pcm: npt.ArrayLike) -> float:
    return f0_stats(estimate_f0(pcm))[0]


def synth16k(backend: EspeakBackend, text: str, voice: EspeakVoice) -> npt.NDArray[np.int16]:
    """espeak at its native 22.05 kHz, resampled to 16 kHz like a registry reference."""
    chunks: list[npt.NDArray[np.int16]] = []

    def collect(chunk: npt.NDArray[np.int16]) -> bool:
        chunks.append(chunk)
        return True

    backend.synthesize(text, voice, collect)
    pcm = np.concatenate(chunks)
    return np.asarray(soxr.resample(pcm, backend.native_sample_rate, SAMPLE_RATE), np.int16)


def speak_profile(backend: EspeakBackend, blob: bytes, text: str = TEXT, voice: str = "en-us"):
    return synth16k(backend, text, backend.resolve_voice(VoiceSettings(voice, 1.0, None, blob)))


def as_reference(pcm: npt.NDArray[np.int16]) -> bytes:
    return pcm.astype("<i2").tobytes()


@dataclass(frozen=True)
class Reference:
    pcm: npt.NDArray[np.int16]
    blob: bytes

    @property
    def profile(self) -> EspeakProfile:
        return EspeakProfile.from_bytes(self.blob)


@pytest.fixture(scope="module")
def high_ref(espeak_backend) -> Reference:
    """A high female reference: espeak's f2 variant at pitch 80 (about 265 Hz)."""
    pcm = synth16k(espeak_backend, TEXT, EspeakVoice("en-us+f2", DEFAULT_RATE_WPM, 80, 50))
    return Reference(pcm, espeak_backend.prepare_voice(as_reference(pcm), "en-US"))


@pytest.fixture(scope="module")
def low_ref(espeak_backend) -> Reference:
    """A low male reference: espeak's m3 variant at pitch 15 (about 80 Hz)."""
    pcm = synth16k(espeak_backend, TEXT, EspeakVoice("en-us+m3", DEFAULT_RATE_WPM, 15, 50))
    return Reference(pcm, espeak_backend.prepare_voice(as_reference(pcm), "en-US"))


# --------------------------------------------------------------------------- estimate_f0


@pytest.mark.parametrize("freq", [100.0, 150.0, 220.0, 300.0])
@pytest.mark.parametrize("harmonics", [1, 8])
def test_estimate_f0_on_tones(freq, harmonics):
    f0 = estimate_f0(tone(freq, harmonics=harmonics))
    assert len(f0) == 1 + (SAMPLE_RATE - 640) // 160  # 40 ms frames, 10 ms hop
    assert np.isfinite(f0).mean() > 0.95
    voiced = f0[np.isfinite(f0)]
    assert np.all(np.abs(voiced / freq - 1) < 0.03)
    assert abs(float(np.median(voiced)) / freq - 1) < 0.005


def test_estimate_f0_with_a_weak_fundamental():
    t = np.arange(SAMPLE_RATE) / SAMPLE_RATE
    x = 0.1 * np.sin(2 * np.pi * 120 * t) + sum(np.sin(2 * np.pi * 120 * k * t) for k in (2, 3, 4))
    assert abs(median_f0(x / 8) / 120 - 1) < 0.03  # float input, full scale 1.0


def test_estimate_f0_other_sample_rate():
    t = np.arange(22050) / 22050
    f0 = estimate_f0(0.3 * np.sin(2 * np.pi * 180 * t), 22050)
    assert len(f0) == 1 + (22050 - 882) // 220  # still 40 ms frames, 10 ms hop
    assert abs(float(np.nanmedian(f0)) - 180) < 0.5


def test_estimate_f0_unvoiced_and_short_input():
    rng = np.random.default_rng(1)
    assert np.isnan(estimate_f0((rng.normal(size=SAMPLE_RATE) * 3000).astype(np.int16))).all()
    assert np.isnan(estimate_f0(np.zeros(SAMPLE_RATE, dtype=np.int16))).all()
    assert len(estimate_f0(np.zeros(100, dtype=np.int16))) == 0
    # A tone with silence around it: only the tone is voiced.
    gap = np.zeros(SAMPLE_RATE // 2, dtype=np.int16)
    f0 = estimate_f0(np.concatenate([gap, tone(200.0), gap]))
    assert 0.45 < np.isfinite(f0).mean() < 0.55
    with pytest.raises(ValueError):
        estimate_f0(np.zeros(SAMPLE_RATE, dtype=np.int32))


def test_f0_stats():
    f0 = np.array([np.nan, 100.0, 200.0, np.nan])
    median, spread, voiced = f0_stats(f0)
    assert median == pytest.approx(150.0)
    assert voiced == 0.5
    assert spread > 0
    assert math.isnan(f0_stats(np.array([np.nan]))[0])


# --------------------------------------------------------------------------- speaking_rate


def syllable_train(per_second: float, seconds: float = 6.0) -> npt.NDArray[np.float64]:
    """Vowel-like bursts (a 150 Hz harmonic tone, raised-cosine envelope dipping 20 dB
    between syllables), with pauses."""
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    carrier = sum(np.sin(2 * np.pi * 150 * k * t) / k for k in range(1, 15))
    envelope = 0.1 + 0.9 * (0.5 - 0.5 * np.cos(2 * np.pi * per_second * t))
    pause = (t % 2.0) > 1.6  # 0.4 s pauses every 2 s: not counted as speaking time
    return np.asarray(0.2 * carrier * envelope * ~pause, dtype=np.float64)


@pytest.mark.parametrize("per_second", [3.0, 4.5, 6.0])
def test_speaking_rate_counts_syllables(per_second):
    assert speaking_rate(syllable_train(per_second)) == pytest.approx(per_second, rel=0.15)


def test_speaking_rate_of_silence():
    assert speaking_rate(np.zeros(SAMPLE_RATE, dtype=np.int16)) == 0.0
    assert speaking_rate(np.zeros(10, dtype=np.int16)) == 0.0


def test_speaking_rate_follows_espeak_rate(espeak_backend):
    slow = synth16k(espeak_backend, TEXT, EspeakVoice("en-us", 130))
    fast = synth16k(espeak_backend, TEXT, EspeakVoice("en-us", 250))
    assert speaking_rate(fast) / speaking_rate(slow) > 1.5  # 250 / 130 = 1.92


# --------------------------------------------------------------------------- profile blob

PROFILE = EspeakProfile(
    version=PROFILE_VERSION,
    variant="f3",
    pitch=72,
    pitch_range=40,
    rate_factor=1.1,
    median_f0_hz=251.5,
    f0_range_semitones=4.2,
    syllables_per_s=5.9,
)


def test_profile_round_trip():
    blob = PROFILE.to_bytes()
    assert len(blob) < 128
    assert json.loads(blob)["v"] == PROFILE_VERSION
    assert EspeakProfile.from_bytes(blob) == PROFILE
    assert EspeakProfile.from_bytes(bytearray(blob)) == PROFILE
    default_variant = replace(PROFILE, variant="", rate_factor=0.7)
    assert EspeakProfile.from_bytes(default_variant.to_bytes()) == default_variant


def _mutated(**changes: object) -> bytes:
    payload = json.loads(PROFILE.to_bytes())
    payload.update(changes)
    return json.dumps(payload).encode()


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"garbage",
        b"\xff\xfe\x00\x01",
        b"[1, 2, 3]",
        b"null",
        b'{"v": 1, "f": 220.0}',  # the synthetic backend's profile
        _mutated(v=2),
        _mutated(v=0),
        _mutated(v="1"),
        _mutated(v=True),
        _mutated(pitch=101),
        _mutated(pitch=-1),
        _mutated(pitch=50.5),
        _mutated(range=True),
        _mutated(rate=2.0),
        _mutated(rate="fast"),
        _mutated(f0=float("nan")),
        _mutated(variant="../../../etc/passwd"),
        _mutated(variant="klatt"),
        _mutated(variant=3),
        b'{"v": 1, "variant": "f3"}',
        b" " * 600 + PROFILE.to_bytes(),
    ],
)
def test_profile_rejects_bad_blobs(blob):
    with pytest.raises(ProfileError):
        EspeakProfile.from_bytes(blob)


def test_profile_unknown_version_is_named():
    with pytest.raises(ProfileError, match="version"):
        EspeakProfile.from_bytes(_mutated(v=2))
    with pytest.raises(ProfileError):
        replace(PROFILE, version=2)
    assert issubclass(ProfileError, ValueError)


# --------------------------------------------------------------------------- calibration


def _model_calibration() -> EspeakCalibration:
    """A calibration of a made-up voice: F0 = 100 Hz x 2^(pitch/50), spread = range/10
    semitones, plus a 20 Hz shift at range 100."""
    points = []
    for r in CALIBRATION_RANGES:
        for p in CALIBRATION_PITCHES:
            median = 100.0 * 2 ** (p / 50) + 20.0 * r / 100
            half = 2 ** (r / 10 / 24)
            points.append(CalibrationPoint(p, r, median, median / half, median * half, 0.7))
    return EspeakCalibration("m3", "en-us", tuple(points))


def test_calibration_solve_inverts_the_grid():
    calibration = _model_calibration()
    pitch, pitch_range = calibration.solve(100.0 * 2 ** (60 / 50), 5.0)
    assert abs(pitch_range - 50) <= 2
    median, spread = calibration.predict(pitch, pitch_range)
    assert median == pytest.approx(100.0 * 2 ** (60 / 50), rel=0.02)
    assert spread == pytest.approx(5.0, abs=0.3)
    # Out of reach: the nearest corner.
    assert calibration.solve(1000.0, 5.0)[0] == 100
    assert calibration.solve(30.0, 0.0) == (0, 0)


def test_calibration_ignores_clipped_points():
    calibration = _model_calibration()
    bad = CalibrationPoint(0, 0, 390.0, 385.0, 399.0, 0.05)  # an octave error, barely voiced
    points = tuple(bad if (p.pitch, p.pitch_range) == (0, 0) else p for p in calibration.points)
    patched = replace(calibration, points=points)
    assert not bad.trusted
    assert patched.predict(0, 0)[0] == pytest.approx(100.0, rel=0.05)  # extrapolated
    assert patched.solve(150.0, 0.0) == calibration.solve(150.0, 0.0)


def test_calibration_rate_factor():
    # A rate measure that saturates at fast rates.
    points = (RatePoint(120, 4.0), RatePoint(175, 5.5), RatePoint(250, 7.0))
    calibration = RateCalibration(EspeakVoice("en-us+m3", 175, 50, 50), points)
    assert calibration.syllables_per_s == 5.5
    assert calibration.rate_factor(5.5) == pytest.approx(1.0)
    assert calibration.rate_factor(4.75) == pytest.approx(147.5 / 175)
    assert calibration.rate_factor(6.25) == pytest.approx(212.5 / 175)
    assert calibration.rate_factor(2.0) == 0.7
    assert calibration.rate_factor(20.0) == 1.4
    # Nonsense measurements: the plain ratio to the default-rate point.
    flat = RateCalibration(calibration.voice, (RatePoint(120, 5.5), RatePoint(175, 5.5)))
    assert flat.rate_factor(6.05) == pytest.approx(1.1)


@pytest.mark.parametrize(
    ("language", "base"),
    [
        (None, "en-us"),
        ("en-US", "en-us"),
        ("en_us", "en-us"),
        ("en", "en-us"),
        ("en-GB", "en"),
        ("zh-CN", "cmn"),
        ("zh", "cmn"),
        ("zh-HK", "yue"),
        ("yue", "yue"),
        ("de-AT", "de"),
        ("fr", "fr"),
        ("es-ES", "es"),
    ],
)
def test_base_voice_for_language(language, base):
    assert base_voice_for_language(language) == base


def test_unsupported_language():
    with pytest.raises(BackendError) as info:
        base_voice_for_language("tlh")
    assert info.value.code == "unsupported_language"


# --------------------------------------------------------------------------- espeak


def test_version_string(espeak_backend):
    version = espeak_backend.version
    assert version.startswith("espeak-ng-1.")
    assert f"/profile-{PROFILE_VERSION}/" in version
    assert "/cal-" in version


def test_espeak_pitch_parameter_moves_f0(espeak_backend):
    low = median_f0(synth16k(espeak_backend, OTHER_TEXT, EspeakVoice("en-us", 175, 20, 50)))
    high = median_f0(synth16k(espeak_backend, OTHER_TEXT, EspeakVoice("en-us", 175, 80, 50)))
    assert high / low > 1.4


def test_resolve_voice_with_profile(espeak_backend):
    blob = PROFILE.to_bytes()
    voice = espeak_backend.resolve_voice(VoiceSettings("en-us", 1.0, None, blob))
    assert voice == EspeakVoice("en-us+f3", round(175 * 1.1), 72, 40)
    # The built-in's own variant is replaced; speed and rate factor multiply.
    voice = espeak_backend.resolve_voice(VoiceSettings("zh-f", 2.0, None, blob))
    assert voice == EspeakVoice("cmn+f3", round(175 * 2.0 * 1.1), 72, 40)
    plain = replace(PROFILE, variant="").to_bytes()
    assert espeak_backend.resolve_voice(VoiceSettings("en-us-f", 1.0, None, plain)).name == "en-us"
    fast = replace(PROFILE, rate_factor=1.4).to_bytes()
    assert espeak_backend.resolve_voice(VoiceSettings("en-us", 4.0, None, fast)).rate_wpm == 450


@pytest.mark.parametrize("blob", [b"garbage", _mutated(v=9), b'{"v": 1, "f": 220.0}'])
def test_resolve_voice_with_a_bad_profile(espeak_backend, blob):
    with pytest.raises(BackendError) as info:
        espeak_backend.resolve_voice(VoiceSettings("en-us", 1.0, None, blob))
    assert info.value.code == "invalid_voice_profile"


def test_resolve_voice_with_profile_still_checks_voice_and_speed(espeak_backend):
    blob = PROFILE.to_bytes()
    with pytest.raises(BackendError) as info:
        espeak_backend.resolve_voice(VoiceSettings("klingon", 1.0, None, blob))
    assert info.value.code == "unknown_voice"
    with pytest.raises(BackendError) as info:
        espeak_backend.resolve_voice(VoiceSettings("en-us", 9.0, None, blob))
    assert info.value.code == "invalid_speed"


def test_high_reference_gets_a_female_profile(espeak_backend, high_ref):
    profile = high_ref.profile
    reference_f0 = median_f0(high_ref.pcm)
    assert profile.variant in FEMALE_VARIANTS
    assert profile.median_f0_hz == pytest.approx(reference_f0, rel=0.01)
    assert profile.pitch > 55  # above the variant's default
    assert 0.8 < profile.rate_factor < 1.25  # the reference was at espeak's default rate
    output_f0 = median_f0(speak_profile(espeak_backend, high_ref.blob))
    assert output_f0 == pytest.approx(reference_f0, rel=0.15)
    # Another text, too.
    assert median_f0(speak_profile(espeak_backend, high_ref.blob, OTHER_TEXT)) == pytest.approx(
        reference_f0, rel=0.15
    )


def test_low_reference_gets_a_male_profile(espeak_backend, low_ref, high_ref):
    profile = low_ref.profile
    reference_f0 = median_f0(low_ref.pcm)
    assert profile.variant in MALE_VARIANTS
    assert profile.pitch < 45
    output_f0 = median_f0(speak_profile(espeak_backend, low_ref.blob))
    assert output_f0 == pytest.approx(reference_f0, rel=0.15)
    plain_f0 = median_f0(
        synth16k(espeak_backend, TEXT, espeak_backend.resolve_voice(VoiceSettings("en-us")))
    )
    assert output_f0 < 0.9 * plain_f0  # lower than espeak's own male voice


def test_high_and_low_profiles_sound_clearly_different(espeak_backend, high_ref, low_ref):
    """THE key test: one text, two profiles, measured pitch differs by far more than 30 %."""
    for text in (TEXT, OTHER_TEXT):
        high = median_f0(speak_profile(espeak_backend, high_ref.blob, text))
        low = median_f0(speak_profile(espeak_backend, low_ref.blob, text))
        assert high > 1.3 * low
    # Whatever the built-in voice the stream opens with.
    high = median_f0(speak_profile(espeak_backend, high_ref.blob, OTHER_TEXT, "en-gb"))
    low = median_f0(speak_profile(espeak_backend, low_ref.blob, OTHER_TEXT, "en-gb"))
    assert high > 1.3 * low


def test_fast_reference_gets_a_higher_rate_factor(espeak_backend, low_ref):
    def prepare(rate_wpm: int) -> EspeakProfile:
        # Same voice as low_ref: its variant is already calibrated.
        pcm = synth16k(espeak_backend, TEXT, EspeakVoice("en-us+m3", rate_wpm, 15, 50))
        return EspeakProfile.from_bytes(espeak_backend.prepare_voice(as_reference(pcm), None))

    slow, fast = prepare(130), prepare(250)
    assert slow.rate_factor < 0.9
    assert fast.rate_factor > 1.2
    assert fast.syllables_per_s > 1.4 * slow.syllables_per_s
    slow_voice = espeak_backend.resolve_voice(VoiceSettings("en-us", 1.0, None, slow.to_bytes()))
    fast_voice = espeak_backend.resolve_voice(VoiceSettings("en-us", 1.0, None, fast.to_bytes()))
    assert fast_voice.rate_wpm > 1.4 * slow_voice.rate_wpm


def test_profile_does_not_leak_into_a_plain_voice(espeak_backend, high_ref):
    plain = espeak_backend.resolve_voice(VoiceSettings("en-us"))
    before = median_f0(synth16k(espeak_backend, OTHER_TEXT, plain))
    profiled = median_f0(speak_profile(espeak_backend, high_ref.blob, OTHER_TEXT))
    after = median_f0(synth16k(espeak_backend, OTHER_TEXT, plain))
    assert profiled > 1.5 * before
    assert after == pytest.approx(before, rel=0.05)
    # Same voice name, only pitch differing from the previous stream's.
    espeak_backend.synthesize("Hi.", EspeakVoice("en-us", 175, 95, 90), lambda c: True)
    assert median_f0(synth16k(espeak_backend, OTHER_TEXT, plain)) == pytest.approx(before, rel=0.05)


def test_prepare_voice_rejects_bad_audio(espeak_backend):
    def code_of(pcm16k: bytes, language: str | None = None) -> str:
        with pytest.raises(BackendError) as info:
            espeak_backend.prepare_voice(pcm16k, language)
        return info.value.code

    assert code_of(b"\x00\x01\x02") == "invalid_audio"  # odd byte count
    assert code_of(as_reference(tone(150.0, 0.5))) == "invalid_audio"  # too short
    assert code_of(bytes(4 * SAMPLE_RATE * 2)) == "invalid_audio"  # silence
    noise = np.random.default_rng(2).normal(size=4 * SAMPLE_RATE) * 3000
    assert code_of(as_reference(noise.astype(np.int16))) == "invalid_audio"  # no voicing
    assert code_of(as_reference(tone(150.0, 3.0)), "tlh") == "unsupported_language"


def test_prepare_voice_leaves_the_backend_usable(espeak_backend, high_ref):
    voice = espeak_backend.resolve_voice(VoiceSettings("en-us"))
    pcm = synth16k(espeak_backend, "Hello again.", voice)
    assert len(pcm) > 0.3 * SAMPLE_RATE


def test_mandarin_reference(espeak_backend):
    text = "您好，欢迎致电客户服务中心。您的账户余额是两百四十元。请问还有什么可以帮您？"
    pcm = synth16k(espeak_backend, text, EspeakVoice("cmn+f2", DEFAULT_RATE_WPM, 80, 50))
    blob = espeak_backend.prepare_voice(as_reference(pcm), "zh-CN")
    profile = EspeakProfile.from_bytes(blob)
    assert profile.variant in FEMALE_VARIANTS
    voice = espeak_backend.resolve_voice(VoiceSettings("zh", 1.0, None, blob))
    assert voice.name == f"cmn+{profile.variant}"
    assert median_f0(synth16k(espeak_backend, text, voice)) == pytest.approx(
        median_f0(pcm), rel=0.15
    )
