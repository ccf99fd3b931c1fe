"""The process's one espeak-ng library, shared by every backend that needs it.

espeak-ng keeps global state (the current voice and its parameters, the synthesis
callback) and is not thread-safe. Two backends use it: :mod:`engine.backends.espeak`
synthesizes with it, :mod:`engine.backends.piper` turns text into IPA phonemes with it.
:func:`library` loads and initializes it once per process; every call into it holds
:attr:`EspeakLibrary.lock`, and whoever changes the current voice records it in
:attr:`EspeakLibrary.current`, so each user re-applies its own voice when someone else
changed it.

API reference: espeak-ng ``speak_lib.h`` (espeak_Initialize, espeak_SetVoiceByName,
espeak_TextToPhonemes, espeak_Info).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Final

AUDIO_OUTPUT_SYNCHRONOUS: Final = 2
ESPEAK_INITIALIZE_DONT_EXIT: Final = 0x8000
ESPEAK_CHARS_UTF8: Final = 1
PHONEMES_IPA: Final = 0x02  # espeakPHONEMES_IPA: phoneme names in IPA (UTF-8)
PHONEMES_TIE: Final = 0x80  # espeakPHONEMES_TIE: bits 8-23 are a tie, not a separator
EE_OK: Final = 0
BUFFER_MS: Final = 200
CLAUSE_PUNCTUATION: Final = frozenset(".,?!;:")


class EspeakLibrary:
    """espeak-ng through the shared library that ``espeakng-loader`` bundles."""

    def __init__(self) -> None:
        import espeakng_loader

        lib = ctypes.CDLL(espeakng_loader.get_library_path())
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_Info.restype = ctypes.c_char_p
        lib.espeak_Info.argtypes = [ctypes.c_void_p]
        lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
        lib.espeak_TextToPhonemes.argtypes = [
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_int,
            ctypes.c_int,
        ]
        lib.espeak_Synth.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_uint,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        data_path = str(espeakng_loader.get_data_path())
        rate = lib.espeak_Initialize(
            AUDIO_OUTPUT_SYNCHRONOUS,
            BUFFER_MS,
            data_path.encode(),
            ESPEAK_INITIALIZE_DONT_EXIT,
        )
        if rate <= 0:
            raise RuntimeError(f"espeak_Initialize failed ({rate})")
        self.lib = lib
        self.sample_rate: int = rate
        self.version = (lib.espeak_Info(None) or b"unknown").decode("ascii", "replace")
        self.data_path = data_path  # the voice data the library speaks with
        #: Held for every call into the library (re-entrant: a synthesis callback may
        #: run code that calls in again on the same thread).
        self.lock = threading.RLock()
        #: Whatever the last user set as the current voice (its own key); None: unknown.
        self.current: object = None

    def phonemes(self, text: str, voice_name: str, tie: str = "") -> list[tuple[str, str]]:
        """``text`` as IPA phonemes, clause by clause: ``(phonemes, punctuation)``.
        ``tie``: a character joining the letters of one multi-letter phoneme ("^":
        ``a^ɪ`` for the diphthong), as Kokoro's phoneme mapping wants; "" for none.

        espeak_TextToPhonemes returns one clause per call and drops the punctuation that
        ended it; the punctuation is recovered from the text the call consumed (the last
        of ``.,?!;:`` in it, or "" when the clause ended without one), because prosody
        models (Piper) are trained with it. Raises ``ValueError`` for an unknown voice.
        """
        raw = text.encode("utf-8")
        buffer = ctypes.create_string_buffer(raw)
        start = ctypes.addressof(buffer)
        pointer = ctypes.c_void_p(start)
        clauses: list[tuple[str, str]] = []
        mode = PHONEMES_IPA | (PHONEMES_TIE | ord(tie) << 8 if tie else 0)
        with self.lock:
            key = ("phonemes", voice_name)
            if self.current != key:
                if self.lib.espeak_SetVoiceByName(voice_name.encode()) != EE_OK:
                    self.current = None
                    raise ValueError(f"espeak has no voice {voice_name!r}")
                self.current = key
            while pointer.value:
                before = pointer.value - start
                ipa = self.lib.espeak_TextToPhonemes(ctypes.byref(pointer), ESPEAK_CHARS_UTF8, mode)
                after = pointer.value - start if pointer.value else len(raw)
                consumed = raw[before:after].decode("utf-8", "ignore")
                marks = [ch for ch in consumed if ch in CLAUSE_PUNCTUATION]
                clauses.append(
                    ((ipa or b"").decode("utf-8", "replace"), marks[-1] if marks else "")
                )
        return clauses


_library: EspeakLibrary | None = None
_library_lock = threading.Lock()


def library() -> EspeakLibrary:
    """The process's espeak-ng, loaded and initialized on first use."""
    global _library
    with _library_lock:
        if _library is None:
            _library = EspeakLibrary()
        return _library
