"""Where a text may be cut without changing how either side is read.

:func:`engine.normalize.spoken` reads some tokens in the light of their neighbours: the
digits after "account" are a code, "Dr." before a name is "Doctor", "Dec" before "3" is a
date, "5" before "kg" is a quantity. The segment splitter (:mod:`engine.text`) cuts the
written text before normalizing each segment on its own, so it must never separate two
tokens that belong together: :func:`glued` says which. The rule is local (the token
before the cut, and the first two characters after it), so a splitter can decide as soon
as those characters have arrived. It errs on the side of keeping tokens together: a cut
then moves to the next free word boundary.
"""

from __future__ import annotations

from engine.normalize import en, zh

# A token with one of these is a number, an amount, a time, a key sequence...: it stays
# with the token after it ("5 kg", "9:30 am", "$5 million", "* key", "Tom & Jerry").
_LEFT_GLUE_CHARS = frozenset("0123456789*#$€£¥%°&@+")
# A token starting with one of these stays with the token before it ("account 0042",
# "press #", "call +1", "USD 20", "(555) 123").
_RIGHT_GLUE_START = frozenset("0123456789*#$€£¥%°&@+(")
_ENGLISH_WORDS = frozenset(
    {
        *en.CODE_KEYWORDS,
        "ending",
        "ends",
        "starting",
        # abbreviations read in the light of the next word
        "mr",
        "mrs",
        "ms",
        "dr",
        "st",
        "prof",
        "no",
        "e.g",
        "i.e",
        "approx",
        # months: "Dec 3", "December 2026"
        *(month.lower() for month in en.MONTHS),
        *(month[:3].lower() for month in en.MONTHS),
        "sept",
    }
)
_CHINESE_KEYWORDS = (*zh.PHONE_KEYWORDS, *zh.CODE_KEYWORDS, "第", "百分之")


def glued(left: str, right: str) -> bool:
    """Whether the written tokens ``left`` and ``right`` must stay in one segment.

    ``left`` is the whole token before the cut (for space-separated text, the word before
    the space; for Chinese, the word before the cut); ``right`` is at least the first two
    characters after the cut (after the space) when there are two. A caller that has
    only ``"-"`` after the cut so far must wait for the next character: "-5" glues, "- a"
    does not.
    """
    if any(ch in _LEFT_GLUE_CHARS for ch in left):
        return True
    first = right[:1]
    if first and (first in _RIGHT_GLUE_START or (first == "-" and right[1:2].isdigit())):
        return True
    word = left.rstrip(".,:;!?").lower()
    if word in _ENGLISH_WORDS:
        return True
    return any(left.endswith(keyword) for keyword in _CHINESE_KEYWORDS)
