"""A lane's pace as a line: the wall seconds of one call are a fixed cost plus a cost per
character of its (longest) segment, fitted to the calls the lane has run, the newest
weighing most (sans-I/O, no clock).

Why a line and not seconds per character alone: a call pays for more than its characters
(a model's text front, its session's set-up, a leading piece decoded first). Kokoro's
Mandarin on two workers (an eight-call run, machine G of docs/kokoro.md) took 0.8-0.9 s for
a 4-character segment and 2.4-2.9 s for 20-22: seconds per character priced the short
ones at up to 1.66 times less than they took (a segment that follows a short clause is
the one a caller waits on), the long ones at up to 1.6 times more; the fitted line
(0.40 s + 0.11 s per character) was off by at most 1.16 times either way.

The fit is weighted least squares with exponential forgetting (:data:`FIT_WEIGHT` for
the newest call). While the calls seen are of one length, or the line would cost a
call less than nothing, or longer calls cheaper, it falls back to seconds per character
through the origin (what the lane priced before). And no call is priced below the
fastest the fit has seen (:attr:`PaceFit.fastest`): through the origin, the short
segments of the first calls were priced at half what they took (a Kokoro segment of
three Mandarin characters, 0.53 s where it took 0.98 s on a slow CPU: it came late)."""

from __future__ import annotations

from dataclasses import dataclass

#: Weight of the newest call in the fit's running moments (about the last ten calls).
FIT_WEIGHT = 0.1
#: The calls' lengths must spread by this fraction of their mean (a standard deviation)
#: before the fit takes a fixed cost from them.
MIN_SPREAD = 0.15


@dataclass
class PaceFit:
    """Running moments of the calls a lane ran: characters ``x``, wall seconds ``y``."""

    calls: int = 0
    mean_x: float = 0.0
    mean_y: float = 0.0
    mean_xx: float = 0.0
    mean_xy: float = 0.0
    fastest: float = 0.0  # the least wall seconds a call took (0 before any)

    def observe(self, chars: int, seconds: float) -> None:
        """One call of ``chars`` characters took ``seconds``."""
        if chars <= 0 or seconds < 0.0:
            return
        self.fastest = seconds if self.calls == 0 else min(self.fastest, seconds)
        x, y = float(chars), seconds
        w = 1.0 if self.calls == 0 else FIT_WEIGHT
        self.mean_x += w * (x - self.mean_x)
        self.mean_y += w * (y - self.mean_y)
        self.mean_xx += w * (x * x - self.mean_xx)
        self.mean_xy += w * (x * y - self.mean_xy)
        self.calls += 1

    def line(self) -> tuple[float, float]:
        """(seconds per call, seconds per character); (0, 0) before any call."""
        if self.calls == 0 or self.mean_x <= 0.0:
            return 0.0, 0.0
        through_origin = self.mean_y / self.mean_x
        variance = self.mean_xx - self.mean_x**2
        if self.calls < 3 or variance < (MIN_SPREAD * self.mean_x) ** 2:
            return 0.0, through_origin
        per_char = (self.mean_xy - self.mean_x * self.mean_y) / variance
        per_call = self.mean_y - per_char * self.mean_x
        if per_char <= 0.0 or per_call < 0.0:
            return 0.0, through_origin
        return per_call, per_char
