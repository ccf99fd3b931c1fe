"""English rules: written IVR text to its spoken form (conventions: :mod:`engine.normalize`).

Number words come from ``num2words`` (cardinals, ordinals, years), cleaned to the chosen
style: no commas, and "and" after hundreds only in British English.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from num2words import num2words

from engine.normalize._common import (
    AFTER,
    AMPM,
    BEFORE,
    CLOCK_24H,
    DIGITS,
    HOUR_AMPM,
    MAX_CARDINAL_DIGITS,
    NUMBER,
    PHONE_INTERNATIONAL,
    TIME_ANY,
    Rule,
    apply_rules,
    at_end,
    compile_rule,
    digit_groups,
    ends_sentence,
    plain_digits,
    split_groups,
    word_after,
    word_before,
)

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")

MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
_MONTH_BY_PREFIX = {name[:3]: i + 1 for i, name in enumerate(MONTHS)}
# Capitalized month names and their abbreviations ("Sept" too), optionally with a period.
MONTH = (
    r"(?P<month>Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
    r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)\.?"
)
_DAYS_IN_MONTH = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)

# Words after which digits are a code read digit by digit ("account 0042", "order number
# 12345678", "call 911"); matched case-insensitively. Shared with the splitter's glue
# rules (engine.normalize.breaks).
CODE_KEYWORDS = (
    "phone",
    "telephone",
    "tel",
    "mobile",
    "cell",
    "fax",
    "call",
    "dial",
    "text",
    "extension",
    "ext",
    "number",
    "num",
    "account",
    "acct",
    "order",
    "reference",
    "ref",
    "confirmation",
    "booking",
    "reservation",
    "ticket",
    "case",
    "claim",
    "invoice",
    "policy",
    "member",
    "membership",
    "customer",
    "tracking",
    "routing",
    "card",
    "pin",
    "code",
    "passcode",
    "password",
    "otp",
    "id",
    "serial",
    "zip",
    "postcode",
    "pnr",
    "flight",
    "room",
    "voucher",
    "transaction",
)
# What may stand between a keyword and its digits: "account number is 1234", "card ending in".
_CODE_FILLER = r"#|:|number|no\.?|num|is|was|ending\s+in|ends\s+in|ending\s+with|starting\s+with"

# Abbreviations expanded without looking at their neighbours (lowercase key, no period).
_ABBREVIATIONS = {
    "mr": "mister",
    "mrs": "missus",
    "ms": "miz",
    "prof": "professor",
    "jr": "junior",
    "sr": "senior",
    "mt": "mount",
    "dept": "department",
    "inc": "incorporated",
    "ltd": "limited",
    "approx": "approximately",
    "e.g": "for example",
    "i.e": "that is",
    "etc": "et cetera",
    "vs": "versus",
    "apt": "apartment",
    "ave": "avenue",
    "blvd": "boulevard",
    "ext": "extension",
    "tel": "telephone",
    "hrs": "hours",
}
# Titles without a period ("Mr Smith", British style) are expanded only before a name.
_TITLES = frozenset({"mr", "mrs", "ms", "prof"})

_NUMBER_WORD = re.compile(
    r"(?:\w+-)?(?:zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|\w+teen"
    r"|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety|hundred|thousand|million|billion)",
    re.IGNORECASE,
)
_ORDINAL_WORD = re.compile(
    r"(?:\w+-)?(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh"
    r"|twelfth|\w+teenth|\w+tieth|hundredth|thousandth|millionth)",
    re.IGNORECASE,
)

_WEEKDAYS = {
    "mon": "Monday",
    "tue": "Tuesday",
    "wed": "Wednesday",
    "thu": "Thursday",
    "fri": "Friday",
    "sat": "Saturday",
    "sun": "Sunday",
}
_WEEKDAY = (
    r"(?:Monday|Mon|Tuesday|Tues|Tue|Wednesday|Wed|Thursday|Thurs|Thur|Thu|Friday|Fri"
    r"|Saturday|Sat|Sunday|Sun)"
)


@dataclass(frozen=True)
class Currency:
    one: str
    many: str
    minor_one: str = ""  # "" when amounts are not read with a minor unit
    minor_many: str = ""


_DOLLAR = Currency("dollar", "dollars", "cent", "cents")
_EURO = Currency("euro", "euros", "cent", "cents")
_POUND = Currency("pound", "pounds", "penny", "pence")
_YEN = Currency("yen", "yen")
_YUAN = Currency("yuan", "yuan")
CURRENCIES = {
    "$": _DOLLAR,
    "US$": _DOLLAR,
    "USD": _DOLLAR,
    "dollar": _DOLLAR,
    "dollars": _DOLLAR,
    "HK$": Currency("Hong Kong dollar", "Hong Kong dollars", "cent", "cents"),
    "HKD": Currency("Hong Kong dollar", "Hong Kong dollars", "cent", "cents"),
    "C$": Currency("Canadian dollar", "Canadian dollars", "cent", "cents"),
    "CAD": Currency("Canadian dollar", "Canadian dollars", "cent", "cents"),
    "A$": Currency("Australian dollar", "Australian dollars", "cent", "cents"),
    "AUD": Currency("Australian dollar", "Australian dollars", "cent", "cents"),
    "€": _EURO,
    "EUR": _EURO,
    "euro": _EURO,
    "euros": _EURO,
    "£": _POUND,
    "GBP": _POUND,
    "¥": _YEN,
    "JPY": _YEN,
    "CNY": _YUAN,
    "RMB": _YUAN,
    "元": _YUAN,
    "yuan": _YUAN,
}
_SYMBOL = r"(?P<sym>US\$|HK\$|C\$|A\$|\$|€|£|¥)"
_CODE = r"(?P<code>USD|EUR|GBP|JPY|CNY|RMB|HKD|CAD|AUD)"
_SCALES = {
    "thousand": "thousand",
    "million": "million",
    "billion": "billion",
    "trillion": "trillion",
    "k": "thousand",
    "K": "thousand",
    "m": "million",
    "M": "million",
    "bn": "billion",
    "b": "billion",
    "B": "billion",
}
_SCALE = r"(?:\s(?P<scale>thousand|million|billion|trillion)|(?P<scale2>k|K|m|M|bn|b|B))?"

# Units after a number: (singular, plural); British spelling is derived (metre, litre).
UNITS = {
    "kg": ("kilogram", "kilograms"),
    "g": ("gram", "grams"),
    "mg": ("milligram", "milligrams"),
    "lb": ("pound", "pounds"),
    "lbs": ("pound", "pounds"),
    "oz": ("ounce", "ounces"),
    "km": ("kilometer", "kilometers"),
    "m": ("meter", "meters"),
    "cm": ("centimeter", "centimeters"),
    "mm": ("millimeter", "millimeters"),
    "mi": ("mile", "miles"),
    "ft": ("foot", "feet"),
    "km/h": ("kilometer per hour", "kilometers per hour"),
    "kph": ("kilometer per hour", "kilometers per hour"),
    "mph": ("mile per hour", "miles per hour"),
    "L": ("liter", "liters"),
    "l": ("liter", "liters"),
    "ml": ("milliliter", "milliliters"),
    "mL": ("milliliter", "milliliters"),
    "KB": ("kilobyte", "kilobytes"),
    "kB": ("kilobyte", "kilobytes"),
    "MB": ("megabyte", "megabytes"),
    "GB": ("gigabyte", "gigabytes"),
    "TB": ("terabyte", "terabytes"),
    "Mbps": ("megabit per second", "megabits per second"),
    "Gbps": ("gigabit per second", "gigabits per second"),
    "kWh": ("kilowatt hour", "kilowatt hours"),
    "min": ("minute", "minutes"),
    "mins": ("minute", "minutes"),
    "h": ("hour", "hours"),
    "hr": ("hour", "hours"),
    "hrs": ("hour", "hours"),
    "s": ("second", "seconds"),
    "sec": ("second", "seconds"),
    "secs": ("second", "seconds"),
    "ms": ("millisecond", "milliseconds"),
    "°C": ("degree Celsius", "degrees Celsius"),
    "°F": ("degree Fahrenheit", "degrees Fahrenheit"),
    "°": ("degree", "degrees"),
}
# Units that must be separated from the number by a space ("5 s", but "5s" is a plural).
_SPACED_UNITS = frozenset({"s", "l"})
_UNIT = "(?P<unit>" + "|".join(re.escape(u) for u in sorted(UNITS, key=len, reverse=True)) + ")"

_AMPM = AMPM
_TIME_ANY = TIME_ANY


def _clean(words: str, british: bool) -> str:
    words = words.replace(",", "")
    if not british:
        words = re.sub(r"\band ", "", words)
    return words


@functools.lru_cache(maxsize=4096)
def cardinal(n: int, british: bool = False) -> str:
    """``n`` (>= 0) in words: 120 -> "one hundred twenty" ("one hundred and twenty" in
    British English)."""
    return _clean(str(num2words(n, lang="en")), british)


@functools.lru_cache(maxsize=1024)
def ordinal(n: int, british: bool = False) -> str:
    """``n`` (>= 0) as an ordinal: 22 -> "twenty-second"."""
    return _clean(str(num2words(n, lang="en", to="ordinal")), british)


@functools.lru_cache(maxsize=512)
def year(n: int, british: bool = False) -> str:
    """``n`` read as a year: 2026 -> "twenty twenty-six", 2005 -> "two thousand five",
    1905 -> "nineteen oh five"."""
    words = _clean(str(num2words(n, lang="en", to="year")), british)
    return words.replace("oh-", "oh ")


def digits(run: str) -> str:
    """Digits one by one: "0042" -> "zero zero four two"."""
    return " ".join(DIGIT_WORDS[int(d)] for d in run if d.isdigit())


def grouped_digits(written: str) -> str:
    """A code read digit by digit in groups with a pause between (see
    :func:`engine.normalize._common.group_sizes`)."""
    return ", ".join(digits(group) for group in digit_groups(written))


class English:
    """The English rules in one style (``british``: en-GB and relatives)."""

    def __init__(self, *, british: bool) -> None:
        self.british = british
        self._rules = self._build_rules()

    def spoken(self, text: str) -> str:
        return apply_rules(text, self._rules)

    # ------------------------------------------------------------------ number words

    def cardinal(self, n: int) -> str:
        return cardinal(n, self.british)

    def number(self, written: str, *, negative: bool = False) -> str:
        """A quantity: "1,234" -> "one thousand two hundred thirty-four", "3.14" ->
        "three point one four"; longer than MAX_CARDINAL_DIGITS: digit by digit."""
        whole, _, fraction = plain_digits(written).partition(".")
        if len(whole) > MAX_CARDINAL_DIGITS:
            words = grouped_digits(whole)
        else:
            words = self.cardinal(int(whole or "0"))
        if fraction:
            words += " point " + digits(fraction)
        return ("minus " + words) if negative else words

    def _code_or_number(self, run: str) -> str:
        """Digits after a code keyword: short numbers (up to 2 digits, no leading zero)
        as a number ("room 12"), anything else digit by digit, grouped."""
        if len(run) <= 2 and not run.startswith("0"):
            return self.cardinal(int(run))
        return grouped_digits(run)

    def _year(self, n: int) -> str:
        return year(n, self.british)

    def _month_name(self, written: str) -> str:
        return MONTHS[_MONTH_BY_PREFIX[written[:3]] - 1]

    def _date(
        self, month: int, day: int, year_: int | None, *, day_first: bool, the: bool = True
    ) -> str | None:
        if not (1 <= month <= 12 and 1 <= day <= _DAYS_IN_MONTH[month - 1]):
            return None
        name = MONTHS[month - 1]
        if day_first:
            out = ("the " if the else "") + f"{ordinal(day)} of {name}"
            return out + (f" {self._year(year_)}" if year_ is not None else "")
        out = f"{name} {ordinal(day)}"
        return out + (f", {self._year(year_)}" if year_ is not None else "")

    def _time(self, hour: int, minute: int, second: int | None, ampm: str | None) -> str:
        suffix = ""
        if ampm and hour > 12:
            ampm = None  # "14:00 pm": the 24-hour clock wins
        if ampm:
            suffix = " AM" if ampm[0] in "Aa" else " PM"
            shown = hour - 12 if hour > 12 else (hour or 12)
        elif hour == 0:
            shown, suffix = 12, " AM"
        elif hour > 12:
            shown, suffix = hour - 12, " PM"
        else:
            shown = hour
        words = self.cardinal(shown)
        if minute:
            words += (" oh " + DIGIT_WORDS[minute]) if minute < 10 else " " + self.cardinal(minute)
        elif not suffix:
            words += " o'clock"
        words += suffix
        if second:
            words += f" and {self.cardinal(second)} second" + ("s" if second != 1 else "")
        return words

    def _amount(
        self, written: str, currency: Currency, scale: str | None, *, negative: bool
    ) -> str:
        whole, _, fraction = plain_digits(written).partition(".")
        if scale:
            words = f"{self.number(written)} {_SCALES[scale]} {currency.many}"
        elif len(whole) > MAX_CARDINAL_DIGITS or (
            fraction and (len(fraction) > 2 or not currency.minor_many)
        ):
            words = f"{self.number(written)} {currency.many}"
        else:
            units = int(whole or "0")
            minor = int(fraction.ljust(2, "0")) if fraction else 0
            parts = []
            if units or not minor:
                parts.append(
                    f"{self.cardinal(units)} {currency.one if units == 1 else currency.many}"
                )
            if minor:
                name = currency.minor_one if minor == 1 else currency.minor_many
                parts.append(f"{self.cardinal(minor)} {name}")
            words = " and ".join(parts)
        return ("minus " + words) if negative else words

    # ------------------------------------------------------------------------ rules

    def _build_rules(self) -> list[Rule]:
        british = self.british
        pound_key = "hash" if british else "pound"

        def email(m: re.Match[str]) -> str:
            return f"{m['local'].replace('.', ' dot ')} at {m['domain'].replace('.', ' dot ')}"

        def domain(m: re.Match[str]) -> str:
            return m.group(0).replace(".", " dot ")

        def abbreviation(m: re.Match[str]) -> str | None:
            written = m["abbr"]
            key = written.rstrip(".").lower()
            if key in _TITLES and not written.endswith("."):
                after = word_after(m)
                if not (after and after[0].isupper()):
                    return None
            words = _ABBREVIATIONS[key]
            if written[0].isupper():
                words = words[0].upper() + words[1:]
            keep = at_end(m) or (key in ("etc", "approx") and ends_sentence(m))
            return words + ("." if written.endswith(".") and keep else "")

        def dr_st(m: re.Match[str]) -> str | None:
            # Runs after the number rules: its neighbours are words by then ("5th St." is
            # "fifth St."), so a second pass sees the same context (idempotence).
            before, after = word_before(m), word_after(m)
            next_capital = bool(after) and after[0].isupper()
            # "Dr."/"St." before: capitalized words once expanded (Doctor, Street...).
            prev_capital = bool(re.fullmatch(r"[A-Z][A-Za-z]*\.*", before))
            dot = m["dot"] is not None
            if m["abbr"] == "St":
                if _ORDINAL_WORD.fullmatch(before):
                    words = "Street"
                elif next_capital:
                    words = "Saint"
                elif _NUMBER_WORD.fullmatch(before) or prev_capital or dot:
                    words = "Street"
                else:
                    return None
            elif next_capital:
                words = "Doctor"
            elif prev_capital:
                words = "Drive"
            elif dot:
                words = "Doctor"
            else:
                return None
            return words + ("." if dot and at_end(m) else "")

        def weekdays(m: re.Match[str]) -> str:
            first, last = (_WEEKDAYS[w[:3].lower()] for w in (m["a"], m["b"]))
            return f"{first} to {last}"

        def time_range(m: re.Match[str]) -> str | None:
            a, b = m["a"], m["b"]
            timeish = re.compile(r":|[AaPp]\.?\s?[Mm]")
            if not (timeish.search(a) or timeish.search(b)):
                return None
            return f"{a} to {b}"

        def iso_date(m: re.Match[str]) -> str | None:
            return self._date(int(m["m"]), int(m["d"]), int(m["y"]), day_first=british)

        def slash_date(m: re.Match[str]) -> str | None:
            a, b = int(m["a"]), int(m["b"])
            y = int(m["y"])
            if len(m["y"]) == 2:
                y += 2000 if y < 70 else 1900
            month, day = (b, a) if british else (a, b)
            if not 1 <= month <= 12 and 1 <= day <= 12:
                month, day = day, month
            the = word_before(m).lower() != "the"
            return self._date(month, day, y, day_first=british, the=the)

        def month_day(m: re.Match[str]) -> str | None:
            y = int(m["y"]) if m["y"] else None
            return self._date(_MONTH_BY_PREFIX[m["month"][:3]], int(m["d"]), y, day_first=False)

        def day_month(m: re.Match[str]) -> str | None:
            y = int(m["y"]) if m["y"] else None
            the = word_before(m).lower() != "the"
            month = _MONTH_BY_PREFIX[m["month"][:3]]
            return self._date(month, int(m["d"]), y, day_first=True, the=the)

        def month_year(m: re.Match[str]) -> str:
            return f"{self._month_name(m['month'])} {self._year(int(m['y']))}"

        def clock(m: re.Match[str]) -> str | None:
            hour, minute = int(m["h"]), int(m["mi"])
            second = int(m["s"]) if m.groupdict().get("s") else None
            ampm = m["ampm"]
            words = self._time(hour, minute, second, ampm)
            return words + ("." if ampm and ampm.endswith(".") and at_end(m) else "")

        def hour_ampm(m: re.Match[str]) -> str:
            words = self._time(int(m["h"]), 0, None, m["ampm"])
            return words + ("." if m["ampm"].endswith(".") and at_end(m) else "")

        def phone_international(m: re.Match[str]) -> str:
            groups = re.findall(r"\d+", m.group(0))
            rest = ", ".join(digits(g) for part in groups[1:] for g in split_groups(part))
            return f"plus {digits(groups[0])}, {rest}"

        def phone(m: re.Match[str]) -> str:
            return grouped_digits(m.group(0))

        def dash_groups(m: re.Match[str]) -> str | None:
            groups = m.group(0).split("-")
            if len(groups) == 2 and sum(len(g) for g in groups) < 7:
                return None
            if len(groups) == 2 and all(re.fullmatch(r"(?:19|20)\d\d", g) for g in groups):
                return None  # a range of years
            return grouped_digits(m.group(0))

        def code(m: re.Match[str]) -> str:
            head = m.string[m.start() : m.start("d")]
            if re.search(r"number|no\b|num", head, re.I):
                head = head.replace("#", " ")
            else:
                head = head.replace("#", " number ")
            head = re.sub(r"\s+", " ", head).rstrip() + " "
            groups = re.findall(r"\d+", m["d"])
            if len(groups) == 1:
                return head + self._code_or_number(groups[0])
            return head + ", ".join(grouped_digits(g) for g in groups)

        def money_symbol(m: re.Match[str]) -> str:
            negative = bool(m["neg"] or m["neg2"])
            scale = m["scale"] or m["scale2"]
            return self._amount(m["num"], CURRENCIES[m["sym"]], scale, negative=negative)

        def money_code(m: re.Match[str]) -> str:
            scale = m["scale"] or m["scale2"]
            return self._amount(m["num"], CURRENCIES[m["code"]], scale, negative=bool(m["neg"]))

        def minor_money(m: re.Match[str]) -> str:
            count = m["num"]
            name = m["cur"].lower()
            if name in ("cent", "cents"):
                name = "cent" if count == "1" else "cents"
            elif name in ("penny", "pence"):
                name = "penny" if count == "1" else "pence"
            return f"{self.number(count, negative=bool(m['neg']))} {name}"

        def percent(m: re.Match[str]) -> str:
            words = self.number(m["num"], negative=bool(m["neg"]))
            if m["num2"]:
                words += " to " + self.number(m["num2"])
            return words + " percent"

        def ordinal_(m: re.Match[str]) -> str | None:
            whole = plain_digits(m["num"])
            if len(whole) > MAX_CARDINAL_DIGITS:
                return None
            return ordinal(int(whole), british)

        def unit(m: re.Match[str]) -> str | None:
            symbol = m["unit"]
            if symbol in _SPACED_UNITS and not m["sp"]:
                return None
            one, many = UNITS[symbol]
            if british:
                one, many = (
                    w.replace("meter", "metre").replace("liter", "litre") for w in (one, many)
                )
            words = self.number(m["num"], negative=bool(m["neg"]))
            if m["num2"]:
                words += " to " + self.number(m["num2"])
            single = m["num"] == "1" and not m["num2"]
            return f"{words} {one if single else many}"

        def keys(m: re.Match[str]) -> str:
            written = m.group(0)
            number_sign = re.fullmatch(r"#(\d+)", written)
            if number_sign:
                return "number " + self._code_or_number(number_sign.group(1))
            names = {"*": "star", "#": pound_key}
            return " ".join(names.get(ch) or DIGIT_WORDS[int(ch)] for ch in written)

        def year_range(m: re.Match[str]) -> str:
            return f"{self._year(int(m['a']))} to {self._year(int(m['b']))}"

        def number_range(m: re.Match[str]) -> str | None:
            a, b = m["a"], m["b"]
            if any(len(plain_digits(x).partition(".")[0]) > 4 for x in (a, b)):
                return None
            return f"{self.number(a)} to {self.number(b)}"

        def year_in_context(m: re.Match[str]) -> str:
            return f"{m['p']} {self._year(int(m['y']))}"

        def dotted(m: re.Match[str]) -> str:
            parts = m.group(0).split(".")
            return " point ".join(
                self.cardinal(int(p)) if len(p) <= 2 and (p == "0" or p[0] != "0") else digits(p)
                for p in parts
            )

        def number(m: re.Match[str]) -> str:
            written = m["num"]
            whole, _, fraction = plain_digits(written).partition(".")
            negative = bool(m["neg"])
            if (
                "," not in written
                and not fraction
                and (len(whole) >= 5 or (len(whole) >= 2 and whole[0] == "0"))
            ):
                words = grouped_digits(whole)
                return ("minus " + words) if negative else words
            return self.number(written, negative=negative)

        NUM = NUMBER
        ASCII_WORD = r"[A-Za-z0-9_]"
        return [
            Rule(
                compile_rule(
                    r"(?<![\w.+-])(?P<local>[\w.+-]+)@(?P<domain>[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)"
                ),
                email,
                needs="@",
            ),
            Rule(
                compile_rule(
                    r"(?<![\w@.])(?:[A-Za-z0-9-]+\.)+(?:com|org|net|gov|edu|io|uk|cn|hk)\b(?!\.\w)"
                ),
                domain,
                needs=".",
            ),
            Rule(
                compile_rule(r"(?<![A-Za-z.])(?P<n>[Nn])o\.\s?(?=\d)"),
                lambda m: m["n"] + "umber ",
                needs=DIGITS,
            ),
            Rule(
                compile_rule(rf"\b(?P<a>{_WEEKDAY})\.?\s?-\s?(?P<b>{_WEEKDAY})\b\.?"),
                weekdays,
                needs="-",
            ),
            Rule(
                compile_rule(
                    rf"(?<![\w:.-])(?P<a>{_TIME_ANY})\s?-\s?(?P<b>{_TIME_ANY})(?![\w:]|\.\d)"
                ),
                time_range,
                needs=DIGITS,
            ),
            Rule(
                compile_rule(
                    r"(?<![\w./-])(?P<y>\d{4})-(?P<m>\d{1,2})-(?P<d>\d{1,2})(?![\w]|[./-]\d)"
                ),
                iso_date,
                needs=DIGITS,
            ),
            Rule(
                compile_rule(
                    r"(?<![\w./-])(?P<y>\d{4})/(?P<m>\d{1,2})/(?P<d>\d{1,2})(?![\w]|[./-]\d)"
                ),
                iso_date,
                needs=DIGITS,
            ),
            Rule(
                compile_rule(
                    r"(?<![\w./-])(?P<a>\d{1,2})/(?P<b>\d{1,2})/(?P<y>\d{4}|\d{2})(?![\w]|[./-]\d)"
                ),
                slash_date,
                needs=DIGITS,
            ),
            Rule(
                compile_rule(
                    rf"(?<![A-Za-z]){MONTH}\s(?P<d>\d{{1,2}})(?:st|nd|rd|th)?(?!\w|[.,:]\d)"
                    r"(?:,?\s(?P<y>\d{4})(?![\w]|[.,:]\d))?"
                ),
                month_day,
                needs=DIGITS,
            ),
            Rule(
                compile_rule(
                    rf"(?<![\w.,])(?P<d>\d{{1,2}})(?:st|nd|rd|th)?\s(?:of\s)?{MONTH}(?![A-Za-z])"
                    r"(?:,?\s(?P<y>\d{4})(?![\w]|[.,:]\d))?"
                ),
                day_month,
                needs=DIGITS,
            ),
            Rule(
                compile_rule(rf"(?<![A-Za-z]){MONTH}\s(?P<y>\d{{4}})(?![\w]|[.,:]\d)"),
                month_year,
                needs=DIGITS,
            ),
            Rule(
                compile_rule(CLOCK_24H),
                clock,
                needs=DIGITS,
            ),
            Rule(
                compile_rule(rf"(?<![\w:.])(?P<h>1[0-2]|0?[1-9])\.(?P<mi>[0-5]\d)\s?{_AMPM}"),
                clock,
                needs=DIGITS,
            ),
            Rule(
                compile_rule(HOUR_AMPM),
                hour_ampm,
                needs=DIGITS,
            ),
            Rule(
                compile_rule(PHONE_INTERNATIONAL),
                phone_international,
                needs=DIGITS,
            ),
            Rule(
                compile_rule(
                    r"(?<![\w(+.-])(?:1[ .-])?(?:\(\d{3}\)\s?|\d{3}[ .-])\d{3}[ .-]\d{4}"
                    r"(?![\w]|[.-]\d)"
                ),
                phone,
                needs=DIGITS,
            ),
            Rule(compile_rule(r"(?<![\w.-])\d{3}-\d{4}(?![\w]|[.-]\d)"), phone, needs=DIGITS),
            Rule(
                compile_rule(r"(?<![\w.-])\d{2,}(?:-\d{2,})+(?![\w]|[.-]\d)"),
                dash_groups,
                needs=DIGITS,
            ),
            Rule(
                compile_rule(
                    rf"(?P<neg>(?<!{ASCII_WORD})-)?{_SYMBOL}\s?(?P<neg2>-)?(?P<num>{NUM})"
                    rf"{_SCALE}{AFTER}"
                ),
                money_symbol,
                needs=DIGITS,
            ),
            Rule(
                compile_rule(rf"\b{_CODE}\s?(?P<neg>-)?(?P<num>{NUM}){_SCALE}{AFTER}"),
                money_code,
                needs=DIGITS,
            ),
            Rule(
                compile_rule(
                    rf"{BEFORE}(?P<neg>-(?=\d))?(?P<num>{NUM})"
                    r"(?:\s(?P<scale>thousand|million|billion|trillion))?"
                    r"(?:\s?(?P<cur>USD|EUR|GBP|JPY|CNY|RMB|HKD|CAD|AUD|元)"
                    r"|\s(?P<cur2>dollars?|euros?|yuan))(?![A-Za-z])"
                ),
                lambda m: self._amount(
                    m["num"],
                    CURRENCIES[m["cur"] or m["cur2"]],
                    m["scale"],
                    negative=bool(m["neg"]),
                ),
                needs=DIGITS,
            ),
            Rule(
                compile_rule(
                    rf"{BEFORE}(?P<neg>-(?=\d))?(?P<num>\d+)\s(?P<cur>cents?|pence|penny)\b",
                    re.IGNORECASE,
                ),
                minor_money,
                needs=DIGITS,
            ),
            Rule(
                compile_rule(
                    rf"{BEFORE}(?P<neg>-(?=\d))?(?P<num>{NUM})(?:\s?-\s?(?P<num2>{NUM}))?\s?%"
                ),
                percent,
                needs=DIGITS,
            ),
            Rule(
                compile_rule(
                    rf"{BEFORE}(?P<num>\d{{1,3}}(?:,\d{{3}})+|\d+)(?:st|nd|rd|th|ST|ND|RD|TH){AFTER}"
                ),
                ordinal_,
                needs=DIGITS,
            ),
            Rule(
                compile_rule(
                    rf"{BEFORE}(?P<neg>-(?=\d))?(?P<num>{NUM})(?:\s?-\s?(?P<num2>{NUM}))?"
                    rf"(?P<sp>\s?){_UNIT}(?![A-Za-z0-9_])"
                ),
                unit,
                needs=DIGITS,
            ),
            Rule(
                compile_rule(
                    rf"\b(?:{'|'.join(CODE_KEYWORDS)})\b\.?"
                    rf"(?:\s*(?:{_CODE_FILLER})(?![A-Za-z]))*\s*:?\s*#?\s*"
                    r"(?P<d>\d+(?:[ -]\d{2,})*)(?![\w%]|[.,:/]\d)",
                    re.IGNORECASE,
                ),
                code,
                needs=DIGITS,
            ),
            Rule(
                compile_rule(r"(?<![A-Za-z0-9_*#])(?=[0-9*#]*[*#])[0-9*#]+(?![A-Za-z0-9_*#])"),
                keys,
                needs="*#",
            ),
            Rule(
                compile_rule(
                    rf"{BEFORE}(?P<a>(?:19|20)\d\d)\s?-\s?(?P<b>(?:19|20)\d\d){AFTER}(?![.,]\d)"
                ),
                year_range,
                needs=DIGITS,
            ),
            Rule(
                compile_rule(rf"{BEFORE}(?P<a>{NUM})-(?P<b>{NUM})(?![A-Za-z0-9_-])"),
                number_range,
                needs=DIGITS,
            ),
            Rule(
                compile_rule(
                    r"\b(?P<p>in|since|until|till|before|after|during|year|circa|from|by)"
                    rf"\s(?P<y>(?:19|20)\d\d){AFTER}(?![.,]\d)",
                    re.IGNORECASE,
                ),
                year_in_context,
                needs=DIGITS,
            ),
            Rule(
                compile_rule(rf"{BEFORE}24/7{AFTER}"), lambda m: "twenty-four seven", needs=DIGITS
            ),
            Rule(compile_rule(rf"{BEFORE}\d+(?:\.\d+){{2,}}{AFTER}(?!\.\d)"), dotted, needs=DIGITS),
            Rule(
                compile_rule(rf"{BEFORE}(?P<neg>-(?=\d))?(?P<num>{NUM}){AFTER}"),
                number,
                needs=DIGITS,
            ),
            # Before the abbreviations: "AT&T Dr" must read its neighbour as "T" in the
            # first pass already (Drive), as a second pass would (idempotence).
            Rule(compile_rule(r"\s*&\s*"), lambda m: " and ", needs="&"),
            Rule(
                compile_rule(
                    r"(?<![A-Za-z.])(?P<abbr>Mrs\.?|Mr\.?|Ms\.?|Prof\.?|Jr\.|Sr\.|Mt\.|Dept\."
                    r"|Inc\.|Ltd\.|[Aa]pprox\.?|[Ee]\.g\.|[Ii]\.e\.|etc\.|vs\.?|Apt\.?|Ave\.?"
                    r"|Blvd\.?|[Ee]xt\.|Tel\.|hrs\.?)(?![A-Za-z])"
                ),
                abbreviation,
            ),
            Rule(
                compile_rule(r"(?<![A-Za-z.])(?P<abbr>Dr|St)(?P<dot>\.)?(?![A-Za-z])"),
                dr_st,
                needs="DS",
            ),
            Rule(compile_rule(r"\s*@\s*"), lambda m: " at ", needs="@"),
        ]
