"""Pieces the English and Chinese rules share: number shapes, digit grouping, rule passes.

Every pattern is compiled with :data:`re.ASCII`: ``\\d`` is ``[0-9]`` (other scripts'
digits are left alone), ``\\w`` and ``\\b`` only see ASCII letters, digits and ``_``
(so a CJK character next to a number is a boundary, as it should be).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# A number as written: digit groups with thousands separators, or a plain run; an optional
# decimal part. Both forms are greedy, so "1,234.50" and "3.14" are one number each.
NUMBER = r"(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)"
# Not glued to an ASCII letter or digit on either side ("word0", "4G", "MP3" stay); not
# the tail of a dotted number ("2.0.1") or of a key sequence ("*72").
BEFORE = r"(?<![A-Za-z0-9_*#])(?<!\d\.)"
AFTER = r"(?![A-Za-z0-9_])"
# An optional minus sign: "-" that does not follow a letter or digit ("555-0100" is no
# negative number).
MINUS = r"(?:(?<![A-Za-z0-9_])-(?=\d))?"

# "am", "pm", "a.m.", "P.M", "a m": the final period only when the first has one ("5pm."
# ends a sentence; its period is not part of the abbreviation).
AMPM = r"(?P<ampm>[AaPp](?:\.\s?[Mm](?![A-Za-z])\.?|\s?[Mm](?![A-Za-z])))"
AMPM_ANY = r"[AaPp](?:\.\s?[Mm](?![A-Za-z])\.?|\s?[Mm](?![A-Za-z]))"
TIME_ANY = r"\d{1,2}(?::[0-5]\d)?(?:\s?" + AMPM_ANY + ")?"

# Patterns both languages read the same way (times, international phone numbers).
CLOCK_24H = (
    r"(?<![\w:.])(?P<h>[01]?\d|2[0-3]):(?P<mi>[0-5]\d)(?::(?P<s>[0-5]\d))?"
    rf"(?:\s?{AMPM}|(?![\w]|:\d|\.\d))"
)
HOUR_AMPM = rf"(?<![\w:.])(?P<h>1[0-2]|0?[1-9])\s?{AMPM}"
PHONE_INTERNATIONAL = r"(?<![\w+])\+\d{1,3}(?:[ .-]?(?:\(\d{1,4}\)|\d{1,5})){2,6}(?![\w]|[.-]\d)"


# Numbers longer than this (integer digits) are read digit by digit: they are codes,
# whatever the context, and the number-word libraries stop at about this size.
MAX_CARDINAL_DIGITS = 15


def compile_rule(pattern: str, flags: int = 0) -> re.Pattern[str]:
    return re.compile(pattern, flags | re.ASCII)


def group_sizes(count: int) -> list[int]:
    """How a run of ``count`` digits read one by one is grouped, for pauses.

    Up to 4 digits: one group. Longer: the fewest groups of at most 4, as even as
    possible, longer groups first (5: 3+2, 6: 3+3, 7: 4+3, 8: 4+4, 9: 3+3+3, 10: 4+3+3).
    """
    if count <= 4:
        return [count]
    groups = -(-count // 4)
    base, extra = divmod(count, groups)
    return [base + 1] * extra + [base] * (groups - extra)


def split_groups(run: str, sizes: Sequence[int] | None = None) -> list[str]:
    """``run`` cut into the groups of :func:`group_sizes` (or of ``sizes``)."""
    out: list[str] = []
    at = 0
    for size in sizes if sizes is not None else group_sizes(len(run)):
        out.append(run[at : at + size])
        at += size
    if at < len(run):
        out.append(run[at:])
    return [group for group in out if group]


def digit_groups(written: str) -> list[str]:
    """The digit groups of a code or phone number as written ("555-0100" -> 555, 0100);
    groups longer than 4 digits are regrouped by :func:`group_sizes`."""
    out: list[str] = []
    for group in re.findall(r"[0-9]+", written):
        out.extend(split_groups(group))
    return out


def plain_digits(number: str) -> str:
    """``number`` without thousands separators."""
    return number.replace(",", "")


DIGITS = "0123456789"


@dataclass(frozen=True)
class Rule:
    """One substitution pass: every match of ``pattern`` is replaced by ``render(match)``;
    ``render`` returns ``None`` to leave a match as it is. ``needs``: characters of which
    every match holds at least one; without any of them in the text the pass is skipped
    (a regex scan costs microseconds even when nothing matches)."""

    pattern: re.Pattern[str]
    render: Callable[[re.Match[str]], str | None]
    needs: str = ""

    def apply(self, text: str) -> str:
        if self.needs and not any(ch in text for ch in self.needs):
            return text

        def replace(match: re.Match[str]) -> str:
            out = self.render(match)
            return match.group(0) if out is None else out

        return self.pattern.sub(replace, text)


# What a pass may leave for another: digits and symbols (a rule declined a number
# because of a neighbour that a later rule then rewrote, as in "2.0.15th").
_LEFTOVER = re.compile(r"[0-9#*$€£¥%&@°]|[A-Za-z]\.[A-Za-z]")
MAX_PASSES = 3


def apply_rules(text: str, rules: Sequence[Rule]) -> str:
    """All ``rules`` in order, repeated while a pass changes the text and leaves digits or
    symbols (at most MAX_PASSES times), so that the result is a fixed point: applying
    the rules again changes nothing. Ordinary text needs one pass."""
    for _ in range(MAX_PASSES):
        before = text
        for rule in rules:
            text = rule.apply(text)
        if text == before or not _LEFTOVER.search(text):
            break
    return text


def word_before(match: re.Match[str]) -> str:
    """The whitespace-separated word just before ``match`` ("" at the start)."""
    found = re.search(r"(\S+)\s*$", match.string[: match.start()])
    return found.group(1) if found else ""


def word_after(match: re.Match[str]) -> str:
    """The whitespace-separated word just after ``match`` ("" at the end)."""
    found = re.match(r"\s*(\S+)", match.string[match.end() :])
    return found.group(1) if found else ""


def at_end(match: re.Match[str]) -> bool:
    """Whether only whitespace follows ``match``."""
    return not match.string[match.end() :].strip()


def ends_sentence(match: re.Match[str]) -> bool:
    """Whether the period that ends ``match`` (an abbreviation's) also ends a sentence:
    nothing follows, or a capitalized word does."""
    return at_end(match) or word_after(match)[:1].isupper()
