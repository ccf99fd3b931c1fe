"""espeak-ng backend, through the shared library bundled by ``espeakng-loader``.

espeak-ng keeps global state and is not thread-safe: one :class:`EspeakBackend` per
process, used from one thread (the scheduler's worker). It runs in synchronous mode
(``AUDIO_OUTPUT_SYNCHRONOUS``): ``espeak_Synth`` blocks and hands audio to our callback
every ``BUFFER_MS`` milliseconds, so the first audio of a segment is available long
before the segment is finished. ctypes releases the GIL around ``espeak_Synth``.

API reference: espeak-ng ``speak_lib.h`` (espeak_Initialize, espeak_SetSynthCallback,
espeak_SetVoiceByName, espeak_SetParameter, espeak_Synth).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.backends.base import (
    BackendError,
    EmitFn,
    UnknownVoice,
    VoiceSettings,
    register_backend,
)
from engine.schema import VoiceInfo

AUDIO_OUTPUT_SYNCHRONOUS = 2
ESPEAK_INITIALIZE_DONT_EXIT = 0x8000
POS_CHARACTER = 1
ESPEAK_CHARS_UTF8 = 1
ESPEAK_RATE = 1
ESPEAK_PITCH = 3
ESPEAK_RANGE = 4
EE_OK = 0
BUFFER_MS = 200
DEFAULT_RATE_WPM = 175
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

_instance_lock = threading.Lock()
_instance_created = False


class EspeakBackend:
    """espeak-ng; see the module docstring for the threading contract."""

    name = "espeak"
    max_text_chars = 5000

    def __init__(self) -> None:
        global _instance_created
        import espeakng_loader

        with _instance_lock:
            if _instance_created:
                raise RuntimeError("espeak-ng supports one backend instance per process")
            _instance_created = True
        self._lib = ctypes.CDLL(espeakng_loader.get_library_path())
        self._lib.espeak_Initialize.restype = ctypes.c_int
        self._lib.espeak_Initialize.argtypes = [
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.c_int,
        ]
        self._lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        self._lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        self._lib.espeak_Synth.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_uint,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        data_path = espeakng_loader.get_data_path().encode()
        rate = self._lib.espeak_Initialize(
            AUDIO_OUTPUT_SYNCHRONOUS, BUFFER_MS, data_path, ESPEAK_INITIALIZE_DONT_EXIT
        )
        if rate <= 0:
            raise RuntimeError(f"espeak_Initialize failed ({rate})")
        self.native_sample_rate: int = rate
        self._emit: EmitFn | None = None
        self._aborted = False
        self._callback = _SynthCallback(self._on_audio)  # keep a reference: C holds it
        self._lib.espeak_SetSynthCallback(self._callback)
        self._current: EspeakVoice | None = None

    def voices(self) -> Sequence[VoiceInfo]:
        return [
            VoiceInfo(id=vid, language=lang, name=display, backend=self.name, gender=gender)
            for vid, (_, lang, display, gender) in BUILTIN_VOICES.items()
        ]

    def resolve_voice(self, settings: VoiceSettings) -> EspeakVoice:
        entry = BUILTIN_VOICES.get(settings.voice_id)
        if entry is None:
            raise UnknownVoice(settings.voice_id)
        if not 0.25 <= settings.speed <= 4.0:
            raise BackendError("invalid_speed", "speed must be between 0.25 and 4.0")
        rate = round(DEFAULT_RATE_WPM * settings.speed)
        return EspeakVoice(name=entry[0], rate_wpm=max(MIN_RATE_WPM, min(MAX_RATE_WPM, rate)))

    def _apply(self, voice: EspeakVoice) -> None:
        if voice == self._current:
            return
        if self._lib.espeak_SetVoiceByName(voice.name.encode()) != EE_OK:
            raise BackendError("backend_error", f"espeak has no voice {voice.name!r}")
        self._lib.espeak_SetParameter(ESPEAK_RATE, voice.rate_wpm, 0)
        if voice.pitch is not None:
            self._lib.espeak_SetParameter(ESPEAK_PITCH, voice.pitch, 0)
        if voice.pitch_range is not None:
            self._lib.espeak_SetParameter(ESPEAK_RANGE, voice.pitch_range, 0)
        self._current = voice

    def _on_audio(self, wav: object, count: int, _events: object) -> int:
        if self._aborted:
            return 1
        if count > 0 and wav and self._emit is not None:
            chunk = np.ctypeslib.as_array(wav, shape=(count,)).copy()
            if not self._emit(chunk):
                self._aborted = True
                return 1
        return 0

    def synthesize(self, text: str, voice: object, emit: EmitFn) -> None:
        if not isinstance(voice, EspeakVoice):
            raise TypeError("voice must come from resolve_voice")
        if len(text) > self.max_text_chars:
            raise BackendError("text_too_long", f"segment over {self.max_text_chars} chars")
        self._apply(voice)
        data = text.encode("utf-8") + b"\0"
        self._emit, self._aborted = emit, False
        try:
            status = self._lib.espeak_Synth(
                data, len(data), 0, POS_CHARACTER, 0, ESPEAK_CHARS_UTF8, None, None
            )
        finally:
            self._emit = None
        if status != EE_OK:
            raise BackendError("backend_error", f"espeak_Synth failed ({status})")

    def close(self) -> None:
        self._lib.espeak_Terminate()


def register() -> None:
    register_backend("espeak", EspeakBackend)
