"""Log lines about one peer, rate-limited: a peer cannot make the gateway write its log.

A hostile or broken client that sends a malformed message per millisecond would
otherwise be answered by one log line each. :class:`PeerLog` lets a burst of
``burst`` lines through, then at most one line per ``interval_s / burst`` seconds on
average (a token bucket); when lines were suppressed, the next line that passes says
how many.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

DEFAULT_BURST = 10
DEFAULT_INTERVAL_S = 10.0


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
        self._burst = float(burst)
        self._rate = burst / interval_s  # tokens per second
        self._tokens = float(burst)
        self._clock = clock
        self._last = clock()
        self.suppressed = 0

    def info(self, message: str, *args: object) -> None:
        self.log(logging.INFO, message, *args)

    def warning(self, message: str, *args: object) -> None:
        self.log(logging.WARNING, message, *args)

    def log(self, level: int, message: str, *args: object) -> None:
        if not self._logger.isEnabledFor(level):
            return
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._last) * self._rate)
        self._last = now
        if self._tokens < 1.0:
            self.suppressed += 1
            return
        self._tokens -= 1.0
        if self.suppressed:
            message += f" ({self.suppressed} earlier line(s) about this peer suppressed)"
            self.suppressed = 0
        self._logger.log(level, "%s: " + message, self._peer, *args)
