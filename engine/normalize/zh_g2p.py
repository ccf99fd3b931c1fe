"""Spoken Chinese text as input for a Mandarin G2P: Mandarin runs and Latin runs.

A Mandarin grapheme-to-phoneme front end (``misaki.zh.ZHG2P``: jieba, pypinyin, cn2an;
Kokoro's Mandarin voices) reads Han characters and a few punctuation marks. Anything else
it misreads or loses: it reads digits itself with cn2an ("400-820-8820" with 负), passes
Latin letters through as if they were phonemes (the model's vocabulary then drops or
misreads them) or replaces them with an unknown sign, and symbols vanish.
:func:`engine.normalize.spoken` (``zh``) already writes digits, amounts, dates, codes and
symbols out as Han characters; this module takes its output the rest of the way.

Contract (what a backend gets):

- :func:`pieces` cuts the text into :class:`Piece` objects, in order, covering
  everything that is spoken. A Mandarin piece (``latin=False``) holds only Han
  characters, :data:`PUNCTUATION` and single spaces: every character is one the Mandarin
  G2P reads (a Han character) or maps to a pause (a piece between two Latin pieces may
  be punctuation only: "iPhone，iPad"). A Latin piece (``latin=True``) holds
  only ASCII letters, apostrophes, hyphens inside words and single spaces: English words
  and brand names as written ("iPhone", "WiFi", "Hello there"), and acronyms already
  spaced letter by letter by ``spoken`` ("V I P", "A P P", the "S F" of "SF1234567890"),
  meant for an English G2P (espeak-ng ``en-us``, misaki ``en``) in the same voice.
- :func:`mandarin_only` is the same text for a backend with no English G2P: Latin
  pieces are spelled letter by letter with the Chinese names of the letters
  (:data:`LETTER_NAMES`: "VIP" -> 维艾批). Its output holds only Han characters,
  :data:`PUNCTUATION` and spaces.
- What ``spoken`` leaves and these functions finish: digits glued to letters, which
  ``spoken`` keeps as written ("4G", "MP3", "G20", "PM2.5", "Win10"), are read as Chinese
  numbers (四 G, MP 三, G 二十, PM 二点五); symbols outside a number are named
  (:data:`SYMBOLS`: "%" 百分号, "#" 井号, "*" 星号, "+" 加, "=" 等于, "&" 和, "@" 艾特,
  currency signs) or, for "/" "-" "~" "_" "|", become a pause or a space; letters with
  accents lose them ("café" -> cafe); other scripts (kana, Hangul, Cyrillic...), emoji
  and any character not listed above are removed. Nothing is dropped silently by the
  G2P afterwards: what is removed is removed here, by these rules.

Sans-I/O, deterministic, never raises; about 20-50 us for a 30-character IVR sentence
(one CPU core, Python 3.11, measured on a loaded machine).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from engine.normalize.zh import digits, fold_width, number

__all__ = ["LETTER_NAMES", "PUNCTUATION", "SYMBOLS", "Piece", "mandarin_only", "pieces", "spell"]

#: Punctuation a Mandarin G2P maps to a pause (misaki's ``map_punctuation`` and Kokoro's
#: vocabulary): full-width and ASCII forms.
PUNCTUATION = frozenset("，。！？：；（）、,.!?:;()…“”")

#: Letter names in Han characters, for a G2P without English (each read by pypinyin as
#: the syllables shown): close to how a Mandarin speaker says the letters.
LETTER_NAMES = {
    "A": "诶",  # ei
    "B": "比",  # bi
    "C": "西",  # xi
    "D": "迪",  # di
    "E": "伊",  # yi
    "F": "艾弗",  # ai fu
    "G": "吉",  # ji
    "H": "艾尺",  # ai chi
    "I": "艾",  # ai
    "J": "杰",  # jie
    "K": "开",  # kai
    "L": "艾欧",  # ai ou (as "L" is said in Mandarin)
    "M": "艾姆",  # ai mu
    "N": "恩",  # en
    "O": "欧",  # ou
    "P": "批",  # pi
    "Q": "丘",  # qiu
    "R": "阿尔",  # a er
    "S": "艾丝",  # ai si
    "T": "提",  # ti
    "U": "优",  # you
    "V": "维",  # wei
    "W": "达布留",  # da bu liu
    "X": "艾克斯",  # ai ke si
    "Y": "歪",  # wai
    "Z": "贼德",  # zei de
}

#: Symbols outside a number, by name ("" is a space; "," a pause).
SYMBOLS = {
    "%": "百分号",
    "#": "井号",
    "*": "星号",
    "+": "加",
    "=": "等于",
    "&": "和",
    "@": "艾特",
    "$": "美元",
    "¥": "元",
    "€": "欧元",
    "£": "英镑",
    "°": "度",
    "/": ",",
    "-": ",",
    "~": ",",
    "|": ",",
    "_": "",
}


@dataclass(frozen=True)
class Piece:
    """A run of text for one G2P: Mandarin (``latin=False``) or English (``latin=True``)."""

    text: str
    latin: bool


_HAN = re.compile(r"[\u3007\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_LATIN_WORD = re.compile(r"[A-Za-z]+(?:['-][A-Za-z]+)*")
_SPACES = re.compile(r"\s+")
_TOKEN = re.compile(
    r"(?P<zh>[\u3007\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
    + re.escape("".join(sorted(PUNCTUATION)))
    + r"]+)"
    r"|(?P<latin>[A-Za-z]+(?:['-][A-Za-z]+)*)"
    r"|(?P<num>[0-9]+(?:\.[0-9]+)?)"
    r"|(?P<space>\s+)"
    r"|(?P<other>.)",
    re.ASCII | re.DOTALL,
)


def _strip_accents(text: str) -> str:
    """Latin letters with diacritics as plain ASCII letters ("café" -> cafe); other
    characters unchanged."""
    if text.isascii():
        return text
    out = []
    for ch in text:
        if ch.isalpha() and not ch.isascii() and not _HAN.match(ch):
            base = unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode()
            out.append(base if base.isalpha() else ch)
        else:
            out.append(ch)
    return "".join(out)


def _number(run: str) -> str:
    """Leftover digits (glued to letters): "4" 四, "20" 二十, "2.5" 二点五; a leading zero
    or more than 4 digits: digit by digit ("0042" 零零四二)."""
    whole = run.partition(".")[0]
    if len(whole) > 4 or (len(whole) > 1 and whole[0] == "0"):
        return "点".join(digits(part) for part in run.split("."))
    return number(run)


def _mandarin(ch: str) -> str:
    """One character that is neither a Latin letter, a digit nor whitespace, as Mandarin
    piece text (a space when it is removed)."""
    if _HAN.match(ch) or ch in PUNCTUATION:
        return ch
    if ch in SYMBOLS:
        return SYMBOLS[ch] or " "
    return " "


def pieces(text: str) -> list[Piece]:
    """``text`` (the output of :func:`engine.normalize.spoken` for ``zh``) as Mandarin and
    Latin pieces, in order; see the module docstring for what each may hold."""
    out: list[tuple[list[str], bool]] = []

    def add(part: str, latin: bool) -> None:
        if out and out[-1][1] == latin:
            out[-1][0].append(part)
        else:
            out.append(([part], latin))

    for m in _TOKEN.finditer(_strip_accents(fold_width(text))):
        if m["zh"]:
            add(m["zh"], False)
        elif m["latin"]:
            add(m["latin"], True)
        elif m["num"]:
            add(_number(m["num"]), False)
        elif m["space"]:
            if out:
                out[-1][0].append(" ")
        else:
            add(_mandarin(m["other"]), False)

    result: list[Piece] = []
    for parts, latin in out:
        piece = _SPACES.sub(" ", "".join(parts)).strip()
        if not piece or (not result and not latin and not _HAN.search(piece)):
            continue  # nothing, or only pauses before anything is said
        if result and result[-1].latin == latin:  # a removed character joined two runs
            result[-1] = Piece(f"{result[-1].text} {piece}", latin)
        else:
            result.append(Piece(piece, latin))
    return result


def spell(latin: str) -> str:
    """Latin letters by their Chinese names ("VIP" -> 维艾批; case ignored; anything else
    in ``latin`` is left out)."""
    return "".join(LETTER_NAMES.get(ch.upper(), "") for ch in latin)


def mandarin_only(text: str) -> str:
    """``text`` for a Mandarin G2P alone: :func:`pieces` with every Latin piece spelled
    by :func:`spell`, word by word, with a space between words."""
    parts = []
    for piece in pieces(text):
        if piece.latin:
            parts.append(" ".join(spell(word) for word in _LATIN_WORD.findall(piece.text)))
        else:
            parts.append(piece.text)
    return " ".join(part for part in parts if part)
