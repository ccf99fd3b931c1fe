"""SIP routes: what a call to a Request-URI user gets (``GATEWAY_SIP_ROUTES``, TOML).

A route runs a flow of prompts and DTMF menus in the gateway, asks a webhook what to do
(:mod:`gateway.legs.sip.webhook`), or waits for an IVR application to attach over the native
protocol (``start.call`` = the SIP Call-ID, as for Twilio legs)::

    [routes.ivr]                  # calls to sip:ivr@gateway
    flow = "demo"
    voice = "en-us-joe"           # optional: the engine's default voice

    [routes.agent]
    application = true            # an IVR application drives the call
    attach_timeout_s = 30         # hang up when none attached by then
    answer_after_s = 2            # ring (180) this long before answering (default 0)

    [routes.hotline]
    webhook = "https://ivr.example.com/sip"   # POSTs the call, runs the actions it returns
    webhook_timeout_s = 5         # per request (default 5)
    webhook_secret_env = "HOTLINE_WEBHOOK_SECRET"  # optional: sign requests (HMAC-SHA256)

    [routes."*"]                  # any other user (optional; else 404)
    flow = "demo"

    [trunks.carrier]              # digest authentication (RFC 8760) for one trunk
    username = "acme"
    password_env = "ACME_TRUNK_PASSWORD"   # or password = "..." (the file is then a secret)
    tenant = "acme"               # the tenant its calls are billed to

    [flows.demo]
    start = "greet"

    [flows.demo.steps.greet]
    say = "Welcome. To continue, press 1."
    gather = { digits = 1, timeout_s = 5, attempts = 3 }
    on = { "1" = "confirm" }      # digits -> next step; other input and silence retry
    fallback = "goodbye"          # after the last attempt (default: hang up)

    [flows.demo.steps.confirm]
    say = "You pressed {digits}. Thank you."
    next = "goodbye"

    [flows.demo.steps.goodbye]
    say = "Goodbye."
    hangup = true

A step says its text (``{digits}``: the digits the last gather collected), then does one
thing: ``gather`` (collect up to ``digits`` digits, ``#`` ends early; the timeout runs
from the end of the prompt; a digit interrupts the prompt), ``next``, ``transfer`` (a SIP
URI, sent as REFER; on refusal the flow goes on at ``fallback``) or ``hangup``. A step
with none of them hangs up. The file is checked whole at start-up: an unknown step, a
step with two actions or a route with no target is a configuration error.

``[trunks.<name>]`` lets a source outside ``GATEWAY_SIP_ALLOW`` in when its INVITE answers
a digest challenge with a trunk's username and password; its calls are billed to the
trunk's tenant. ``realm`` (top level, default ``voice-gateway``) names the realm and
``digest_algorithms`` (top level) the algorithms challenged, in order: the default is
``["MD5"]``, what every trunk and PBX speaks; ``["SHA-256", "MD5"]`` is RFC 8760's order,
for trunks that all handle it (some UACs, sipp among them, answer only the first
challenge and fail on SHA-256). Secrets
named by ``*_env`` keys are read from the environment when the file is loaded; a missing
one is a configuration error.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from engine.ipc.env import ConfigError
from telephony.sip import SipError, parse_uri

__all__ = [
    "DEFAULT_ROUTES",
    "Flow",
    "Gather",
    "Route",
    "Routes",
    "Step",
    "Trunk",
    "load_routes",
    "parse_routes",
]

MAX_STEPS = 256
MAX_SAY_CHARS = 2000
MAX_GATHER_DIGITS = 32
ANY_USER = "*"
DEFAULT_REALM = "voice-gateway"
MAX_TRUNKS = 256
DEFAULT_DIGEST_ALGORITHMS = ("MD5",)
DIGEST_ALGORITHMS = ("SHA-256", "MD5")

#: The built-in routes: user ``ivr`` greets the caller, asks for 1, confirms the digit,
#: says goodbye and hangs up (the demo of design brief section 7); user ``app`` waits for
#: an IVR application.
DEFAULT_ROUTES = """
[routes.ivr]
flow = "demo"

[routes.app]
application = true

[flows.demo]
start = "greet"

[flows.demo.steps.greet]
say = "Welcome to the voice gateway demo. To continue, please press 1."
gather = { digits = 1, timeout_s = 6, attempts = 3 }
on = { "1" = "confirm" }
fallback = "goodbye"

[flows.demo.steps.confirm]
say = "You pressed {digits}. Thank you."
next = "goodbye"

[flows.demo.steps.goodbye]
say = "Goodbye."
hangup = true
"""


@dataclass(frozen=True)
class Gather:
    digits: int = 1
    timeout_s: float = 5.0
    attempts: int = 3


@dataclass(frozen=True)
class Step:
    name: str
    say: str = ""
    gather: Gather | None = None
    on: Mapping[str, str] = field(default_factory=dict)
    next: str | None = None
    transfer: str | None = None
    hangup: bool = False
    fallback: str | None = None


@dataclass(frozen=True)
class Flow:
    name: str
    start: str
    steps: Mapping[str, Step]


@dataclass(frozen=True)
class Route:
    user: str
    flow: Flow | None = None
    application: bool = False
    attach_timeout_s: float = 30.0
    answer_after_s: float = 0.0
    voice: str | None = None
    webhook: str | None = None
    webhook_timeout_s: float = 5.0
    webhook_secret: bytes | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Trunk:
    """A SIP trunk that authenticates by digest: its calls are billed to ``tenant``."""

    name: str
    username: str
    password: str = field(repr=False)
    tenant: str


@dataclass(frozen=True)
class Routes:
    routes: Mapping[str, Route]
    trunks: Mapping[str, Trunk] = field(default_factory=dict)  # by username
    realm: str = DEFAULT_REALM
    digest_algorithms: tuple[str, ...] = DEFAULT_DIGEST_ALGORITHMS

    def match(self, user: str | None) -> Route | None:
        """The route for a Request-URI user (``*`` catches the rest)."""
        return self.routes.get(user or "") or self.routes.get(ANY_USER)


def _table(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"SIP routes: {where} must be a table")
    return value


def _text(value: Any, where: str, limit: int = MAX_SAY_CHARS) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise ConfigError(f"SIP routes: {where} must be a string of at most {limit} characters")
    return value


def _number(value: Any, where: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ConfigError(f"SIP routes: {where} must be a number from {low} to {high}")
    return float(value)


_STEP_KEYS = {"say", "gather", "on", "next", "transfer", "hangup", "fallback"}


def _step(name: str, raw: Mapping[str, Any], where: str) -> Step:
    unknown = set(raw) - _STEP_KEYS
    if unknown:
        raise ConfigError(f"SIP routes: {where}: unknown keys {sorted(unknown)}")
    actions = [key for key in ("gather", "next", "transfer") if key in raw]
    if raw.get("hangup"):
        actions.append("hangup")
    if len(actions) > 1:
        raise ConfigError(f"SIP routes: {where} has more than one action: {actions}")
    gather = None
    if "gather" in raw:
        g = _table(raw["gather"], f"{where}.gather")
        gather = Gather(
            digits=int(_number(g.get("digits", 1), f"{where}.gather.digits", 1, MAX_GATHER_DIGITS)),
            timeout_s=_number(g.get("timeout_s", 5), f"{where}.gather.timeout_s", 0.5, 120),
            attempts=int(_number(g.get("attempts", 3), f"{where}.gather.attempts", 1, 10)),
        )
    on = {
        _text(k, f"{where}.on key", MAX_GATHER_DIGITS): _text(v, f"{where}.on.{k}", 128)
        for k, v in _table(raw.get("on", {}), f"{where}.on").items()
    }
    if on and gather is None:
        raise ConfigError(f"SIP routes: {where}: 'on' needs a gather")
    transfer = _text(raw["transfer"], f"{where}.transfer", 256) if "transfer" in raw else None
    if transfer is not None:
        try:
            if parse_uri(transfer).scheme not in ("sip", "sips", "tel"):
                raise SipError("bad_scheme", "not a SIP or tel URI")
        except SipError:
            raise ConfigError(
                f"SIP routes: {where}.transfer must be a sip:, sips: or tel: URI"
            ) from None
    return Step(
        name=name,
        say=_text(raw.get("say", ""), f"{where}.say"),
        gather=gather,
        on=on,
        next=_text(raw["next"], f"{where}.next", 128) if "next" in raw else None,
        transfer=transfer,
        hangup=bool(raw.get("hangup", False)),
        fallback=_text(raw["fallback"], f"{where}.fallback", 128) if "fallback" in raw else None,
    )


def _flow(name: str, raw: Mapping[str, Any]) -> Flow:
    where = f"flows.{name}"
    steps_raw = _table(raw.get("steps", {}), f"{where}.steps")
    if not steps_raw or len(steps_raw) > MAX_STEPS:
        raise ConfigError(f"SIP routes: {where} needs 1 to {MAX_STEPS} steps")
    steps = {
        k: _step(k, _table(v, f"{where}.steps.{k}"), f"{where}.steps.{k}")
        for k, v in steps_raw.items()
    }
    start = _text(raw.get("start", next(iter(steps))), f"{where}.start", 128)
    targets = [(start, "start")]
    for step in steps.values():
        targets += [(t, f"steps.{step.name}.on") for t in step.on.values()]
        targets += [(t, f"steps.{step.name}") for t in (step.next, step.fallback) if t]
    for target, source in targets:
        if target not in steps:
            raise ConfigError(f"SIP routes: {where}.{source} names an unknown step {target!r}")
    _refuse_silent_loops(where, steps)
    return Flow(name=name, start=start, steps=steps)


def _refuse_silent_loops(where: str, steps: Mapping[str, Step]) -> None:
    """A loop of steps that neither say anything nor gather would spin without end."""
    silent = {n for n, s in steps.items() if not s.say.strip() and s.gather is None}
    for first in silent:
        seen: set[str] = set()
        name: str | None = first
        while name is not None and name in silent and name not in seen:
            seen.add(name)
            name = steps[name].next
        if name is not None and name in seen:
            raise ConfigError(f"SIP routes: {where}: steps {sorted(seen)} loop without a word")


def _secret(raw: Mapping[str, Any], key: str, where: str, env: Mapping[str, str]) -> str | None:
    """``key`` in the file, or the environment variable that ``key_env`` names."""
    if key in raw and f"{key}_env" in raw:
        raise ConfigError(f"SIP routes: {where}: give {key} or {key}_env, not both")
    if key in raw:
        return _text(raw[key], f"{where}.{key}", 256)
    if f"{key}_env" not in raw:
        return None
    name = _text(raw[f"{key}_env"], f"{where}.{key}_env", 128)
    value = env.get(name)
    if not value:
        raise ConfigError(f"SIP routes: {where}.{key}_env: {name} is not set")
    return value


def _webhook_url(value: Any, where: str) -> str:
    url = _text(value, where, 2048)
    parsed = urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(f"SIP routes: {where} must be an http:// or https:// URL")
    return url


def _route(
    user: str, raw: Mapping[str, Any], flows: Mapping[str, Flow], env: Mapping[str, str]
) -> Route:
    where = f"routes.{user}"
    unknown = set(raw) - _ROUTE_KEYS
    if unknown:
        raise ConfigError(f"SIP routes: {where}: unknown keys {sorted(unknown)}")
    targets = [key for key in ("flow", "webhook") if key in raw]
    if raw.get("application", False):
        targets.append("application")
    if len(targets) != 1:
        raise ConfigError(f"SIP routes: {where} needs exactly one of flow, webhook or application")
    flow = None
    if "flow" in raw:
        flow_name = _text(raw["flow"], f"{where}.flow", 128)
        flow = flows.get(flow_name)
        if flow is None:
            raise ConfigError(f"SIP routes: {where} names an unknown flow {flow_name!r}")
    secret = _secret(raw, "webhook_secret", where, env)
    if secret is not None and "webhook" not in raw:
        raise ConfigError(f"SIP routes: {where}: webhook_secret needs a webhook")
    voice = raw.get("voice")
    return Route(
        user=user,
        flow=flow,
        application=bool(raw.get("application", False)),
        attach_timeout_s=_number(
            raw.get("attach_timeout_s", 30), f"{where}.attach_timeout_s", 1, 3600
        ),
        answer_after_s=_number(raw.get("answer_after_s", 0), f"{where}.answer_after_s", 0, 60),
        voice=_text(voice, f"{where}.voice", 128) if voice is not None else None,
        webhook=_webhook_url(raw["webhook"], f"{where}.webhook") if "webhook" in raw else None,
        webhook_timeout_s=_number(
            raw.get("webhook_timeout_s", 5), f"{where}.webhook_timeout_s", 0.5, 30
        ),
        webhook_secret=secret.encode() if secret is not None else None,
    )


_ROUTE_KEYS = {
    "flow",
    "application",
    "webhook",
    "webhook_timeout_s",
    "webhook_secret",
    "webhook_secret_env",
    "attach_timeout_s",
    "answer_after_s",
    "voice",
}
_TRUNK_KEYS = {"username", "password", "password_env", "tenant"}


def _trunks(doc: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Trunk]:
    trunks: dict[str, Trunk] = {}
    raw_trunks = _table(doc.get("trunks", {}), "trunks")
    if len(raw_trunks) > MAX_TRUNKS:
        raise ConfigError(f"SIP routes: at most {MAX_TRUNKS} trunks")
    for name, raw_trunk in raw_trunks.items():
        where = f"trunks.{name}"
        raw = _table(raw_trunk, where)
        unknown = set(raw) - _TRUNK_KEYS
        if unknown:
            raise ConfigError(f"SIP routes: {where}: unknown keys {sorted(unknown)}")
        username = _text(raw.get("username", ""), f"{where}.username", 128)
        tenant = _text(raw.get("tenant", ""), f"{where}.tenant", 128)
        password = _secret(raw, "password", where, env)
        if not username or not tenant or not password:
            raise ConfigError(f"SIP routes: {where} needs username, password and tenant")
        if '"' in username or not username.isprintable() or " " in tenant:
            raise ConfigError(f"SIP routes: {where}: bad username or tenant")
        if username in trunks:
            raise ConfigError(f"SIP routes: {where}: username {username!r} is used twice")
        trunks[username] = Trunk(name=name, username=username, password=password, tenant=tenant)
    return trunks


def parse_routes(text: str, env: Mapping[str, str] | None = None) -> Routes:
    """Parse and check a routes file (raises :class:`ConfigError`); ``*_env`` keys are
    looked up in ``env`` (default: the process environment)."""
    env = os.environ if env is None else env
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"SIP routes: not TOML: {exc}") from None
    flows = {
        name: _flow(name, _table(raw, f"flows.{name}"))
        for name, raw in _table(doc.get("flows", {}), "flows").items()
    }
    routes = {
        user: _route(user, _table(raw, f"routes.{user}"), flows, env)
        for user, raw in _table(doc.get("routes", {}), "routes").items()
    }
    if not routes:
        raise ConfigError("SIP routes: no [routes.<user>] table")
    realm = _text(doc.get("realm", DEFAULT_REALM), "realm", 128)
    if not realm or '"' in realm or "\\" in realm or not realm.isprintable():
        raise ConfigError("SIP routes: realm must be printable, without quotes or backslashes")
    algorithms = doc.get("digest_algorithms", list(DEFAULT_DIGEST_ALGORITHMS))
    if (
        not isinstance(algorithms, list)
        or not algorithms
        or len(set(algorithms)) != len(algorithms)
        or any(a not in DIGEST_ALGORITHMS for a in algorithms)
    ):
        raise ConfigError(f"SIP routes: digest_algorithms must list some of {DIGEST_ALGORITHMS}")
    return Routes(
        routes, trunks=_trunks(doc, env), realm=realm, digest_algorithms=tuple(algorithms)
    )


def load_routes(path: Path | None, env: Mapping[str, str] | None = None) -> Routes:
    """The routes file at ``path``, or the built-in demo routes."""
    if path is None:
        return parse_routes(DEFAULT_ROUTES, env)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"GATEWAY_SIP_ROUTES: cannot read {path}: {exc}") from None
    return parse_routes(text, env)
