"""espeak-ng backend, through the shared library bundled by ``espeakng-loader``.

espeak-ng keeps global state and is not thread-safe: one :class:`EspeakBackend` per
process, used from one thread (the scheduler's worker). It runs in synchronous mode
(``AUDIO_OUTPUT_SYNCHRONOUS``): ``espeak_Synth`` blocks and hands audio to our callback
every ``BUFFER_MS`` milliseconds, so the first audio of a segment is available long
before the segment is finished. ctypes releases the GIL around ``espeak_Synth``.

Registered voices (``prepare_voice``, ``VoiceSettings.profile``) are voice *matching*,
not cloning: see :class:`EspeakProfile` and :meth:`EspeakBackend.prepare_voice`. The
reference recording only chooses a stock espeak variant and moves its pitch, pitch range
and speaking rate towards the reference's; the caller hears an espeak voice, never the
person who recorded the reference.

API reference: espeak-ng ``speak_lib.h`` (espeak_Initialize, espeak_SetSynthCallback,
espeak_SetVoiceByName, espeak_SetParameter, espeak_Synth, espeak_Info).
"""

from __future__ import annotations

import ctypes
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import soxr

from engine.backends.base import (
    BackendError,
    CacheIdentity,
    EmitFn,
    PcmChunk,
    UnknownVoice,
    VoiceSettings,
    WordTiming,
    text_sha256,
)
from engine.backends.espeak_lib import EE_OK, ESPEAK_CHARS_UTF8, library
from engine.ipc.schema import Capabilities, VoiceInfo
from engine.voice_profile import (
    HOP_S,
    MAX_RATE_FACTOR,
    MIN_RATE_FACTOR,
    PROFILE_VERSION,
    SAMPLE_RATE,
    EspeakProfile,
    ProfileError,
    estimate_f0,
    f0_stats,
    pcm16_from_bytes,
    speaking_rate,
)

POS_CHARACTER = 1
ESPEAK_RATE = 1
ESPEAK_PITCH = 3
ESPEAK_RANGE = 4
DEFAULT_RATE_WPM = 175
DEFAULT_PITCH = 50  # espeakPITCH and espeakRANGE defaults
DEFAULT_RANGE = 50
MIN_RATE_WPM, MAX_RATE_WPM = 80, 450


class _EspeakEvent(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),
        ("length", ctypes.c_int),
        ("audio_position", ctypes.c_int),
        ("sample", ctypes.c_int),
        ("user_data", ctypes.c_void_p),
        ("id", ctypes.c_char * 8),
    ]


EVENT_LIST_TERMINATED = 0  # espeak_EVENT_TYPE (speak_lib.h)
EVENT_WORD = 1
MAX_EVENTS_PER_CALLBACK = 4096  # a bound on walking the list: it ends with type 0


def _timed_words(
    text: str, events: Sequence[tuple[int, int, int]], duration_s: float
) -> list[WordTiming]:
    """Word events (1-based character position, length, ms) as timed words of ``text``:
    each ends where the next starts, the last where the audio ends."""
    words: list[WordTiming] = []
    starts = [ms / 1000 for _pos, _len, ms in events] + [duration_s]
    for (position, length, _ms), start, end in zip(events, starts, starts[1:], strict=False):
        word = text[position - 1 : position - 1 + length].strip()
        if word:
            words.append(WordTiming(word, start, max(start, min(end, duration_s))))
    return words


_SynthCallback = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_EspeakEvent)
)


@dataclass(frozen=True)
class EspeakVoice:
    """A resolved voice: espeak voice name (with variant) and prosody parameters."""

    name: str
    rate_wpm: int
    pitch: int | None = None  # 0..100, espeak default 50
    pitch_range: int | None = None  # 0..100, espeak default 50


# Built-in voices: public id -> (espeak voice name, language tag, display name, gender)
BUILTIN_VOICES: dict[str, tuple[str, str, str, str]] = {
    "en-us": ("en-us", "en-US", "English (US)", "male"),
    "en-us-f": ("en-us+f3", "en-US", "English (US), female", "female"),
    "en-gb": ("en", "en-GB", "English (UK)", "male"),
    "zh": ("cmn", "zh-CN", "Mandarin Chinese", "male"),
    "zh-f": ("cmn+f3", "zh-CN", "Mandarin Chinese, female", "female"),
    "yue": ("yue", "zh-HK", "Cantonese", "male"),
    "es": ("es", "es-ES", "Spanish", "male"),
    "fr": ("fr", "fr-FR", "French", "male"),
    "de": ("de", "de-DE", "German", "male"),
}

# --- voice matching: calibration of espeak's pitch, range and rate --------------------

# Bump when the calibration (sentences, grids, solver, variant choice) changes: it is
# part of EspeakBackend.version, so that a registry re-prepares its voices.
CALIBRATION_VERSION: Final = 1
# A reference whose median F0 is above this gets a female variant, else a male one.
FEMALE_ABOVE_HZ: Final = 165.0
# Candidates in order of preference: when two are about as near (within
# VARIANT_TIE_SEMITONES), the earlier wins, so that measurement noise (espeak's output is
# not bit-exact from one call to the next) does not flip the choice between near twins
# (f1/f4, m1/m4 and m5/m6 differ by a few Hz).
FEMALE_VARIANTS: Final = ("f3", "f2", "f1", "f5", "f4")
MALE_VARIANTS: Final = ("m3", "m2", "m1", "m6", "m7", "m4", "m5")
VARIANT_TIE_SEMITONES: Final = 0.5
# Measured per (variant, base voice): espeakPITCH x espeakRANGE at the default rate ...
CALIBRATION_PITCHES: Final = (0, 25, 50, 75, 100)
CALIBRATION_RANGES: Final = (0, 50, 100)
# The speaking rate is measured on a longer passage at these rates, spoken with the
# profile's variant, pitch and range rounded to these steps (at one espeak rate, the
# syllable estimator's reading moves by a few % from one voice setting to another).
CALIBRATION_RATES: Final = (120, DEFAULT_RATE_WPM, 250)
RATE_CALIBRATION_STEPS: Final = (10, 25)  # pitch, range
# Solver weight of the spread error (semitones^2) against the median error (semitones^2).
SPREAD_WEIGHT: Final = 0.25
# A calibration point's median is trusted when enough of it is voiced and the median is
# clear of the estimator's search limits (60..400 Hz); its spread when its 10th and 90th
# percentiles are (beyond them the track is clipped). Untrusted values are filled in.
_TRUSTED_MEDIAN_HZ: Final = (66.0, 370.0)
_TRUSTED_SPREAD_HZ: Final = (63.0, 380.0)
_TRUSTED_VOICED: Final = 0.25
# Reference requirements (the registry normalizes and trims; these catch the rest).
MIN_REFERENCE_S: Final = 1.0
MIN_VOICED_S: Final = 0.5
MAX_REFERENCE_S: Final = 120.0

# Per base espeak voice: a sentence for the pitch grid (about 3.5 s at the default rate)
# and a passage for the speaking rate (about 12 s: syllable counts by envelope peaks vary
# by some 7 % from one sentence to another, and a passage averages that out).
CALIBRATION_TEXT: Final[dict[str, str]] = {
    "en-us": "Thank you for calling. Please hold while we connect your call.",
    "en": "Thank you for calling. Please hold while we connect your call.",
    "cmn": "感谢您的来电, 请稍候, 我们正在为您转接.",
    "yue": "多謝你嘅來電, 請稍候, 我哋而家幫你轉駁.",
    "es": "Gracias por su llamada. Por favor, espere mientras le comunicamos.",
    "fr": "Merci de votre appel. Veuillez patienter, nous transférons votre appel.",
    "de": "Vielen Dank für Ihren Anruf. Bitte warten Sie, wir verbinden Sie.",
}
_EN_PASSAGE = (
    "Thank you for calling. Your account balance is two hundred and forty dollars. "
    "For billing questions, press one. For technical support, press two. We are "
    "experiencing higher than usual call volumes, and your estimated waiting time is "
    "about five minutes."
)
CALIBRATION_RATE_TEXT: Final[dict[str, str]] = {
    "en-us": _EN_PASSAGE,
    "en": _EN_PASSAGE,
    "cmn": "感谢您的来电. 您的账户余额是两百四十元. 账单问题请按一, 技术支持请按二. "
    "目前来电较多, 预计等候时间大约五分钟.",
    "yue": "多謝你嘅來電. 你嘅戶口結餘係二百四十蚊. 賬單查詢請按一, 技術支援請按二. "
    "而家來電比較多, 預計等候時間大約五分鐘.",
    "es": "Gracias por su llamada. El saldo de su cuenta es de doscientos cuarenta euros. "
    "Para facturación, pulse uno. Para soporte técnico, pulse dos. Estamos recibiendo "
    "más llamadas de lo habitual y el tiempo de espera es de unos cinco minutos.",
    "fr": "Merci de votre appel. Le solde de votre compte est de deux cent quarante euros. "
    "Pour la facturation, tapez un. Pour l'assistance technique, tapez deux. Nous "
    "recevons plus d'appels que d'habitude, le temps d'attente est d'environ cinq minutes.",
    "de": "Vielen Dank für Ihren Anruf. Ihr Kontostand beträgt zweihundertvierzig Euro. "
    "Für Fragen zur Rechnung drücken Sie die Eins, für technische Hilfe die Zwei. Zurzeit "
    "rufen sehr viele Kunden an, die Wartezeit beträgt etwa fünf Minuten.",
}


@dataclass(frozen=True)
class CalibrationPoint:
    """espeak's pitch at one (pitch, range) setting, measured exactly as a reference."""

    pitch: int
    pitch_range: int
    median_f0_hz: float  # NaN: nothing voiced
    f0_p10_hz: float
    f0_p90_hz: float
    voiced_fraction: float

    @property
    def f0_range_semitones(self) -> float:
        return 12.0 * math.log2(self.f0_p90_hz / self.f0_p10_hz)

    @property
    def trusted(self) -> bool:
        """Whether the median is a real measurement (see ``_TRUSTED_MEDIAN_HZ``)."""
        low, high = _TRUSTED_MEDIAN_HZ
        return (
            self.voiced_fraction >= _TRUSTED_VOICED
            and math.isfinite(self.median_f0_hz)
            and low <= self.median_f0_hz <= high
        )

    @property
    def spread_trusted(self) -> bool:
        """Whether the spread is a real measurement (see ``_TRUSTED_SPREAD_HZ``)."""
        low, high = _TRUSTED_SPREAD_HZ
        return self.trusted and low <= self.f0_p10_hz and self.f0_p90_hz <= high


def _interp_extend(
    x: npt.NDArray[np.float64], xs: npt.NDArray[np.float64], ys: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """Piecewise-linear through (xs, ys) (xs increasing, at least two points), and
    beyond them the line through the two nearest points."""
    y = np.interp(x, xs, ys)
    low, high = x < xs[0], x > xs[-1]
    y[low] = ys[0] + (x[low] - xs[0]) * (ys[1] - ys[0]) / (xs[1] - xs[0])
    y[high] = ys[-1] + (x[high] - xs[-1]) * (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    return np.asarray(y, dtype=np.float64)


def _fill(xs: npt.NDArray[np.float64], ys: npt.NDArray[np.float64], *, extend: bool) -> None:
    """Replace the NaNs of ``ys`` in place from the known points: linear in between;
    beyond them the line through the two nearest (``extend``) or the nearest value."""
    known = np.isfinite(ys)
    if not known.any():
        raise ValueError("no known point")
    if extend and known.sum() >= 2:
        ys[~known] = _interp_extend(xs[~known], xs[known], ys[known])
    else:
        ys[~known] = np.interp(xs[~known], xs[known], ys[known])


@dataclass(frozen=True)
class RatePoint:
    """espeak's measured syllables per second (:func:`speaking_rate`) at one rate."""

    rate_wpm: int
    syllables_per_s: float


@dataclass(frozen=True)
class EspeakCalibration:
    """What espeak's settings do to one variant of one base voice, as measured.

    ``points``: the grid ``CALIBRATION_PITCHES`` x ``CALIBRATION_RANGES``, each the
    sentence of ``CALIBRATION_TEXT`` synthesized at the default rate, resampled to
    16 kHz and measured with :func:`estimate_f0` exactly like a reference, so that the
    estimator's own biases cancel out.

    :meth:`solve` inverts the grid. Values that reach the estimator's limits (see
    :attr:`CalibrationPoint.trusted`) are left out and filled in along pitch: log2 of
    the median F0 linearly (espeak's pitch scale is close to exponential), the spread
    with the nearest value; the median is then made non-decreasing in pitch. Log median
    and spread (semitones, 10th to 90th percentile) are interpolated linearly in pitch,
    then in range, at every integer setting, and the setting with the least (median
    error in semitones)^2 + ``SPREAD_WEIGHT`` x (spread error in semitones)^2 wins.
    """

    variant: str
    base_voice: str
    points: tuple[CalibrationPoint, ...]

    def _grid(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """(log2 median, spread) over ranges x pitches."""
        pitches = np.array(CALIBRATION_PITCHES, dtype=np.float64)
        index = {(p.pitch, p.pitch_range): p for p in self.points}
        logs = np.full((len(CALIBRATION_RANGES), len(pitches)), np.nan)
        spreads = np.full_like(logs, np.nan)
        for i, r in enumerate(CALIBRATION_RANGES):
            for j, p in enumerate(CALIBRATION_PITCHES):
                point = index.get((p, r))
                if point is not None and point.trusted:
                    logs[i, j] = math.log2(point.median_f0_hz)
                if point is not None and point.spread_trusted:
                    spreads[i, j] = point.f0_range_semitones
            try:
                _fill(pitches, logs[i], extend=True)
                _fill(pitches, spreads[i], extend=False)
            except ValueError:
                raise BackendError(
                    "backend_error",
                    f"espeak calibration of {self.base_voice}+{self.variant} failed",
                ) from None
            logs[i] = np.maximum.accumulate(logs[i])  # more pitch never lowers F0
        return logs, spreads

    def _surfaces(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """(log2 median, spread) at every integer (range, pitch), shape (101, 101)."""
        logs, spreads = self._grid()
        settings = np.arange(101, dtype=np.float64)
        pitches = np.array(CALIBRATION_PITCHES, dtype=np.float64)
        ranges = np.array(CALIBRATION_RANGES, dtype=np.float64)
        log_p = np.stack([np.interp(settings, pitches, row) for row in logs])
        spread_p = np.stack([np.interp(settings, pitches, row) for row in spreads])
        seg = np.clip(np.searchsorted(ranges, settings, side="right") - 1, 0, len(ranges) - 2)
        w = ((settings - ranges[seg]) / (ranges[seg + 1] - ranges[seg]))[:, None]
        log_median = (1 - w) * log_p[seg] + w * log_p[seg + 1]
        spread = (1 - w) * spread_p[seg] + w * spread_p[seg + 1]
        return log_median, spread

    def predict(self, pitch: int, pitch_range: int) -> tuple[float, float]:
        """(median F0 Hz, spread semitones) the calibration expects at a setting."""
        log_median, spread = self._surfaces()
        return 2.0 ** float(log_median[pitch_range, pitch]), float(spread[pitch_range, pitch])

    def solve(self, median_f0_hz: float, f0_range_semitones: float) -> tuple[int, int]:
        """The (espeakPITCH, espeakRANGE) whose output is closest to the target."""
        log_median, spread = self._surfaces()
        median_err = 12.0 * (log_median - math.log2(median_f0_hz))
        cost = median_err**2 + SPREAD_WEIGHT * (spread - f0_range_semitones) ** 2
        r, p = np.unravel_index(int(np.argmin(cost)), cost.shape)
        return int(p), int(r)


@dataclass(frozen=True)
class RateCalibration:
    """espeak's speaking rate as :func:`speaking_rate` measures it, for one voice.

    ``points``: the passage of ``CALIBRATION_RATE_TEXT`` spoken by ``voice`` (its rate
    ignored) at each of ``CALIBRATION_RATES``, resampled to 16 kHz and measured like a
    reference.
    """

    voice: EspeakVoice
    points: tuple[RatePoint, ...]

    @property
    def syllables_per_s(self) -> float:
        """espeak's measured speaking rate at its default rate."""
        for point in self.points:
            if point.rate_wpm == DEFAULT_RATE_WPM:
                return point.syllables_per_s
        raise ValueError("no rate point at the default rate")

    def rate_factor(self, syllables_per_s: float) -> float:
        """The factor on the default rate at which espeak is measured at
        ``syllables_per_s``: piecewise linear through the rate points, extended beyond
        them, clamped to ``MIN_RATE_FACTOR``..``MAX_RATE_FACTOR``. It is the reference's
        syllables per second over espeak's at its default rate, except that the
        estimator's saturation at fast rates (250 wpm reads 10-20 % slow) is measured
        and corrected."""
        points = sorted(self.points, key=lambda p: p.rate_wpm)
        rates = np.array([p.rate_wpm for p in points], dtype=np.float64)
        measured = np.array([p.syllables_per_s for p in points])
        if len(rates) >= 2 and bool(np.all(np.diff(measured) > 0)):
            target = np.array([syllables_per_s])
            factor = float(_interp_extend(target, measured, rates)[0]) / DEFAULT_RATE_WPM
        else:  # a measurement that makes no sense: the plain ratio
            factor = syllables_per_s / self.syllables_per_s
        return min(MAX_RATE_FACTOR, max(MIN_RATE_FACTOR, factor))


def base_voice_for_language(language: str | None) -> str:
    """The base espeak voice (no variant) a reference in ``language`` is calibrated on.

    Accepts a language tag of a built-in voice ("en-US", "zh-CN"; case and ``_`` are
    ignored), a built-in voice id ("en-us", "zh", "zh-f" ...), or a primary language
    ("en", "zh", "de"); None means English (US). Raises ``BackendError``
    ("unsupported_language") otherwise.
    """
    if language is None or not language.strip():
        return "en-us"
    tag = language.strip().lower().replace("_", "-")
    for voice_id, (espeak_name, lang, _, _) in BUILTIN_VOICES.items():
        if tag in (lang.lower(), voice_id):
            return espeak_name.split("+")[0]
    primary = tag.split("-")[0]
    for voice_id, (espeak_name, lang, _, _) in BUILTIN_VOICES.items():
        base = espeak_name.split("+")[0]
        if primary in (lang.lower().split("-")[0], voice_id, base):
            return base
    raise BackendError("unsupported_language", f"no espeak voice for language {language!r}")


_instance_lock = threading.Lock()
_instance_created = False


class EspeakBackend:
    """espeak-ng; see the module docstring for the threading contract.

    ``version`` ("espeak-ng-<library version>/profile-<n>/cal-<n>") changes whenever a
    profile made by :meth:`prepare_voice` could come out differently: another espeak-ng
    library, another :class:`EspeakProfile` format, another calibration. A registry
    stores it with each profile and re-prepares the voice from its reference when the
    engine's version differs.
    """

    name = "espeak"
    max_text_chars = 5000
    version: str
    # Inline (one segment at a time in the coordinator), its words timed by espeak-ng's
    # word events, voices registered from a reference (prepare_voice).
    capabilities = Capabilities(word_timings=True, cloning=True)

    def __init__(self) -> None:
        global _instance_created
        with _instance_lock:
            if _instance_created:
                raise RuntimeError("espeak-ng supports one backend instance per process")
            _instance_created = True
        self._espeak = library()
        self._lib = self._espeak.lib
        self.native_sample_rate: int = self._espeak.sample_rate
        self._emit: EmitFn | None = None
        self._aborted = False
        self._word_events: list[tuple[int, int, int]] = []  # (char pos, length, ms)
        self._last_words: list[WordTiming] = []
        self._callback = _SynthCallback(self._on_audio)  # keep a reference: C holds it
        self._lib.espeak_SetSynthCallback(self._callback)
        version = self._espeak.version
        self.version = f"espeak-ng-{version}/profile-{PROFILE_VERSION}/cal-{CALIBRATION_VERSION}"
        # The speech cache's model digest: the library's version and its voice data.
        self.model_digest = text_sha256("espeak-ng", version, self._espeak.data_path)
        # Voice matching, measured lazily: (variant, base voice) -> pitch calibration,
        # (variant, base voice, pitch, range) -> its points, voice -> rate calibration.
        self._calibrations: dict[tuple[str, str], EspeakCalibration] = {}
        self._points: dict[tuple[str, str, int, int], CalibrationPoint] = {}
        self._rate_calibrations: dict[EspeakVoice, RateCalibration] = {}

    def voices(self) -> Sequence[VoiceInfo]:
        return [
            VoiceInfo(id=vid, language=lang, name=display, backend=self.name, gender=gender)
            for vid, (_, lang, display, gender) in BUILTIN_VOICES.items()
        ]

    def resolve_voice(self, settings: VoiceSettings) -> EspeakVoice:
        """A built-in voice, or, with ``settings.profile`` (an :class:`EspeakProfile`
        blob from :meth:`prepare_voice`), that voice's language spoken with the profile's
        variant, pitch, range and rate factor: ``voice_id`` "en-us" with a profile of
        variant "f3" is espeak's "en-us+f3" (the built-in's own variant, if any, is
        replaced). Pure validation, no espeak call: safe on any thread. Raises
        ``UnknownVoice``, ``BackendError`` ("invalid_speed", "invalid_voice_profile").
        """
        entry = BUILTIN_VOICES.get(settings.voice_id)
        if entry is None:
            raise UnknownVoice(settings.voice_id)
        if not 0.25 <= settings.speed <= 4.0:
            raise BackendError("invalid_speed", "speed must be between 0.25 and 4.0")
        if settings.profile is None:
            rate = round(DEFAULT_RATE_WPM * settings.speed)
            return EspeakVoice(name=entry[0], rate_wpm=_clamp_rate(rate))
        try:
            profile = EspeakProfile.from_bytes(settings.profile)
        except ProfileError as exc:
            raise BackendError("invalid_voice_profile", str(exc)) from None
        base = entry[0].split("+")[0]
        rate = round(DEFAULT_RATE_WPM * settings.speed * profile.rate_factor)
        return EspeakVoice(
            name=f"{base}+{profile.variant}" if profile.variant else base,
            rate_wpm=_clamp_rate(rate),
            pitch=profile.pitch,
            pitch_range=profile.pitch_range,
        )

    def cache_identity(self, voice: object) -> CacheIdentity:
        """The library and its data; the resolved voice (variant, rate, pitch, range: what
        a profile and the calibration made of it). Deterministic."""
        assert isinstance(voice, EspeakVoice)
        extra = (
            ("name", voice.name),
            ("pitch", str(voice.pitch)),
            ("range", str(voice.pitch_range)),
            ("rate", str(voice.rate_wpm)),
        )
        return CacheIdentity(self.model_digest, extra)

    def _apply(self, voice: EspeakVoice) -> None:
        """Make ``voice`` espeak's current voice (the caller holds the library lock)."""
        if voice == self._espeak.current:
            return
        if self._lib.espeak_SetVoiceByName(voice.name.encode()) != EE_OK:
            self._espeak.current = None
            raise BackendError("backend_error", f"espeak has no voice {voice.name!r}")
        self._lib.espeak_SetParameter(ESPEAK_RATE, voice.rate_wpm, 0)
        # Always set both: espeak keeps them across espeak_SetVoiceByName, so a plain
        # voice after a profiled one would otherwise keep the profile's pitch.
        pitch = DEFAULT_PITCH if voice.pitch is None else voice.pitch
        pitch_range = DEFAULT_RANGE if voice.pitch_range is None else voice.pitch_range
        self._lib.espeak_SetParameter(ESPEAK_PITCH, pitch, 0)
        self._lib.espeak_SetParameter(ESPEAK_RANGE, pitch_range, 0)
        self._espeak.current = voice

    def _on_audio(self, wav: object, count: int, events: Any) -> int:
        if self._aborted:
            return 1
        if events:
            self._take_events(events)
        if count > 0 and wav and self._emit is not None:
            chunk = np.ctypeslib.as_array(wav, shape=(count,)).copy()
            if not self._emit(chunk):
                self._aborted = True
                return 1
        return 0

    def _take_events(self, events: Any) -> None:
        """Record the word events of a callback (``events``: espeak's event list, a
        ``POINTER(_EspeakEvent)``): each word's character position in the segment and
        its audio position (ms from the call's start)."""
        for i in range(MAX_EVENTS_PER_CALLBACK):
            event = events[i]
            if event.type == EVENT_LIST_TERMINATED:
                return
            if event.type == EVENT_WORD:
                self._word_events.append((event.text_position, event.length, event.audio_position))

    def last_words(self) -> Sequence[WordTiming]:
        """The words of the last :meth:`synthesize` call, timed by espeak's word events
        (a word ends where the next begins; the last where the audio ends)."""
        return self._last_words

    def synthesize(self, text: str, voice: object, emit: EmitFn) -> None:
        if not isinstance(voice, EspeakVoice):
            raise TypeError("voice must come from resolve_voice")
        if len(text) > self.max_text_chars:
            raise BackendError("text_too_long", f"segment over {self.max_text_chars} chars")
        data = text.encode("utf-8") + b"\0"
        samples = 0

        def counting(chunk: PcmChunk) -> bool:
            nonlocal samples
            samples += len(chunk)
            return emit(chunk)

        with self._espeak.lock:
            self._apply(voice)
            self._emit, self._aborted = counting, False
            self._word_events = []
            try:
                status = self._lib.espeak_Synth(
                    data, len(data), 0, POS_CHARACTER, 0, ESPEAK_CHARS_UTF8, None, None
                )
            finally:
                self._emit = None
        if status != EE_OK:
            raise BackendError("backend_error", f"espeak_Synth failed ({status})")
        self._last_words = _timed_words(text, self._word_events, samples / self.native_sample_rate)

    # --- voice matching (owning thread only) -------------------------------------------

    def prepare_voice(
        self, pcm16k: bytes, language: str | None, transcript: str | None = None
    ) -> bytes:
        """An :class:`EspeakProfile` blob (``VoiceSettings.profile``) for a reference.

        This is voice matching, not cloning: the profile names a stock espeak variant
        and the pitch, pitch range and speaking rate that bring it closest to the
        reference; the speaker's timbre is not reproduced.

        ``pcm16k``: 16-bit little-endian mono PCM at 16 kHz (normalized, silence
        trimmed; 1 to 120 s with at least 0.5 s voiced). ``language``: see
        :func:`base_voice_for_language` (None: English); it picks the sentence espeak
        is calibrated with, the profile itself is applied to whatever voice id a stream
        opens.

        Method: the reference's median F0 and F0 spread (10th to 90th percentile, in
        semitones) come from :func:`estimate_f0`, its syllables per second from
        :func:`speaking_rate`. Above ``FEMALE_ABOVE_HZ`` the variant is one of
        ``FEMALE_VARIANTS``, else one of ``MALE_VARIANTS``: the one whose own output at
        pitch 50, range 50 is nearest to the reference's median (in semitones), so that
        the pitch setting moves it least. That variant's :class:`EspeakCalibration`
        (measured with espeak itself, see there) turns median and spread into espeakPITCH
        and espeakRANGE. A :class:`RateCalibration` of espeak speaking with those
        settings turns the reference's syllables per second into ``rate_factor``: the
        reference's rate over espeak's at its default rate, both measured the same way,
        with the estimator's saturation at fast rates calibrated out.

        Threading: this synthesizes, so, like :meth:`synthesize`, it is only ever called
        on the thread that owns the backend (the scheduler's worker), which does nothing
        else meanwhile. Cost: calibration is measured lazily and kept for the backend's
        life. The first call for a gender and language synthesizes and measures one
        sentence per candidate variant (5 or 7) and the 15-point grid of the chosen
        variant (about 0.4 s of CPU on an idle core); any call whose rounded settings are
        new measures a 12 s passage at 3 rates (about 0.15 s); the analysis of the
        reference itself costs about 10 ms per second of audio. :meth:`calibrate`
        measures ahead, e.g. at start-up.

        Raises ``BackendError`` ("invalid_audio", "unsupported_language").
        """
        base = base_voice_for_language(language)
        try:
            pcm = pcm16_from_bytes(pcm16k)
        except ValueError as exc:
            raise BackendError("invalid_audio", str(exc)) from None
        seconds = len(pcm) / SAMPLE_RATE
        if seconds < MIN_REFERENCE_S:
            raise BackendError("invalid_audio", f"reference shorter than {MIN_REFERENCE_S:g} s")
        if seconds > MAX_REFERENCE_S:
            raise BackendError("invalid_audio", f"reference longer than {MAX_REFERENCE_S:g} s")
        f0 = estimate_f0(pcm)
        voiced_s = float(np.count_nonzero(np.isfinite(f0))) * HOP_S
        if voiced_s < MIN_VOICED_S:
            raise BackendError(
                "invalid_audio", f"only {voiced_s:.2f} s of the reference is voiced speech"
            )
        median_hz, spread_st, _ = f0_stats(f0)
        syllables = speaking_rate(pcm)
        variant = self.nearest_variant(median_hz, base)
        calibration = self.calibrate(variant, base)
        pitch, pitch_range = calibration.solve(median_hz, spread_st)
        if syllables > 0:
            rates = self.rate_calibration(variant, base, pitch, pitch_range)
            rate_factor = rates.rate_factor(syllables)
        else:
            rate_factor = 1.0
        profile = EspeakProfile(
            version=PROFILE_VERSION,
            variant=variant,
            pitch=pitch,
            pitch_range=pitch_range,
            rate_factor=round(rate_factor, 4),
            median_f0_hz=round(median_hz, 2),
            f0_range_semitones=round(spread_st, 3),
            syllables_per_s=round(syllables, 3),
        )
        return profile.to_bytes()

    def calibrate(self, variant: str, base_voice: str = "en-us") -> EspeakCalibration:
        """The calibration of espeak voice ``base_voice+variant`` (``variant`` "" for
        the plain voice), measured on first use and cached for the backend's life.

        Owning thread only (it synthesizes; it also leaves espeak's current voice
        changed, which :meth:`synthesize` handles). Call it at start-up for the usual
        pairs to keep the first :meth:`prepare_voice` quick.
        """
        if base_voice not in CALIBRATION_TEXT:
            raise BackendError("unsupported_language", f"no calibration for {base_voice!r}")
        key = (variant, base_voice)
        cached = self._calibrations.get(key)
        if cached is not None:
            return cached
        points = tuple(
            self._measure(variant, base_voice, p, r)
            for r in CALIBRATION_RANGES
            for p in CALIBRATION_PITCHES
        )
        calibration = EspeakCalibration(variant, base_voice, points)
        self._calibrations[key] = calibration
        return calibration

    def nearest_variant(self, median_f0_hz: float, base_voice: str = "en-us") -> str:
        """The variant of the reference's gender whose default pitch (its output at
        pitch 50, range 50) is nearest to ``median_f0_hz`` in semitones, preferring the
        earlier candidate within ``VARIANT_TIE_SEMITONES``. One measured point per
        candidate, cached; owning thread only."""
        candidates = FEMALE_VARIANTS if median_f0_hz > FEMALE_ABOVE_HZ else MALE_VARIANTS
        distances: list[tuple[float, str]] = []
        for variant in candidates:
            point = self._measure(variant, base_voice, DEFAULT_PITCH, DEFAULT_RANGE)
            if point.trusted:
                distance = abs(12.0 * math.log2(point.median_f0_hz / median_f0_hz))
                distances.append((distance, variant))
        if not distances:
            return candidates[0]
        nearest = min(d for d, _ in distances)
        return next(v for d, v in distances if d <= nearest + VARIANT_TIE_SEMITONES)

    def _synthesize_16k(self, text: str, voice: EspeakVoice) -> npt.NDArray[np.float32]:
        chunks: list[npt.NDArray[np.int16]] = []

        def collect(chunk: npt.NDArray[np.int16]) -> bool:
            chunks.append(chunk)
            return True

        self.synthesize(text, voice, collect)
        native = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int16)
        return np.asarray(
            soxr.resample(
                native.astype(np.float32) / 32768.0, self.native_sample_rate, SAMPLE_RATE
            ),
            dtype=np.float32,
        )

    def _measure(
        self, variant: str, base_voice: str, pitch: int, pitch_range: int
    ) -> CalibrationPoint:
        key = (variant, base_voice, pitch, pitch_range)
        cached = self._points.get(key)
        if cached is not None:
            return cached
        name = f"{base_voice}+{variant}" if variant else base_voice
        voice = EspeakVoice(name, DEFAULT_RATE_WPM, pitch, pitch_range)
        f0 = estimate_f0(self._synthesize_16k(CALIBRATION_TEXT[base_voice], voice))
        voiced = f0[np.isfinite(f0)]
        if len(voiced):
            p10, median, p90 = (float(v) for v in np.percentile(voiced, [10, 50, 90]))
        else:
            p10 = median = p90 = math.nan
        point = CalibrationPoint(
            pitch=pitch,
            pitch_range=pitch_range,
            median_f0_hz=median,
            f0_p10_hz=p10,
            f0_p90_hz=p90,
            voiced_fraction=len(voiced) / len(f0) if len(f0) else 0.0,
        )
        self._points[key] = point
        return point

    def rate_calibration(
        self, variant: str, base_voice: str, pitch: int, pitch_range: int
    ) -> RateCalibration:
        """espeak's measured speaking rate for ``base_voice+variant`` at about ``pitch``
        and ``pitch_range`` (rounded to ``RATE_CALIBRATION_STEPS``), cached. Owning
        thread only."""
        if base_voice not in CALIBRATION_RATE_TEXT:
            raise BackendError("unsupported_language", f"no calibration for {base_voice!r}")
        pitch_step, range_step = RATE_CALIBRATION_STEPS
        name = f"{base_voice}+{variant}" if variant else base_voice
        voice = EspeakVoice(
            name,
            DEFAULT_RATE_WPM,
            round(pitch / pitch_step) * pitch_step,
            round(pitch_range / range_step) * range_step,
        )
        cached = self._rate_calibrations.get(voice)
        if cached is not None:
            return cached
        text = CALIBRATION_RATE_TEXT[base_voice]
        points = tuple(
            RatePoint(
                rate, speaking_rate(self._synthesize_16k(text, replace(voice, rate_wpm=rate)))
            )
            for rate in CALIBRATION_RATES
        )
        calibration = RateCalibration(voice, points)
        self._rate_calibrations[voice] = calibration
        return calibration

    def voice_sample_rate(self, voice: object) -> int:
        return self.native_sample_rate

    def close(self) -> None:
        """Nothing to release: the library is the process's (the Piper backend may
        still phonemize with it); it goes with the process."""


def _clamp_rate(rate_wpm: int) -> int:
    return max(MIN_RATE_WPM, min(MAX_RATE_WPM, rate_wpm))
