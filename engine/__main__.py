"""``python -m engine``: run the engine process.

Usually the gateway starts it (see :mod:`gateway.engine_supervisor`); run it alone to let one
or more gateway workers attach to it through ``--socket`` (gateway: ``ENGINE_SOCKET``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import secrets
import signal
import sys
import threading

from engine.backends.routing import BackendSet
from engine.backends.table import backend_names
from engine.config import EngineSettings
from engine.ipc.heap import freeze_startup_heap
from engine.ipc.lifetime import die_with_parent, watch_parent
from engine.ipc.shm import SharedRegion, SlotArena
from engine.server import EngineLayout, EngineServer
from engine.speech_cache import SpeechCacheSettings, open_speech_cache
from engine.text import load_word_segmenter

log = logging.getLogger("engine")


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    defaults = EngineSettings.from_env(os.environ)
    parser = argparse.ArgumentParser(prog="python -m engine", description=__doc__)
    parser.add_argument("--socket", default=defaults.socket_path, help="control socket path")
    parser.add_argument(
        "--backend",
        default=defaults.backend,
        type=_backend_list,
        help=f"a backend or a comma-separated list, first wins for a voice id "
        f"({', '.join(backend_names())}); ENGINE_BACKEND",
    )
    parser.add_argument("--slots", type=int, default=defaults.slots)
    parser.add_argument("--out-ring-kib", type=int, default=defaults.out_ring_kib)
    parser.add_argument("--in-ring-kib", type=int, default=defaults.in_ring_kib)
    parser.add_argument("--shm-dir", default=defaults.shm_directory)
    parser.add_argument(
        "--shm-name",
        default=None,
        help="name of the shared-memory segment (default: ivr-engine-<pid>-<random>); "
        "the supervisor names it so that it can remove it if the engine is killed",
    )
    parser.add_argument(
        "--parent-pid", type=int, default=None, help="exit when this process goes away"
    )
    parser.add_argument(
        "--no-vad",
        action="store_true",
        default=os.environ.get("ENGINE_VAD") == "0",
        help="do not load the caller-audio VAD model (no barge-in); ENGINE_VAD=0",
    )
    parser.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "INFO"))
    return parser.parse_args(argv)


def _backend_list(value: str) -> str:
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in backend_names()]
    if not names or unknown:
        known = ", ".join(backend_names())
        raise argparse.ArgumentTypeError(f"unknown backend(s) {unknown or value!r}; known: {known}")
    return ",".join(names)


async def run_engine(args: argparse.Namespace) -> None:
    backend = BackendSet.create(args.backend.split(","))
    out_bytes, in_bytes = args.out_ring_kib * 1024, args.in_ring_kib * 1024
    size = SlotArena.region_size(args.slots, out_bytes, in_bytes)
    name = args.shm_name or f"ivr-engine-{os.getpid()}-{secrets.token_hex(4)}"
    region = SharedRegion.create(name, size, directory=args.shm_dir)
    arena = SlotArena(region, args.slots, out_bytes, in_bytes)
    arena.reset_all()
    layout = EngineLayout(region, arena, args.slots, out_bytes, in_bytes)
    settings = EngineSettings.from_env(os.environ)
    # The speech cache (docs/speech-cache.md): opened here, closed after the server stops.
    speech_cache = open_speech_cache(SpeechCacheSettings.from_env(os.environ))
    server = EngineServer(
        backend,
        layout,
        memory_budget_bytes=settings.memory_budget_mb << 20,
        memory_reject_fraction=settings.memory_reject_percent / 100,
        start_timeout_s=settings.start_timeout_ms / 1000,
        speech_cache=speech_cache,
    )
    if args.no_vad:
        server.vad.load_error = "disabled (ENGINE_VAD=0)"
    # Otherwise the VAD thread loads the model (about 2 s for torch) while the engine
    # already serves: a restarted engine takes calls at once, and barge-in joins in
    # as soon as the model is loaded (duplex audio that arrived meanwhile is caught up).
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher = None
    if args.parent_pid is not None:
        watcher = asyncio.create_task(watch_parent(args.parent_pid, stop))
    if any(v.language.lower().startswith(("zh", "yue")) for v in backend.voices()):
        # Chinese word boundaries need jieba's dictionary (about 1 s to load): load it
        # now, beside serving, so that no utterance waits for it.
        threading.Thread(target=load_word_segmenter, name="jieba-load", daemon=True).start()
    try:
        await server.start(args.socket)
        freeze_startup_heap("the engine's start-up")
        log.info(
            "engine ready: backend=%s slots=%d socket=%s shm=%s (%.1f MiB) speech cache=%s",
            backend.name,
            args.slots,
            args.socket,
            region.path,
            size / 2**20,
            ("on, shared" if speech_cache.has_shared else "on") if speech_cache.enabled else "off",
        )
        await stop.wait()
    finally:
        log.info("engine stopping")
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        await server.stop()
        speech_cache.close()
        backend.close()
        with contextlib.suppress(OSError):
            os.unlink(args.socket)
        arena.close()
        region.close()
        region.unlink()


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s engine[%(process)d] %(levelname)s %(name)s: %(message)s",
    )
    if args.parent_pid is not None:
        die_with_parent(args.parent_pid)
    # Three threads share the GIL: the control loop, the synthesis scheduler and the VAD.
    # With the default 5 ms switch interval, a thread that needs the GIL for a moment (an
    # espeak callback, a control message) waits up to 5 ms each time the busy VAD thread
    # holds it, and first audio suffers under duplex load. Hand over more often.
    sys.setswitchinterval(float(os.environ.get("ENGINE_GIL_SWITCH_MS", "1")) / 1000)
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    asyncio.run(run_engine(args))


if __name__ == "__main__":
    main()
