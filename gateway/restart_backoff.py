"""How long a supervisor waits before starting a process that exited unasked again: the
engine (gateway/engine_supervisor.py) and the host's gateway workers (gateway/workers.py).

Sans-I/O: the caller says how long the last run lasted and sleeps the answer. The wait
doubles from ``initial_s`` up to ``max_s`` while runs keep failing, and starts over after
a run that lasted ``stable_after_s`` (a crash after a long healthy run restarts at once,
a crash loop does not spin).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RestartBackoff:
    initial_s: float = 0.2
    max_s: float = 5.0
    stable_after_s: float = 30.0
    _next_s: float = field(default=0.0, init=False, repr=False)

    def __post_init__(self) -> None:
        self._next_s = self.initial_s

    def after_exit(self, ran_for_s: float) -> float:
        """Seconds to wait before the next start, after a run of ``ran_for_s``."""
        if ran_for_s > self.stable_after_s:
            self._next_s = self.initial_s
        delay = self._next_s
        self._next_s = min(self._next_s * 2, self.max_s)
        return delay
