"""Mandarin IVR readings (engine.normalize.spoken, zh-CN): what a caller hears in a
Chinese call centre, one row per case."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.normalize import spoken

IVR = [
    # phone numbers: digit by digit, 1 is 幺, grouped as written (mobiles 3-4-4)
    ("客服热线400-820-8820", "客服热线四零零, 八二零, 八八二零"),
    ("请拨打400 810 1234", "请拨打四零零, 八幺零, 幺二三四"),
    ("请拨打138 0013 8000", "请拨打幺三八, 零零幺三, 八零零零"),
    ("手机138-0013-8000", "手机幺三八, 零零幺三, 八零零零"),
    ("+86 138 0013 8000", "加八六, 幺三八, 零零幺三, 八零零零"),
    ("+8613800138000", "加八六, 幺三八, 零零幺三, 八零零零"),
    ("+86 13800138000", "加八六, 幺三八, 零零幺三, 八零零零"),
    ("+86-10-12345678", "加八六, 幺零, 幺二三四, 五六七八"),
    ("(010)12345678", "零幺零, 幺二三四, 五六七八"),
    ("致电95511", "致电九五五, 幺幺"),
    ("分机号8012", "分机号八零幺二"),
    # account, card and other codes: digit by digit, 1 is 一
    ("您的账号是6222 0202 0011 2233", "您的账号是六二二二, 零二零二, 零零一一, 二二三三"),
    ("卡号6222020200112233", "卡号六二二二, 零二零二, 零零一一, 二二三三"),
    ("验证码是 8 3 1 1 0 2", "验证码是 八三一, 一零二"),
    ("您的验证码为831102，5分钟内有效", "您的验证码为八三一, 一零二，五分钟内有效"),
    ("工号1001", "工号一零零一"),
    ("请输入6位密码", "请输入六位密码"),
    # amounts: 元/角/分, other currencies, large numbers, negatives
    ("¥12.50", "十二元五角"),
    ("12.5元", "十二元五角"),
    ("RMB12.50", "十二元五角"),
    ("100 RMB", "一百元"),
    ("23.05元", "二十三元零五分"),
    ("0.05元", "五分"),
    ("¥2.20", "两元两角"),
    ("￥99", "九十九元"),
    ("-23.05元", "负二十三元零五分"),
    ("余额-5元", "余额负五元"),
    ("共计1.2亿元", "共计一点二亿元"),
    ("1,000,000元", "一百万元"),
    ("12345678元", "一千二百三十四万五千六百七十八元"),
    ("3万元", "三万元"),
    ("共有12000人", "共有一万二千人"),
    ("2亿", "两亿"),
    ("−5", "负五"),
    # dates and times
    ("本月账单2026年12月5日到期", "本月账单二零二六年十二月五日到期"),
    ("2026-12-05", "二零二六年十二月五日"),
    ("2026.12.05", "二零二六年十二月五日"),
    ("12/05", "十二月五日"),
    ("请于12/05前还款", "请于十二月五日前还款"),
    ("14:30", "十四点三十分"),
    ("１２：３０", "十二点三十分"),
    ("下午3点", "下午三点"),
    ("下午3:30", "下午三点三十分"),
    ("周一至周五9:00至18:00", "周一至周五九点至十八点"),
    ("2026年12月5日14:30", "二零二六年十二月五日十四点三十分"),
    ("7*24小时服务", "七乘二十四小时服务"),
    ("7×24小时", "七乘二十四小时"),
    # percentages, decimals, ordinals, ranges
    ("利率3.85%", "利率百分之三点八五"),
    ("100％", "百分之一百"),
    ("10%-20%", "百分之十到百分之二十"),
    ("满意度（95%）", "满意度（百分之九十五）"),
    ("0.5", "零点五"),
    ("第3位", "第三位"),
    ("第12个", "第十二个"),
    ("3-5天", "三到五天"),
    ("3~5个工作日", "三到五个工作日"),
    ("３～５天", "三到五天"),
    ("1-2周", "一到两周"),
    # letters and digits: letters one by one, then the digits as a code
    ("订单号A12345", "订单号A 一二三, 四五"),
    ("A12345", "A 一二三, 四五"),
    ("您的订单SF1234567890已发货", "您的订单S F 一二三四, 五六七, 八九零已发货"),
    ("快递单号YT9876543210", "快递单号Y T 九八七六, 五四三, 二一零"),
    ("B302房间", "B 三零二房间"),
    # English inside Chinese: acronyms letter by letter, words kept for an English G2P
    ("VIP客户", "V I P客户"),
    ("请下载APP", "请下载A P P"),
    ("ＶＩＰ", "V I P"),
    ("ATM机", "A T M机"),
    ("欢迎使用iPhone", "欢迎使用iPhone"),
    ("请打开WiFi", "请打开WiFi"),
    # keys and full-width punctuation and symbols
    ("请按#号键", "请按井号键"),
    ("请按＃号键", "请按井号键"),
    ("按*键返回", "按星号键返回"),
    ("按＊键", "按星号键"),
    ("重听请按*，返回请按#", "重听请按星号，返回请按井号"),
    ("请输入卡号后按#", "请输入卡号后按井号"),
    ("按0转人工", "按零转人工"),
    ("价格：１２．５元", "价格：十二元五角"),
    ("您好，欢迎致电！请问有什么可以帮您？", "您好，欢迎致电！请问有什么可以帮您？"),
]


@pytest.mark.parametrize(("text", "said"), IVR)
def test_mandarin_ivr(text: str, said: str) -> None:
    assert spoken(text, "zh-CN") == said


@pytest.mark.parametrize(("text", "said"), IVR)
def test_mandarin_ivr_is_idempotent(text: str, said: str) -> None:
    assert spoken(said, "zh-CN") == said


_IVR_PIECES = [text for text, _ in IVR] + ["A", "VIP", "iPhone", "#", "*", "，", "-", "/", "12"]
_IVR_COMPOSITIONS = st.lists(
    st.tuples(st.sampled_from(_IVR_PIECES), st.sampled_from(["", " ", "，", "。", "-"])),
    max_size=5,
).map(lambda parts: "".join(piece + sep for piece, sep in parts))


@settings(max_examples=400, deadline=None)
@given(_IVR_COMPOSITIONS, st.sampled_from(["zh-CN", "yue"]))
def test_idempotent_on_ivr_compositions(text: str, language: str) -> None:
    once = spoken(text, language)
    assert spoken(once, language) == once


def test_ivr_table_is_large_enough() -> None:
    assert len(IVR) >= 60


def test_cantonese_keeps_one_as_yi_in_phone_numbers() -> None:
    assert spoken("+8613800138000", "yue") == "加八六, 一三八, 零零一三, 八零零零"
    assert spoken("VIP客户", "yue") == "V I P客户"
