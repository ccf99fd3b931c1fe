"""Tests for engine.text: normalize() and the incremental SegmentSplitter.

Segments are in their spoken form (engine.normalize.spoken) in the splitter's language,
en-US by default. Tests about where cuts fall and what is kept use ``language=PLAIN``, a
language without normalization rules, so the written text comes back as written.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from engine.normalize import spoken
from engine.text import (
    FIRST_SEGMENT_MAX_CJK_CHARS,
    FIRST_SEGMENT_MAX_WORDS,
    MIN_FIT_CHARS,
    SegmentSplitter,
    _limit,
    map_characters,
    normalize,
    split_to_fit,
)

PLAIN = "x-plain"  # no normalization rules: segments stay as written

# --------------------------------------------------------------------------- helpers


def make_splitter(
    *,
    language: str = SegmentSplitter.language,
    max_segment_chars: int = SegmentSplitter.max_segment_chars,
    first_clause_min_chars: int = SegmentSplitter.first_clause_min_chars,
    clause_split_chars: int = SegmentSplitter.clause_split_chars,
) -> SegmentSplitter:
    return SegmentSplitter(
        language=language,
        max_segment_chars=max_segment_chars,
        first_clause_min_chars=first_clause_min_chars,
        clause_split_chars=clause_split_chars,
    )


def split_at_once(text: str, **kwargs: Any) -> list[str]:
    """Feed ``text`` in one piece, then flush."""
    splitter = make_splitter(**kwargs)
    return splitter.feed(text) + splitter.flush()


def split_char_by_char(text: str, **kwargs: Any) -> list[str]:
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
    ("text", "said"),
    [
        ("Pi is 3.14 today.", "Pi is three point one four today."),
        ("Dr. Smith will call you.", "Doctor Smith will call you."),
        ("Mr. and Mrs. Jones are here.", "Mister and Missus Jones are here."),
        ("Meet me at St. Mary's.", "Meet me at Saint Mary's."),
        ("We offer loans e.g. mortgages.", "We offer loans for example mortgages."),
        ("Version 2.0.1 is out.", "Version two point zero point one is out."),
    ],
)
def test_decimals_and_abbreviations_are_not_split(text, said):
    assert split_at_once(text) == [said]
    assert split_char_by_char(text) == [said]
    assert split_at_once(text, language=PLAIN) == [text]
    assert split_char_by_char(text, language=PLAIN) == [text]


def test_trailing_number_dot_waits_for_more_input():
    splitter = SegmentSplitter()
    assert splitter.feed("It costs 3.") == []
    assert splitter.flush() == ["It costs three."]


def test_trailing_number_dot_continued_as_decimal():
    splitter = SegmentSplitter()
    assert splitter.feed("It costs 3.") == []
    assert splitter.feed("50 dollars. ") == ["It costs three dollars and fifty cents."]
    assert splitter.flush() == []


def test_trailing_dot_followed_by_space_is_a_boundary():
    splitter = SegmentSplitter()
    assert splitter.feed("It costs 3.") == []
    assert splitter.feed(" Thank you") == ["It costs three."]
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
    # The first segment ends after FIRST_SEGMENT_MAX_CJK_CHARS characters; later ones
    # at the last word boundary jieba sees within 200 characters ("好好" is a word, and
    # the end of the window is no known boundary).
    text = "好" * 450
    segments = split_at_once(text)
    assert [len(s) for s in segments] == [12, 198, 198, 42]
    assert "".join(segments) == text


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
        language=PLAIN,
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
    segments = split_at_once(text, language=PLAIN)
    assert all(any(ch.isalnum() for ch in s) for s in segments)
    assert speakable("".join(segments)) == speakable(normalize(text))


# ------------------------------------------------- regressions (bugs found and fixed)


def test_comma_at_end_of_fed_text_waits_for_more_input():
    splitter = SegmentSplitter()
    out = splitter.feed("Your balance is 1,")
    out += splitter.feed("234 dollars.")
    out += splitter.flush()
    assert out == ["Your balance is one thousand two hundred thirty-four dollars."]


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


# ------------------------------------------- spoken form, IVR-friendly cuts (languages)


def test_default_language_is_american_english():
    splitter = SegmentSplitter()  # as engine/scheduler/coordinator.py constructs it
    assert splitter.language == "en-US"
    assert splitter.feed("Your balance is $120.50. ") == [
        "Your balance is one hundred twenty dollars and fifty cents."
    ]


def test_language_selects_the_rules():
    assert split_at_once("Press #.", language="en-GB") == ["Press hash."]
    assert split_at_once("余额为¥120.50。", language="zh-CN") == ["余额为一百二十元五角."]
    assert split_at_once("$120.50 today.", language="fr-FR") == ["$120.50 today."]


def test_amount_split_across_feeds_is_one_amount():
    splitter = SegmentSplitter()
    out = splitter.feed("It costs $1")
    out += splitter.feed("20.50 in total.")
    out += splitter.flush()
    assert out == ["It costs one hundred twenty dollars and fifty cents in total."]


@pytest.mark.parametrize(
    "pieces",
    [
        ["Call 555-", "0100 now."],
        ["Call 555", "-0100 now."],
        ["It is 9:", "30 now."],
        ["Total 1,234", ".50 dollars."],
        ["Pi is 3", ".", "5 now."],
        ["Ask Dr", ". Smith now."],
        ["Your account is 00", "42 thanks."],
        ["余额为¥1", "20.50元。"],
    ],
)
def test_numbers_split_across_feeds_read_as_one(pieces):
    whole = "".join(pieces)
    language = "zh-CN" if _CJK.search(whole) else "en-US"
    splitter = SegmentSplitter(language=language)
    out: list[str] = []
    for piece in pieces:
        out += splitter.feed(piece)
    out += splitter.flush()
    assert out == split_at_once(whole, language=language)
    assert len(out) == 1
    assert not any(ch.isdigit() for ch in out[0])


def test_first_segment_is_bounded_in_words():
    text = (
        "Thank you for calling the Acme Bank support line where we are always happy "
        "to help you today."
    )
    segments = split_at_once(text)
    assert segments[0] == "Thank you for calling the Acme Bank support"
    assert len(segments[0].split()) == FIRST_SEGMENT_MAX_WORDS
    assert segments[1:] == ["line where we are always happy to help you today."]
    assert split_char_by_char(text) == segments


def test_first_segment_bound_moves_past_glued_tokens():
    # The 8th word is "account": no cut before its digits, nor right after them (a token
    # with digits keeps the next word: it may be a unit).
    text = "Please have your card ready and your account 0042 handy for the agent to see today."
    segments = split_at_once(text)
    assert segments[0] == "Please have your card ready and your account zero zero four two handy"
    assert segments[1] == "for the agent to see today."


def test_first_segment_bound_strands_no_last_words():
    # A clause that ends within three more words is not cut at the bound.
    text = "Please have your card ready and your account 0042 handy for the agent, thanks."
    segments = split_at_once(text)
    assert segments[0] == (
        "Please have your card ready and your account zero zero four two handy for the agent"
    )
    assert segments[1] == "thanks."


@pytest.mark.parametrize(
    ("text", "said"),
    [
        # the cut comes after the bound, never between the tokens of a reading
        ("One two three four five six seven Dr. Smith will see you now.", "Doctor Smith"),
        ("One two three four five six seven eight 5 kg of rice arrive today.", "five kilograms"),
        ("One two three four five six seven on Dec 3 we will call you back.", "December third"),
        ("One two three four five six seven at 9:30 am we open the doors.", "nine thirty AM"),
        ("One two three four five six seven e.g. this one is an example.", "for example this"),
        (
            "One two three four five six seven call +1 (555) 123-4567 for help with your bill.",
            "four five six seven",
        ),
    ],
)
def test_first_segment_bound_never_splits_a_reading(text, said):
    segments = split_at_once(text)
    assert len(segments) == 2
    assert any(said in segment for segment in segments)
    assert split_char_by_char(text) == segments


def test_first_segment_is_bounded_in_chinese_characters():
    text = "欢迎致电某某银行信用卡中心我们将竭诚为您服务请您耐心等待。"
    segments = split_at_once(text, language="zh-CN")
    # Cut at the first word boundary after 12 characters: "中心" is not broken.
    assert segments[0] == "欢迎致电某某银行信用卡中心"
    assert len(segments[0]) >= FIRST_SEGMENT_MAX_CJK_CHARS
    assert segments[1:] == ["我们将竭诚为您服务请您耐心等待."]
    assert split_char_by_char(text, language="zh-CN") == segments


def test_chinese_bound_strands_no_last_characters():
    """A sentence that ends within FIRST_SEGMENT_TAIL_CJK_CHARS more characters is not cut
    at the bound (a two-character segment is a whole call and a sentence of its own)."""
    text = "我们将会尽快为您转接人工服务。"
    assert split_at_once(text, language="zh-CN") == ["我们将会尽快为您转接人工服务."]
    assert split_char_by_char(text, language="zh-CN") == ["我们将会尽快为您转接人工服务."]
    # five more characters: cut as before
    longer = "我们将会尽快为您转接人工服务请稍候。"
    assert len(split_at_once(longer, language="zh-CN")) == 2


def test_chinese_bound_never_splits_a_date():
    text = "您好请您准备好您的银行卡和身份证件我们将在2026年12月3日联系您。"
    segments = split_at_once(text, language="zh-CN")
    assert "二零二六年十二月三日" in "".join(segments)
    assert split_char_by_char(text, language="zh-CN") == segments


@pytest.mark.parametrize(
    ("text", "segments"),
    [
        # a comma between numbers, a colon before a number: no clause boundary
        (
            "Your visit is on Dec 3, 2026 at 9:30 am, please arrive early.",
            [
                "Your visit is on December third, twenty twenty-six at nine thirty AM",
                "please arrive early.",
            ],
        ),
        (
            "Your order number: 12345 has shipped.",
            ["Your order number: one two three, four five has shipped."],
        ),
        ("尾号：1234的卡已还款。", ["尾号:一二三四的卡已还款."]),
        # the Chinese comma after a number still ends the first clause
        (
            "您的验证码是123456，请在5分钟内输入。",
            ["您的验证码是一二三, 四五六", "请在五分钟内输入."],
        ),
    ],
)
def test_boundaries_around_numbers(text, segments):
    language = "zh-CN" if _CJK.search(text) else "en-US"
    assert split_at_once(text, language=language) == segments
    assert split_char_by_char(text, language=language) == segments


def test_colon_and_comma_wait_for_the_next_character():
    splitter = SegmentSplitter()
    assert splitter.feed("Your code is:") == []
    assert splitter.feed(" 1") == []
    assert splitter.feed("234 thanks.") == []
    assert splitter.flush() == ["Your code is: one two three four thanks."]


def test_spoken_form_never_exceeds_max_segment_chars():
    text = "Pay $1,234,567.89 or $7,654,321.98 now. " * 3
    segments = split_at_once(text, max_segment_chars=60)
    assert all(0 < len(s) <= 60 for s in segments)
    assert "one million two hundred thirty-four thousand" in " ".join(segments)


def test_star_key_survives_until_spoken():
    assert split_at_once("Press * to go back.") == ["Press star to go back."]
    assert split_at_once("Dial *72 now.") == ["Dial star seven two now."]
    assert split_at_once("*Important* please hold.") == ["Important please hold."]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("press *", "press *"),
        ("press the * key", "press the * key"),
        ("*72", "*72"),
        ("*#06#", "*#06#"),
        ("按*号键", "按*号键"),
        ("* Press 1 for sales", "Press 1 for sales"),  # a markdown bullet
        ("**Note:** hold", "Note: hold"),
        ("30°C", "30°C"),
    ],
)
def test_normalize_keeps_keys_and_degrees(raw, expected):
    assert normalize(raw) == expected


def test_word_segmenter_loads_once():
    from engine.text import load_word_segmenter, word_ends

    assert load_word_segmenter() is load_word_segmenter()
    assert word_ends("欢迎致电某某银行") == [2, 4, 6, 8]


# Property: the language changes how each segment is said, never where it is cut. The
# segments in a language are exactly the written (PLAIN) segments, each said on its own.

_IVR_WORDS = [
    "$1",
    "20.50",
    "$120.50",
    "Dr.",
    "Smith",
    "St.",
    "Mary's",
    "account",
    "number",
    "0042",
    "12345678",
    "9:30",
    "am",
    "Dec",
    "3,",
    "2026",
    "5",
    "kg",
    "press #",
    "press *",
    "*72",
    "555-0100",
    "No.",
    "e.g.",
    "15%",
    "1st",
    "hello",
    "please",
    "hold",
    "你好",
    "尾号",
    "1234",
    "第",
    "2",
    "个",
    "欢迎致电",
    "验证码",
    "2026年12月3日",
]
_IVR_SEPARATORS = [" ", " ", " ", ", ", ". ", "! ", ": ", "", "。", "，"]
ivr_texts = st.lists(
    st.tuples(st.sampled_from(_IVR_WORDS), st.sampled_from(_IVR_SEPARATORS)), max_size=30
).map(lambda units: "".join(w + p for w, p in units))


@settings(max_examples=150, deadline=None)
@given(ivr_texts, st.sampled_from(["en-US", "en-GB", "zh-CN", "yue"]), st.booleans())
def test_segments_are_the_written_segments_said_alone(text, language, incremental):
    split = split_char_by_char if incremental else split_at_once
    written = split(text, language=PLAIN)
    said = split(text, language=language)
    expected = [
        piece
        for segment in written
        for piece in _limit(normalize(spoken(segment, language)), SegmentSplitter.max_segment_chars)
    ]
    assert said == [s for s in expected if any(ch.isalnum() for ch in s)]


@settings(max_examples=150, deadline=None)
@given(ivr_texts, st.sampled_from(["en-US", "zh-CN"]), st.data())
def test_random_chunking_matches_feeding_at_once_in_every_language(text, language, data):
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=8)))
    splitter = SegmentSplitter(language=language)
    out: list[str] = []
    for lo, hi in zip([0, *cuts], [*cuts, len(text)], strict=True):
        out += splitter.feed(text[lo:hi])
    out += splitter.flush()
    assert out == split_at_once(text, language=language)
    assert all(0 < len(s) <= SegmentSplitter.max_segment_chars for s in out)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200), st.sampled_from(["en-US", "en-GB", "zh-CN", "yue"]))
def test_arbitrary_text_never_raises_in_any_language(text, language):
    segments = split_at_once(text, language=language)
    assert all(any(ch.isalnum() for ch in s) and len(s) <= 200 for s in segments)


def test_release_speaks_the_complete_words_of_a_stalled_stream_and_keeps_the_last() -> None:
    """``max_buffer_delay_ms``: a token stream that stalls mid-clause has its complete
    words spoken now; the unfinished word waits for the rest of it."""
    splitter = SegmentSplitter()
    assert splitter.feed("So what I would really like to do is book a flight to New Yo") == [
        "So what I would really like to do"
    ]
    assert splitter.release() == ["is book a flight to New"]
    assert splitter.feed("rk tomorrow morning") == []
    assert splitter.release() == ["York tomorrow"]
    assert splitter.feed(" please.") == []
    assert splitter.flush() == ["morning please."]
    one_word = SegmentSplitter()
    assert one_word.feed("Hello") == [] and one_word.release() == []  # nothing complete
    assert one_word.feed(" there.") == [] and one_word.flush() == ["Hello there."]


# ------------------------------------------------------------------- split_to_fit

SENTENCE = (
    "Your call is important to us, so please stay on the line and the next available "
    "agent will be with you shortly."
)


@pytest.mark.parametrize(
    ("max_chars", "expected"),
    [
        (200, [SENTENCE]),  # it fits
        (
            60,  # the comma is in the window's first half: cut at the last space
            [
                "Your call is important to us, so please stay on the line and",
                "the next available agent will be with you shortly.",
            ],
        ),
        (40, ["Your call is important to us,", "so please stay on the line and the next "
              "available agent will be with you shortly."]),  # after the clause mark
        (5, ["Your call is important", "to us, so please stay on the line and the next "
             "available agent will be with you shortly."]),  # a window of MIN_FIT_CHARS
        (110, ["Your call is important to us, so please stay on the line and the next "
               "available agent", "will be with you shortly."]),  # the rest keeps 24 too
    ],
)  # fmt: skip
def test_split_to_fit(max_chars, expected):
    assert split_to_fit(SENTENCE, max_chars) == expected


def test_split_to_fit_leaves_what_it_cannot_cut():
    assert split_to_fit("a" * 80, 30) == ["a" * 80]  # no boundary
    assert split_to_fit("Press one for billing, two for sales.", 20) == [
        "Press one for billing, two for sales."
    ]  # a rest under MIN_FIT_CHARS


def test_split_to_fit_cuts_chinese_between_words():
    text = (
        "请稍候我们将尽快为您转接人工服务感谢您的耐心等待"
        "祝您生活愉快再见欢迎下次再来请按一号键查询余额谢谢您的来电"
    )
    first, rest = split_to_fit(text, 24)
    assert first + rest == text and len(first) <= 24 and len(rest) >= MIN_FIT_CHARS
    assert first.endswith("等待")
