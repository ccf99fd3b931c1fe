"""The prompts file and a prompt's fields: limits, and errors that name the line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.ipc.env import ConfigError
from gateway.speech_cache.prompts import (
    SHARED_TENANT,
    PromptError,
    PromptLimits,
    PromptSpec,
    load_prompts_file,
    parse_prompt,
    parse_prompts_file,
)

LIMITS = PromptLimits(max_text_chars=50, max_prompts=3)


def line(**fields: object) -> str:
    return json.dumps({"text": "Welcome.", "voice": "en-us", **fields})


def test_a_file_gives_its_prompts_with_their_lines_and_tenants() -> None:
    text = "\n".join(
        [
            "# the bank's greeting",
            line(),
            "",
            line(text="Please hold.", speed=1.25, format="pcm_16000"),
            line(voice="vc_0123456789abcdef", tenant="acme", language="en-US", instruct="calm"),
        ]
    )
    prompts = parse_prompts_file(text, LIMITS)
    assert [(p.line, p.tenant) for p in prompts] == [(2, SHARED_TENANT), (4, ""), (5, "acme")]
    assert prompts[0].spec == PromptSpec(text="Welcome.", voice="en-us")
    assert prompts[0].spec.sample_rate == 8000  # mulaw_8000 unless told
    assert (prompts[1].spec.speed, prompts[1].spec.sample_rate) == (1.25, 16000)
    assert (prompts[2].spec.language, prompts[2].spec.instruct) == ("en-US", "calm")


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "JSON object"),
        (json.dumps({"voice": "en-us"}), "'text' is required"),
        (line(text="   "), "'text' is empty"),
        (line(voice=7), "'voice' must be a string"),
        (line(text="x" * 51), "over 50 characters"),
        (line(speed=5), "'speed' must be from"),
        (line(speed="fast"), "'speed' must be a number"),
        (line(speed=True), "'speed' must be a number"),
        (line(format="flac"), "'format' must be one of"),
        (line(instruct="y" * 201), "'instruct' is over 200"),
        (line(colour="red"), "unknown field 'colour'"),
    ],
)
def test_a_bad_line_is_a_configuration_error_naming_it(bad: str, words: str) -> None:
    text = line() + "\n# comment\n" + bad + "\n"
    with pytest.raises(ConfigError, match=f"line 3: .*{words}"):
        parse_prompts_file(text, LIMITS, "prompts.jsonl")


def test_more_prompts_than_the_limit_are_refused() -> None:
    parse_prompts_file("\n".join([line()] * 3), LIMITS)
    with pytest.raises(ConfigError, match="line 4: more than 3 prompts"):
        parse_prompts_file("\n".join([line()] * 4), LIMITS)


def test_the_file_must_be_readable_utf8(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_prompts_file(tmp_path / "missing.jsonl", LIMITS)
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"text": "caf\xe9", "voice": "en-us"}\n')
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_prompts_file(latin, LIMITS)
    good = tmp_path / "good.jsonl"
    good.write_text(line(text="Café.") + "\n", encoding="utf-8")
    assert load_prompts_file(good, LIMITS)[0].spec.text == "Café."


def test_api_fields_name_the_field_at_fault() -> None:
    with pytest.raises(PromptError) as caught:
        parse_prompt({"text": "x" * 51, "voice": "en-us"}, LIMITS)
    assert (caught.value.code, caught.value.field) == ("text_too_long", "text")
    spec, tenant = parse_prompt({"text": "Hi.", "voice": "zh", "speed": 1}, LIMITS)
    assert (spec.speed, tenant) == (1.0, None)


def test_ids_are_stable_and_differ_for_every_field_and_tenant() -> None:
    base = PromptSpec(text="Welcome.", voice="en-us")
    same = PromptSpec(text="Welcome.", voice="en-us")
    assert base.prompt_id("acme") == same.prompt_id("acme")
    others = [
        PromptSpec(text="Welcome!", voice="en-us"),
        PromptSpec(text="Welcome.", voice="zh"),
        PromptSpec(text="Welcome.", voice="en-us", speed=1.1),
        PromptSpec(text="Welcome.", voice="en-us", language="en"),
        PromptSpec(text="Welcome.", voice="en-us", instruct="calm"),
        PromptSpec(text="Welcome.", voice="en-us", format="pcm_16000"),
    ]
    ids = {base.prompt_id("acme"), base.prompt_id("other"), *(o.prompt_id("acme") for o in others)}
    assert len(ids) == 2 + len(others)
    # alaw and mu-law share 8 kHz: the same audio, the same prompt
    assert PromptSpec(text="a", voice="v", format="alaw_8000").prompt_id("t") == PromptSpec(
        text="a", voice="v"
    ).prompt_id("t")
