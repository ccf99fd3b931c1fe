"""Prompts to keep warm in the engine's speech cache: what one is, and the prompts file.

A prompt is what a call would say, as the call would say it: the speech cache's key is
made of the voice, the normalized text, the speed, the language, the style instruction
and the output sample rate (the engine adds the backend and its model digest), so a
prompt is warm for a call only when those are the call's. ``format`` names the wire
format the calls use (its sample rate is what counts): ``mulaw_8000`` by default, the
rate of telephony (SIP, Twilio, AudioSocket).

The prompts file (``GATEWAY_SPEECH_CACHE_PROMPTS``) holds one JSON object a line::

    {"text": "Welcome to Acme Bank.", "voice": "en-us-joe"}
    {"text": "Please hold.", "voice": "en-us-joe", "speed": 1.1, "format": "pcm_16000"}
    {"text": "Bonjour.", "voice": "vc_0123456789abcdef", "tenant": "acme"}

Fields: ``text`` (required, at most ``max_text_chars``), ``voice`` (required; a
registered voice needs ``tenant``, the tenant allowed to use it), ``speed`` (0.25 to 4,
default 1), ``language``, ``instruct`` (at most :data:`MAX_INSTRUCT_CHARS`), ``format``,
``tenant``. Blank lines and lines starting with ``#`` are skipped. Any other field, a
line that is not a JSON object, a value out of range, or more than ``max_prompts`` lines
is a configuration error naming the line (the gateway does not start). A voice the
engine does not know is found only once the engine is up: that line is logged as an
error and skipped, the others are warmed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from engine.ipc.env import ConfigError
from engine.ipc.schema import MAX_INSTRUCT_CHARS
from gateway.formats import FORMATS

DEFAULT_FORMAT: Final = "mulaw_8000"
MAX_VOICE_CHARS: Final = 128
MAX_LANGUAGE_CHARS: Final = 32
MAX_TENANT_CHARS: Final = 128
MIN_SPEED: Final = 0.25
MAX_SPEED: Final = 4.0
#: The prompts file may not be larger than this (a line is at most a prompt's text).
MAX_FILE_BYTES: Final = 16 * 1024 * 1024
FIELDS: Final = frozenset({"text", "voice", "speed", "language", "instruct", "format", "tenant"})
#: The tenant of prompts that are nobody's: the prompts file's and the SIP flows' in
#: built-in voices (a built-in voice's cached speech serves every tenant).
SHARED_TENANT: Final = ""


class PromptError(ValueError):
    """A prompt the gateway refuses: ``code`` (an :class:`gateway.errors.ErrorCode`
    value), ``field`` (the field at fault, or None) and ``message``."""

    def __init__(self, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field


@dataclass(frozen=True, slots=True)
class PromptLimits:
    max_text_chars: int = 2000
    max_prompts: int = 1000  # per tenant (and lines of the prompts file)


@dataclass(frozen=True, slots=True)
class PromptSpec:
    """One prompt, as a call would speak it."""

    text: str
    voice: str
    speed: float = 1.0
    language: str | None = None
    instruct: str | None = None
    format: str = DEFAULT_FORMAT

    @property
    def sample_rate(self) -> int:
        return FORMATS[self.format].sample_rate

    def prompt_id(self, tenant: str) -> str:
        """A stable id: the same prompt of the same tenant always has the same one (so
        warming it again is answered with the entry that exists)."""
        canonical = json.dumps(
            [tenant, self.voice, self.text, self.speed, self.language, self.instruct,
             self.sample_rate],
            ensure_ascii=False,
            separators=(",", ":"),
        )  # fmt: skip
        return "sp_" + hashlib.sha256(canonical.encode()).hexdigest()[:20]

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "voice": self.voice,
            "speed": self.speed,
            "language": self.language,
            "instruct": self.instruct,
            "format": self.format,
        }


def _string(doc: Mapping[str, Any], name: str, limit: int, *, required: bool = False) -> str | None:
    value = doc.get(name)
    if value is None:
        if required:
            raise PromptError("invalid_field", f"{name!r} is required", name)
        return None
    if not isinstance(value, str):
        raise PromptError("invalid_field", f"{name!r} must be a string", name)
    if required and not value.strip():
        raise PromptError("invalid_field", f"{name!r} is empty", name)
    if len(value) > limit:
        code = "text_too_long" if name == "text" else "invalid_field"
        raise PromptError(code, f"{name!r} is over {limit} characters", name)
    return value


def parse_prompt(doc: object, limits: PromptLimits) -> tuple[PromptSpec, str | None]:
    """A prompt and its ``tenant`` field (None without one) from a decoded JSON object;
    raises :class:`PromptError`."""
    if not isinstance(doc, dict):
        raise PromptError("invalid_request", "a prompt must be a JSON object")
    unknown = sorted(set(doc) - FIELDS)
    if unknown:
        raise PromptError(
            "invalid_field",
            f"unknown field {unknown[0][:40]!r} (fields: {', '.join(sorted(FIELDS))})",
            unknown[0][:40],
        )
    text = _string(doc, "text", limits.max_text_chars, required=True)
    voice = _string(doc, "voice", MAX_VOICE_CHARS, required=True)
    assert text is not None and voice is not None
    speed = doc.get("speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, int | float):
        raise PromptError("invalid_speed", "'speed' must be a number", "speed")
    if not MIN_SPEED <= speed <= MAX_SPEED:
        raise PromptError(
            "invalid_speed", f"'speed' must be from {MIN_SPEED} to {MAX_SPEED}", "speed"
        )
    fmt = _string(doc, "format", 32) or DEFAULT_FORMAT
    if fmt not in FORMATS:
        raise PromptError(
            "unsupported_format", f"'format' must be one of {', '.join(sorted(FORMATS))}", "format"
        )
    spec = PromptSpec(
        text=text,
        voice=voice,
        speed=float(speed),
        language=_string(doc, "language", MAX_LANGUAGE_CHARS) or None,
        instruct=_string(doc, "instruct", MAX_INSTRUCT_CHARS) or None,
        format=fmt,
    )
    return spec, _string(doc, "tenant", MAX_TENANT_CHARS)


@dataclass(frozen=True, slots=True)
class DeclaredPrompt:
    """A prompt a leg kind will speak by itself (a SIP flow's step), declared so that it
    is warm before the first call: ``voice`` None is the engine's default voice (known
    once the engine is up); ``source`` says where it comes from, for the log."""

    source: str
    text: str
    voice: str | None = None
    format: str = DEFAULT_FORMAT


@dataclass(frozen=True, slots=True)
class PromptLine:
    """A prompt of the prompts file: where it is, whose it is."""

    line: int
    tenant: str
    spec: PromptSpec


def parse_prompts_file(
    text: str, limits: PromptLimits, source: str = "prompts file"
) -> list[PromptLine]:
    """Every prompt of a prompts file's ``text``; raises :class:`ConfigError` naming
    ``source`` and the line at fault."""
    prompts: list[PromptLine] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if len(prompts) >= limits.max_prompts:
            raise ConfigError(
                f"{source}, line {number}: more than {limits.max_prompts} prompts "
                "(GATEWAY_SPEECH_CACHE_MAX_PROMPTS)"
            )
        try:
            doc = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise ConfigError(f"{source}, line {number}: not JSON ({exc})") from None
        try:
            spec, tenant = parse_prompt(doc, limits)
        except PromptError as exc:
            raise ConfigError(f"{source}, line {number}: {exc.message}") from None
        prompts.append(PromptLine(number, tenant or SHARED_TENANT, spec))
    return prompts


def load_prompts_file(path: Path, limits: PromptLimits) -> list[PromptLine]:
    """The prompts of the file at ``path``; raises :class:`ConfigError` (unreadable, too
    large, not UTF-8, or a bad line)."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ConfigError(
                f"GATEWAY_SPEECH_CACHE_PROMPTS: {path} is over {MAX_FILE_BYTES} bytes"
            )
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"GATEWAY_SPEECH_CACHE_PROMPTS: cannot read {path}: {exc.strerror}"
        ) from None
    except UnicodeDecodeError:
        raise ConfigError(f"GATEWAY_SPEECH_CACHE_PROMPTS: {path} is not UTF-8") from None
    return parse_prompts_file(text, limits, str(path))


__all__ = [
    "DEFAULT_FORMAT",
    "SHARED_TENANT",
    "DeclaredPrompt",
    "PromptError",
    "PromptLimits",
    "PromptLine",
    "PromptSpec",
    "load_prompts_file",
    "parse_prompt",
    "parse_prompts_file",
]
