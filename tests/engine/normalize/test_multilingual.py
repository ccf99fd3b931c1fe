"""Language ``mul`` (a multilingual voice: CosyVoice2): the rules follow the text."""

from __future__ import annotations

from engine.normalize import language_family, spoken


def test_text_with_han_characters_is_read_with_the_chinese_rules() -> None:
    assert spoken("余额¥120.50", "mul") == spoken("余额¥120.50", "zh")
    assert "一百二十" in spoken("余额¥120.50", "mul")


def test_text_without_han_characters_is_read_with_the_english_rules() -> None:
    assert spoken("Your balance is $120.50.", "mul") == spoken("Your balance is $120.50.", "en")
    assert "dollars" in spoken("Your balance is $120.50.", "mul")


def test_the_family_of_mul_turns_normalization_on() -> None:
    assert language_family("mul") == "mul"
    assert language_family("MUL") == "mul"
    assert language_family("fr") == ""
