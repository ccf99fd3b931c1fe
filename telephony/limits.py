"""Limits the vendor protocol cores share (``telephony/twilio.py``, ``telephony/asterisk.py``).

Call ids (Twilio ``callSid``, ``streamSid`` and ``accountSid``; Asterisk ``connection_id``
and ``channel_id``) come from the vendor and travel on: into the gateway's call registry,
log lines, and the ``call_started``/``call_ended`` events an attached IVR application
receives, which must be able to name the call back (``{"type": "start", "call": ...}``).
Neither vendor documents a maximum length, so both cores bound them here, with one rule.

Twilio's sids are 34 characters, ``CA``/``MZ``/``AC`` and 32 hex digits (the REST API
reference's pattern for a Call sid is ``^CA[0-9a-fA-F]{32}$``); Asterisk's channel id is
the channel's uniqueid (``pbx1-123456789.999`` in the "WebSocket" channel driver page's
example) and ``connection_id`` a UUID or a configured name. Test tools and other vendors
send other shapes, so only the bound and the character rules are enforced, never a
vendor's exact shape.
"""

from __future__ import annotations

from typing import Final

__all__ = ["DTMF_DIGITS", "MAX_CALL_ID_CHARS", "MAX_ECHO_CHARS", "call_id_problem", "excerpt"]

#: The 16 DTMF tones (RFC 4733 telephone-events 0-15): what an IVR application may be told
#: a caller pressed. A core passes on whatever single character its vendor reports; the
#: gateway's telephony leg drops anything else (a peer's oddity is no reason to end a call).
DTMF_DIGITS: Final = frozenset("0123456789*#ABCD")

#: The longest call id accepted, in characters.
MAX_CALL_ID_CHARS: Final = 128
#: The most characters of remote input an error message quotes.
MAX_ECHO_CHARS: Final = 64


def call_id_problem(value: str) -> str | None:
    """Why ``value`` is not an acceptable call id, or None when it is.

    An id is 1..:data:`MAX_CALL_ID_CHARS` characters, every one printable in the sense of
    :meth:`str.isprintable` (no control, format, surrogate, private-use, unassigned or
    separator characters) and none of them a space: ids go into log lines and JSON, and
    plain-text vendor protocols split on whitespace.
    """
    if not value:
        return "is empty"
    if len(value) > MAX_CALL_ID_CHARS:
        return f"is {len(value)} characters, limit {MAX_CALL_ID_CHARS}"
    if not value.isprintable() or " " in value:
        return "has a control, whitespace or other non-printable character"
    return None


def excerpt(value: str) -> str:
    """``value`` quoted for an error message: at most :data:`MAX_ECHO_CHARS` characters of
    it, as ``repr`` writes them (so control characters and lone surrogates are escaped),
    with ``...`` when it was cut."""
    if len(value) <= MAX_ECHO_CHARS:
        return repr(value)
    return repr(value[:MAX_ECHO_CHARS]) + "..."
