"""The speech cache (issue 27, made private per tenant by issue 34): synthesized segments
by everything that changes their audio and whose they are, in an in-process LRU and a
level shared by the host's engines (a directory) or by every instance (Redis), named and
sealed under a deployment secret. See docs/speech-cache.md."""

from engine.speech_cache.cache import SpeechCache, open_speech_cache
from engine.speech_cache.key import SHARED_SCOPE, SegmentKey, tenant_scope
from engine.speech_cache.settings import SpeechCacheSettings
from engine.speech_cache.value import MAX_PCM_BYTES, CachedSegment

__all__ = [
    "MAX_PCM_BYTES",
    "SHARED_SCOPE",
    "CachedSegment",
    "SegmentKey",
    "SpeechCache",
    "SpeechCacheSettings",
    "open_speech_cache",
    "tenant_scope",
]
