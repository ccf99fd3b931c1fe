"""A queue served round-robin by tenant, bounded per tenant and in all (sans-I/O).

The warm-up queue is shared by every tenant of a gateway worker; first come, first served
would let one tenant's burst (or a POST+DELETE flood) fill it and make everyone else's
prompts wait or fail. Here each tenant has its own FIFO of at most ``per_tenant`` items,
the queue at most ``total``, and :meth:`pop` takes the tenants in turn, so a tenant with
one prompt waits behind at most one prompt of each other tenant. :meth:`remove` takes an
item out (a prompt deleted before its turn never reaches the engine).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Generic, TypeVar

T = TypeVar("T")


class FairQueue(Generic[T]):
    def __init__(self, *, per_tenant: int, total: int) -> None:
        if per_tenant < 1 or total < 1:
            raise ValueError("the bounds must be positive")
        self.per_tenant = per_tenant
        self.total = total
        self._queues: OrderedDict[str, deque[T]] = OrderedDict()  # next tenant first
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def queued(self, tenant: str) -> int:
        queue = self._queues.get(tenant)
        return 0 if queue is None else len(queue)

    def push(self, tenant: str, item: T) -> bool:
        """Queue ``item`` for ``tenant``; False when the tenant's share or the queue is
        full (nothing is queued)."""
        queue = self._queues.get(tenant)
        if self._size >= self.total or (queue is not None and len(queue) >= self.per_tenant):
            return False
        if queue is None:
            queue = self._queues[tenant] = deque()
        queue.append(item)
        self._size += 1
        return True

    def pop(self) -> T | None:
        """The oldest item of the tenant whose turn it is (that tenant then goes last);
        None when empty."""
        if not self._queues:
            return None
        tenant, queue = next(iter(self._queues.items()))
        item = queue.popleft()
        self._size -= 1
        if queue:
            self._queues.move_to_end(tenant)
        else:
            del self._queues[tenant]
        return item

    def remove(self, tenant: str, item: T) -> bool:
        """Take ``item`` (this very object) out of ``tenant``'s queue; False when it is
        not there."""
        queue = self._queues.get(tenant)
        at = next((i for i, x in enumerate(queue) if x is item), None) if queue else None
        if queue is None or at is None:
            return False
        del queue[at]
        self._size -= 1
        if not queue:
            del self._queues[tenant]
        return True
