"""The speech cache's shared level from the command line (an operator's tools).

    python -m engine.speech_cache purge --tenant acme
    python -m engine.speech_cache sweep

``purge``: a tenant's right to erasure: every entry cached from the tenant's calls and
prompts is deleted from the shared level the environment names (the host directory, or
Redis with ``GATEWAY_REDIS_URL``), with the same settings and secret the engines use.
Running engines also hold the tenant's recent entries in memory: the tenant's own
``DELETE /v1/speech-cache/entries`` (or a restart) drops those too.

``sweep``: deletes the directory's expired entries now (and holds it to its budgets),
for a host where no engine runs to do it: a timer can call it; an engine sweeps at start
and every 5 minutes anyway.

Exit 0 when done, 2 on a configuration error (named), 1 when the store failed.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from engine.ipc.env import ConfigError
from engine.speech_cache.cache import open_shared_store, speech_cache_secret
from engine.speech_cache.directory import DirectoryStore
from engine.speech_cache.key import tenant_scope
from engine.speech_cache.sealing import Sealer
from engine.speech_cache.settings import SpeechCacheSettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.speech_cache", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    purge = commands.add_parser("purge", help="delete a tenant's entries from the shared level")
    purge.add_argument("--tenant", required=True)
    commands.add_parser("sweep", help="delete the directory's expired entries now")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        settings = SpeechCacheSettings.from_env(os.environ)
        if settings.shared_store is None:
            raise ConfigError("the speech cache has no shared level (ENGINE_SPEECH_CACHE_SHARED)")
        sealer = Sealer(speech_cache_secret(settings))
        store = open_shared_store(settings, sealer)
    except ConfigError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    if store is None:
        print("the shared level could not be opened", file=sys.stderr)
        return 1
    try:
        if args.command == "purge":
            removed = store.purge_scope(sealer.label("scope", tenant_scope(args.tenant)))
            print(f"{removed} entries of tenant {args.tenant!r} deleted from {store.name}")
        elif isinstance(store, DirectoryStore):  # it swept when it opened; once more
            store.sweep(time.monotonic())
            entries, size, evicted = store.usage()
            print(f"{entries} entries ({size} bytes) left; {evicted} evicted for the budgets")
        else:
            print("redis expires its entries itself: nothing to sweep")
    except Exception as exc:  # a store failure, said plainly
        print(f"{store.name} failed: {exc}", file=sys.stderr)
        return 1
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
