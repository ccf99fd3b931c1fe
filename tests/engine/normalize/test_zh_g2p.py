"""The pieces a Mandarin G2P gets (engine.normalize.zh_g2p), and misaki's ZHG2P on them."""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.normalize import spoken
from engine.normalize.zh_g2p import (
    LETTER_NAMES,
    PUNCTUATION,
    Piece,
    mandarin_only,
    pieces,
    spell,
)
from tests.engine.normalize.test_zh_ivr import IVR

_HAN = re.compile(r"[\u3007\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_LATIN_PIECE = re.compile(r"[A-Za-z]+(?:['-][A-Za-z]+)*(?: [A-Za-z]+(?:['-][A-Za-z]+)*)*")


def _mandarin_ok(text: str) -> bool:
    return all(_HAN.match(ch) or ch in PUNCTUATION or ch == " " for ch in text)


def _assert_contract(found: list[Piece]) -> None:
    for piece in found:
        assert piece.text == piece.text.strip() and piece.text, piece
        assert "  " not in piece.text, piece
        if piece.latin:
            assert _LATIN_PIECE.fullmatch(piece.text), piece
        else:
            assert _mandarin_ok(piece.text), piece
    for before, after in itertools.pairwise(found):
        assert before.latin != after.latin, found


PIECES = [
    (
        "欢迎使用iPhone和iPad，VIP客户请按1。",
        [
            Piece("欢迎使用", False),
            Piece("iPhone", True),
            Piece("和", False),
            Piece("iPad", True),
            Piece("，", False),
            Piece("V I P", True),
            Piece("客户请按一。", False),
        ],
    ),
    ("4G网络", [Piece("四", False), Piece("G", True), Piece("网络", False)]),
    ("PM2.5超标", [Piece("PM", True), Piece("二点五超标", False)]),
    ("Win10系统", [Piece("Win", True), Piece("十系统", False)]),
    (
        "您的订单SF1234567890已发货",
        [
            Piece("您的订单", False),
            Piece("S F", True),
            Piece("一二三四, 五六七, 八九零已发货", False),
        ],
    ),
    ("café很好", [Piece("cafe", True), Piece("很好", False)]),
    ("按*键返回，按#号键确认。", [Piece("按星号键返回，按井号键确认。", False)]),
    ("Wi-Fi密码", [Piece("Wi-Fi", True), Piece("密码", False)]),
    ("A/B测试", [Piece("A", True), Piece(",", False), Piece("B", True), Piece("测试", False)]),
    ("🙂您好★", [Piece("您好", False)]),
]


@pytest.mark.parametrize(("text", "expected"), PIECES)
def test_pieces(text: str, expected: list[Piece]) -> None:
    found = pieces(spoken(text, "zh-CN"))
    assert found == expected
    _assert_contract(found)


def test_leftover_symbols_are_named_not_dropped() -> None:
    # What spoken() leaves (a symbol outside a number) is named for the G2P.
    assert pieces("满意请按%") == [Piece("满意请按百分号", False)]
    assert pieces("A+B") == [Piece("A", True), Piece("加", False), Piece("B", True)]


def test_spell_uses_every_letter() -> None:
    assert spell("VIP") == "维艾批"
    assert spell("app") == "诶批批"
    assert set(LETTER_NAMES) == set("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    assert all(_HAN.fullmatch(ch) for name in LETTER_NAMES.values() for ch in name)


@pytest.mark.parametrize(("text", "said"), IVR)
def test_mandarin_only_holds_only_what_the_g2p_reads(text: str, said: str) -> None:
    out = mandarin_only(spoken(text, "zh-CN"))
    assert _mandarin_ok(out), out
    assert _HAN.search(out)


def test_mandarin_only_spells_latin_words() -> None:
    assert mandarin_only(spoken("VIP客户请下载APP", "zh-CN")) == "维 艾 批 客户请下载 诶 批 批"
    assert mandarin_only("iPhone") == "艾批艾尺欧恩伊"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_pieces_contract_on_arbitrary_text(text: str) -> None:
    said = spoken(text, "zh-CN")
    _assert_contract(pieces(said))
    assert _mandarin_ok(mandarin_only(said))


_SOUP = list("0123456789 .,:-/+#*$¥%&@°年月日号点第元个按键AaBbZz，。：（）％＃＊１２")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(_SOUP), max_size=40))
def test_pieces_contract_on_digit_and_symbol_soup(text: str) -> None:
    said = spoken(text, "zh-CN")
    found = pieces(said)
    _assert_contract(found)
    # every letter of the spoken text reaches a Latin piece; every Han character a
    # Mandarin piece, in order (symbols and digits add characters between them)
    letters = "".join(ch for ch in said if ch.isascii() and ch.isalpha())
    latin = "".join(p.text for p in found if p.latin)
    assert "".join(ch for ch in latin if ch.isalpha()) == letters
    mandarin = iter("".join(p.text for p in found if not p.latin))
    assert all(ch in mandarin for ch in _HAN.findall(said))


# ------------------------------------------------- through misaki's Mandarin G2P

_HAS_MISAKI = importlib.util.find_spec("misaki") is not None and (
    importlib.util.find_spec("pypinyin") is not None
)

G2P_SENTENCES = [
    "客服热线400-820-8820，请拨打+86 138 0013 8000。",
    "您的订单SF1234567890已发货，金额¥23.05。",
    "VIP客户请下载APP，或使用iPhone拨打95511。",
    "您的验证码为831102，5分钟内有效，请勿泄露。",
    "本月账单2026-12-05到期，利率3.85%，最低还款-23.05元。",
    "重听请按*，返回请按#，转人工请按0。",
    "服务时间：周一至周五９：００-１８：００（法定节假日除外）。",
]


@pytest.mark.skipif(
    not _HAS_MISAKI, reason="misaki[zh] is not installed (pip install 'misaki[zh]')"
)
@pytest.mark.parametrize("text", G2P_SENTENCES)
def test_misaki_reads_every_character(text: str) -> None:
    """Every Han character the normalizer emits gets a syllable from misaki's ZHG2P (the
    Kokoro-82M v1.0 Mandarin front end, ``version=None``), and no digit, Latin letter or
    symbol reaches it (it would be read by cn2an, passed through, or dropped)."""
    from pypinyin import Style, lazy_pinyin

    # misaki has no type information: imported by name, so mypy sees Any
    g2p = importlib.import_module("misaki.zh").ZHG2P()
    said = spoken(text, "zh-CN")
    for piece in pieces(said):
        if piece.latin:
            continue
        assert not re.search(r"[0-9A-Za-z#*%&@+=/$¥°~]", piece.text), piece
        phonemes, _ = g2p(piece.text)
        assert not re.search(r"[0-9A-Z#*%&@+=/$¥°~❓]", phonemes), (piece, phonemes)
        # one tone mark per syllable that pypinyin gives a tone (1-4), as misaki does
        syllables = lazy_pinyin(
            "".join(_HAN.findall(piece.text)), style=Style.TONE3, neutral_tone_with_five=True
        )
        assert len(syllables) == len(_HAN.findall(piece.text))
        assert all(re.fullmatch(r"[a-zü]+[1-5]", s) for s in syllables), syllables
        toned = sum(1 for s in syllables if not s.endswith("5"))
        assert sum(phonemes.count(mark) for mark in "→↗↓↘") == toned, (piece, phonemes)
    spelled, _ = g2p(mandarin_only(said))
    assert not re.search(r"[0-9A-Z#*%&@+=/$¥°~❓]", spelled), spelled
