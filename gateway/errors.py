"""Error codes and WebSocket close codes: the only place errors meet the wire.

Remote misbehaviour (a bad message, a bad token) and local failures (the engine is gone)
both end up as a :class:`SessionError` with a machine-readable ``code`` for the peer and
an optional close code; details go to the log, never to the peer.
"""

from __future__ import annotations

import enum


class CloseCode(enum.IntEnum):
    """WebSocket close codes used by the gateway (RFC 6455 section 7.4.1, IANA registry)."""

    NORMAL = 1000
    POLICY = 1008  # auth failures and protocol/policy violations
    TOO_BIG = 1009
    INTERNAL_ERROR = 1011
    TRY_AGAIN_LATER = 1013  # overloaded


class SessionError(Exception):
    """An error to report to the peer as ``{"type": "error", "code": ...}``.

    ``close_code`` None means the session goes on; otherwise it closes with that code.
    """

    def __init__(
        self,
        code: str,
        message: str,
        close_code: int | None = None,
        utterance_id: str | None = None,
        retry_after_ms: int | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.close_code = close_code
        self.utterance_id = utterance_id
        self.retry_after_ms = retry_after_ms


class ProtocolViolation(SessionError):
    """The peer sent something the protocol does not allow (remote misbehaviour)."""
