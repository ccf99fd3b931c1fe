"""Personal data in written text, as the normalizer sees it before it spells it out.

The speech cache keeps what callers heard; amounts, one-time codes, card and account
numbers, dates and e-mail addresses must not be kept (docs/speech-cache.md, "What may
be kept"). :func:`personal_start` finds where the first such item begins in a written
segment (after character normalization, :func:`engine.text.normalize`, before
:func:`engine.normalize.spoken`), so that the splitter can cut the segment there and
mark what follows as not to be stored. The rules err on the side of privacy: a segment
they flag that was harmless costs a cache hit, never a leak.

Personal, in any language:

- a run of 3 digits or more, separators between them allowed ("682163", "1,234.56",
  "4111 1111 1111 1111", "555-0100", "9:30", "2026-12-03"; a lone "1" or "24" in a menu
  is not);
- any number next to a currency ("$5", "5 dollars", "€3", "USD 20", "5元", "RMB 100");
- a month name next to a number ("Dec 3", "3 December") and Chinese dates ("3月5日",
  "2026年");
- digits after a code keyword ("PIN 42", "account no. 7", "验证码 12"), the keywords of
  the normalizer (:data:`engine.normalize.en.CODE_KEYWORDS` but call, dial, text and
  number, which precede menu choices, and :data:`engine.normalize.zh.CODE_KEYWORDS`);
- an e-mail address;
- digits spelled out: 3 digit words or more in a row ("six eight two", "一二三四",
  "幺三八") and Chinese numerals with a currency ("一百二十元").
"""

from __future__ import annotations

import re
from typing import Final

from engine.normalize import en, zh

_CURRENCY_BEFORE = r"(?:[$€£¥₹]|\b(?:USD|EUR|GBP|RMB|CNY|JPY|HKD|HK\$|C\$|A\$)\s?)"
_CURRENCY_AFTER = (
    r"(?:\s?(?:dollars?|cents?|euros?|pounds?|pence|yen|yuan|rmb|usd|eur|gbp|bucks?)\b"
    r"|\s?(?:元|块|角|毛|美元|欧元|英镑|港元|港币|日元|人民币))"
)
_NUMBER = r"\d(?:[\d.,]*\d)?"
_MONTH_NAMES = {m for month in en.MONTHS for m in (month, month[:3])} | {"Sept"}
_MONTHS = "|".join(sorted(_MONTH_NAMES, key=len, reverse=True))
_EN_KEYWORDS = tuple(k for k in en.CODE_KEYWORDS if k not in ("call", "dial", "text", "number"))
_DIGIT_WORDS = r"(?:zero|oh|one|two|three|four|five|six|seven|eight|nine)"
_HAN_DIGITS = "零〇一二三四五六七八九幺"
_HAN_NUMERALS = _HAN_DIGITS + "十百千万亿两点"

# (rule, whether the item starts at its first digit: the keyword rules match the keyword)
_RULES: Final = tuple(
    (re.compile(pattern, re.IGNORECASE), from_digit)
    for pattern, from_digit in (
        # 3 digits or more, with separators between them
        (r"\d(?:[\s.,:/\-()]{0,3}\d){2,}", False),
        # a number next to a currency
        (rf"{_CURRENCY_BEFORE}\s?-?\d|\d{_CURRENCY_AFTER}", False),
        (rf"{_NUMBER}\s?(?:k|m|bn|million|billion|thousand)?{_CURRENCY_AFTER}", False),
        # dates: a month name next to a number; Chinese year, month, day
        (rf"\b(?:{_MONTHS})\.?\s+\d|\d(?:st|nd|rd|th)?\s+(?:of\s+)?(?:{_MONTHS})\b", False),
        (r"\d+\s?(?:年|月|日)", False),
        # digits after a code keyword (and what may stand between)
        (
            rf"\b(?:{'|'.join(_EN_KEYWORDS)})\b\.?(?:\s*(?:#|:|no\.?|number|num|is|was|ending"
            rf"\s+in|ends\s+in|ending\s+with|starting\s+with))*\s*\d",
            True,
        ),
        (rf"(?:{'|'.join(zh.CODE_KEYWORDS + zh.PHONE_KEYWORDS)})\s*(?:是|为|:)?\s*\d", True),
        # e-mail
        (r"[\w.+\-]+@[\w\-]+(?:\.[\w\-]+)+", False),
        # digits spelled out
        (rf"\b{_DIGIT_WORDS}(?:[\s,\-]+{_DIGIT_WORDS}){{2,}}\b", False),
        (rf"[{_HAN_DIGITS}]{{3,}}", False),
        (rf"[{_HAN_NUMERALS}]+(?:元|块|角|美元|欧元|英镑|港元|日元)", False),
    )
)
_DIGIT = re.compile(r"\d")


def personal_start(text: str) -> int | None:
    """Where the first personal item of ``text`` begins (its first digit for items led
    by a keyword), or None when it has none. Pure, about 10-30 us a segment."""
    first: int | None = None
    for rule, from_digit in _RULES:
        match = rule.search(text)
        if match is None:
            continue
        start = match.start()
        if from_digit:
            digit = _DIGIT.search(text, start, match.end())
            start = digit.start() if digit is not None else start
        if first is None or start < first:
            first = start
    return first


def is_personal(text: str) -> bool:
    """Whether ``text`` holds personal data (see the module docstring)."""
    return personal_start(text) is not None
