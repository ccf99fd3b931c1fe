"""Chinese spoken forms (engine.normalize.spoken, zh-CN and yue/zh-HK): one row per case."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.normalize import language_family, spoken
from engine.normalize.zh import Chinese

MANDARIN = [
    # amounts and currencies
    ("¥100", "一百元"),
    ("100元", "一百元"),
    ("RMB 100", "一百元"),
    ("人民币100元", "人民币一百元"),
    ("¥120.50", "一百二十元五角"),
    ("¥120.05", "一百二十元零五分"),
    ("¥0.5", "五角"),
    ("¥2", "两元"),
    ("余额为¥1,234.56元", "余额为一千二百三十四元五角六分"),
    ("-¥5", "负五元"),
    ("$5", "五美元"),
    ("$5.50", "五点五美元"),
    ("€3.20", "三点二欧元"),
    ("£5", "五英镑"),
    ("USD 20", "二十美元"),
    ("2000元", "两千元"),
    ("1.5万元", "一点五万元"),
    # numbers
    ("234", "二百三十四"),
    ("1,234", "一千二百三十四"),
    ("2.5", "二点五"),
    ("3.14", "三点一四"),
    ("-5", "负五"),
    ("10", "十"),
    ("10010", "一零零, 一零"),
    ("共12345人", "共一万二千三百四十五人"),
    ("2个", "两个"),
    ("2月", "二月"),
    ("3-5个工作日", "三到五个工作日"),
    # ordinals
    ("第1", "第一"),
    ("第2名", "第二名"),
    # percentages
    ("15%", "百分之十五"),
    ("2.5%", "百分之二点五"),
    ("百分之15", "百分之十五"),
    ("-3%", "负百分之三"),
    # dates
    ("2026年12月3日", "二零二六年十二月三日"),
    ("2026-12-03", "二零二六年十二月三日"),
    ("2026/12/3", "二零二六年十二月三日"),
    ("12月3号", "十二月三号"),
    # times
    ("9:30", "九点三十分"),
    ("9:05", "九点零五分"),
    ("9:00", "九点"),
    ("14:05", "十四点零五分"),
    ("2:00", "两点"),
    ("下午2点", "下午两点"),
    ("9am", "上午九点"),
    ("上午9am", "上午九点"),
    ("9:00-17:00", "九点到十七点"),
    # phone numbers and codes
    ("手机号码13800138000", "手机号码幺三八, 零零幺三, 八零零零"),
    ("13800138000", "幺三八, 零零幺三, 八零零零"),
    ("请拨打010-12345678", "请拨打零幺零, 幺二三四, 五六七八"),
    ("客服热线400-123-4567", "客服热线四零零, 幺二三, 四五六七"),
    ("+86 138 0013 8000", "加八六, 幺三八, 零零幺三, 八零零零"),
    ("拨打95511", "拨打九五五, 幺幺"),
    ("验证码123456", "验证码一二三, 四五六"),
    ("您的验证码是：123456", "您的验证码是：一二三, 四五六"),
    ("客服电话：12345678", "客服电话：幺二三四, 五六七八"),
    ("尾号1234", "尾号一二三四"),
    ("尾号为0042", "尾号为零零四二"),
    ("订单号12345678", "订单号一二三四, 五六七八"),
    ("12345", "一二三, 四五"),
    ("0042", "零零四二"),
    # units
    ("5 kg", "五公斤"),
    ("10km", "十公里"),
    ("2h", "两小时"),
    ("20min", "二十分钟"),
    ("30°C", "三十摄氏度"),
    ("-5°C", "零下五摄氏度"),
    ("3GB", "三G"),
    ("500MB", "五百兆"),
    # symbols
    ("按#号键", "按井号键"),
    ("请按#", "请按井号"),
    ("按*", "按星号"),
    ("#5", "五号"),
    ("A&B", "A和B"),
    # left alone
    ("4G网络", "4G网络"),
]

CANTONESE = [
    ("拨打13800138000", "拨打一三八, 零零一三, 八零零零"),
    ("$100", "一百元"),
    ("HK$100", "一百港元"),
    ("9:30", "九点三十分"),
    ("¥120.50", "一百二十元五角"),
]

UNCHANGED = [
    "",
    "你好，欢迎致电某某银行。",
    "请稍候，您的来电对我们很重要。",
    "请按井号键返回。",
    "Hello there.",
    "4G网络",
]


@pytest.mark.parametrize(("text", "said"), MANDARIN)
def test_mandarin(text, said):
    assert spoken(text, "zh-CN") == said


@pytest.mark.parametrize(("text", "said"), CANTONESE)
def test_cantonese(text, said):
    assert spoken(text, "yue") == said
    assert spoken(text, "zh-HK") == said


def test_table_is_large_enough():
    assert len(MANDARIN) + len(CANTONESE) >= 30


@pytest.mark.parametrize("text", UNCHANGED)
def test_text_without_anything_to_expand_is_unchanged(text):
    assert spoken(text, "zh-CN") == text
    assert spoken(text, "yue") == text


@pytest.mark.parametrize(("text", "said"), MANDARIN + CANTONESE)
def test_idempotent_on_table(text, said):
    for language in ("zh-CN", "yue"):
        once = spoken(text, language)
        assert spoken(once, language) == once


@pytest.mark.parametrize(
    ("tag", "family"),
    [("zh", "zh"), ("zh-CN", "zh"), ("zh_TW", "zh"), ("cmn", "zh"), ("yue", "zh"), ("zh-HK", "zh")],
)
def test_chinese_tags(tag, family):
    assert language_family(tag) == family


_PIECES = [text for text, _ in MANDARIN] + [
    "第",
    "年",
    "月",
    "日",
    "号",
    "点",
    "元",
    "个",
    "-",
    ":",
    "，",
    "。",
    "#",
    "*",
    "2",
    "12",
    "2026",
    "0",
    "am",
]
compositions = st.lists(
    st.tuples(st.sampled_from(_PIECES), st.sampled_from(["", " ", "，", "。"])), max_size=6
).map(lambda parts: "".join(piece + sep for piece, sep in parts))


@settings(max_examples=300, deadline=None)
@given(compositions, st.booleans())
def test_idempotent_on_compositions(text, cantonese):
    rules = Chinese(cantonese=cantonese)
    once = rules.spoken(text)
    assert rules.spoken(once) == once


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60), st.booleans())
def test_never_raises_on_arbitrary_text(text, cantonese):
    rules = Chinese(cantonese=cantonese)
    once = rules.spoken(text)
    assert rules.spoken(once) == once


@settings(max_examples=200, deadline=None)
@given(
    st.text(
        alphabet=st.sampled_from(list("0123456789 .,:-/+#*$¥%&@°年月日号点第元个一")), max_size=40
    )
)
def test_never_raises_on_digit_and_symbol_soup(text):
    for cantonese in (False, True):
        rules = Chinese(cantonese=cantonese)
        once = rules.spoken(text)
        assert rules.spoken(once) == once
