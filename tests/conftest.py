"""Settings for every test: no test shares the engine's speech cache with another.

The speech cache (docs/speech-cache.md) is on by default, with a level shared by the
host's engines in a host directory. Tests that start engines (in-process servers,
``python -m engine`` under a gateway) would otherwise share cached audio with each other
and with earlier runs, and the tests that measure synthesis would measure the cache.
So it is off for every engine a test starts, unless the test turns it on with its own
directory (``ENGINE_SPEECH_CACHE=1`` and ``ENGINE_SPEECH_CACHE_DIR`` under ``tmp_path``),
as tests/engine/scheduler/test_speech_cache.py does. The cache's default private places
(its directory, ``~/.cache/ivr-gateway/speech-cache``, and the secret that names and seals
its shared entries, ``~/.local/state/ivr-gateway/speech-cache.secret``) are moved to a
temporary folder of this test process (``XDG_CACHE_HOME``, ``XDG_STATE_HOME``), so no test
writes into the home directory.

The test process's own garbage collector is kept from the measurements: collecting the
suite imports every test module (torch, transformers, onnxruntime, ...: some 470,000
objects), and a full collection over them took 250 ms here, during which every frame the
realtime tests' clients receive would be stamped late. Collection runs with the collector
off, and what it leaves is frozen (``gc.freeze``), as the engine and the gateway freeze
their start-up heaps (engine/ipc/heap.py). And before each realtime test, what the tests
before it left is collected and frozen too: the realtime suite runs some seventy tests in
one process before its load tests (test_admission.py), and on a slow machine (H, stop
44) their clients' loops stalled up to 68 ms while they timed frames.
"""

from __future__ import annotations

import atexit
import gc
import os
import shutil
import tempfile

import pytest

from engine.ipc.heap import freeze_startup_heap

os.environ["ENGINE_SPEECH_CACHE"] = "0"
_PRIVATE_HOME = tempfile.mkdtemp(prefix="ivr-test-home-")  # 0700
os.environ["XDG_CACHE_HOME"] = os.path.join(_PRIVATE_HOME, "cache")
os.environ["XDG_STATE_HOME"] = os.path.join(_PRIVATE_HOME, "state")
atexit.register(shutil.rmtree, _PRIVATE_HOME, True)


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session) -> object:
    gc.disable()  # importing the test modules makes no garbage worth a collection
    try:
        return (yield)
    finally:
        gc.enable()
        freeze_startup_heap("collecting the tests")


@pytest.fixture(autouse=True)
def _realtime_heap_frozen(request: pytest.FixtureRequest) -> None:
    """A realtime test starts with what earlier tests left collected and frozen, so that
    a collection during it walks only its own objects (the frames it times are stamped
    by this process's event loop)."""
    if request.node.get_closest_marker("realtime") is not None:
        gc.collect()
        gc.freeze()
