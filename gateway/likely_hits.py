"""Which utterances the engine's speech cache is likely to serve: the gateway's guess,
learned from the engine's own answers (``UtteranceAudio.cache``).

The admission gate queues new utterances while the engine's synthesis is slow
(:mod:`gateway.admission`). An utterance the engine will answer from its speech cache
costs no synthesis and is served in milliseconds, so it should not wait behind
synthesis at the gateway either (issue 27, item 5); but whether it hits is known only
once the engine has answered. This keeps, per gateway worker, the utterances (voice,
speed, instruction and first text) whose last first audio was a hit: the next one with
the same key is dispatched at once. A miss, or an engine without a cache, forgets the
key, so a wrong guess costs one utterance's place in the queue, never more. Bounded
(LRU, ``capacity`` keys) and aged (``ttl_s``). The guess changes only when an utterance
is dispatched, never what it sounds like.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

DEFAULT_CAPACITY: Final = 4096
DEFAULT_TTL_S: Final = 600.0


#: The tenant of the operator's shared prompts in :func:`likely_hit_key`: no tenant's name
#: (those are never empty).
SHARED: Final = ""


def likely_hit_key(tenant: str, voice: str, speed: float, instruct: str | None, text: str) -> str:
    """The key of an utterance as its first text reaches the gateway: its tenant's own
    (the engine's cache is scoped by tenant, so another tenant's hit says nothing of
    this one's), or :data:`SHARED` for a prompt the operator declared."""
    raw = "\0".join((tenant, voice, f"{speed:.4f}", instruct or "", text))
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


class LikelyHits:
    def __init__(
        self,
        capacity: int = DEFAULT_CAPACITY,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity < 1 or ttl_s <= 0:
            raise ValueError("capacity must be at least 1 and ttl_s positive")
        self._capacity = capacity
        self._ttl_s = ttl_s
        self._clock = clock
        self._hits: OrderedDict[str, float] = OrderedDict()  # key -> when it last hit

    def __len__(self) -> int:
        return len(self._hits)

    def likely(self, key: str) -> bool:
        """The last first audio of ``key`` came from the cache, within ``ttl_s``."""
        seen = self._hits.get(key)
        if seen is None:
            return False
        if self._clock() - seen > self._ttl_s:
            del self._hits[key]
            return False
        return True

    def observe(self, keys: tuple[str, ...], cache: str) -> None:
        """The engine's answer for an utterance of ``keys`` (its tenant's own key first,
        then the shared prompts'): "hit", "join", "miss" or "". A hit marks its own key; a
        miss forgets them all (a shared prompt evicted is no longer likely either); a join
        (another stream's synthesis of it, in flight) says nothing yet."""
        if cache == "join":
            return
        if cache != "hit":
            for key in keys:
                self._hits.pop(key, None)
            return
        if keys:
            self.remember(keys[0])

    def remember(self, key: str) -> None:
        """``key`` is likely a hit from now on (a prompt warmed, an answer seen)."""
        self._hits[key] = self._clock()
        self._hits.move_to_end(key)
        while len(self._hits) > self._capacity:
            self._hits.popitem(last=False)
