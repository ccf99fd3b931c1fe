"""What the vendor protocol cores (``telephony/twilio.py``, ``asterisk.py``,
``jambonz.py``, ``freeswitch.py``, ``audiosocket.py``) share: the shape of their errors
and typed reads of a decoded JSON object's fields. Each core keeps its own error codes (a
``StrEnum``) and its own error classes, derived from :class:`CoreError`: ``code`` for
machines, ``message`` for the log; its ``...ProtocolError`` is remote misbehaviour, its
``...UsageError`` local misuse."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

C = TypeVar("C", bound=enum.StrEnum)


class CoreError(Exception, Generic[C]):
    """Base of a core's errors: ``code`` for machines, ``message`` for the log."""

    def __init__(self, code: C, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class JsonFields(Generic[C]):
    """Typed reads of the fields of a decoded JSON object. ``path`` names the field in the
    error; a missing field raises ``error(missing, ...)``, one of the wrong type
    ``error(invalid, ...)`` (the core's protocol error)."""

    def __init__(self, error: Callable[[C, str], Exception], missing: C, invalid: C) -> None:
        self._error = error
        self._missing = missing
        self._invalid = invalid

    def get(self, obj: Mapping[str, Any], key: str, path: str) -> Any:
        if key not in obj:
            raise self._error(self._missing, f"{path} is missing")
        return obj[key]

    def string(self, obj: Mapping[str, Any], key: str, path: str) -> str:
        value = self.get(obj, key, path)
        if not isinstance(value, str):
            raise self._error(self._invalid, f"{path} must be a string")
        return value

    def object(self, obj: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
        value = self.get(obj, key, path)
        if not isinstance(value, dict):
            raise self._error(self._invalid, f"{path} must be an object")
        return value

    def integer(self, obj: Mapping[str, Any], key: str, path: str) -> int:
        value = self.get(obj, key, path)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._error(self._invalid, f"{path} must be an integer")
        return value
