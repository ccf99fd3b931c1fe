"""Text (already normalized by :mod:`engine.normalize`) to Kokoro phonemes, word by word.

Mandarin: misaki's ``ZHG2P`` as Kokoro v1.0 was trained with it (its "legacy" path, no
``version``: jieba words, pypinyin syllables with tone numbers, each syllable to IPA with
a tone arrow). misaki reads Latin letters in Chinese text as they are (Kokoro would spell
them as IPA symbols), so runs of Latin letters go to the English path here instead: brand
names and English words inside Chinese prompts are spoken. Everything misaki needs is in
its wheels (jieba's and pypinyin's dictionaries): nothing is fetched at run time.

English: espeak-ng's IPA (the process's library, :mod:`engine.backends.espeak_lib`) mapped
to misaki's symbols as misaki's own ``EspeakFallback`` does (diphthongs as capitals, ``ɾ``
as ``T``...). misaki's English G2P proper needs a spaCy model from a model hub, which
this project cannot fetch; its espeak path is what it falls back to for unknown words.

Each result is a list of :class:`Token`: the phonemes of one written word (``word`` set:
it is timed) or of the punctuation and spaces between words (``word`` empty).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Any, Final

from engine.backends.base import BackendError
from engine.backends.espeak_lib import library

# misaki.espeak.EspeakFallback.E2M (Apache-2.0), longest first.
_E2M: Final = sorted(
    {
        "ʔˌn\u0329": "ʔn",
        "ʔn\u0329": "ʔn",
        "a^ɪ": "I",
        "a^ʊ": "W",
        "d^ʒ": "ʤ",
        "e^ɪ": "A",
        "e": "A",
        "t^ʃ": "ʧ",
        "ɔ^ɪ": "Y",
        "ə^l": "ᵊl",
        "ʲo": "jo",
        "ʲə": "jə",
        "ʲ": "",
        "ɚ": "əɹ",
        "r": "ɹ",
        "x": "k",
        "ç": "k",
        "ɐ": "ə",
        "ɬ": "l",
        "\u0303": "",
    }.items(),
    key=lambda kv: -len(kv[0]),
)
_SYLLABIC = re.compile(r"(\S)\u0329")
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_LATIN_RUN = re.compile(r"[A-Za-z][A-Za-z'’-]*(?:\s+[A-Za-z][A-Za-z'’-]*)*")
_WORD = re.compile(r"[A-Za-z0-9]")


@dataclass(frozen=True)
class Token:
    """Phonemes of one written word (``word``), or of what lies between words."""

    word: str
    phonemes: str


def _espeak_to_misaki(ipa: str, british: bool) -> str:
    ps = ipa.strip()
    for old, new in _E2M:
        ps = ps.replace(old, new)
    ps = _SYLLABIC.sub(r"ᵊ\1", ps).replace(chr(809), "")
    if british:
        ps = ps.replace("e^ə", "ɛː").replace("iə", "ɪə").replace("ə^ʊ", "Q")
    else:
        ps = ps.replace("o^ʊ", "O").replace("ɜːɹ", "ɜɹ").replace("ɜː", "ɜɹ")
        ps = ps.replace("ɪə", "iə").replace("ː", "")
    ps = ps.replace("o", "ɔ")
    ps = ps.replace("ɾ", "T").replace("ʔ", "t")
    return ps.replace("^", "")


def english(text: str, british: bool = False) -> list[Token]:
    """``text`` in English: one token per written word when espeak-ng's words line up
    with the text's, else one untimed token per clause."""
    voice = "en" if british else "en-us"  # espeak-ng's names for British and US English
    try:
        clauses = library().phonemes(text, voice, tie="^")
    except ValueError as exc:
        raise BackendError("backend_error", str(exc)) from None
    groups: list[str] = []
    tokens: list[Token] = []
    for ipa, punctuation in clauses:
        words = _espeak_to_misaki(ipa, british).split()
        groups += words
        tokens.append(Token("", " ".join(words) + punctuation + " "))
    written = [w for w in text.split() if _WORD.search(w)]
    if len(written) != len(groups):
        return tokens
    timed: list[Token] = []
    index = 0
    for ipa, punctuation in clauses:
        words = _espeak_to_misaki(ipa, british).split()
        for position, phonemes in enumerate(words):
            timed.append(Token(written[index], phonemes))
            index += 1
            timed.append(Token("", punctuation + " " if position == len(words) - 1 else " "))
    return timed


class MandarinG2P:
    """misaki's Mandarin G2P (loaded on first use: about 1 s for jieba's dictionary)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._g2p: Any = None

    def _misaki(self) -> Any:
        with self._lock:
            if self._g2p is None:
                try:
                    from misaki import zh
                except ImportError as exc:
                    raise BackendError(
                        "backend_error", f"Mandarin G2P needs misaki[zh] ({exc})"
                    ) from None
                self._g2p = zh.ZHG2P()
            return self._g2p

    def load(self) -> None:
        import jieba

        self._misaki()
        jieba.initialize()

    def __call__(self, text: str) -> list[Token]:
        g2p = self._misaki()
        import cn2an
        import jieba

        tokens: list[Token] = []
        at = 0
        for match in _LATIN_RUN.finditer(text):
            tokens += self._chinese(text[at : match.start()], g2p, cn2an, jieba)
            tokens += [Token("", " "), *english(match.group()), Token("", " ")]
            at = match.end()
        tokens += self._chinese(text[at:], g2p, cn2an, jieba)
        return tokens

    @staticmethod
    def _chinese(text: str, g2p: Any, cn2an: Any, jieba: Any) -> list[Token]:
        if not text.strip():
            return [Token("", " ")] if text else []
        text = g2p.map_punctuation(cn2an.transform(text, "an2cn"))
        tokens: list[Token] = []
        previous_han = False
        for word in jieba.lcut(text, cut_all=False):
            han = bool(_HAN.search(word))
            if han and previous_han:  # misaki: a space between two Chinese words
                tokens.append(Token("", " "))
            if han:
                tokens.append(Token(word, g2p.word2ipa(word).replace(chr(815), "")))
            else:
                tokens.append(Token("", word))
            previous_han = han
        return tokens
