"""Settings for every test: no test shares the engine's speech cache with another.

The speech cache (docs/speech-cache.md) is on by default, with a level shared by the
host's engines in a host directory. Tests that start engines (in-process servers,
``python -m engine`` under a gateway) would otherwise share cached audio with each other
and with earlier runs, and the tests that measure synthesis would measure the cache.
So it is off for every engine a test starts, unless the test turns it on with its own
directory (``ENGINE_SPEECH_CACHE=1`` and ``ENGINE_SPEECH_CACHE_DIR`` under ``tmp_path``),
as tests/engine/scheduler/test_speech_cache.py does.
"""

from __future__ import annotations

import os

os.environ["ENGINE_SPEECH_CACHE"] = "0"
