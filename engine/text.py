"""Text front end: normalization and incremental sentence/clause splitting.

Streaming TTS starts speaking before the whole text is synthesized, so text is cut into
segments: sentences, and clauses of long sentences. The first segment of an utterance is
cut at the first clause boundary so that the first audio comes early.

Normalization (applied before splitting):

- Unicode NFKC, which maps full-width ASCII variants (``！`` ``，`` ``？`` ``：`` ``１``)
  to their ASCII forms.
- CJK punctuation that NFKC keeps (``。`` ``、`` ``「」`` ``《》`` ...) is mapped to ASCII
  punctuation or removed, so that no backend reads punctuation aloud.
- Decorative symbols (``*`` ``~`` ``※`` ``★`` emoji, box drawing, brackets) are dropped.
  Symbols with a spoken meaning in IVR prompts are kept: ``#`` ("press pound"), ``%``,
  currency signs, ``+``, ``@``, ``&``, ``=``, digits.
- Runs of whitespace collapse to one space; control characters are removed.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field

# CJK punctuation NFKC leaves alone -> ASCII replacement ("" removes it).
_CJK_PUNCTUATION = {
    "。": ".",
    "｡": ".",
    "、": ",",
    "､": ",",
    "〜": " ",
    "～": " ",
    "・": " ",
    "…": "...",
    "‥": "..",
    "「": "",
    "」": "",
    "『": "",
    "』": "",
    "《": "",
    "》": "",
    "〈": "",
    "〉": "",
    "【": "",
    "】": "",
    "〔": "",
    "〕": "",
    "“": "",
    "”": "",
    "‘": "",
    "’": "'",
    "—": ",",
    "–": ",",
    "·": " ",
}
_DECORATIVE = set('*~^_`|\\<>{}[]"※')
_KEEP_SYMBOLS = set("#%$€£¥+@&=/'-:,.!?;()")

SENTENCE_END = frozenset(".!?;")
CLAUSE_END = frozenset(",:")
# Characters after which a boundary is taken even without following whitespace
# (CJK text has no spaces); these are the ASCII forms after normalization.
_CJK_CHAR = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]")
_SPACES = re.compile(r"\s+")


def _keep(ch: str) -> str:
    if ch in _CJK_PUNCTUATION:
        return _CJK_PUNCTUATION[ch]
    if ch.isalnum() or ch.isspace() or ch in _KEEP_SYMBOLS:
        return ch
    if ch in _DECORATIVE:
        return " "
    category = unicodedata.category(ch)
    if category.startswith("P"):  # other punctuation: a pause at most
        return ","
    if category.startswith(("S", "C")):  # symbols, emoji, control, private use
        return " "
    return ch  # marks (combining accents) and anything else stay


def map_characters(text: str) -> str:
    """The per-character part of :func:`normalize` (safe on a prefix of a stream)."""
    return "".join(_keep(ch) for ch in unicodedata.normalize("NFKC", text))


_EMPTY_BRACKETS = re.compile(r"\(\s*\)")
# A run of pauses becomes one ", "; a comma between digits ("1,234") is left alone.
_PAUSES = re.compile(r"\s*(?:(?<!\d),|,(?!\d))[\s,]*|\s+,[\s,]*")


def _normalize_once(text: str) -> str:
    text = map_characters(text)
    while True:
        stripped = _EMPTY_BRACKETS.sub(" ", text)
        if stripped == text:
            break
        text = stripped
    text = _PAUSES.sub(", ", text)
    text = _SPACES.sub(" ", text)
    return text.strip(" ,")


def normalize(text: str) -> str:
    """Normalize ``text`` for synthesis; see the module docstring. Idempotent.

    Removing characters can create new sequences (brackets around nothing, a combining
    mark meeting its base letter), so the steps repeat until nothing changes.
    """
    for _ in range(4):
        again = _normalize_once(text)
        if again == text:
            break
        text = again
    return text


_ABBREVIATIONS = frozenset(
    {"mr", "mrs", "ms", "dr", "st", "no", "vs", "etc", "e.g", "i.e", "jr", "sr", "prof", "inc"}
)


_LAST_WORD = re.compile(r"[A-Za-z][A-Za-z.]*$")


def _is_boundary(text: str, i: int, ends: frozenset[str], *, final: bool) -> bool:
    """Whether ``text[i]`` ends a segment.

    Punctuation ends a segment when followed by whitespace or more punctuation, or when
    it follows a CJK character (Chinese has no spaces). At the end of the text seen so
    far, a "." waits for the next character unless the text is final ("3." may be "3.5").
    """
    ch = text[i]
    if ch not in ends:
        return False
    after_cjk = i > 0 and bool(_CJK_CHAR.match(text[i - 1]))
    if i + 1 >= len(text):  # "1," may become "1,234" and "10:" may become "10:30"
        return final or after_cjk
    nxt = text[i + 1]
    if ch == ".":
        word = _LAST_WORD.search(text, 0, i)
        if word is not None and word.group(0).lower() in _ABBREVIATIONS:
            return False
    return after_cjk or nxt.isspace() or nxt in SENTENCE_END or nxt in CLAUSE_END


def _has_speech(segment: str) -> bool:
    return any(ch.isalnum() for ch in segment)


@dataclass
class SegmentSplitter:
    """Incremental splitter: ``feed`` text as it arrives, ``flush`` at the end.

    Contract: the concatenation of every returned segment, re-normalized, covers all
    speakable input in order; no segment is empty or pure punctuation; no segment is
    longer than ``max_segment_chars`` (long runs are cut at the last space, or hard).
    The first segment is cut at a clause boundary (comma) once it has at least
    ``first_clause_min_chars`` characters, for early first audio; later segments are
    cut at sentence ends, or at clause ends once longer than ``clause_split_chars``.
    """

    max_segment_chars: int = 200
    first_clause_min_chars: int = 2
    clause_split_chars: int = 60
    _pending: str = ""
    _emitted: int = field(default=0)
    _cut_speech: bool = field(default=False)  # a speakable piece was cut off already

    def feed(self, text: str) -> list[str]:
        self._pending += map_characters(text)
        return self._split(final=False)

    def flush(self) -> list[str]:
        return self._split(final=True)

    def _split(self, *, final: bool) -> list[str]:
        text = self._pending
        out: list[str] = []
        start = 0
        i = 0
        while i < len(text):
            length = i + 1 - start
            clause_min = (
                self.clause_split_chars if self._cut_speech else self.first_clause_min_chars
            )
            if _is_boundary(text, i, SENTENCE_END, final=final) or (
                length >= clause_min and _is_boundary(text, i, CLAUSE_END, final=final)
            ):
                out.append(text[start : i + 1])
                self._cut_speech = self._cut_speech or _has_speech(out[-1])
                start = i + 1
            elif length >= self.max_segment_chars:
                cut = text.rfind(" ", start, i)
                cut = cut if cut > start else i
                out.append(text[start : cut + 1])
                self._cut_speech = self._cut_speech or _has_speech(out[-1])
                start = cut + 1
            i += 1
        rest = text[start:]
        if final:
            out.append(rest)
            rest = ""
        self._pending = rest
        segments = [
            piece
            for seg in out
            for piece in _limit(normalize(seg), self.max_segment_chars)
            if _has_speech(piece)
        ]
        self._emitted += len(segments)
        return segments


def _limit(segment: str, max_chars: int) -> list[str]:
    """``segment`` cut at spaces (or hard) into pieces of at most ``max_chars``."""
    pieces = []
    while len(segment) > max_chars:
        cut = segment.rfind(" ", 1, max_chars + 1)
        cut = cut if cut > 0 else max_chars
        pieces.append(segment[:cut].strip())
        segment = segment[cut:].strip()
    pieces.append(segment)
    return pieces
