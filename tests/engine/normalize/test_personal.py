"""Personal data as the normalizer sees it (engine/normalize/personal.py), and the
splitter's cut before it (engine/text.py, ``cut_before_personal``)."""

from __future__ import annotations

import pytest

from engine.normalize.personal import is_personal, personal_start
from engine.text import SegmentSplitter, stream_splitter


@pytest.mark.parametrize(
    ("text", "item"),
    [
        ("Your verification code is 682163.", "682163"),
        ("Your current balance is $1,234.56.", "$1,234.56"),
        ("You owe 5 dollars.", "5 dollars"),
        ("The fee is €3 today.", "€3"),
        ("Send USD 20 now.", "USD 20"),
        ("Your card ending in 4242 is blocked.", "4242"),
        ("Card 4111 1111 1111 1111 expires.", "4111"),
        ("Call us on 555-0100.", "555-0100"),
        ("Your PIN is 42.", "42"),
        ("Account no. 7 is closed.", "7"),
        ("Your appointment is on Dec 3.", "Dec 3"),
        ("Born 3 December 1990.", "3 December"),
        ("Write to me@example.com today.", "me@example.com"),
        ("The code is six eight two one.", "six eight two one"),
        ("We open at 9:30 tomorrow.", "9:30"),
        ("您的验证码是682163。", "682163"),
        ("您的余额是1234.56元。", "1234.56元"),
        ("您的余额是一千二百元。", "一千二百元"),
        ("还款日是3月5日。", "3月5日"),
        ("验证码 12 请勿泄露。", "12"),
        ("尾号幺三八的卡。", "幺三八"),
    ],
)
def test_personal_items_are_found_where_they_begin(text: str, item: str) -> None:
    at = personal_start(text)
    assert at is not None and text[at:].startswith(item.split()[0]), (text, at)


@pytest.mark.parametrize(
    "text",
    [
        "Welcome to Acme Bank.",
        "Press 1 for sales, 2 for support.",
        "We are open 24 hours a day.",
        "Please hold, an agent will be with you shortly.",
        "For option one, press one.",
        "按1查询余额，按2转人工。",
        "您好，欢迎致电安信银行。",
        "",
    ],
)
def test_menus_and_greetings_are_not_personal(text: str) -> None:
    assert not is_personal(text)


def test_the_stream_splitter_cuts_before_the_item_and_marks_it() -> None:
    splitter = stream_splitter("en-US")
    out = splitter.feed("Welcome to Acme Bank. Your balance is $1,234.56. Goodbye.")
    out += splitter.flush()
    assert out == [
        "Welcome to Acme Bank.",
        "Your balance is",
        "one thousand two hundred thirty-four dollars and fifty-six cents.",
        "Goodbye.",
    ]
    assert splitter.personal == {out[2]}
    # The two halves of one cut know the segment they were: spoken whole when the words
    # before may not play ahead of the amount (engine/scheduler/cache_path.py).
    assert splitter.wholes == {(out[1], out[2]): f"{out[1]} {out[2]}"}


def test_a_chinese_segment_is_cut_between_characters_where_cutting_is_asked() -> None:
    splitter = SegmentSplitter(language="zh-CN", cut_before_personal=True)
    out = splitter.feed("您的验证码是682163。") + splitter.flush()
    assert out == ["您的验证码是", "六八二, 一六三."]
    assert splitter.personal == {out[1]}
    assert splitter.wholes == {(out[0], out[1]): "您的验证码是六八二, 一六三."}


def test_the_engine_does_not_cut_chinese_sentences_and_keeps_them_personal_whole() -> None:
    """Composed Mandarin sentences were heard worse than whole ones (engine/text.py
    NOT_CUT_FAMILIES): the stream's splitter speaks them whole, marked personal."""
    splitter = stream_splitter("zh-CN")
    out = splitter.feed("您的验证码是682163。") + splitter.flush()
    assert out == ["您的验证码是六八二, 一六三."]
    assert splitter.personal == set(out) and not splitter.prefixes and not splitter.wholes


@pytest.mark.parametrize(
    "text",
    [
        "682163 is your code.",  # the item first: nothing before it to keep
        "Order ABC12345 has shipped.",  # "ABC" reads otherwise alone: no cut
    ],
)
def test_no_cut_leaves_the_whole_segment_personal(text: str) -> None:
    splitter = stream_splitter("en-US")
    out = splitter.feed(text) + splitter.flush()
    assert len(out) == 1 and splitter.personal == set(out)


def test_without_the_cut_segments_are_as_before_but_still_marked() -> None:
    plain = SegmentSplitter(language="en-US")
    out = plain.feed("Your balance is $5.") + plain.flush()
    assert out == ["Your balance is five dollars."] and plain.personal == set(out)
