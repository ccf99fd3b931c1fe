"""Error codes and WebSocket close codes: the only place errors meet the wire.

Remote misbehaviour (a bad message, a bad token) and local failures (the engine is gone)
both end up as a :class:`SessionError` with a machine-readable ``code`` for the peer and
an optional close code; details go to the log, never to the peer.
"""

from __future__ import annotations

import enum
from typing import NewType


class CloseCode(enum.IntEnum):
    """WebSocket close codes used by the gateway (RFC 6455 section 7.4.1, IANA registry)."""

    NORMAL = 1000
    POLICY = 1008  # auth failures and protocol/policy violations
    TOO_BIG = 1009
    INTERNAL_ERROR = 1011
    TRY_AGAIN_LATER = 1013  # overloaded


class ErrorCode(enum.StrEnum):
    """Every error code a client can see, in ``error`` events and HTTP error bodies.

    One list, documented in docs/protocol.md (a test checks that each member is). Codes
    of the vendor protocol cores are ``<protocol>_<core code>`` (:func:`vendor_code`);
    codes the engine reports come through :meth:`from_engine`.
    """

    # authentication (gateway/auth.py raises these values)
    TOKEN_MISSING = "token_missing"
    TOKEN_MALFORMED = "token_malformed"
    TOKEN_EXPIRED = "token_expired"
    TOKEN_INVALID = "token_invalid"
    TOKEN_CLAIMS = "token_claims"
    INSUFFICIENT_SCOPE = "insufficient_scope"
    # connection and wire format
    WEBSOCKET_REQUIRED = "websocket_required"
    TOO_MANY_CONNECTIONS = "too_many_connections"
    START_TIMEOUT = "start_timeout"
    MESSAGE_TOO_BIG = "message_too_big"
    INVALID_JSON = "invalid_json"
    UNKNOWN_TYPE = "unknown_type"
    INVALID_MESSAGE = "invalid_message"
    TOO_MANY_ERRORS = "too_many_errors"
    INTERNAL_ERROR = "internal_error"
    NOT_FOUND = "not_found"
    FORBIDDEN = "forbidden"  # /metrics to a client GATEWAY_METRICS_* does not name
    # session
    NOT_STARTED = "not_started"
    ALREADY_STARTED = "already_started"
    UNSUPPORTED_FORMAT = "unsupported_format"
    UNKNOWN_VOICE = "unknown_voice"
    TEXT_TOO_LONG = "text_too_long"
    QUEUE_FULL = "queue_full"
    UNEXPECTED_BINARY = "unexpected_binary"
    INVALID_AUDIO = "invalid_audio"
    CLOSING = "closing"
    UNKNOWN_UTTERANCE = "unknown_utterance"
    IDLE_TIMEOUT = "idle_timeout"
    # capacity and limits
    OVERLOADED = "overloaded"
    QUEUE_TIMEOUT = "queue_timeout"
    TENANT_LIMIT = "tenant_limit"
    LIMITS_UNAVAILABLE = "limits_unavailable"
    LEASE_LOST = "lease_lost"
    SHUTTING_DOWN = "shutting_down"
    # the engine
    ENGINE_UNAVAILABLE = "engine_unavailable"
    ENGINE_ERROR = "engine_error"
    BACKEND_ERROR = "backend_error"
    INVALID_SPEED = "invalid_speed"
    INVALID_VOICE_PROFILE = "invalid_voice_profile"
    CUDA_OOM = "cuda_oom"  # a GPU backend ran out of device memory for a batch
    INSTRUCT_UNSUPPORTED = "instruct_unsupported"  # the voice's backend takes no instruction
    # telephony calls
    NOT_ATTACHED = "not_attached"
    UNKNOWN_CALL = "unknown_call"
    CALL_NOT_ACTIVE = "call_not_active"
    CALL_ID_IN_USE = "call_id_in_use"
    CALL_LOST = "call_lost"
    MARK_BACKLOG_FULL = "mark_backlog_full"
    # voices (HTTP)
    INVALID_REQUEST = "invalid_request"
    INVALID_FIELD = "invalid_field"
    INVALID_NAME = "invalid_name"
    UNSUPPORTED_LANGUAGE = "unsupported_language"
    VOICE_CLONING_UNSUPPORTED = "voice_cloning_unsupported"
    VOICE_UNAVAILABLE = "voice_unavailable"
    STORAGE_UNAVAILABLE = "storage_unavailable"
    TOO_MANY_UPLOADS = "too_many_uploads"
    UPLOAD_TIMEOUT = "upload_timeout"
    UPLOAD_UNAVAILABLE = "upload_unavailable"
    REQUEST_TOO_LARGE = "request_too_large"
    AUDIO_TOO_LARGE = "audio_too_large"
    AUDIO_TOO_SHORT = "audio_too_short"
    AUDIO_TOO_LONG = "audio_too_long"
    AUDIO_CLIPPED = "audio_clipped"
    NO_SPEECH = "no_speech"
    TRANSCRIPT_REQUIRED = "transcript_required"  # the backend conditions on what it says
    # the speech cache's warm prompts (HTTP)
    SPEECH_CACHE_OFF = "speech_cache_off"  # the engine runs without a speech cache
    TOO_MANY_PROMPTS = "too_many_prompts"  # GATEWAY_SPEECH_CACHE_MAX_PROMPTS per tenant

    @classmethod
    def from_engine(cls, code: str) -> ErrorCode:
        """A code the engine reported over IPC; one this gateway does not know (a newer
        engine) is ``engine_error``."""
        try:
            return cls(code)
        except ValueError:
            return cls.ENGINE_ERROR


VendorCode = NewType("VendorCode", str)
"""``<protocol>_<code>``: a vendor protocol core's error (``twilio_invalid_json``)."""


def vendor_code(protocol: str, code: str) -> VendorCode:
    return VendorCode(f"{protocol}_{code}")


class IllegalTransition(RuntimeError):
    """A bug: a state machine (a session, the engine supervisor) was driven into a state
    its transition table does not allow from where it is."""


class SessionError(Exception):
    """An error to report to the peer as ``{"type": "error", "code": ...}``.

    ``close_code`` None means the session goes on; otherwise it closes with that code.
    """

    def __init__(
        self,
        code: ErrorCode | VendorCode,
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
