"""Log lines about one peer, rate-limited: a peer cannot make the gateway write its log.

A hostile or broken client that sends a malformed message per millisecond would
otherwise be answered by one log line each. :class:`PeerLog` lets a burst of
``burst`` lines through, then at most one line per ``interval_s / burst`` seconds on
average (a :class:`TokenBucket`); when lines were suppressed, the next line that passes
says how many. :class:`RateLimitFilter` does the same for a whole library logger
(aiohttp logs every malformed HTTP request with a traceback).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

DEFAULT_BURST = 10
DEFAULT_INTERVAL_S = 10.0


class TokenBucket:
    """``burst`` tokens, refilled at ``burst / interval_s`` per second."""

    def __init__(
        self,
        burst: int = DEFAULT_BURST,
        interval_s: float = DEFAULT_INTERVAL_S,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._burst = float(burst)
        self._rate = burst / interval_s
        self._tokens = float(burst)
        self._clock = clock
        self._last = clock()
        self.suppressed = 0  # takes refused since the last one granted

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._last) * self._rate)
        self._last = now
        if self._tokens < 1.0:
            self.suppressed += 1
            return False
        self._tokens -= 1.0
        return True


class PeerLog:
    def __init__(
        self,
        logger: logging.Logger,
        peer: str,
        *,
        burst: int = DEFAULT_BURST,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._peer = peer
        self._bucket = TokenBucket(burst, interval_s, clock=clock)

    @property
    def suppressed(self) -> int:
        return self._bucket.suppressed

    def info(self, message: str, *args: object) -> None:
        self.log(logging.INFO, message, *args)

    def warning(self, message: str, *args: object) -> None:
        self.log(logging.WARNING, message, *args)

    def log(self, level: int, message: str, *args: object) -> None:
        if not self._logger.isEnabledFor(level):
            return
        suppressed = self._bucket.suppressed
        if not self._bucket.take():
            return
        if suppressed:
            message += f" ({suppressed} earlier line(s) about this peer suppressed)"
            self._bucket.suppressed = 0
        self._logger.log(level, "%s: " + message, self._peer, *args)


class RateLimitFilter(logging.Filter):
    """Lets a burst of records through, then about one per ``interval_s / burst``
    seconds; the next record that passes after a gap says how many were dropped."""

    def __init__(self, burst: int = DEFAULT_BURST, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        super().__init__()
        self._bucket = TokenBucket(burst, interval_s)

    def filter(self, record: logging.LogRecord) -> bool:
        suppressed = self._bucket.suppressed
        if not self._bucket.take():
            return False
        if suppressed:
            record.msg = f"{record.msg} ({suppressed} similar record(s) suppressed)"
            self._bucket.suppressed = 0
        return True
