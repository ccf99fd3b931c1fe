"""Short IVR prompts for load tests, by the voice that speaks them.

Every prompt is about 15 characters (the figure the sizing goals are stated for). A
call picks one voice for its whole session and only speaks prompts in that voice's
language: Chinese text always goes to ``zh``, English text to ``en-us``.
"""

from __future__ import annotations

import random

PROMPTS: dict[str, tuple[str, ...]] = {
    "zh": (
        "您好，欢迎致电客服中心，请稍候",
        "请按一号键查询您当前账户余额。",
        "我们将会尽快为您转接人工服务。",
        "您的来电对我们非常重要，谢谢。",
        "查询话费请按二，办理业务请按三",
        "请输入您的手机号码并按井号键。",
        "系统正在处理中，请您不要挂机。",
        "感谢您的耐心等待，祝您生活愉快",
    ),
    "en-us": (
        "Press 1 to pay.",
        "Please hold on.",
        "You are 3rd now",
        "Please say yes.",
        "Enter your PIN.",
        "Thanks, goodbye",
        "For menu, say 0",
        "One moment now.",
    ),
}
VOICES: tuple[str, ...] = tuple(PROMPTS)  # the standard (espeak) call mix
#: Other voices speak the prompts of their language.
SAME_LANGUAGE = {
    "en-us-joe": "en-us",
    "en-us-f": "en-us",
    "en-gb": "en-us",
    "zh-f": "zh",
    **{  # the Kokoro voices
        f"zh-{name}": "zh"
        for name in ("xiaoyi", "xiaoxiao", "xiaobei", "xiaoni", "yunxi", "yunxia", "yunjian")
    },
    "zh-yunyang": "zh",
    **{f"en-us-{name}": "en-us" for name in ("heart", "bella", "michael")},
    **{f"en-gb-{name}": "en-us" for name in ("emma", "george")},
}


def pick_prompt(voice: str, rng: random.Random) -> str:
    """A random prompt in ``voice``'s language (KeyError for a voice with no prompts)."""
    return rng.choice(PROMPTS[SAME_LANGUAGE.get(voice, voice)])
