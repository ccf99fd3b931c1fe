"""A child process that must not outlive its parent (the engine under a gateway, a
gateway worker under the host supervisor): Linux's parent-death signal, and a watch for
the moment between fork and ``prctl`` when the parent may already be gone."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys

log = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1
PARENT_CHECK_S = 1.0


def die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGTERM us when the parent dies (``prctl(PR_SET_PDEATHSIG)``); exit
    at once when it already has."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        sys.exit(0)


async def watch_parent(parent_pid: int, stop: asyncio.Event) -> None:
    """Set ``stop`` when the parent goes away (checked every :data:`PARENT_CHECK_S`)."""
    while not stop.is_set():
        if os.getppid() != parent_pid:
            log.warning("parent %d is gone; exiting", parent_pid)
            stop.set()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), PARENT_CHECK_S)
