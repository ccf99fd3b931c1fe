"""Tests for engine.text: normalize() and the incremental SegmentSplitter."""

from __future__ import annotations

import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from engine.text import SegmentSplitter, map_characters, normalize

# --------------------------------------------------------------------------- helpers


def make_splitter(
    *,
    max_segment_chars: int = SegmentSplitter.max_segment_chars,
    first_clause_min_chars: int = SegmentSplitter.first_clause_min_chars,
    clause_split_chars: int = SegmentSplitter.clause_split_chars,
) -> SegmentSplitter:
    return SegmentSplitter(
        max_segment_chars=max_segment_chars,
        first_clause_min_chars=first_clause_min_chars,
        clause_split_chars=clause_split_chars,
    )


def split_at_once(text: str, **kwargs: int) -> list[str]:
    """Feed ``text`` in one piece, then flush."""
    splitter = make_splitter(**kwargs)
    return splitter.feed(text) + splitter.flush()


def split_char_by_char(text: str, **kwargs: int) -> list[str]:
    """Feed ``text`` one character at a time, then flush."""
    splitter = make_splitter(**kwargs)
    out: list[str] = []
    for ch in text:
        out += splitter.feed(ch)
    return out + splitter.flush()


def speakable(text: str) -> str:
    """The alphanumeric characters of ``text``, in order."""
    return "".join(ch for ch in text if ch.isalnum())


_CJK = re.compile(r"[\u3400-\u9fff]")
_HANGUL_JAMO = (
    (0x1100, 0x11FF),
    (0x3130, 0x318F),
    (0xA960, 0xA97F),
    (0xD7B0, 0xD7FF),
    (0xFFA0, 0xFFDC),
)


# ------------------------------------------------------------------------ normalize


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("你好！", "你好!"),
        ("你好？", "你好?"),
        ("你好，再见", "你好, 再见"),
        ("你好。", "你好."),
        ("你好。再见。", "你好.再见."),
        ("好的、谢谢", "好的, 谢谢"),
        ("「你好」", "你好"),
        ("《红楼梦》", "红楼梦"),
        ("【通知】请稍候", "通知请稍候"),
        ("等一下…", "等一下..."),
        ("１２３", "123"),
        ("ＡＢＣ", "ABC"),
    ],
)
def test_normalize_maps_cjk_and_full_width_punctuation(raw, expected):
    assert normalize(raw) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("*important*", "important"),
        ("~hello~", "hello"),
        ("★ VIP ★", "VIP"),
        ("hello 😀 world", "hello world"),
        ("hello😀😀world", "hello world"),
        ("※注意", "注意"),
        ("[menu] {one} <two> |three|", "menu one two three"),
        ("a_b^c`d", "a b c d"),
        ("┌──┐ box", "box"),
        ('"quoted"', "quoted"),
    ],
)
def test_normalize_removes_decorative_symbols(raw, expected):
    assert normalize(raw) == expected


@pytest.mark.parametrize(
    "text",
    [
        "press # to repeat",
        "press #",
        "50% off",
        "costs $5",
        "€10 or £8 or ¥1000",
        "1+1=2",
        "mail me@example.com",
        "Tom & Jerry",
        "24/7",
        "it's 10:30",
        "Pi is 3.14",
        "call (555) 0100",
        "well-known",
    ],
)
def test_normalize_keeps_meaningful_symbols(text):
    assert normalize(text) == text


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("  a   b  ", "a b"),
        ("a\t\tb\n\nc", "a b c"),
        ("a\u3000b", "a b"),  # ideographic space (NFKC -> U+0020)
        ("a\x00b\x07c", "a b c"),  # control characters
        ("\n\n", ""),
        ("", ""),
        ("a ,, b", "a, b"),
        (", , hello , ,", "hello"),
        ("a ( ) b", "a b"),
    ],
)
def test_normalize_collapses_whitespace_and_pauses(raw, expected):
    assert normalize(raw) == expected


def test_normalize_strips_leading_and_trailing_pauses():
    assert normalize("，你好，") == "你好"
    assert normalize(" - ok - ") == "- ok -"


def test_map_characters_is_per_character():
    # map_characters is the streaming-safe part: it never looks at neighbours.
    text = "你好！「欢迎」*致电*。"
    assert map_characters(text) == "".join(map_characters(ch) for ch in text)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8")))
@example("你好！")
@example("a ,, b ( ) c")
@example("「你好」※★")
def test_normalize_is_idempotent(text):
    once = normalize(text)
    assert normalize(once) == once


@settings(max_examples=200, deadline=None)
@given(
    st.text(
        alphabet=st.sampled_from(list(" ,.!?;:()#%$-'*~、。，！？「」…\t\nab1你é")),
        max_size=30,
    )
)
def test_normalize_is_idempotent_on_punctuation_heavy_text(text):
    once = normalize(text)
    assert normalize(once) == once


@pytest.mark.parametrize("text", ["(())", "（（ ））", "ok (( )) ok"])
def test_normalize_idempotent_with_nested_empty_parentheses(text):
    once = normalize(text)
    assert normalize(once) == once


@pytest.mark.parametrize("text", ["a「\u0301", "e」\u0301", "\u1100「\u1161"])
def test_normalize_idempotent_when_removed_character_separates_combining_sequence(text):
    once = normalize(text)
    assert normalize(once) == once


def test_normalize_drops_reference_mark_inside_text():
    assert normalize("a ※ b") == "a b"


@pytest.mark.parametrize("amount", ["1,234", "1,000,000", "$2,500.00"])
def test_normalize_keeps_digit_group_separators(amount):
    assert normalize(f"Your balance is {amount} dollars.") == (f"Your balance is {amount} dollars.")


# ------------------------------------------------------------------ SegmentSplitter


def test_chinese_sentences_split_without_spaces():
    text = "你好。欢迎致电某某银行。请问有什么可以帮您？我们的营业时间是九点到五点！"
    assert split_at_once(text) == [
        "你好.",
        "欢迎致电某某银行.",
        "请问有什么可以帮您?",
        "我们的营业时间是九点到五点!",
    ]


def test_chinese_first_clause_cut_at_comma():
    text = "欢迎致电某某银行，请稍候，您的来电对我们很重要。"
    segments = split_at_once(text)
    assert segments[0] == "欢迎致电某某银行"
    # Later clauses are only cut once they are long: the rest stays one sentence.
    assert segments[1:] == ["请稍候, 您的来电对我们很重要."]


def test_chinese_long_clauses_split_at_commas():
    clause = "这是一个比较长的从句" * 7  # 70 characters, over clause_split_chars
    text = f"你好。{clause}，{clause}。"
    assert split_at_once(text) == ["你好.", clause, f"{clause}."]


def test_western_sentences():
    text = "Hello there. How are you? Fine! Thanks; bye."
    assert split_at_once(text) == ["Hello there.", "How are you?", "Fine!", "Thanks;", "bye."]


def test_first_clause_is_cut_early_at_a_comma():
    text = "Welcome to Acme Bank, please listen carefully, as our menu options have changed."
    segments = split_at_once(text)
    assert segments[0] == "Welcome to Acme Bank"
    assert segments[1] == "please listen carefully, as our menu options have changed."


def test_first_clause_needs_minimum_length():
    # "Hi," is shorter than first_clause_min_chars=4: no cut; the default (2) cuts it.
    assert split_at_once("Hi, welcome.", first_clause_min_chars=4) == ["Hi, welcome."]
    assert split_at_once("Hi, welcome.") == ["Hi", "welcome."]


def test_later_clauses_cut_only_when_long():
    long_clause = "and this clause keeps going for quite a long time indeed"
    text = f"Hello. First part, {long_clause}, end of it."
    segments = split_at_once(text, clause_split_chars=30)
    assert segments == ["Hello.", f"First part, {long_clause}", "end of it."]


@pytest.mark.parametrize(
    "text",
    [
        "Pi is 3.14 today.",
        "Dr. Smith will call you.",
        "Mr. and Mrs. Jones are here.",
        "Meet me at St. Mary's.",
        "We offer loans e.g. mortgages.",
        "Version 2.0.1 is out.",
    ],
)
def test_decimals_and_abbreviations_are_not_split(text):
    assert split_at_once(text) == [text]
    assert split_char_by_char(text) == [text]


def test_trailing_number_dot_waits_for_more_input():
    splitter = SegmentSplitter()
    assert splitter.feed("It costs 3.") == []
    assert splitter.flush() == ["It costs 3."]


def test_trailing_number_dot_continued_as_decimal():
    splitter = SegmentSplitter()
    assert splitter.feed("It costs 3.") == []
    assert splitter.feed("50 dollars. ") == ["It costs 3.50 dollars."]
    assert splitter.flush() == []


def test_trailing_dot_followed_by_space_is_a_boundary():
    splitter = SegmentSplitter()
    assert splitter.feed("It costs 3.") == []
    assert splitter.feed(" Thank you") == ["It costs 3."]
    assert splitter.flush() == ["Thank you"]


def test_cjk_full_stop_at_end_of_stream_is_final_at_once():
    splitter = SegmentSplitter()
    assert splitter.feed("你好。") == ["你好."]
    assert splitter.flush() == []


def test_feed_keeps_incomplete_sentence_until_flush():
    splitter = SegmentSplitter()
    assert splitter.feed("Hello") == []
    assert splitter.feed(" world") == []
    assert splitter.flush() == ["Hello world"]
    assert splitter.flush() == []


def test_streamed_pieces_match_whole_text():
    pieces = ["Welcome to Acme", " Bank, please ", "hold. Your call ", "is important to us."]
    splitter = SegmentSplitter()
    out: list[str] = []
    for piece in pieces:
        out += splitter.feed(piece)
    out += splitter.flush()
    assert out == split_at_once("".join(pieces))


def test_long_run_without_punctuation_is_cut_at_spaces():
    words = " ".join(f"word{i}" for i in range(100))
    segments = split_at_once(words, max_segment_chars=50)
    assert all(len(s) <= 50 for s in segments)
    assert " ".join(segments) == words  # cut at spaces: no word is broken


def test_long_run_without_spaces_is_cut_hard():
    text = "好" * 450
    segments = split_at_once(text)
    assert [len(s) for s in segments] == [200, 200, 50]


@pytest.mark.parametrize("text", ["", "   ", "...", "!!! ??? ...", "。。。", "★★★", "*~*", ", ; :"])
def test_punctuation_only_text_gives_no_segments(text):
    assert split_at_once(text) == []
    assert split_char_by_char(text) == []


def test_no_punctuation_only_segments_between_sentences():
    assert split_at_once("Hello! !! ? World.") == ["Hello!", "World."]


# Property tests. The generator builds text from words, CJK words and punctuation,
# with or without a space after the punctuation (streamed text is often glued).

_WORDS = [
    "hello",
    "world",
    "please",
    "hold",
    "press",
    "3",
    "14",
    "2024",
    "你好",
    "谢谢",
    "欢迎致电",
    "请",
    "稍候",
]
_PUNCT = ["", "", "", ".", ",", "!", "?", ";", ":", "...", "。", "，", "！", "？", "、", "…"]


def _build(units: list[tuple[str, str, str]]) -> str:
    out: list[str] = []
    for word, punct, sep in units:
        out.append(word + punct + sep)
    return "".join(out)


prompt_texts = st.lists(
    st.tuples(st.sampled_from(_WORDS), st.sampled_from(_PUNCT), st.sampled_from(["", " "])),
    max_size=40,
).map(_build)


@settings(max_examples=300, deadline=None)
@given(prompt_texts)
def test_char_by_char_feeding_matches_feeding_at_once(text):
    assert split_char_by_char(text) == split_at_once(text)


@settings(max_examples=200, deadline=None)
@given(prompt_texts, st.data())
def test_random_chunking_matches_feeding_at_once(text, data):
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=8)))
    splitter = SegmentSplitter()
    out: list[str] = []
    for lo, hi in zip([0, *cuts], [*cuts, len(text)], strict=True):
        out += splitter.feed(text[lo:hi])
    out += splitter.flush()
    assert out == split_at_once(text)


_SPACED_PUNCT = [
    ".",
    ",",
    ":",
    "",
    "",
    "",
    ". ",
    ", ",
    "! ",
    "? ",
    "; ",
    ": ",
    "。",
    "， ",
    "！",
    "？",
    "、 ",
    "… ",
]
segment_texts = st.lists(
    st.tuples(st.sampled_from([*_WORDS, "Dr", "no", "Mrs"]), st.sampled_from(_SPACED_PUNCT)),
    max_size=60,
).map(lambda units: " ".join(w + p for w, p in units))


@settings(max_examples=300, deadline=None)
@given(
    segment_texts,
    st.integers(min_value=8, max_value=200),
    st.integers(min_value=1, max_value=10),
    st.integers(min_value=4, max_value=80),
    st.booleans(),
)
def test_segment_contract(text, max_chars, first_min, clause_chars, incremental):
    split = split_char_by_char if incremental else split_at_once
    segments = split(
        text,
        max_segment_chars=max_chars,
        first_clause_min_chars=first_min,
        clause_split_chars=clause_chars,
    )
    for segment in segments:
        assert 0 < len(segment) <= max_chars
        assert any(ch.isalnum() for ch in segment), segment
        assert segment == normalize(segment)
    assert speakable("".join(segments)) == speakable(normalize(text))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_no_speakable_character_lost_on_arbitrary_text(text):
    segments = split_at_once(text)
    assert all(any(ch.isalnum() for ch in s) for s in segments)
    assert speakable("".join(segments)) == speakable(normalize(text))


# ------------------------------------------------- regressions (bugs found and fixed)


def test_comma_at_end_of_fed_text_waits_for_more_input():
    splitter = SegmentSplitter()
    out = splitter.feed("Your balance is 1,")
    out += splitter.feed("234 dollars.")
    out += splitter.flush()
    assert speakable(out[0]) == speakable("Your balance is 1,234 dollars.")


@pytest.mark.parametrize("text", ["The time is 10:30 now.", "Total 1,000 dollars.", "333!33"])
def test_char_by_char_matches_at_once_with_glued_punctuation(text):
    assert split_char_by_char(text) == split_at_once(text)


def test_leading_punctuation_does_not_disable_first_clause_cut():
    text = "... Welcome to Acme Bank, please hold. Press 1 for sales. "
    assert split_at_once(text)[0] == "Welcome to Acme Bank"


def test_hard_cut_segment_respects_limit_after_normalization():
    text = "你好。" + "一二三四五六七八九，" * 5 + "一" * 160
    segments = split_at_once(text)
    assert max(len(s) for s in segments) <= 200


def test_abbreviation_detection_independent_of_chunking():
    text = "please. 谢谢;no。 稍候、 请! "
    assert split_char_by_char(text) == split_at_once(text)
