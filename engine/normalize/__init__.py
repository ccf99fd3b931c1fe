"""IVR text normalization: written text to the words a voice should say.

:func:`spoken` turns digits, amounts, dates, times, codes, units, abbreviations and
symbols into words, the same for every backend (espeak-ng, and neural voices phonemized
by espeak-ng, which read "$120.50" as "dollar one hundred twenty point five zero"). It is
sans-I/O, deterministic and idempotent (``spoken(spoken(t)) == spoken(t)``: the rules
run again while a pass leaves digits or symbols behind, so the result is a fixed point);
text with nothing to expand comes back unchanged, and no input makes it raise. It only
replaces what it recognizes: whitespace and punctuation are the caller's business
(:func:`engine.text.normalize`, which the splitter runs before and after). The segment
splitter (:mod:`engine.text`) applies it to each segment it cuts;
:func:`engine.normalize.breaks.glued` tells it where a cut would change a reading.

Languages (BCP-47-ish tags, case and ``_``/``-`` insensitive; voice names such as
``en-us-f`` work too): ``en``, ``en-US`` and every other English -> American English;
``en-GB``, ``en-UK``, ``en-IE``, ``en-AU``, ``en-NZ``, ``en-ZA`` -> British English;
``zh``, ``zh-CN``, ``zh-TW``, ``zh-SG``, ``cmn`` -> Mandarin; ``yue``, ``zh-HK``,
``zh-MO``, ``zh-yue`` -> Cantonese. Any other language: the text is returned unchanged.

Libraries: ``num2words`` (English number words) and ``cn2an`` (Chinese numerals, imported
on first Chinese use), both pure Python, no data downloads. Cost: about 30 us for a
100-character English prompt without digits, 150-400 us with several amounts, dates and
codes; 20-150 us for a Chinese prompt (one CPU core, Python 3.11).

Conventions, English
====================

- Numbers: American style without "and" ("one hundred twenty"); British English keeps
  it ("one hundred and twenty"). Thousands separators "1,234" are read as one number;
  decimals digit by digit after "point" ("3.14": "three point one four"); a leading
  minus is "minus". Digits glued to letters ("word0", "4G", "MP3") are left alone.
- Zero is "zero" everywhere digits are read one by one (codes, phone numbers); "oh" only
  in clock minutes ("9:05": "nine oh five") and in years from num2words ("1905":
  "nineteen oh five").
- Codes read digit by digit, in groups with a pause (", ") between: up to 4 digits one
  group; longer runs the fewest groups of at most 4, longer groups first (5: 3+2,
  8: 4+4, 10: 4+3+3). Digits are a code when they follow a keyword (number, no., #,
  account, order, reference, ref, confirmation, booking, ticket, case, claim, invoice,
  policy, member, customer, tracking, card, PIN, code, passcode, OTP, ID, zip, phone,
  call, dial, text, extension, ext, flight, room, ...; "is", ":", "ending in" may come
  between), except 1-2 digits without a leading zero ("room 12": "room twelve"); when
  they are phone-shaped ("+1 (555) 123-4567": "plus one, five five five, one two three,
  four five six seven"; "555-0100"; "(555) 123-4567"; "555.123.4567"); dash-grouped
  (3 groups or more, or 7 digits or more: "1234-5678"); 5 digits or more without
  separators ("12345"); or have a leading zero ("0042").
- Amounts: "$120.50": "one hundred twenty dollars and fifty cents"; "$1": "one dollar";
  "$0.50": "fifty cents"; "-$5": "minus five dollars"; "$1.5 million", "$2k", "$3bn";
  "€" euros and cents, "£" pounds and pence, "¥" yen (no minor unit), "USD 20", "20 USD",
  "RMB 100" / "100元" yuan, "HK$", "C$", "A$"; "3.50 dollars" is read as an amount too.
  More than two decimals: "one point two three four dollars".
- Percentages: "15%": "fifteen percent"; "10-15%": "ten to fifteen percent".
- Ordinals: "1st", "22nd", "101st": "first", "twenty-second", "one hundred first".
- Dates: ISO "2026-12-03" and "12/03/2026": month first in American English ("December
  third, twenty twenty-six"; "12/03" is month/day), day first in British English ("the
  third of December twenty twenty-six"; "12/03" is day/month); a date impossible in the
  locale's order but valid the other way round is read the other way round. "Dec 3",
  "December 3rd, 2026": "December third, twenty twenty-six"; "3 December 2026": "the third
  of December twenty twenty-six"; "December 2026"; years as years ("twenty twenty-six")
  in dates and after in/since/until/before/after/during/from/by/year; elsewhere a 4-digit
  number is a number.
- Times: "9:30": "nine thirty"; "9:05": "nine oh five"; "9:00": "nine o'clock"; "9:30 am",
  "9.30pm", "9am", "9 a.m.": "nine thirty AM", "nine AM" ("AM"/"PM" in capitals: espeak-ng spells
  them, where "a m" would be read "uh em"); a 24-hour time is read on the 12-hour clock:
  "14:05": "two oh five PM", "0:30": "twelve thirty AM". "9am-5pm": "nine AM to five PM";
  "Mon-Fri": "Monday to Friday".
- Units after a number (a small table): "5 kg": "five kilograms" ("1 kg": "one
  kilogram"), km, m, cm, mm, g, mg, lb, oz, mi, ft, km/h, mph, L, ml, KB, MB, GB, TB,
  Mbps, kWh, min, h, hr(s), s, sec, ms, "°C" "degrees Celsius", "°F", "°"; British
  spelling "metre", "litre". "s" and "l" need a space ("5s" may be a plural).
- Abbreviations: Mr. Mister, Mrs. Missus, Ms. Miz, Prof., Jr., Sr., Mt., Dept., Inc.,
  Ltd., approx. approximately, e.g. "for example", i.e. "that is", etc. "et cetera", vs.
  versus, Apt apartment, Ave avenue, Blvd, ext., Tel., hrs hours; "No." before a number
  is "number". "Dr." is "Doctor" before a capitalized word, "Drive" after one (otherwise
  Doctor). "St." is "Street" after an ordinal ("5th St."), "Saint" before a capitalized
  word ("St. Mary's"), "Street" after a number or a capitalized word ("42 St.", "Main
  St.") or otherwise. Titles without a period ("Mr Smith") only before a capitalized
  word. An abbreviation's period at the end of the text is kept (it ends the sentence),
  and so is that of "etc." and "approx." before a capitalized word; "a.m." keeps it at the
  end only ("8 p.m. Eastern Time" is one sentence).
- Symbols: "#" alone or in key sequences is "pound" ("hash" in British English); "#5":
  "number five"; "*": "star" ("*72": "star seven two"); "&": "and"; "@": "at"; e-mail
  addresses and common domains: "me at example dot com"; "24/7": "twenty-four seven".
  A "*" is only kept as a key by :func:`engine.text.normalize` next to a digit or "#",
  after press/dial/enter/hit/push/tap/select (and "the"), before key/button/sign, after
  按 or before 号/键; elsewhere it is decoration and removed.
- Not handled: dates without a year in digits ("12/25"), fractions ("1/2"), Roman
  numerals, URLs beyond common domains, letters spelled out ("ABC" is left to the voice).

Conventions, Chinese
====================

- Quantities as Chinese numerals (cn2an): "234": 二百三十四, "1,234": 一千二百三十四,
  "2.5": 二点五, "-5": 负五, "10": 十; 2 before a measure word is 两 (两个, 两点, 两元,
  两小时) and 2000 is 两千 (also 两万, 两亿); elsewhere 二 (二月, 第二).
- Codes digit by digit with 零 for 0 and the same grouping as English ("12345":
  一二三, 四五; a leading zero "0042": 零零四二). 1 is 幺 in phone numbers only: after a
  phone keyword (电话, 手机, 热线, 拨打, 致电, 来电, 呼叫, 分机, 座机, 传真, 客服) or
  phone-shaped (11-digit mobiles 1[3-9]xxxxxxxxx grouped 3-4-4, "+86 ...",
  "+8613800138000", "010-12345678", "(010)12345678", "400-123-4567", "400 820 8820");
  after other code keywords (号码, 账号, 卡号, 尾号, 订单号, 验证码, 密码, 编号, ...) 1 is
  一. Cantonese (yue, zh-HK) never uses 幺. A code spelled with spaces after a keyword
  ("验证码是 8 3 1 1 0 2") is read as one code (八三一, 一零二).
- Letters and digits: 1-4 capitals before 3 or more digits are an order or parcel
  number, the letters one by one, then the digits as a code ("A12345": "A 一二三, 四五";
  "SF1234567890": "S F 一二三四, 五六七, 八九零"). Acronyms (2-6 capitals alone) are
  spaced letter by letter as Mandarin speakers say them ("VIP": "V I P", "APP": "A P P");
  other Latin words ("iPhone", "WiFi") and digits glued to letters ("4G", "MP3") are left
  as written, for the voice's English. A Mandarin G2P that reads only Han characters
  gets the text through :mod:`engine.normalize.zh_g2p` (Mandarin and Latin pieces, or
  Latin spelled with Chinese letter names).
- A run of 5 digits or more is a code unless a measure word or currency follows
  ("12345人" is a quantity).
- Amounts: "¥120.50", "120.50元", "RMB 120.50": 一百二十元五角; "¥120.05": 一百二十元零五分;
  "¥2": 两元; other currencies as a decimal number and the currency ("$5.50": 五点五美元,
  "€3": 三欧元, "£5": 五英镑, "HK$" 港元, "JPY" 日元); in Cantonese "$" is 元.
- Percentages: "15%": 百分之十五; "百分之15": 百分之十五; "-3%": 负百分之三; "10%-20%":
  百分之十到百分之二十.
- Ordinals: "第1": 第一.
- Dates: "2026年12月3日" and "2026-12-03" (also "/" and "."): 二零二六年十二月三日 (the year
  digit by digit, month and day as numbers); "12/03/2026" is month/day/year; "12/05"
  (a valid month and day) is 十二月五日.
- Times, on the 24-hour clock as written: "9:30": 九点三十分; "9:05": 九点零五分; "9:00":
  九点; "14:05": 十四点零五分; "2:00": 两点; "9am": 上午九点, "3pm": 下午三点;
  "7*24小时" (also "7×24"): 七乘二十四小时.
- Units: "5 kg": 五公斤, km 公里, m 米, min 分钟, h 小时, s 秒, "°C" 摄氏度 ("-5°C":
  零下五摄氏度); data sizes as said: "3GB": 三G, "500MB": 五百兆.
- Symbols: "#": 井号, "*": 星号, "#5": 五号, "&": 和, "@": 艾特; ranges "3-5": 三到五.
- Full-width digits, letters and symbols are read as ASCII ("１２：３０", "１００％", "＃",
  "＊", "￥", "－", and "−" U+2212); full-width punctuation (，。！？：；（）、) is kept.
- Simplified characters are used for Cantonese too (espeak-ng's yue voice reads both).
- Not covered: :mod:`engine.normalize.zh` lists it (fractions, "24/7", "12-05" as a date,
  幺 outside phone numbers, ...).
"""

from __future__ import annotations

import functools
import re

from engine.normalize.en import English
from engine.normalize.zh import Chinese

__all__ = ["language_family", "spoken"]

_BRITISH_REGIONS = frozenset({"gb", "uk", "ie", "au", "nz", "za"})
_CANTONESE_REGIONS = frozenset({"hk", "mo"})


@functools.lru_cache(maxsize=64)
def _rules(language: str) -> English | Chinese | None:
    tags = language.strip().lower().replace("_", "-").split("-")
    primary = tags[0]
    if primary == "en":
        return English(british=bool(_BRITISH_REGIONS.intersection(tags[1:])))
    if primary == "yue" or (primary == "zh" and ("yue" in tags or _CANTONESE_REGIONS & set(tags))):
        return Chinese(cantonese=True)
    if primary in ("zh", "cmn"):
        return Chinese(cantonese=False)
    return None


MULTILINGUAL = "mul"  # ISO 639-2 "multiple languages": a voice that reads several
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


def _rules_for(text: str, language: str) -> English | Chinese | None:
    """``language``'s rules; for ``mul`` (a multilingual voice such as CosyVoice2's)
    Chinese rules when the text has Han characters, else English."""
    if language.strip().lower() == MULTILINGUAL:
        return _rules("zh" if _HAN.search(text) else "en")
    return _rules(language)


def language_family(language: str) -> str:
    """``"en"``, ``"zh"`` (Mandarin and Cantonese), ``"mul"`` (chosen per text) or ``""``
    (passed through) for a tag."""
    if language.strip().lower() == MULTILINGUAL:
        return MULTILINGUAL
    rules = _rules(language)
    if isinstance(rules, English):
        return "en"
    if isinstance(rules, Chinese):
        return "zh"
    return ""


def spoken(text: str, language: str) -> str:
    """``text`` with numbers, amounts, dates, times, codes, units, abbreviations and
    symbols written out as words in ``language`` (see the module docstring).

    Unknown languages: ``text`` unchanged. Deterministic, idempotent, never raises.
    """
    rules = _rules_for(text, language)
    if rules is None:
        return text
    try:
        return rules.spoken(text)
    except Exception:  # a rule's bug must not silence a call: say the text as written
        return text
