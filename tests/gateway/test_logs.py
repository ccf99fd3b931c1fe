"""Token redaction in every log line (gateway/logs.py)."""

from __future__ import annotations

import logging

import pytest

from gateway.auth import mint_token
from gateway.logs import REDACTED, RedactingFormatter, redact

TOKEN = mint_token(secret="x" * 40, subject="alice", tenant="acme")


@pytest.mark.parametrize(
    "line",
    [
        f"GET /v1/stream?access_token={TOKEN} HTTP/1.1",
        f"GET /v1/stream?voice=en&access_token={TOKEN}&x=1",
        f"GET /v1/stream?Access%5FToken={TOKEN}",
        f"Authorization: Bearer {TOKEN}",
        f"authorization: bearer {TOKEN[:100]}...",
        "Authorization: Basic YXN0ZXJpc2s6c2VjcmV0LXRva2Vu",
        f"b'GET /v1/stream?access_token={TOKEN[:60]}...'",
        f'{{"customParameters": {{"token": "{TOKEN}"}}}}',
        f"token={TOKEN}",
        f"some text {TOKEN} more",
        f"truncated {TOKEN[:30]}",
    ],
)
def test_no_part_of_a_token_survives(line: str) -> None:
    out = redact(line)
    assert REDACTED in out
    for part in TOKEN.split("."):
        assert part[:12] not in out
    assert "YXN0ZXJpc2s6" not in out


def test_other_text_is_kept_byte_for_byte() -> None:
    line = 'session 1a2b "GET /v1/voices?x=1" 200 3.1ms tokens=3 basically fine'
    assert redact(line) == line


def test_the_formatter_redacts_tracebacks_too() -> None:
    try:
        raise ValueError(f"Got more than 8190 bytes when reading: b'Bearer {TOKEN[:90]}...'")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), None)
        import sys

        record.exc_info = sys.exc_info()
    text = RedactingFormatter("%(message)s").format(record)
    assert "Traceback" in text and TOKEN.split(".")[1][:12] not in text
