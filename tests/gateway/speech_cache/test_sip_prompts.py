"""The SIP flows declare the prompts they say, and the leg table hands them over."""

from __future__ import annotations

from pathlib import Path

from gateway.legs.kinds import declared_prompts
from gateway.legs.sip.prompts import flow_prompts
from gateway.legs.sip.routes import DEFAULT_ROUTES, parse_routes


def test_the_demo_flow_declares_its_prompts_with_the_digits_its_menu_matches() -> None:
    prompts = flow_prompts(parse_routes(DEFAULT_ROUTES))
    assert [p.text for p in prompts] == [
        "Welcome to the voice gateway demo. To continue, please press 1.",
        "You pressed 1. Thank you.",
        "Goodbye.",
    ]
    assert {(p.voice, p.format) for p in prompts} == {(None, "mulaw_8000")}
    assert prompts[1].source == "sip flow demo, step confirm"


def test_routes_with_their_own_voices_declare_each_once_and_skip_registered_voices() -> None:
    routes = parse_routes(
        """
        [routes.a]
        flow = "f"
        voice = "en-us-joe"
        [routes.b]
        flow = "f"
        voice = "en-us-joe"
        [routes.c]
        flow = "f"
        voice = "zh"
        [routes.d]
        flow = "f"
        voice = "vc_0123456789abcdef"
        [flows.f]
        start = "s"
        [flows.f.steps.s]
        say = "Hello."
        hangup = true
        """
    )
    assert [(p.text, p.voice) for p in flow_prompts(routes)] == [
        ("Hello.", "en-us-joe"),
        ("Hello.", "zh"),
    ]


def test_the_leg_table_declares_prompts_only_for_legs_that_are_on(tmp_path: Path) -> None:
    assert declared_prompts({}) == []
    on = declared_prompts({"GATEWAY_SIP_LISTEN": "127.0.0.1:0"})
    assert "Goodbye." in [p.text for p in on]
