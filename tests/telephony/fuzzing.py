"""What the fuzz targets of the telephony cores share: settings and generic mutations.

``test_twilio_fuzz.py`` and ``test_asterisk_fuzz.py`` build documented messages of their
vendor and damage them with what is here: values wrong in interesting ways
(:class:`BadValues`, shared bases plus a core's own), JSON documents with members dropped,
replaced or mutated (:func:`corrupted`, :func:`mutated`), serialization with deep nesting
spliced in (:func:`serialized`), text cut, poked or padded (:func:`damaged`), and raw text
(:func:`raw_texts`), and SDP connection addresses of every family (:func:`sdp_addresses`).
Nothing here knows a vendor: what differs by core is passed in.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from typing import Any, Final

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

__all__ = [
    "FUZZ",
    "JSON_VALUES",
    "MAX_ERROR_CHARS",
    "NESTING",
    "BadValues",
    "assert_loggable",
    "corrupted",
    "damaged",
    "mutated",
    "raw_texts",
    "sdp_addresses",
    "serialized",
    "texts",
]

#: Deterministic and bounded: every run fuzzes the same examples, in a few seconds.
FUZZ: Final = settings(
    max_examples=250,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

MAX_ERROR_CHARS: Final = 1024  # "stay short": messages quote at most 64 input characters

#: Nesting depths for deep-nesting inputs: up to 6,000, past Python's recursion limit.
NESTING: Final = st.integers(1, 6000)


def assert_loggable(message: str, code: object) -> None:
    """An error message stays short and printable: the gateway logs it on one line, with
    the input quoted by ``repr``."""
    assert len(message) <= MAX_ERROR_CHARS, code
    assert message.isprintable(), (code, message)


# --------------------------------------------------------------------------- text

#: Any character, lone surrogates included, and the ones that matter to JSON, to ids and
#: to the plain-text ``key:value`` format.
CHARS: Final = (
    st.characters()
    | st.characters(categories=["Cs"])
    | st.sampled_from(list('\x00\t\n\r :\x7f\x85\xa0\u2028\u200b\ufeff{}[],"\\é问😀'))
)


def texts(max_size: int) -> st.SearchStrategy[str]:
    return st.text(CHARS, max_size=max_size)


@st.composite
def damaged(draw: st.DrawFn, text: str) -> str:
    """``text`` mostly as it is, else cut short, with a character or so changed, or after
    up to 70,000 characters of padding."""
    damage = draw(st.sampled_from(("none",) * 6 + ("cut", "poke", "pad")))
    if damage == "cut":
        text = text[: draw(st.integers(0, len(text)))]
    elif damage == "poke":
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(texts(3)) + text[at + 1 :]
    elif damage == "pad":
        text = (
            draw(st.sampled_from([" ", "\n", "\ufeff", "\x00"])) * draw(st.integers(1, 70_000))
            + text
        )
    return text


#: Texts any text protocol must refuse whole.
_RAW_WORDS: Final = ["", " ", "null", "[]", "{}", "1", "NaN", "{" * 3]


def raw_texts(
    *, words: Iterable[str], nested_in: str, extras: Iterable[st.SearchStrategy[str]] = ()
) -> st.SearchStrategy[str]:
    """Raw text: random characters, random bytes decoded every way a broken transport
    might, deep nesting on its own and as the value of the member that ``nested_in`` opens
    (e.g. ``'{"event":"start","start":'``), short texts of the core's own (``words``) and
    of any protocol, and the core's ``extras``."""
    return st.one_of(
        texts(200),
        st.binary(max_size=200).map(lambda b: b.decode("utf-8", "surrogateescape")),
        st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
        NESTING.map(lambda n: "[" * n),
        NESTING.map(lambda n: "{" * n),
        NESTING.map(lambda n: '{"event":' * n),
        NESTING.map(lambda n: nested_in + "[" * n + "]" * n + "}"),
        *extras,
        st.sampled_from([*_RAW_WORDS, *words]),
    )


# --------------------------------------------------------------------------- values

#: A placeholder that :func:`serialized` turns into deep nesting, and how json writes it
#: ("\x00" as "\u0000" whether or not it escapes non-ASCII).
_DEEP: Final = "\x00DEEP\x00"
_DEEP_JSON: Final = '"\\u0000DEEP\\u0000"'

#: Values that are wrong in interesting ways, by the kind of value they replace, so a
#: corrupted member is mostly wrong in a way its parser must notice: decimal strings too
#: long for int() (4,300 digits), not ASCII, signed or spaced; ids around the
#: 128-character bound, with control, space, format or surrogate characters; numbers out
#: of every range; containers empty, nested, with odd members, or deep nesting.
_BAD_DECIMALS: Final[tuple[Any, ...]] = (
    "",
    "-1",
    "+1",
    " 1",
    "1.5",
    "٣",
    "0" * 25,
    "9" * 21,
    "9" * 4_301,
    "9" * 9_000,
)
_BAD_TEXTS: Final[tuple[Any, ...]] = (
    "",
    " ",
    "a b",
    "\t",
    "\x7f",
    "\u2028",
    "\ud800",
    "\u200b",
    "\xa0",
    "问候",
    "x" * 128,
    "x" * 129,
    "x" * 10_000,
    "x" * 70_000,
)
_BAD_NUMBERS: Final[tuple[Any, ...]] = (
    2**64,
    2**63,
    -(2**63) - 1,
    -1,
    0,
    1e308,
    float("nan"),
    True,
    None,
)
_BAD_CONTAINERS: Final[tuple[Any, ...]] = ([], {}, [[[]]], {"": None}, {"A": 1}, _DEEP)


class BadValues:
    """Wrong values by kind: the shared bases above plus a core's own (its ids' prefixes,
    its separators, its limits, its numbers as strings)."""

    def __init__(
        self,
        *,
        decimals: Iterable[Any] = (),
        texts: Iterable[Any] = (),
        numbers: Iterable[Any] = (),
        containers: Iterable[Any] = (),
    ) -> None:
        kinds = [
            [*_BAD_DECIMALS, *decimals],
            [*_BAD_TEXTS, *texts],
            [*_BAD_NUMBERS, *numbers],
            [*_BAD_CONTAINERS, *containers],
        ]
        # deepcopy: a fresh [] each time, as corrupted() may mutate it
        self.nasty: Final[st.SearchStrategy[Any]] = st.sampled_from(
            [value for kind in kinds for value in kind]
        ).map(copy.deepcopy)
        self._decimals, self._texts, self._numbers, self._containers = (
            st.sampled_from(kind).map(copy.deepcopy) | self.nasty for kind in kinds
        )

    def nasty_for(self, value: Any) -> st.SearchStrategy[Any]:
        """Wrong values for a member that holds ``value`` now."""
        if isinstance(value, str) and value.isdigit():
            return self._decimals
        if isinstance(value, str):
            return self._texts
        if isinstance(value, int | float):
            return self._numbers
        return self._containers


SCALARS: Final[st.SearchStrategy[Any]] = (
    st.none() | st.booleans() | st.integers() | st.floats() | texts(12)
)
JSON_VALUES: Final[st.SearchStrategy[Any]] = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts(6), inner, max_size=3),
    max_leaves=6,
)


# --------------------------------------------------------------------------- documents


@st.composite
def mutated(draw: st.DrawFn, value: Any, bad: BadValues) -> Any:
    """``value`` with members kept, dropped, replaced or mutated recursively."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, member in value.items():
            op = draw(st.sampled_from(("keep",) * 6 + ("mutate", "drop", "replace")))
            if op == "keep":
                out[key] = member
            elif op == "mutate":
                out[key] = draw(mutated(member, bad))
            elif op == "replace":
                out[key] = draw(bad.nasty | JSON_VALUES)
        for key in draw(st.lists(texts(8) | st.sampled_from(list(value)), max_size=2)):
            out[key] = draw(bad.nasty | JSON_VALUES)
        return out
    if isinstance(value, list):
        return [draw(mutated(v, bad)) for v in value] + draw(st.lists(bad.nasty, max_size=2))
    return draw(bad.nasty | JSON_VALUES | st.just(value))


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every member of ``value`` (dict keys, list indexes, at any depth) as a path."""
    if isinstance(value, dict):
        members: list[tuple[Any, Any]] = list(value.items())
    elif isinstance(value, list):
        members = list(enumerate(value))
    else:
        return []
    found: list[tuple[Any, ...]] = []
    for key, member in members:
        found.append((*prefix, key))
        found.extend(_paths(member, (*prefix, key)))
    return found


@st.composite
def corrupted(draw: st.DrawFn, doc: dict[str, Any], bad: BadValues) -> dict[str, Any]:
    """``doc`` with one or two members dropped, replaced, or joined by an extra one."""
    doc = copy.deepcopy(doc)
    for _ in range(draw(st.integers(1, 2))):
        paths = _paths(doc)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent: Any = doc
        for key in path[:-1]:
            parent = parent[key]
        op = draw(st.sampled_from(("nasty", "nasty", "nasty", "random", "drop", "extra")))
        if op == "drop":
            del parent[path[-1]]
        elif op == "extra" and isinstance(parent, dict):
            parent[draw(texts(8))] = draw(bad.nasty | JSON_VALUES)
        elif op == "nasty":
            parent[path[-1]] = draw(bad.nasty_for(parent[path[-1]]))
        else:
            parent[path[-1]] = draw(JSON_VALUES)
    return doc


@st.composite
def serialized(draw: st.DrawFn, doc: Any) -> str:
    """``doc`` as JSON, non-ASCII escaped or not, each deep-nesting placeholder in it
    replaced by up to 6,000 levels of ``[]``."""
    text = json.dumps(doc, ensure_ascii=draw(st.booleans()))
    depth = draw(NESTING)
    return text.replace(_DEEP_JSON, "[" * depth + "]" * depth)


# --------------------------------------------------------------------------- SDP addresses

_IP4: Final = ["127.0.0.1", "127.0.0.9", "192.0.2.1", "0.0.0.0", "255.255.255.255", "224.2.1.1"]
_IP6: Final = [
    "::1",
    "::",
    "2001:db8::1",
    "::ffff:127.0.0.1",  # IPv4-mapped
    "::127.0.0.1",
    "fe80::1%eth0",  # a zone
    "ff02::1",  # multicast
    "2001:DB8:0:0:0:0:0:1",
]
_NAMES: Final = [
    "localhost",
    "host.example",
    "127.0.0.1.nip.io",
    "a" * 300,
    "xn--bcher-kva.example",
]


@st.composite
def sdp_addresses(draw: st.DrawFn) -> tuple[str, str]:
    """``(addrtype, address)`` for a ``c=`` line (RFC 4566 5.7): IPv4 and IPv6 literals
    (unspecified, loopback, mapped, zoned, multicast), host names, literals under the
    other family's addrtype, unknown addrtypes, multicast suffixes and junk."""
    family = draw(st.sampled_from(("IP4", "IP6", "name", "swapped", "unknown", "junk")))
    if family == "IP4":
        address = draw(st.sampled_from(_IP4) | st.ip_addresses(v=4).map(str))
        return "IP4", address + draw(st.sampled_from(["", "", "/127", "/1/2", "/"]))
    if family == "IP6":
        address = draw(st.sampled_from(_IP6) | st.ip_addresses(v=6).map(str))
        return "IP6", address + draw(st.sampled_from(["", "", "/3", "/"]))
    if family == "name":
        return draw(st.sampled_from(("IP4", "IP6"))), draw(st.sampled_from(_NAMES))
    if family == "swapped":
        return draw(st.sampled_from([("IP4", a) for a in _IP6] + [("IP6", a) for a in _IP4]))
    if family == "unknown":
        addrtype = draw(st.sampled_from(["IP5", "ip4", "Ip6", "X", "", "IP4 IP4"]))
        return addrtype, draw(st.sampled_from(_IP4 + _IP6))
    return draw(st.sampled_from(("IP4", "IP6"))), draw(texts(12))
