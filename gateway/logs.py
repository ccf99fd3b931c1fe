"""Log set-up for the gateway process: no part of a token in any log line.

Tokens travel in ``Authorization`` headers (Bearer, or Basic for Asterisk), in
``access_token``/``token`` query parameters and in Twilio custom parameters. Our own
code never logs them, but libraries do in their error paths: aiohttp, for one, puts the
first 100 bytes of an over-long request or header line into its exception message, which
it logs with the traceback. :class:`RedactingFormatter` therefore redacts the *formatted*
record, traceback included, so every logger and every error path is covered.
"""

from __future__ import annotations

import logging
import re

from gateway.peer_log import RateLimitFilter

REDACTED = "[redacted]"

_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # Authorization: Bearer <token> / Basic <base64 of user:token>
    (re.compile(r"(?i)\b(bearer|basic)(\s+|%20|\+)[^\s\"',;\\]+"), rf"\1\2{REDACTED}"),
    # access_token=..., token=... in a query string or form body (also percent-encoded =)
    (
        re.compile(r"(?i)\b((?:access_token|access%5ftoken|token)(?:=|%3d))[^&\s\"'\\]+"),
        rf"\1{REDACTED}",
    ),
    # "token": "..." in JSON (Twilio customParameters)
    (re.compile(r"(?i)(\"token\"\s*:\s*\")[^\"]*"), rf"\1{REDACTED}"),
    # Anything shaped like a JWT (base64url JSON header "eyJ..."), whole or truncated
    (re.compile(r"eyJ[A-Za-z0-9_-]{2,}(?:\.[A-Za-z0-9_-]*){0,2}"), REDACTED),
)


def redact(text: str) -> str:
    """``text`` with every token-like value replaced by ``[redacted]``."""
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


class RedactingFormatter(logging.Formatter):
    """A :class:`logging.Formatter` whose output never contains a token."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


#: Loggers that write a line (with a traceback) per malformed request from anyone:
#: rate-limited, so that bad requests cannot flood the log.
RATE_LIMITED_LOGGERS = ("aiohttp.server", "aiohttp.web_protocol")


def configure(level: str, fmt: str) -> None:
    """Root logging to stderr at ``level`` through :class:`RedactingFormatter`; the
    :data:`RATE_LIMITED_LOGGERS` rate-limited."""
    logging.basicConfig(level=level.upper(), format=fmt)
    formatter = RedactingFormatter(fmt)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter)
    for name in RATE_LIMITED_LOGGERS:
        logging.getLogger(name).addFilter(RateLimitFilter())
