"""The warm prompts this gateway worker knows, per tenant, bounded.

An entry is a prompt someone asked to keep warm (the prompts file, a SIP flow, the API)
and what this worker last learnt of it: ``pending`` (queued), ``warming`` (the engine is
rendering it), ``warm`` (every segment cached when the engine answered), ``failed``
(with the engine's or the gateway's code). Which levels hold each segment *now* is
the engine's to say (``CheckPrompt``): the catalog does not pretend to know it.

Bounds: ``max_per_tenant`` entries per tenant and ``max_total`` in all; beyond, adding
raises :class:`CatalogFull`. Tenant ``""`` holds the shared prompts (built-in voices, from
the prompts file and the SIP flows), which every tenant sees.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from engine.ipc.schema import SegmentState
from gateway.speech_cache.prompts import SHARED_TENANT, PromptSpec

State = Literal["pending", "warming", "warm", "failed"]
STATES: Final = ("pending", "warming", "warm", "failed")


class CatalogFull(Exception):
    """A tenant (or the worker) holds as many warm prompts as it may."""


@dataclass
class Entry:
    id: str
    tenant: str
    spec: PromptSpec
    source: str  # "file:<line>", "flow:<name>", "api"
    created_at: float
    state: State = "pending"
    code: str = ""
    message: str = ""
    segments: tuple[SegmentState, ...] = ()
    warmed_at: float | None = None
    attempts: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            **self.spec.to_json(),
            "shared": self.tenant == SHARED_TENANT,
            "source": self.source,
            "state": self.state,
            "error": {"code": self.code, "message": self.message} if self.code else None,
            "segments": len(self.segments),
            "created_at": self.created_at,
            "warmed_at": self.warmed_at,
        }


@dataclass
class Catalog:
    max_per_tenant: int = 1000
    max_total: int = 100_000
    clock: Callable[[], float] = time.time
    _tenants: dict[str, OrderedDict[str, Entry]] = field(default_factory=dict)
    _count: int = 0

    def add(self, tenant: str, spec: PromptSpec, source: str) -> tuple[Entry, bool]:
        """The entry of ``spec`` for ``tenant`` and whether it is new; raises
        :class:`CatalogFull` when a new one does not fit."""
        prompt_id = spec.prompt_id(tenant)
        entries = self._tenants.get(tenant)
        if entries is not None and prompt_id in entries:
            return entries[prompt_id], False
        if (entries is not None and len(entries) >= self.max_per_tenant) or (
            self._count >= self.max_total
        ):
            raise CatalogFull(f"at most {self.max_per_tenant} warm prompts per tenant")
        entry = Entry(prompt_id, tenant, spec, source, created_at=self.clock())
        self._tenants.setdefault(tenant, OrderedDict())[prompt_id] = entry
        self._count += 1
        return entry, True

    def get(self, tenant: str, prompt_id: str) -> Entry | None:
        """The tenant's entry (or a shared one) with that id; another tenant's is None."""
        for owner in (tenant, SHARED_TENANT):
            entries = self._tenants.get(owner)
            if entries is not None and prompt_id in entries:
                return entries[prompt_id]
        return None

    def remove(self, tenant: str, prompt_id: str) -> bool:
        """Forget the tenant's own entry (shared entries are the operator's)."""
        entries = self._tenants.get(tenant)
        if entries is None or prompt_id not in entries or tenant == SHARED_TENANT:
            return False
        del entries[prompt_id]
        self._count -= 1
        if not entries:
            del self._tenants[tenant]
        return True

    def remove_voice(self, voice: str) -> int:
        """Forget every entry spoken in ``voice`` (a deleted registered voice)."""
        removed = 0
        for tenant in list(self._tenants):
            entries = self._tenants[tenant]
            for prompt_id in [i for i, e in entries.items() if e.spec.voice == voice]:
                del entries[prompt_id]
                removed += 1
            if not entries:
                del self._tenants[tenant]
        self._count -= removed
        return removed

    def visible(self, tenant: str) -> list[Entry]:
        """What ``tenant`` may list: its own entries, then the shared ones."""
        empty: OrderedDict[str, Entry] = OrderedDict()
        own = list(self._tenants.get(tenant, empty).values()) if tenant != SHARED_TENANT else []
        return own + list(self._tenants.get(SHARED_TENANT, empty).values())

    def count(self, tenant: str | None = None) -> int:
        if tenant is None:
            return self._count
        entries = self._tenants.get(tenant)
        return 0 if entries is None else len(entries)

    def __iter__(self) -> Iterator[Entry]:
        for entries in list(self._tenants.values()):
            yield from list(entries.values())

    def by_state(self) -> dict[str, int]:
        counts = dict.fromkeys(STATES, 0)
        for entry in self:
            counts[entry.state] += 1
        return counts


__all__ = ["STATES", "Catalog", "CatalogFull", "Entry", "State"]
