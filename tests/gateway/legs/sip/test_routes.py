"""The routes file: the demo routes, and every mistake an operator can make in one."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.ipc.env import ConfigError
from gateway.legs.sip.routes import DEFAULT_ROUTES, load_routes, parse_routes


def test_the_demo_routes() -> None:
    routes = load_routes(None)
    ivr = routes.match("ivr")
    assert ivr is not None and ivr.flow is not None
    assert ivr.flow.start == "greet"
    greet = ivr.flow.steps["greet"]
    assert greet.gather is not None and greet.gather.digits == 1
    assert greet.on == {"1": "confirm"}
    assert ivr.flow.steps["goodbye"].hangup
    app = routes.match("app")
    assert app is not None and app.application and app.flow is None
    assert routes.match("nobody") is None
    assert routes.match(None) is None


def test_a_catch_all_route(tmp_path: Path) -> None:
    path = tmp_path / "routes.toml"
    path.write_text(DEFAULT_ROUTES + '\n[routes."*"]\nflow = "demo"\nvoice = "en-us-joe"\n')
    routes = load_routes(path)
    other = routes.match("+15551234")
    assert other is not None and other.voice == "en-us-joe"


FLOW = """
[flows.f]
start = "a"
[flows.f.steps.a]
say = "Hi"
"""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[routes.x]\nflow = 'f'\n", "unknown flow"),
        ("[routes.x]\n" + FLOW, "exactly one of flow, webhook or application"),
        ("[routes.x]\nflow = 'f'\napplication = true\n" + FLOW, "exactly one"),
        (FLOW, "no [routes"),
        ("[routes.x]\nflow = 'f'\n" + FLOW + "next = 'b'\n", "unknown step 'b'"),
        ("[routes.x]\nflow = 'f'\n" + FLOW + "next = 'a'\nhangup = true\n", "more than one"),
        ("[routes.x]\nflow = 'f'\n" + FLOW + "on = { '1' = 'a' }\n", "needs a gather"),
        ("[routes.x]\nflow = 'f'\n" + FLOW + "gather = { digits = 0 }\n", "digits"),
        ("[routes.x]\nflow = 'f'\n" + FLOW + "transfer = 'http://x'\n", "sip:"),
        ("[routes.x]\nflow = 'f'\n" + FLOW + "colour = 'red'\n", "unknown keys"),
        ("[routes.x]\nflow = 'f'\n" + FLOW.replace('"Hi"', "1"), "say"),
        ("[routes.x]\nflow = 'f'\nanswer_after_s = 99\n" + FLOW, "answer_after_s"),
        ("not toml [", "not TOML"),
        (
            "[routes.x]\nflow = 'f'\n[flows.f.steps.a]\nnext = 'b'\n"
            "[flows.f.steps.b]\nnext = 'a'\n",
            "loop without a word",
        ),
    ],
)
def test_mistakes_are_configuration_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        parse_routes(text)


def test_an_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_routes(tmp_path / "missing.toml")


def test_webhook_routes_and_trunks_read_their_secrets_from_the_environment() -> None:
    routes = parse_routes(
        """
realm = "gw.example.com"
[routes.hotline]
webhook = "https://ivr.example.com/sip"
webhook_timeout_s = 3
webhook_secret_env = "HOOK_SECRET"
[trunks.carrier]
username = "acme"
password_env = "ACME_PASSWORD"
tenant = "acme"
[trunks.lab]
username = "lab"
password = "in-the-file"
tenant = "lab"
""",
        {"HOOK_SECRET": "s3cret", "ACME_PASSWORD": "pw"},
    )
    route = routes.routes["hotline"]
    assert route.webhook == "https://ivr.example.com/sip" and route.webhook_timeout_s == 3.0
    assert route.webhook_secret == b"s3cret" and "s3cret" not in repr(route)
    assert routes.realm == "gw.example.com"
    assert {u: (t.tenant, t.password) for u, t in routes.trunks.items()} == {
        "acme": ("acme", "pw"),
        "lab": ("lab", "in-the-file"),
    }
    assert "pw" not in repr(routes.trunks["acme"])
    assert load_routes(None).trunks == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[routes.x]\nwebhook = 'ftp://a/b'\n", "http:// or https://"),
        ("[routes.x]\nwebhook = 'https://a/b'\nflow = 'f'\n" + FLOW, "exactly one"),
        ("[routes.x]\nwebhook = 'https://a/b'\nwebhook_timeout_s = 60\n", "webhook_timeout_s"),
        ("[routes.x]\nwebhook = 'https://a/b'\nwebhook_secret_env = 'NOPE'\n", "NOPE is not set"),
        ("[routes.x]\napplication = true\nwebhook_secret = 'x'\n", "needs a webhook"),
        ("[routes.x]\napplication = true\ncolour = 1\n", "unknown keys"),
        (
            "[routes.x]\napplication = true\n[trunks.a]\nusername = 'u'\ntenant = 't'\n",
            "needs username, password and tenant",
        ),
        (
            "[routes.x]\napplication = true\n[trunks.a]\nusername = 'u'\npassword = 'p'\n"
            "password_env = 'P'\ntenant = 't'\n",
            "not both",
        ),
        (
            "[routes.x]\napplication = true\n[trunks.a]\nusername = 'u'\npassword = 'p'\n"
            "tenant = 't'\n[trunks.b]\nusername = 'u'\npassword = 'q'\ntenant = 't'\n",
            "used twice",
        ),
        ("realm = 'a\"b'\n[routes.x]\napplication = true\n", "realm"),
    ],
)
def test_webhook_and_trunk_mistakes(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_routes(text, {})
