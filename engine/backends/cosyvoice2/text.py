"""The text the model reads: what upstream's ``CosyVoiceFrontEnd.text_normalize`` does
after its text-normalization model.

Upstream normalizes with ttsfrd when it is installed, else with WeText (``wetext``'s
Chinese and English normalizers); neither is used here: the engine's own rules
(:mod:`engine.normalize`, Chinese for text with Han characters, else English) write out
numbers, amounts, dates and symbols before a segment reaches the backend. Then, for text
with Chinese characters, upstream applies a few fixed rules, which :func:`model_text`
applies with upstream's own functions: newlines removed, spaces kept only between two
ASCII characters, ``²``/``³`` read as 平方/立方, ``.`` as ``。``, `` - `` as ``，``,
brackets (``（）【】``, backticks, ``——``) removed, trailing commas made ``。``. For
English text upstream spells out digits left after WeText (inflect); the engine's rules
leave none to spell. Upstream also cuts a text into sentences of 60-80 tokens; the
engine's segmenter cuts first (up to 400 characters a segment), so a long paragraph's
LLM prompts can differ from upstream's.
"""

from __future__ import annotations

import re
from typing import Final

_TRAILING_COMMAS: Final = re.compile(r"[，,、]+$")


def model_text(text: str) -> str:
    """``text`` (already normalized) as upstream's ``text_normalize(split=False)``
    hands it to the tokenizer."""
    from cosyvoice.utils.frontend_utils import (
        contains_chinese,
        remove_bracket,
        replace_blank,
        replace_corner_mark,
    )

    text = text.strip()
    if not contains_chinese(text):
        return text
    text = text.replace("\n", "")
    text = replace_blank(text)
    text = replace_corner_mark(text)
    text = text.replace(".", "。")
    text = text.replace(" - ", "，")
    text = remove_bracket(text)
    return _TRAILING_COMMAS.sub("。", text)
