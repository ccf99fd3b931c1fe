"""The garbage collector of a long-running serving process (the engine, a gateway worker).

CPython's full collection walks every tracked object. A serving process holds hundreds of
thousands that live as long as it does (imported modules: aiohttp, numpy, onnxruntime,
torch for the VAD) and a full collection over them takes 50 ms in a gateway worker and
120 ms in an engine with the VAD on this 2-core machine, longer on a loaded one: a pause
of the pacer or of the ring writer that every call hears once it exceeds the 60 ms lead.
:func:`freeze_startup_heap` moves what exists once start-up is done into the permanent
generation (``gc.freeze``), so that later collections walk only what the calls allocate.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger(__name__)


def freeze_startup_heap(what: str) -> int:
    """Collect once, then keep every object alive now out of all later collections;
    returns how many objects are frozen in all (``what`` names the moment, for the log).
    Safe to call again (after a lazy load): each call freezes what was added since."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("heap frozen after %s: %d objects kept out of collections", what, frozen)
    return frozen
