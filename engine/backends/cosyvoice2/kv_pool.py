"""The LLM's key/value cache for many streams, pre-allocated: one buffer per layer,
``[slots, kv_heads, capacity, head_dim]``, a slot per decoding stream.

A decode step used to pad every stream's cache to the longest, concatenate them into a
batch and split the result back: a copy of every cache in and out of every step. Here the
streams a step advances hold slots ``0..n-1``, so the step's cache is a view of the
buffers; each stream's keys sit at positions ``0..length-1`` of its slot (padding on the
right, masked), and the step writes each stream's new key and value at its own position.
What is copied is one stream's cache when it joins (its prefill), when it leaves (the
last slot moves into the hole, so the slots stay dense), when a step is given a subset of
the streams (they are swapped to the front once), and when the buffers grow (doubling:
amortized). Time per step then grows with the streams' tokens (attention reads them), not
with a copy of every cache.

:class:`SlotCache` is the ``transformers`` cache object a step passes the Qwen2 body: its
layers return the buffer views. The buffers are made in inference mode, so every method
that changes them runs in it (a cancelled stream is released from outside a step).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


class Slotted(Protocol):
    slot: int | None
    length: int  # positions cached


S = TypeVar("S", bound=Slotted)


class KvPool:
    """See the module docstring. Not thread-safe: the step loop runs one step at a time."""

    def __init__(
        self,
        layers: int,
        kv_heads: int,
        head_dim: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
        slots: int = 4,
        capacity: int = 256,
    ) -> None:
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.dtype, self.device = dtype, device
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._owners: list[Slotted] = []
        self._allocate(slots, capacity)

    @property
    def used(self) -> int:
        return len(self._owners)

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def _allocate(self, slots: int, capacity: int) -> None:
        shape = (slots, self.kv_heads, capacity, self.head_dim)
        old_k, old_v = self.keys, self.values
        self.keys = [
            torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.layers)
        ]
        self.values = [
            torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.layers)
        ]
        if old_k:
            n, length = self.used, min(old_k[0].shape[2], capacity)
            for new, old in zip((*self.keys, *self.values), (*old_k, *old_v), strict=True):
                new[:n, :, :length] = old[:n, :, :length]

    @torch.inference_mode()
    def reserve(self, slots: int, capacity: int) -> None:
        """Room for ``slots`` streams of ``capacity`` positions (doubling what is short)."""
        have_slots, have_capacity = self.keys[0].shape[0], self.capacity
        if slots <= have_slots and capacity <= have_capacity:
            return
        while have_slots < slots:
            have_slots *= 2
        while have_capacity < capacity:
            have_capacity *= 2
        self._allocate(have_slots, have_capacity)

    @torch.inference_mode()
    def admit(self, owner: Slotted, layers: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Give ``owner`` the next slot, holding ``layers`` (its prefill: per layer
        ``[1, kv_heads, length, head_dim]`` keys and values)."""
        length = layers[0][0].shape[2]
        self.reserve(self.used + 1, length + 1)
        slot = self.used
        for layer, (k, v) in enumerate(layers):
            self.keys[layer][slot, :, :length] = k[0]
            self.values[layer][slot, :, :length] = v[0]
        owner.slot, owner.length = slot, length
        self._owners.append(owner)

    @torch.inference_mode()
    def release(self, owner: Slotted) -> None:
        """Free ``owner``'s slot; the last slot moves into it."""
        slot = owner.slot
        if slot is None:
            return
        last = self._owners.pop()
        if last is not owner:
            self._move(last, slot)
            self._owners[slot] = last
        owner.slot = None

    def _move(self, owner: Slotted, slot: int) -> None:
        assert owner.slot is not None
        length = owner.length
        for buffer in (*self.keys, *self.values):
            buffer[slot, :, :length] = buffer[owner.slot, :, :length]
        owner.slot = slot

    def _swap(self, a: int, b: int) -> None:
        first, second = self._owners[a], self._owners[b]
        for buffer in (*self.keys, *self.values):
            held = buffer[a].clone()
            buffer[a] = buffer[b]
            buffer[b] = held
        self._owners[a], self._owners[b] = second, first
        first.slot, second.slot = b, a

    @torch.inference_mode()
    def to_front(self, owners: Sequence[S]) -> list[S]:
        """Arrange ``owners`` (all admitted) in slots ``0..len-1``; returns them in slot
        order."""
        wanted = {id(o) for o in owners}
        front = 0
        for owner in sorted(owners, key=lambda o: o.slot if o.slot is not None else -1):
            assert owner.slot is not None
            if owner.slot >= len(owners):
                while id(self._owners[front]) in wanted:
                    front += 1
                self._swap(front, owner.slot)
        by_slot = sorted(owners, key=lambda o: o.slot if o.slot is not None else -1)
        return by_slot

    def step_cache(self, owners: Sequence[Slotted]) -> SlotCache:
        """The cache object for one decode step of ``owners`` (in slots ``0..n-1``):
        room for one more position each."""
        self.reserve(self.used, max(o.length for o in owners) + 1)
        return SlotCache(self, [o.length for o in owners])


class _SlotLayer(CacheLayerMixin):  # type: ignore[no-untyped-call]
    """One layer of a step: writes each row's new key and value at its own position and
    returns views of the buffers."""

    is_sliding = False

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor, width: int):
        super().__init__()  # type: ignore[no-untyped-call]
        self.keys, self.values = keys, values
        self._lengths, self._width = lengths, width
        self.is_initialized = True
        self.device = keys.device

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        return None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.arange(key_states.shape[0], device=key_states.device)
        assert self.keys is not None and self.values is not None
        self.keys[rows, :, self._lengths] = key_states[:, :, 0].to(self.keys.dtype)
        self.values[rows, :, self._lengths] = value_states[:, :, 0].to(self.values.dtype)
        return self.keys[:, :, : self._width], self.values[:, :, : self._width]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self._width, 0

    def get_seq_length(self) -> int:
        return self._width - 1

    def get_max_length(self) -> int:
        return -1


class SlotCache(Cache):
    """A decode step's cache over a :class:`KvPool` (one new position per row)."""

    def __init__(self, pool: KvPool, lengths: list[int]) -> None:
        n = len(lengths)
        width = max(lengths) + 1
        self.lengths = torch.tensor(lengths, device=pool.device)
        super().__init__(
            layers=[
                _SlotLayer(pool.keys[i][:n], pool.values[i][:n], self.lengths, width)
                for i in range(pool.layers)
            ]
        )
        self.width = width

    def attention_mask(self) -> torch.Tensor:
        """``[n, width]``: each row's cached positions and its new one."""
        positions = torch.arange(self.width, device=self.lengths.device)
        return (positions[None, :] <= self.lengths[:, None]).long()
