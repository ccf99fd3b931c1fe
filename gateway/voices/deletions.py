"""Voice deletions announced to every instance that shares the Redis, at once.

Each instance caches voice records (and features) in L1 for up to ``RECORD_TTL_S``. A
voice deleted through one instance is published on ``<prefix>:voices:deleted``; every
subscribed instance (the deleting one included) drops it from L1 when the message
arrives, so the voice stops speaking everywhere within the publish's latency instead of
the record lifetime. The record lifetime stays the bound when a message is lost: after
the subscription fails and comes back, every cached record is expired (deletions may have
been missed meanwhile).

Message: JSON ``{"voice": "<id>", "erased": "<sha256>" | null, "digest": "<sha256>" |
null, "tenant": "<tenant>"}``; ``erased`` names the reference audio when the voice was
its last user, so its features go too; ``digest`` is the voice's digest
(engine/speech_cache/key.py ``registered_voice_digest``: its tenant, id and features),
which keys its speech in the engines' speech caches (each instance asks its engine to
forget it, in ``tenant``'s entries). Anything else
on the channel is ignored (and counted in the log).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

POLL_S = 0.5  # how long one read of the subscription waits for a message
RETRY_S = 1.0  # after the subscription failed, before subscribing again
MAX_MESSAGE_BYTES = 1024


@dataclass(frozen=True)
class Deletion:
    voice_id: str
    erased_sha256: str | None  # the reference audio, when the voice was its last user
    #: The speech cache's voice digest (its tenant, id and features), when known.
    features_digest: str | None = None
    tenant: str = ""

    def encode(self) -> bytes:
        return json.dumps(
            {
                "voice": self.voice_id,
                "erased": self.erased_sha256,
                "digest": self.features_digest,
                "tenant": self.tenant,
            }
        ).encode()

    @classmethod
    def decode(cls, data: bytes | str) -> Deletion | None:
        """The deletion ``data`` announces, or None when it is not one."""
        if len(data) > MAX_MESSAGE_BYTES:
            return None
        try:
            doc = json.loads(data)
        except ValueError:
            return None
        if not isinstance(doc, dict):
            return None
        voice, erased, digest = doc.get("voice"), doc.get("erased"), doc.get("digest")
        tenant = doc.get("tenant", "")
        if not isinstance(voice, str) or not (erased is None or isinstance(erased, str)):
            return None
        if not (digest is None or (isinstance(digest, str) and len(digest) == 64)):
            return None
        if not isinstance(tenant, str):
            return None
        return cls(voice, erased, digest, tenant)


class DeletionChannel:
    """Publishes this instance's voice deletions and applies every instance's.

    ``on_deleted`` is called for each deletion announced (this instance's own included);
    ``on_resync`` after the subscription came back from a failure. :meth:`start` and
    :meth:`stop` own the subscriber task.
    """

    def __init__(
        self,
        client: aioredis.Redis,
        prefix: str,
        *,
        on_deleted: Callable[[Deletion], None],
        on_resync: Callable[[], None],
        retry_s: float = RETRY_S,
    ) -> None:
        self._client = client
        self.channel = f"{prefix}:voices:deleted"
        self._on_deleted = on_deleted
        self._on_resync = on_resync
        self._retry_s = retry_s
        self._task: asyncio.Task[None] | None = None
        self.subscribed = asyncio.Event()  # set while the subscription is up

    async def publish(self, deletion: Deletion) -> bool:
        """Announce ``deletion``; False (logged) when Redis is unreachable: the other
        instances then learn of it within the record lifetime."""
        try:
            await self._client.publish(self.channel, deletion.encode())
        except (TimeoutError, RedisError, OSError) as exc:
            log.warning(
                "voice %s deleted, but the deletion could not be announced (%s): other "
                "instances stop it within the record lifetime",
                deletion.voice_id,
                type(exc).__name__,
            )
            return False
        return True

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._listen(), name="voice-deletions")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _listen(self) -> None:
        failed = False
        while True:
            pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.channel)
                self.subscribed.set()
                if failed:
                    log.info("voice deletions: subscribed again; cached records expired")
                    self._on_resync()
                    failed = False
                while True:
                    message = await pubsub.get_message(timeout=POLL_S)
                    if message is not None:
                        self._apply(message)
            except (TimeoutError, RedisError, OSError) as exc:
                if not failed:
                    log.warning("voice deletions: subscription lost (%s)", type(exc).__name__)
                failed = True
            finally:
                self.subscribed.clear()
                with contextlib.suppress(Exception):
                    await asyncio.shield(pubsub.aclose())
            await asyncio.sleep(self._retry_s)

    def _apply(self, message: dict[str, Any]) -> None:
        if message.get("type") != "message":
            return
        deletion = Deletion.decode(message.get("data") or b"")
        if deletion is None:
            log.warning("voice deletions: ignored a malformed message on %s", self.channel)
            return
        self._on_deleted(deletion)
