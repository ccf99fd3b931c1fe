"""Chinese rules (Mandarin and Cantonese): written text to its spoken form.

Conventions, one by one: :mod:`engine.normalize` ("Conventions, Chinese"). Chinese
numerals come from ``cn2an`` (imported on first use: it takes about 0.15 s to import).

What comes out (the contract a backend relies on, Mandarin IVR first):

- Digits and the symbols around them become Han characters: amounts (元/角/分), dates,
  times, percentages, decimals, ordinals, ranges, units, phone numbers and codes, keys
  ("#" 井号, "*" 星号), "&" 和, "@" 艾特, "7*24小时" 七乘二十四小时. Full-width digits,
  letters and symbols are read as their ASCII forms (:func:`fold_width`: "１２：３０",
  "％", "＃", "＊", "￥"); full-width punctuation (，。！？：；（）、) is kept as written.
- The rule for 幺: 1 is 幺 in telephone numbers (after a phone keyword such as 电话,
  热线, 拨打, 致电, 客服, 分机, or phone-shaped: mobiles 1[3-9]xxxxxxxxx, "+86 ...",
  "010-12345678", "(010)12345678", "400-820-8820", "400 820 8820"); in every other code
  (账号, 卡号, 尾号, 验证码, 密码, 订单号, letter codes, 5+ digit runs) 1 is 一, the
  written form that banks' and shops' prompts use. Cantonese (yue, zh-HK) never says 幺.
- Latin letters stay Latin, for the voice's English (espeak-ng reads them in English;
  a Mandarin G2P gets them through :mod:`engine.normalize.zh_g2p`): acronyms of 2-6
  capitals alone are spaced letter by letter, as they are said in Mandarin ("VIP" ->
  "V I P", "APP" -> "A P P", "ATM机" -> "A T M机"); 1-4 capitals before 3 or more digits
  are an order or parcel number: letters one by one, then the digits as a code
  ("A12345" -> "A 一二三, 四五", "SF1234567890" -> "S F 一二三四, 五六七, 八九零");
  words with lowercase letters ("iPhone", "WiFi", "Hello") are left as written, and so
  are digits glued to letters otherwise ("4G", "MP3", "G20", "PM2.5", "Win10").
- Digit groups read one by one are separated by ", " (a short pause).

Not covered (read as written, or by the general number rules): fractions ("1/2" is a
date, 一月二日; "24/7"), month/day with "-" ("12-05" is a range), dates and times in
words or other calendars, Roman numerals, URLs (e-mail addresses only), model numbers
with lowercase letters or digits first ("iPhone15", "3D"), 幺 in flight, bus or room
numbers, the ID-card grouping 6-8-4 (an 18-digit ID is grouped 4-4-4-3-3), measure words
other than those in :data:`LIANG_BEFORE` for 两, polyphonic characters (the G2P's job),
traditional-only readings, and English words spelled in the Mandarin voice (the G2P
helper's fallback, :func:`engine.normalize.zh_g2p.mandarin_only`, spells them; a brand
such as "iPhone" then sounds letter by letter).
"""

from __future__ import annotations

import functools
import re
from typing import Any

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
    compile_rule,
    digit_groups,
    plain_digits,
    split_groups,
)

ZH_DIGITS = "零一二三四五六七八九"

# Keywords after which digits are a phone number (1 read 幺) or another code (1 read 一).
PHONE_KEYWORDS = (
    "联系电话",
    "联系方式",
    "电话",
    "手机",
    "热线",
    "拨打",
    "致电",
    "来电",
    "呼叫",
    "分机",
    "座机",
    "传真",
    "客服",
)
CODE_KEYWORDS = (
    "身份证号",
    "快递单号",
    "运单号",
    "订单号",
    "流水号",
    "会员号",
    "工单号",
    "房间号",
    "验证码",
    "校验码",
    "动态码",
    "号码",
    "账号",
    "账户",
    "帐号",
    "帐户",
    "卡号",
    "尾号",
    "订单",
    "单号",
    "密码",
    "编号",
    "工号",
    "票号",
    "房号",
    "邮编",
)
_FILLER = r"(?:号码|号|是|为|:|：|\s)*"
# Country calling codes recognized in a "+" number written without separators
# ("+8613800138000"), longest first.
_CALLING_CODES = ("852", "853", "886", "86", "1")
_MOBILE = re.compile(r"1[3-9]\d{9}")

# "2" is read 两 before these (两个, 两点, 两元); 二 elsewhere (二月, 第二, 二零二六).
LIANG_BEFORE = (
    "个位次件张台份种条项本天周年岁瓶杯块元角分毛名人家辆只双套间倍小时点斤公斤公里千万亿"
)
# A digit run of 5 or more before one of these is a quantity (12345人), not a code.
_QUANTITY_BEFORE = LIANG_BEFORE + "月日号所户笔层米克升美港欧英"

UNITS = {
    "kg": "公斤",
    "g": "克",
    "mg": "毫克",
    "km": "公里",
    "m": "米",
    "cm": "厘米",
    "mm": "毫米",
    "km/h": "公里每小时",
    "L": "升",
    "ml": "毫升",
    "mL": "毫升",
    "KB": "K",
    "kB": "K",
    "MB": "兆",
    "GB": "G",
    "TB": "T",
    "min": "分钟",
    "mins": "分钟",
    "h": "小时",
    "hr": "小时",
    "hrs": "小时",
    "s": "秒",
    "sec": "秒",
    "ms": "毫秒",
    "°C": "摄氏度",
    "°F": "华氏度",
    "°": "度",
}
_LIANG_UNITS = frozenset(
    {"公斤", "公里", "米", "克", "升", "小时", "分钟", "秒", "K", "G", "T", "兆"}
)
_UNIT = "(?P<unit>" + "|".join(re.escape(u) for u in sorted(UNITS, key=len, reverse=True)) + ")"

_CURRENCY_WORDS = {
    "$": "美元",
    "US$": "美元",
    "USD": "美元",
    "HK$": "港元",
    "HKD": "港元",
    "€": "欧元",
    "EUR": "欧元",
    "£": "英镑",
    "GBP": "英镑",
    "JPY": "日元",
    "¥": "元",
    "RMB": "元",
    "CNY": "元",
}
_AMPM = AMPM
_TIME_ANY = TIME_ANY
_DAYS_IN_MONTH = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


_PARTS_OF_DAY = ("上午", "下午", "早上", "晚上", "中午", "凌晨", "傍晚", "夜里")


def _part_of_day(m: re.Match[str]) -> bool:
    return m.string[: m.start()].rstrip().endswith(_PARTS_OF_DAY)


# Full-width forms folded to ASCII before the rules run (NFKC would do it, but callers of
# :func:`engine.normalize.spoken` need not have applied it): digits, letters and the
# symbols the rules read. Full-width punctuation (，。！？：；（）、) is kept: it is a pause
# that every Chinese front end reads, and the G2P maps it itself.
_FULL_WIDTH = {chr(0xFF10 + i): str(i) for i in range(10)}
_FULL_WIDTH.update({chr(0xFF21 + i): chr(0x41 + i) for i in range(26)})
_FULL_WIDTH.update({chr(0xFF41 + i): chr(0x61 + i) for i in range(26)})
_FULL_WIDTH.update(
    {
        "％": "%",
        "＃": "#",
        "＊": "*",
        "＄": "$",
        "￥": "¥",
        "＆": "&",
        "＠": "@",
        "＋": "+",
        "－": "-",
        "−": "-",  # U+2212 MINUS SIGN
        "／": "/",
        "＝": "=",
        "×": "乘",  # "7×24小时": 七乘二十四小时
    }
)
_FULL_WIDTH_RE = re.compile("[" + "".join(_FULL_WIDTH) + "]")
# Punctuation that is part of a number when it stands between digits ("１２：３０",
# "１２．５", "３～５"): folded only there. Not "，": between digits it is a pause
# ("验证码831102，5分钟内有效"), never a thousands separator.
_BETWEEN_DIGITS = re.compile(r"(?<=[0-9０-９])(?P<p>[：．～〜])(?=[0-9０-９])")
_BETWEEN_DIGITS_ASCII = {"：": ":", "．": ".", "～": "~", "〜": "~"}


def fold_width(text: str) -> str:
    """Full-width digits, letters and symbols as ASCII ("１２３" -> 123, "％" -> %,
    "＃" -> #, "×" -> 乘), and ":" "." "~" between digits ("１２：３０" -> 12:30); full-width
    punctuation elsewhere is kept."""
    if text.isascii():
        return text
    text = _BETWEEN_DIGITS.sub(lambda m: _BETWEEN_DIGITS_ASCII[m["p"]], text)
    return _FULL_WIDTH_RE.sub(lambda m: _FULL_WIDTH[m.group(0)], text)


@functools.cache
def _cn2an() -> Any:
    import cn2an

    return cn2an


@functools.lru_cache(maxsize=4096)
def integer(whole: str) -> str:
    """Digits as a Chinese numeral: "234" -> 二百三十四, "10" -> 十, "2000" -> 两千."""
    if len(whole.lstrip("0")) > MAX_CARDINAL_DIGITS:
        return digits(whole)
    words = str(_cn2an().an2cn(whole.lstrip("0") or "0", "low"))
    if words[:2] in ("二千", "二万", "二亿"):
        words = "两" + words[1:]
    return words


def digits(run: str, *, yao: bool = False) -> str:
    """Digits one by one: "0042" -> 零零四二; ``yao``: 1 is 幺 (phone numbers)."""
    out = "".join(ZH_DIGITS[int(d)] for d in run if d.isdigit())
    return out.replace("一", "幺") if yao else out


def grouped_digits(written: str, *, yao: bool = False) -> str:
    return ", ".join(digits(group, yao=yao) for group in digit_groups(written))


def number(written: str, *, negative: bool = False, before: str = "") -> str:
    """A quantity: "1,234" -> 一千二百三十四, "2.5" -> 二点五, "-5" -> 负五; exactly 2
    before a measure word (``before``: the text that follows) is 两."""
    whole, _, fraction = plain_digits(written).partition(".")
    words = integer(whole or "0")
    if fraction:
        words += "点" + digits(fraction)
    elif words == "二" and before[:1] and before[0] in LIANG_BEFORE and before[:2] != "年级":
        words = "两"
    return ("负" + words) if negative else words


class Chinese:
    """The Chinese rules; ``cantonese``: zh-HK / yue conventions (no 幺, "$" is 元)."""

    def __init__(self, *, cantonese: bool) -> None:
        self.cantonese = cantonese
        self._rules = self._build_rules()

    def spoken(self, text: str) -> str:
        return apply_rules(fold_width(text), self._rules)

    def _phone_digits(self, written: str, sizes: list[int] | None = None) -> str:
        yao = not self.cantonese
        if sizes is not None:
            groups = split_groups(plain_digits(written), sizes)
            return ", ".join(digits(g, yao=yao) for g in groups)
        return grouped_digits(written, yao=yao)

    def _date(self, y: str | None, month: int, day: int) -> str | None:
        if not (1 <= month <= 12 and 1 <= day <= _DAYS_IN_MONTH[month - 1]):
            return None
        out = f"{digits(y)}年" if y else ""
        return out + f"{integer(str(month))}月{integer(str(day))}日"

    def _time(
        self, hour: int, minute: int, second: int | None, ampm: str | None, said_before: bool
    ) -> str:
        """``said_before``: the text already says the part of the day (上午9am)."""
        prefix = ""
        if ampm and hour <= 12 and not said_before:
            prefix = "上午" if ampm[0] in "Aa" else "下午"
        words = prefix + ("两" if hour == 2 else integer(str(hour))) + "点"
        if minute:
            words += ("零" if minute < 10 else "") + integer(str(minute)) + "分"
        if second:
            words += ("零" if second < 10 else "") + integer(str(second)) + "秒"
        return words

    def _yuan(self, written: str, scale: str | None, *, negative: bool) -> str:
        whole, _, fraction = plain_digits(written).partition(".")
        if scale or len(fraction) > 2 or len(whole) > MAX_CARDINAL_DIGITS:
            words = number(written) + (scale or "") + "元"
        else:
            units = int(whole or "0")
            jiao, fen = (int(d) for d in fraction.ljust(2, "0"))
            words = number(whole, before="元") + "元" if units or not (jiao or fen) else ""
            if jiao:
                words += ("两" if jiao == 2 else ZH_DIGITS[jiao]) + "角"
            elif fen and units:
                words += "零"
            if fen:
                words += ("两" if fen == 2 else ZH_DIGITS[fen]) + "分"
        return ("负" + words) if negative else words

    def _currency(self, written: str, key: str, scale: str | None, *, negative: bool) -> str:
        word = _CURRENCY_WORDS[key]
        if word == "元" or (key == "$" and self.cantonese):
            return self._yuan(written, scale, negative=negative)
        whole, _, fraction = plain_digits(written).partition(".")
        fraction = fraction.rstrip("0")
        amount = whole + ("." + fraction if fraction else "")
        return number(amount, negative=negative, before="元") + (scale or "") + word

    def _build_rules(self) -> list[Rule]:
        def email(m: re.Match[str]) -> str:
            return f"{m['local'].replace('.', '点')}艾特{m['domain'].replace('.', '点')}"

        def time_range(m: re.Match[str]) -> str | None:
            timeish = re.compile(r":|[AaPp]\.?\s?[Mm]")
            if not (timeish.search(m["a"]) or timeish.search(m["b"])):
                return None
            return f"{m['a']}到{m['b']}"

        def ymd(m: re.Match[str]) -> str | None:
            return self._date(m["y"], int(m["m"]), int(m["d"]))

        def mdy(m: re.Match[str]) -> str | None:
            month, day = int(m["a"]), int(m["b"])
            if not 1 <= month <= 12:
                month, day = day, month
            return self._date(m["y"], month, day)

        def month_day(m: re.Match[str]) -> str | None:
            return self._date(None, int(m["m"]), int(m["d"]))

        def year(m: re.Match[str]) -> str:
            return digits(m["y"]) + "年"

        def year_range(m: re.Match[str]) -> str:
            return f"{digits(m['a'])}年到{digits(m['b'])}年"

        def clock(m: re.Match[str]) -> str:
            second = int(m["s"]) if m["s"] else None
            return self._time(int(m["h"]), int(m["mi"]), second, m["ampm"], _part_of_day(m))

        def hour_ampm(m: re.Match[str]) -> str:
            return self._time(int(m["h"]), 0, None, m["ampm"], _part_of_day(m))

        def phone_international(m: re.Match[str]) -> str:
            groups = re.findall(r"\d+", m.group(0))
            yao = not self.cantonese
            if len(groups) == 1:  # "+8613800138000": the country code, then the number
                code = next((c for c in _CALLING_CODES if groups[0].startswith(c)), "")
                if code:
                    groups = [code, groups[0][len(code) :]]
            if len(groups) == 2 and _MOBILE.fullmatch(groups[1]):
                mobile_groups = split_groups(groups[1], [3, 4, 4])
                rest = [digits(g, yao=yao) for g in mobile_groups]
                return ", ".join(["加" + digits(groups[0], yao=yao), *rest])
            rest = [self._phone_digits(g) for g in groups[1:]]
            return ", ".join(["加" + digits(groups[0], yao=yao), *rest])

        def mobile(m: re.Match[str]) -> str:
            return self._phone_digits(m.group(0), [3, 4, 4])

        def phone(m: re.Match[str]) -> str:
            return self._phone_digits(m.group(0))

        def dash_groups(m: re.Match[str]) -> str | None:
            groups = m.group(0).split("-")
            if len(groups) == 2 and sum(len(g) for g in groups) < 7:
                return None
            return grouped_digits(m.group(0))

        def code(m: re.Match[str]) -> str:
            head = m.string[m.start() : m.start("d")]
            groups = re.findall(r"\d+", m["d"])
            if len(groups) > 2 and all(len(g) == 1 for g in groups):
                groups = ["".join(groups)]  # spelled out with spaces: "8 3 1 1 0 2"
            phone_context = m["kw"] in PHONE_KEYWORDS
            if len(groups) == 1 and len(groups[0]) <= 2 and not groups[0].startswith("0"):
                return head + integer(groups[0])
            if phone_context:
                return head + ", ".join(self._phone_digits(g) for g in groups)
            return head + ", ".join(grouped_digits(g) for g in groups)

        def letter_code(m: re.Match[str]) -> str:
            return " ".join(m["letters"]) + " " + grouped_digits(m["d"])

        def acronym(m: re.Match[str]) -> str:
            return " ".join(m.group(0))

        def times(m: re.Match[str]) -> str:
            return number(m["a"]) + "乘" + number(m["b"])

        def money_suffix(m: re.Match[str]) -> str:
            negative = bool(m["neg"])
            if m["cur"] == "元":
                return self._yuan(m["num"], m["scale"], negative=negative)
            return self._currency(m["num"], m["cur"], m["scale"], negative=negative)

        def percent(m: re.Match[str]) -> str:
            words = "百分之" + number(m["num"])
            if m["num2"]:
                words += "到百分之" + number(m["num2"])
            return ("负" + words) if m["neg"] else words

        def ordinal(m: re.Match[str]) -> str:
            return "第" + number(m["num"])

        def unit(m: re.Match[str]) -> str:
            word = UNITS[m["unit"]]
            before = "个" if word in _LIANG_UNITS else ""
            amount = number(m["num"], before=before)
            if m["num2"]:
                amount = number(m["num"]) + "到" + number(m["num2"], before=before)
            if m["neg"]:
                amount = ("零下" if word.endswith("度") else "负") + amount
            return amount + word

        def keys(m: re.Match[str]) -> str:
            written = m.group(0)
            number_sign = re.fullmatch(r"#(\d+)", written)
            if number_sign:
                return integer(number_sign.group(1)) + "号"
            # "#号键" is already "the # key": the sign alone is 井 (星 for "*").
            names = {"*": "星号", "#": "井号"}
            if m.string[m.end() : m.end() + 1] == "号":
                names = {"*": "星", "#": "井"}
            return "".join(names.get(ch) or ZH_DIGITS[int(ch)] for ch in written)

        def number_range(m: re.Match[str]) -> str | None:
            a, b = m["a"], m["b"]
            if any(len(plain_digits(x).partition(".")[0]) > 4 for x in (a, b)):
                return None
            after = m.string[m.end() : m.end() + 2].lstrip()
            return f"{number(a, before=after)}到{number(b, before=after)}"

        def dotted(m: re.Match[str]) -> str:
            return "点".join(
                integer(p) if len(p) <= 2 else digits(p) for p in m.group(0).split(".")
            )

        def plain(m: re.Match[str]) -> str:
            written = m["num"]
            whole, _, fraction = plain_digits(written).partition(".")
            negative = bool(m["neg"])
            after = m.string[m.end() : m.end() + 2].lstrip()
            long_run = len(whole) >= 5 and not (after[:1] and after[0] in _QUANTITY_BEFORE)
            if (
                "," not in written
                and not fraction
                and (long_run or (len(whole) >= 2 and whole[0] == "0"))
            ):
                return ("负" if negative else "") + grouped_digits(whole)
            return number(written, negative=negative, before=after)

        NUM = NUMBER
        kw_phone = "|".join(PHONE_KEYWORDS)
        kw_code = "|".join(CODE_KEYWORDS)
        currency_codes = "RMB|CNY|USD|EUR|GBP|HKD|JPY"
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
                    rf"(?<![\w:.-])(?P<a>{_TIME_ANY})\s?[-~]\s?(?P<b>{_TIME_ANY})(?![\w:]|\.\d)"
                ),
                time_range,
                needs=DIGITS,
            ),
            Rule(
                compile_rule(
                    r"(?<![\w./-])(?P<y>\d{4})(?P<sep>[-/.])(?P<m>\d{1,2})(?P=sep)(?P<d>\d{1,2})"
                    r"(?![\w]|[./-]\d)"
                ),
                ymd,
                needs=DIGITS,
            ),
            Rule(
                compile_rule(
                    r"(?<![\w./-])(?P<a>\d{1,2})/(?P<b>\d{1,2})/(?P<y>\d{4})(?![\w]|[./-]\d)"
                ),
                mdy,
                needs=DIGITS,
            ),
            Rule(
                compile_rule(r"(?<![\w./-])(?P<m>\d{1,2})/(?P<d>\d{1,2})(?![\w]|[./-]\d|/)"),
                month_day,
                needs="/",
            ),
            Rule(
                compile_rule(r"(?<![\w.])(?P<a>\d{4})\s?[-~]\s?(?P<b>\d{4})\s?年"),
                year_range,
                needs=DIGITS,
            ),
            Rule(compile_rule(r"(?<![\w.,])(?P<y>\d{4})\s?年(?!级)"), year, needs=DIGITS),
            Rule(
                compile_rule(CLOCK_24H),
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
            Rule(compile_rule(r"(?<![\w.-])1[3-9]\d{9}(?![\w]|[.-]\d)"), mobile, needs=DIGITS),
            Rule(
                compile_rule(
                    r"(?<![\w(+.-])(?:\(\d{3}\)\s?|\d{3}[ .-])\d{3}[ .-]\d{4}(?![\w]|[.-]\d)"
                    r"|(?<![\w.-])0\d{2,3}-\d{7,8}(?![\w]|[.-]\d)"
                    r"|(?<![\w(])\(0\d{2,3}\)\s?\d{7,8}(?![\w]|[.-]\d)"
                    r"|(?<![\w.-])\d{3}-\d{4}(?![\w]|[.-]\d)"
                    r"|(?<![\w.-])\d{3}-\d{4}-\d{4}(?![\w]|[.-]\d)"
                ),
                phone,
                needs=DIGITS,
            ),
            Rule(
                compile_rule(r"(?<![\w.-])\d{2,}(?:-\d{2,})+(?![\w]|[.-]\d)"),
                dash_groups,
                needs=DIGITS,
            ),
            Rule(
                compile_rule(
                    rf"(?P<kw>{kw_phone}|{kw_code}){_FILLER}(?P<d>\d+(?:[ -]\d+)*)"
                    r"(?![\w]|[.,:/]\d)"
                ),
                code,
                needs=DIGITS,
            ),
            Rule(
                compile_rule(
                    r"(?P<neg>(?<![A-Za-z0-9_])-)?(?P<cur>US\$|HK\$|\$|€|£|¥)\s?(?P<neg2>-)?"
                    rf"(?P<num>{NUM})(?P<scale>万|亿|千)?{AFTER}(?:\s?元)?"
                    rf"|\b(?P<cur2>{currency_codes})\s?(?P<neg3>-)?(?P<num2>{NUM})"
                    rf"(?P<scale2>万|亿|千)?{AFTER}(?:\s?元)?"
                ),
                lambda m: self._currency(
                    m["num"] or m["num2"],
                    m["cur"] or m["cur2"],
                    m["scale"] or m["scale2"],
                    negative=bool(m["neg"] or m["neg2"] or m["neg3"]),
                ),
                needs=DIGITS,
            ),
            Rule(
                compile_rule(
                    r"(?<![A-Za-z0-9_'.-])(?P<letters>[A-Z]{1,4})(?P<d>\d{3,})"
                    r"(?![A-Za-z0-9_]|[.,:/]\d)"
                ),
                letter_code,
                needs=DIGITS,
            ),
            Rule(
                compile_rule(rf"{BEFORE}(?P<a>\d{{1,2}})\s?[*xX]\s?(?P<b>\d{{1,2}})(?=\s?小时)"),
                times,
                needs=DIGITS,
            ),
            Rule(
                compile_rule(
                    rf"{BEFORE}(?P<neg>-(?=\d))?(?P<num>{NUM})(?P<scale>万|亿)?"
                    rf"\s?(?P<cur>元|{currency_codes})(?![A-Za-z])"
                ),
                money_suffix,
                needs=DIGITS,
            ),
            Rule(
                compile_rule(
                    rf"{BEFORE}(?P<neg>-(?=\d))?(?P<num>{NUM})"
                    rf"(?:%?\s?[-~]\s?(?P<num2>{NUM}))?\s?%"
                ),
                percent,
                needs=DIGITS,
            ),
            Rule(compile_rule(r"第\s?(?P<num>\d+)(?![\w]|[.,]\d)"), ordinal, needs=DIGITS),
            Rule(
                compile_rule(
                    rf"{BEFORE}(?P<neg>-(?=\d))?(?P<num>{NUM})(?:\s?[-~]\s?(?P<num2>{NUM}))?"
                    rf"\s?{_UNIT}(?![A-Za-z0-9_])"
                ),
                unit,
                needs=DIGITS,
            ),
            Rule(
                compile_rule(r"(?<![A-Za-z0-9_*#])(?=[0-9*#]*[*#])[0-9*#]+(?![A-Za-z0-9_*#])"),
                keys,
                needs="*#",
            ),
            Rule(
                compile_rule(rf"{BEFORE}(?P<a>{NUM})\s?[-~]\s?(?P<b>{NUM})(?![A-Za-z0-9_-])"),
                number_range,
                needs=DIGITS,
            ),
            Rule(compile_rule(rf"{BEFORE}\d+(?:\.\d+){{2,}}{AFTER}(?!\.\d)"), dotted, needs=DIGITS),
            Rule(
                compile_rule(rf"{BEFORE}(?P<neg>-(?=\d))?(?P<num>{NUM}){AFTER}"),
                plain,
                needs=DIGITS,
            ),
            Rule(compile_rule(r"\s*&\s*"), lambda m: "和", needs="&"),
            Rule(compile_rule(r"\s*@\s*"), lambda m: "艾特", needs="@"),
            Rule(
                compile_rule(r"(?<![A-Za-z0-9_'.-])[A-Z]{2,6}(?![A-Za-z0-9_']|\.[A-Za-z])"),
                acronym,
            ),
        ]
