"""The speech cache (issue 27): synthesized segments by everything that changes their
audio, in an in-process LRU and a level shared by the host's engines (a directory) or by
every instance (Redis). See docs/speech-cache.md."""

from engine.speech_cache.cache import SpeechCache, open_speech_cache
from engine.speech_cache.key import SegmentKey
from engine.speech_cache.settings import SpeechCacheSettings
from engine.speech_cache.value import MAX_PCM_BYTES, CachedSegment

__all__ = [
    "MAX_PCM_BYTES",
    "CachedSegment",
    "SegmentKey",
    "SpeechCache",
    "SpeechCacheSettings",
    "open_speech_cache",
]
