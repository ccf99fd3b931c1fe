"""Text front end: normalization and incremental sentence/clause splitting.

Streaming TTS starts speaking before the whole text is synthesized, so text is cut into
segments: sentences, and clauses of long sentences. The first segment of an utterance is
short, for early first audio: it ends at the first clause boundary, or at the first free
word boundary once it holds :data:`FIRST_SEGMENT_MAX_WORDS` words or
:data:`FIRST_SEGMENT_MAX_CJK_CHARS` CJK characters without one.

Cuts are made on the written text; then each segment is normalized on its own and turned
into its spoken form (:func:`engine.normalize.spoken`: numbers, amounts, dates, codes...
as words, in the splitter's language). A cut never separates tokens whose reading depends
on each other (:func:`engine.normalize.breaks.glued`: "account 0042", "Dr. Smith",
"5 kg", "Dec 3, 2026"), never falls inside a number ("1,234.50", "9:30", "555-0100",
"3.5") unless ``max_segment_chars`` of text have no space and no word boundary, nor
after an abbreviation's period ("Dr.", "e.g.", "Dec.") or before a number after
a colon ("order number: 12345"), and cuts Chinese text without punctuation between words
(jieba, dictionary words only; loaded on first use, about 1 s: an engine should call
:func:`load_word_segmenter` at start-up; then about 40 us per decision). Deciding whether
a position between Chinese characters is a word boundary needs the next
``_WORD_WINDOW`` (6) characters, so a streamed Chinese first segment without punctuation
waits for them; a space-separated one waits for the first character of the next word.

Character normalization (:func:`normalize`, applied to each segment):

- Unicode NFKC, which maps full-width ASCII variants (``！`` ``，`` ``？`` ``：`` ``１``)
  to their ASCII forms.
- CJK punctuation that NFKC keeps (``。`` ``、`` ``「」`` ``《》`` ...) is mapped to ASCII
  punctuation or removed, so that no backend reads punctuation aloud.
- Decorative symbols (``~`` ``※`` ``★`` emoji, box drawing, brackets) are dropped.
  Symbols with a spoken meaning in IVR prompts are kept: ``#`` ("press pound"), ``%``,
  ``°``, currency signs, ``+``, ``@``, ``&``, ``=``, digits. ``*`` is kept where it is a
  telephone key (next to a digit or ``#``, after press/dial/enter/hit/push/tap/select
  (the), before key/button/sign, after 按 or before 号/键) and dropped elsewhere
  (``*important*``, markdown bullets).
- Runs of whitespace collapse to one space; control characters are removed.
"""

from __future__ import annotations

import logging
import re
import threading
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Final

from engine.normalize import language_family, spoken
from engine.normalize.breaks import glued
from engine.normalize.personal import personal_start

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
_DECORATIVE = set('~^_`|\\<>{}[]"※')
_KEEP_SYMBOLS = set("#%$€£¥°+@&=/'-:,.!?;()*")

SENTENCE_END = frozenset(".!?;")
CLAUSE_END = frozenset(",:")
# Characters after which a boundary is taken even without following whitespace
# (CJK text has no spaces); these are the ASCII forms after normalization.
_CJK_CHAR = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]")
_SPACES = re.compile(r"\s+")

#: The first segment is cut at the first free word boundary after this many words (or
#: CJK characters) when no clause boundary came before: about 2 s of speech, so the
#: first audio never waits for a long opening sentence.
FIRST_SEGMENT_MAX_WORDS: Final = 8
FIRST_SEGMENT_MAX_CJK_CHARS: Final = 12
#: The bounded cut is not made when the clause visibly ends within this many more words:
#: "This is sentence number zero of a long | prompt." would strand its last word.
FIRST_SEGMENT_TAIL_WORDS: Final = 3
#: ... or within this many more CJK characters: "我们将会尽快为您转接人工 | 服务。" left a
#: two-character segment, spoken as a sentence of its own after a clause's pause, and
#: costing a neural voice a whole call (about 1 s for Kokoro on a slow CPU, while the
#: 12 characters before it played: a hole when it came late).
FIRST_SEGMENT_TAIL_CJK_CHARS: Final = 4
#: Context (characters either side) given to the word segmenter to decide whether a
#: position between CJK characters is a word boundary.
_WORD_WINDOW: Final = 6


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
_STAR = re.compile(r"\*")
_KEY_VERB_BEFORE = re.compile(
    r"\b(?:press|dial|enter|hit|push|tap|select)(?:\s+the)?\s*$", re.IGNORECASE
)
_KEY_NOUN_AFTER = re.compile(r"\s*(?:key|button|sign)\b", re.IGNORECASE)
_CHINESE_KEY = re.compile(r"按\s*$")


def _star(match: re.Match[str]) -> str:
    """A ``*`` that is a telephone key stays; any other is decoration (a space)."""
    text, at = match.string, match.start()
    before, after = text[at - 1 : at], text[at + 1 : at + 2]
    if before == "#" or after == "#" or before.isdigit() or after.isdigit():
        return "*"
    if after in ("号", "键") or _CHINESE_KEY.search(text, 0, at):
        return "*"
    if not after.isalnum() and _KEY_VERB_BEFORE.search(text, 0, at):
        return "*"
    if not before.isalnum() and _KEY_NOUN_AFTER.match(text, at + 1):
        return "*"
    return " "


def _normalize_once(text: str) -> str:
    text = map_characters(text)
    if "*" in text:
        text = _STAR.sub(_star, text)
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


# ------------------------------------------------------------- Chinese word boundaries

_segmenter: Any = None
_segmenter_lock = threading.Lock()


def _clause_ends_soon(text: str, i: int) -> bool:
    """Whether a clause or sentence end follows ``text[i]`` within
    :data:`FIRST_SEGMENT_TAIL_WORDS` words of the text received so far."""
    words = 0
    in_word = False
    for ch in text[i : i + 80]:
        if ch in SENTENCE_END or ch in CLAUSE_END:
            return True
        if ch.isspace():
            in_word = False
        elif not in_word:
            in_word = True
            words += 1
            if words > FIRST_SEGMENT_TAIL_WORDS:
                return False
    return False


def _cjk_clause_ends_soon(text: str, i: int) -> bool:
    """Whether a clause or sentence end follows ``text[i]`` within
    :data:`FIRST_SEGMENT_TAIL_CJK_CHARS` more characters of the text received so far."""
    for ch in text[i : i + FIRST_SEGMENT_TAIL_CJK_CHARS + 1]:
        if ch in SENTENCE_END or ch in CLAUSE_END:
            return True
    return False


def load_word_segmenter() -> Any:
    """jieba's tokenizer, its dictionary loaded (about 1 s, once per process).

    Called on the first Chinese cut that needs word boundaries; an engine may call it at
    start-up instead, so that no utterance waits for it. jieba keeps a cache of the
    parsed dictionary in the temporary directory (it works without one, only slower).
    """
    global _segmenter
    with _segmenter_lock:
        if _segmenter is None:
            import jieba

            jieba.setLogLevel(logging.WARNING)
            tokenizer = jieba.Tokenizer()
            tokenizer.initialize()
            _segmenter = tokenizer
        return _segmenter


def word_ends(text: str) -> list[int]:
    """Offsets in ``text`` where a word ends (jieba, dictionary words only), ascending;
    ``len(text)`` included."""
    ends: list[int] = []
    at = 0
    for token in load_word_segmenter().cut(text, HMM=False):
        at += len(token)
        ends.append(at)
    return ends


def _is_cjk(ch: str) -> bool:
    return bool(_CJK_CHAR.match(ch))


# ------------------------------------------------------------------------- splitting

_ABBREVIATIONS = frozenset(
    {
        "mr",
        "mrs",
        "ms",
        "dr",
        "st",
        "no",
        "vs",
        "etc",
        "e.g",
        "i.e",
        "jr",
        "sr",
        "prof",
        "inc",
        "approx",
        "apt",
        "ave",
        "blvd",
        "dept",
        "ext",
        "tel",
        "mt",
        "ltd",
        "a.m",
        "p.m",
        "u.s",
        *("jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec"),
    }
)


_LAST_WORD = re.compile(r"[A-Za-z][A-Za-z.]*$")
_WAIT: Final = None  # a decision that needs more text than has arrived


def _token_has_digit(text: str, start: int, end: int) -> bool:
    """Whether the whitespace-separated token ending at ``end`` (not before ``start``)
    holds an ASCII digit."""
    at = end - 1
    while at >= start and not text[at].isspace():
        if "0" <= text[at] <= "9":
            return True
        at -= 1
    return False


def _is_boundary(
    text: str, start: int, i: int, ends: frozenset[str], *, final: bool
) -> bool | None:
    """Whether ``text[i]`` ends the segment that starts at ``start``; ``None``: not known
    before more text arrives. Nothing before ``start`` is looked at: the text before the
    last cut is gone when text arrives in pieces.

    Punctuation ends a segment when followed by whitespace or more punctuation, or when
    a CJK character is on either side (Chinese has no spaces: "是123456，请"). At the end
    of the text seen so far, a "." waits for the next character unless the text is final
    ("3." may be "3.5"), and so do "," and ":" ("1," may become "1,234"), except after a
    CJK character for "." "!" "?" ";". Not boundaries: the period of an
    abbreviation ("Dr.", "e.g.", "Dec."); a ":" before a number ("order number: 1234",
    "尾号：1234"); a "," between numbers ("Dec 3, 2026").
    """
    ch = text[i]
    if ch not in ends:
        return False
    after_cjk = i > start and _is_cjk(text[i - 1])
    if i + 1 >= len(text):
        if final or (after_cjk and ch in SENTENCE_END):
            return True
        return _WAIT
    nxt = text[i + 1]
    if ch == ".":
        word = _LAST_WORD.search(text, start, i)
        if word is not None and word.group(0).lower() in _ABBREVIATIONS:
            return False
    if ch in CLAUSE_END:
        following = nxt
        if nxt == " ":
            if i + 2 >= len(text):
                return True if final else _WAIT
            following = text[i + 2]
        if "0" <= following <= "9" and (ch == ":" or _token_has_digit(text, start, i)):
            return False
    return after_cjk or nxt.isspace() or nxt in SENTENCE_END or nxt in CLAUSE_END or _is_cjk(nxt)


def _has_speech(segment: str) -> bool:
    return any(ch.isalnum() for ch in segment)


@dataclass
class SegmentSplitter:
    """Incremental splitter: ``feed`` text as it arrives, ``flush`` at the end.

    Contract: no segment is empty or pure punctuation; no segment is longer than
    ``max_segment_chars`` (long runs are cut at the last free space, or between Chinese
    words, or hard); each segment is ``spoken(normalize(written segment), language)``,
    normalized, where the written segments, concatenated, cover all input in order. The
    segments do not depend on how the text was cut into ``feed`` calls ("$1" then
    "20.50" is one amount). The first segment is cut at a clause boundary (comma) once it
    has at least ``first_clause_min_chars`` characters, or at the first free word
    boundary once it has ``first_segment_max_words`` words or
    ``first_segment_max_cjk_chars`` CJK characters, for early first audio; later segments
    are cut at sentence ends, or at clause ends once longer than ``clause_split_chars``.

    ``language``: a BCP-47-ish tag (see :mod:`engine.normalize`); languages without
    normalization rules get the character normalization only.

    Personal data (:mod:`engine.normalize.personal`: amounts, codes, card and account
    numbers, dates, e-mail addresses): the segments that carry any are in
    :attr:`personal` (the speech cache never stores them). With ``cut_before_personal``
    (the engine's streams and prompts) a segment is cut where its first personal item
    begins, when the words before it read the same on their own (their spoken form
    starts the whole's), so that they can be kept and reused. ``"Your balance is
    $1,234.56."`` is ``"Your balance is"`` and ``"one thousand two hundred thirty-four
    dollars and fifty-six cents."``, the second personal. A segment whose item comes
    first, or whose words before it read otherwise alone, is personal whole.
    """

    language: str = "en-US"
    max_segment_chars: int = 200
    first_clause_min_chars: int = 2
    clause_split_chars: int = 60
    first_segment_max_words: int = FIRST_SEGMENT_MAX_WORDS
    first_segment_max_cjk_chars: int = FIRST_SEGMENT_MAX_CJK_CHARS
    cut_before_personal: bool = False
    _pending: str = ""
    _emitted: int = field(default=0)
    _cut_speech: bool = field(default=False)  # a speakable piece was cut off already
    _family: str = field(default="", init=False)
    #: The segments emitted so far that carry personal data (engine.normalize.personal),
    #: and those that are the words before one, cut off to be kept (``prefixes``).
    personal: set[str] = field(default_factory=set, init=False)
    prefixes: set[str] = field(default_factory=set, init=False)
    #: A prefix and the personal rest cut from one segment -> that segment whole (when
    #: each is one segment): what is spoken when the prefix may not play ahead of it.
    wholes: dict[tuple[str, str], str] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self._family = language_family(self.language)

    def feed(self, text: str) -> list[str]:
        self._pending += map_characters(text)
        return self._split(final=False)

    def flush(self) -> list[str]:
        return self._split(final=True)

    def release(self) -> list[str]:
        """What is buffered up to its last whitespace, as segments now, though no clause
        has ended (a token stream that stalled: speak what is complete rather than wait
        for punctuation). The unfinished last word stays buffered; more text may follow."""
        text = self._pending
        cut = max(text.rfind(" "), text.rfind("\n"), text.rfind("\t"))
        if cut <= 0:
            return []
        self._pending = text[:cut]
        segments = self._split(final=True)
        self._pending = text[cut:].lstrip()
        return segments

    def _split(self, *, final: bool) -> list[str]:
        text = self._pending
        written: list[str] = []
        start = 0
        i = 0
        words = cjk = 0  # in text[start:i], for the first segment's bound
        token_counted = False
        while i < len(text):
            ch = text[i]
            if (
                not self._cut_speech
                and i > start
                and (
                    (cjk >= self.first_segment_max_cjk_chars and not _cjk_clause_ends_soon(text, i))
                    or (words >= self.first_segment_max_words and not _clause_ends_soon(text, i))
                )
            ):
                cut = self._word_boundary(text, start, i, final=final)
                if cut is _WAIT:
                    break
                if cut:
                    self._cut(written, text[start:i])
                    start = i
                    words = cjk = 0
                    token_counted = False
            # Count words and CJK characters of text[start:i + 1].
            if ch.isspace():
                token_counted = False
            else:
                if _is_cjk(ch):
                    cjk += 1
                elif not token_counted and ch.isalnum():
                    words += 1
                    token_counted = True
            length = i + 1 - start
            clause_min = (
                self.clause_split_chars if self._cut_speech else self.first_clause_min_chars
            )
            boundary = _is_boundary(text, start, i, SENTENCE_END, final=final)
            if boundary is False and length >= clause_min:
                boundary = _is_boundary(text, start, i, CLAUSE_END, final=final)
            if boundary is _WAIT:
                break
            if boundary:
                self._cut(written, text[start : i + 1])
                start = i + 1
                words = cjk = 0
                token_counted = False
            elif length >= self.max_segment_chars:
                cut_at = _hard_cut(text, start, i + 1)
                self._cut(written, text[start:cut_at])
                start = cut_at
                words = cjk = 0
                token_counted = False
                for rest in text[start : i + 1]:  # recount what stays
                    if rest.isspace():
                        token_counted = False
                    else:
                        cjk += _is_cjk(rest)
                        if not _is_cjk(rest) and not token_counted and rest.isalnum():
                            words += 1
                            token_counted = True
            i += 1
        rest = text[start:]
        if final:
            written.append(rest)
            rest = ""
        self._pending = rest
        segments = [piece for seg in written for piece in self._speakable(seg)]
        self._emitted += len(segments)
        return segments

    def _cut(self, written: list[str], segment: str) -> None:
        written.append(segment)
        self._cut_speech = self._cut_speech or _has_speech(segment)

    def _speakable(self, segment: str) -> list[str]:
        """A written segment as the segments to synthesize: normalized, in its spoken
        form, cut before its first personal item (see the class docstring) and to
        ``max_segment_chars``, without pieces that have nothing to say."""
        text = normalize(segment)
        at = personal_start(text) if text else None
        whole = self._spoken(text)
        parts: list[tuple[str, bool]] = [(whole, at is not None)]
        if at and self.cut_before_personal:
            head = self._spoken(text[:at])
            after = whole[len(head) : len(head) + 1]
            if (
                _has_speech(head)
                and whole.startswith(head)
                and (after in (" ", ",") or _is_cjk(head[-1]) or _is_cjk(after))
            ):
                parts = [(head, False), (whole[len(head) :].strip(" ,"), True)]
                self.prefixes.add(head)
        segments: list[str] = []
        split: list[list[str]] = []
        for part, personal in parts:
            pieces = [p for p in _limit(part, self.max_segment_chars) if _has_speech(p)]
            if personal:
                self.personal.update(pieces)
            segments += pieces
            split.append(pieces)
        if [len(pieces) for pieces in split] == [1, 1] and len(whole) <= self.max_segment_chars:
            self.wholes[(split[0][0], split[1][0])] = whole
        return segments

    def _spoken(self, text: str) -> str:
        """``text`` (normalized) in its spoken form, normalized again."""
        text = normalize(text)
        if self._family and text:
            text = normalize(spoken(text, self.language))
        return text

    def _word_boundary(self, text: str, start: int, i: int, *, final: bool) -> bool | None:
        """Whether the first segment may end just before ``text[i]``: a word boundary
        (a space, or between Chinese words) that does not separate glued tokens."""
        ch, before = text[i], text[i - 1]
        if ch.isspace():
            if before.isspace():
                return False
            right = text[i + 1 : i + 3]
            if not right:
                return False if final else _WAIT
            if right[0].isspace():
                return False
            if right == "-" and not final:
                return _WAIT
            left = text[start:i].rsplit(None, 1)[-1]
            return _has_speech(left) and not glued(left, right)
        if not (_is_cjk(ch) or _is_cjk(before)) or before.isspace():
            return False
        if not (ch.isalnum() and before.isalnum()):
            return False  # punctuation stays with its clause
        if i + _WORD_WINDOW > len(text) and not final:
            return _WAIT
        lo = max(start, i - _WORD_WINDOW)
        window = text[lo : i + _WORD_WINDOW]
        ends = word_ends(window)
        if i - lo not in ends:
            return False
        left_start = max((e for e in ends if e < i - lo), default=0)
        return not glued(window[left_start : i - lo], text[i : i + 2])


def _hard_cut(text: str, start: int, end: int) -> int:
    """Where to cut ``text[start:end]`` (``max_segment_chars`` long, no boundary): after
    the last space that separates no glued tokens, else the last space, else between the
    last two free Chinese words, else at ``end``. Looks at nothing after ``end``, so the
    result does not depend on how much text has arrived."""
    spaces = [
        p for p in range(end - 2, start, -1) if text[p].isspace() and not text[p - 1].isspace()
    ]
    for p in spaces:
        left = text[start:p].rsplit(None, 1)[-1]
        right = text[p + 1 : min(p + 3, end)]
        if right and not right[0].isspace() and not glued(left, right):
            return p
    if spaces:
        return spaces[0]
    if any(_is_cjk(ch) for ch in text[start:end]):
        window = text[start:end]
        ends = [e for e in word_ends(window) if 0 < e < len(window)]
        for e in reversed(ends):
            left_start = max((x for x in ends if x < e), default=0)
            if not glued(window[left_start:e], window[e : e + 2]):
                return start + e
        if ends:
            return start + ends[-1]
    return end


def _limit(segment: str, max_chars: int) -> list[str]:
    """``segment`` cut at spaces (or between Chinese words, or hard) into pieces of at
    most ``max_chars``."""
    pieces = []
    while len(segment) > max_chars:
        cut = segment.rfind(" ", 1, max_chars + 1)
        if cut <= 0 and any(_is_cjk(ch) for ch in segment[: max_chars + 1]):
            ends = [e for e in word_ends(segment[: max_chars + 1]) if 0 < e <= max_chars]
            cut = ends[-1] if ends else 0
        cut = cut if cut > 0 else max_chars
        pieces.append(segment[:cut].strip(" ,"))
        segment = segment[cut:].strip(" ,")
    pieces.append(segment)
    return pieces


#: The shortest first piece :func:`split_to_fit` cuts (a few words: shorter pieces sound
#: chopped and cost more per character).
MIN_FIT_CHARS: Final = 24


def split_to_fit(segment: str, max_chars: int) -> list[str]:
    """``segment`` (spoken form) as a first piece of at most ``max_chars`` characters
    (a window of at least :data:`MIN_FIT_CHARS`) and the rest: cut after the last clause mark of
    that window when it is in its second half, else at its last word boundary. The rest
    keeps at least :data:`MIN_FIT_CHARS` too (no stranded last word). ``[segment]`` when
    it fits or has no such cut."""
    if len(segment) <= max(max_chars, MIN_FIT_CHARS):
        return [segment]
    max_chars = min(max(max_chars, MIN_FIT_CHARS), len(segment) - MIN_FIT_CHARS)
    if max_chars < MIN_FIT_CHARS:
        return [segment]
    window = segment[: max_chars + 1]
    cut = max(window.rfind(mark, 0, max_chars) + 1 for mark in ",:;")
    if cut <= max_chars // 2:
        cut = window.rfind(" ")
        if cut <= 0 and any(_is_cjk(ch) for ch in window):
            ends = [e for e in word_ends(window) if 0 < e <= max_chars]
            cut = ends[-1] if ends else 0
    first, rest = segment[:cut].strip(), segment[cut:].strip(" ,")
    if cut <= 0 or not (_has_speech(first) and _has_speech(rest)):
        return [segment]
    return [first, rest]


# Languages whose sentences are not cut before personal data. Chinese: the words before
# an amount, spoken alone, end on a sentence's final syllable ("是" drawn out and falling),
# and the recognizer heard the joined sentences worse than whole ones, beyond the 0.02 of
# error rate allowed (Whisper base, 10 Mandarin prompts of tests/bench/composed.py,
# zh-xiaoyi: CER 0.211 composed, 0.118 whole; 0.255 before the clause's pause was cut
# short); English composed sentences were heard as well as whole ones (WER 0.048-0.056
# against 0.075-0.107). Such a segment is spoken whole and not kept (it carries the item).
NOT_CUT_FAMILIES: Final = frozenset({"zh"})


def stream_splitter(language: str) -> SegmentSplitter:
    """The splitter of the engine's streams and warm prompts: cuts before personal data
    (so the words before it can be cached; both must cut alike for their keys to meet),
    except in the languages of :data:`NOT_CUT_FAMILIES`."""
    cut = language_family(language) not in NOT_CUT_FAMILIES
    return SegmentSplitter(language=language, cut_before_personal=cut)
