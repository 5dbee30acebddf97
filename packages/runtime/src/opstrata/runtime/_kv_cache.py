"""Paged KV cache (after vLLM's PagedAttention, Kwon et al. 2023): fixed-size token blocks in one pool.

Every layer's K and V live in one preallocated pool of ``num_blocks`` blocks of ``block_size``
token slots, laid out ``[layer, k|v, block, slot, kv_head, head_dim]``. A sequence owns a block
table (a list of block ids); appending fills its last block and takes a new block only when that
one is full, so at most ``block_size - 1`` slots per sequence are wasted. ``fork`` shares every
block of a prefix (reference counts) for parallel sampling and beam search; the first write into a
shared, partly filled last block copies it (copy on write). Full blocks are never written again, so
they stay shared for good.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._allocator import Block, CachingAllocator
from ._errors import InvalidArgument, RuntimeFailure

__all__ = ["KVCacheFullError", "PagedKVCache"]


class KVCacheFullError(RuntimeFailure, MemoryError):
    """The paged KV cache has too few free blocks for an append or a copy-on-write."""


def _kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.2f} MiB"


class PagedKVCache:
    """Block pool + per-sequence block tables with refcounted copy-on-write sharing.

    >>> c = PagedKVCache(num_layers=1, num_kv_heads=2, head_dim=4, block_size=4, num_blocks=8)
    >>> s = c.add_sequence()
    >>> c.append(s, np.ones((1, 6, 2, 4), np.float32), np.ones((1, 6, 2, 4), np.float32)).tolist()
    [0, 1, 2, 3, 4, 5]
    >>> c.block_table(s), c.length(s), c.stats()["waste_bytes"] == 2 * c.bytes_per_slot
    ([0, 1], 6, True)
    """

    def __init__(
        self,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        num_blocks: int,
        block_size: int = 16,
        dtype: Any = np.float32,
        allocator: CachingAllocator | None = None,
    ) -> None:
        for name, value in (
            ("num_layers", num_layers), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim),
            ("num_blocks", num_blocks), ("block_size", block_size),
        ):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise InvalidArgument("PagedKVCache", f"{name} must be an int >= 1, got {value!r}")
        self.num_layers, self.num_kv_heads, self.head_dim = int(num_layers), int(num_kv_heads), int(head_dim)
        self.num_blocks, self.block_size = int(num_blocks), int(block_size)
        self.dtype = np.dtype(dtype)
        if self.dtype.kind != "f":
            raise InvalidArgument("PagedKVCache", f"dtype must be a float dtype, got {self.dtype}")
        shape = (self.num_layers, 2, self.num_blocks, self.block_size, self.num_kv_heads, self.head_dim)
        self._allocator = allocator
        self._pool_block: Block | None = None
        if allocator is None:
            self.pool = np.zeros(shape, self.dtype)
        else:  # the pool is one block of the caching allocator (its limit and stats see it)
            self._pool_block = allocator.allocate(math.prod(shape) * self.dtype.itemsize)
            self.pool = self._pool_block.array(shape, self.dtype)
            self.pool[...] = 0
        # flat slot views per layer: [layer][k|v] -> (num_blocks * block_size, Hkv, D)
        self._flat = self.pool.reshape(self.num_layers, 2, -1, self.num_kv_heads, self.head_dim)
        self._free: list[int] = list(range(self.num_blocks - 1, -1, -1))  # pop() takes the lowest id
        self._ref = np.zeros(self.num_blocks, np.int64)  # owners per block
        self._fill = np.zeros(self.num_blocks, np.int64)  # slots written per block
        self._tables: dict[int, list[int]] = {}
        self._lengths: dict[int, int] = {}
        self._ids = itertools.count()
        self._c = dict.fromkeys(("num_appended_tokens", "num_cow_copies", "num_forks", "peak_used_blocks"), 0)

    # ------------------------------------------------------------------ sizes

    @property
    def bytes_per_slot(self) -> int:
        """Bytes of one token's K and V over every layer."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype.itemsize

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one block (``block_size`` slots) over every layer, K and V."""
        return self.block_size * self.bytes_per_slot

    def blocks_for(self, tokens: int) -> int:
        """Blocks a sequence of ``tokens`` tokens holds."""
        return -(-int(tokens) // self.block_size)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    # ------------------------------------------------------------------ sequences

    def add_sequence(self) -> int:
        """A new empty sequence; returns its id."""
        sid = next(self._ids)
        self._tables[sid], self._lengths[sid] = [], 0
        return sid

    def sequences(self) -> list[int]:
        return list(self._tables)

    def length(self, seq: int) -> int:
        return self._lengths[self._check_seq(seq, "length")]

    def block_table(self, seq: int) -> list[int]:
        """The sequence's block ids in token order (a copy)."""
        return list(self._tables[self._check_seq(seq, "block_table")])

    def refcount(self, block: int) -> int:
        return int(self._ref[block])

    def fork(self, seq: int) -> int:
        """A new sequence sharing every block of ``seq`` (no copy); writes later copy a shared last block."""
        table = self._tables[self._check_seq(seq, "fork")]
        child = next(self._ids)
        self._tables[child], self._lengths[child] = list(table), self._lengths[seq]
        self._ref[table] += 1
        self._c["num_forks"] += 1
        return child

    def free(self, seq: int) -> None:
        """Drop the sequence; blocks no other sequence holds return to the pool."""
        table = self._tables.pop(self._check_seq(seq, "free"))
        del self._lengths[seq]
        for b in reversed(table):
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._fill[b] = 0
                self._free.append(b)

    # ------------------------------------------------------------------ append

    def reserve(self, seqs: Sequence[int] | int, n: int = 1) -> np.ndarray:
        """Make room for ``n`` more tokens in each sequence; returns their flat slot ids ``(len(seqs) * n,)``.

        All or nothing: when the free blocks (new blocks plus copies of shared partly filled last
        blocks) do not cover every sequence, raises KVCacheFullError and changes nothing. Write the
        tokens' K/V with :meth:`write` (slot ``i * n + t`` is token ``t`` of ``seqs[i]``).
        """
        seqs = [seqs] if isinstance(seqs, (int, np.integer)) else list(seqs)
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise InvalidArgument("PagedKVCache.reserve", f"n must be an int >= 0, got {n!r}")
        if len(set(seqs)) != len(seqs):
            raise InvalidArgument(
                "PagedKVCache.reserve", f"sequence ids repeat in {seqs}", "pass each id once"
            )
        bs = self.block_size
        need = 0
        copied: dict[int, int] = {}  # shared block -> owners that copy it away before a later one writes
        for s in seqs:
            length = self._lengths[self._check_seq(s, "reserve")]
            need += self.blocks_for(length + n) - self.blocks_for(length)
            last = self._tables[s][-1] if length % bs else -1
            if n and last >= 0 and self._ref[last] - copied.get(last, 0) > 1:
                need += 1  # copy on write of the shared partly filled last block
                copied[last] = copied.get(last, 0) + 1
        if need > len(self._free):
            raise self._full(seqs, n, need)
        slots = np.empty(len(seqs) * n, np.int64)
        for i, s in enumerate(seqs):
            table, length = self._tables[s], self._lengths[s]
            if n and length % bs and self._ref[table[-1]] > 1:
                table[-1] = self._copy_block(table[-1])
            while len(table) * bs < length + n:
                b = self._free.pop()
                self._ref[b] = 1
                table.append(b)
            pos = np.arange(length, length + n)
            first = length // bs  # touch only the blocks written: O(n), not O(length)
            blocks = np.asarray(table[first : -(-(length + n) // bs)], np.int64)[pos // bs - first]
            slots[i * n : (i + 1) * n] = blocks * bs + pos % bs
            np.add.at(self._fill, blocks, 1)
            self._lengths[s] = length + n
        self._c["num_appended_tokens"] += len(seqs) * n
        self._c["peak_used_blocks"] = max(self._c["peak_used_blocks"], self.num_blocks - len(self._free))
        return slots

    def write(self, layer: int, slots: np.ndarray, k: Any, v: Any) -> None:
        """Store K and V ``(len(slots), Hkv, D)`` of ``layer`` at slots from :meth:`reserve`."""
        self._check_layer(layer, "write")
        want = (len(slots), self.num_kv_heads, self.head_dim)
        for name, t in (("k", k), ("v", v)):
            if np.shape(t) != want:
                raise InvalidArgument(
                    "PagedKVCache.write",
                    f"{name} must have shape (tokens, Hkv, D) = {want}, got {np.shape(t)}",
                )
        self._flat[layer, 0, slots] = k
        self._flat[layer, 1, slots] = v

    def append(self, seq: int, k: Any, v: Any) -> np.ndarray:
        """Append tokens with every layer's K/V ``(num_layers, n, Hkv, D)`` to ``seq``; returns the slots."""
        want = (self.num_layers, None, self.num_kv_heads, self.head_dim)
        for name, t in (("k", k), ("v", v)):
            shape = np.shape(t)
            if len(shape) != 4 or any(w is not None and w != d for w, d in zip(want, shape, strict=True)):
                raise InvalidArgument(
                    "PagedKVCache.append",
                    f"{name} must have shape (num_layers, tokens, Hkv, D) = "
                    f"({self.num_layers}, n, {self.num_kv_heads}, {self.head_dim}), got {shape}",
                )
        if np.shape(k) != np.shape(v):
            raise InvalidArgument(
                "PagedKVCache.append", f"k {np.shape(k)} and v {np.shape(v)} differ in shape"
            )
        slots = self.reserve([seq], int(np.shape(k)[1]))
        for layer in range(self.num_layers):
            self.write(layer, slots, k[layer], v[layer])
        return slots

    # ------------------------------------------------------------------ read

    def padded_tables(self, seqs: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Block tables ``(B, max blocks)`` padded with block 0, and lengths ``(B,)``, for :meth:`gather`."""
        tables = [self._tables[self._check_seq(s, "gather")] for s in seqs]
        width = max((len(t) for t in tables), default=0)
        out = np.zeros((len(tables), width), np.int64)
        for i, t in enumerate(tables):
            out[i, : len(t)] = t
        return out, np.array([self._lengths[s] for s in seqs], np.int64)

    def gather(
        self,
        layer: int,
        seqs: Sequence[int] | None = None,
        *,
        tables: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """K and V ``(B, Hkv, M, D)`` of ``seqs`` (M = longest length; shorter rows padded) and lengths ``(B,)``.

        The layout the attention kernel takes; mask keys ``>= lengths[b]`` of row ``b``. Pass
        ``tables=padded_tables(seqs)`` to reuse the tables across layers.
        """
        self._check_layer(layer, "gather")
        table, lengths = tables if tables is not None else self.padded_tables(list(seqs or []))
        m = int(lengths.max(initial=0))
        b = table.shape[0]
        hkv, d = self.num_kv_heads, self.head_dim
        out = []
        for kv in (0, 1):
            blocks = self.pool[layer, kv].take(table, axis=0)  # (B, nb, block_size, Hkv, D)
            out.append(blocks.reshape(b, -1, hkv, d)[:, :m].transpose(0, 2, 1, 3))
        return out[0], out[1], lengths

    # ------------------------------------------------------------------ stats

    def stats(self) -> dict[str, float | int]:
        """Block and byte counters: pool, reserved (held blocks), used (written slots), waste and sharing.

        ``waste_bytes = reserved_bytes - used_bytes`` is the internal fragmentation of the sequences'
        last blocks; ``waste_fraction`` is it over ``reserved_bytes``. ``logical_tokens`` counts every
        sequence's tokens, ``physical_tokens`` the slots written once (shared prefixes count once).
        """
        used_blocks = self.num_blocks - len(self._free)
        physical = int(self._fill.sum())
        reserved = used_blocks * self.bytes_per_block
        used = physical * self.bytes_per_slot
        out: dict[str, float | int] = {
            "num_blocks": self.num_blocks,
            "block_size": self.block_size,
            "bytes_per_slot": self.bytes_per_slot,
            "bytes_per_block": self.bytes_per_block,
            "pool_bytes": self.num_blocks * self.bytes_per_block,
            "free_blocks": len(self._free),
            "used_blocks": used_blocks,
            "shared_blocks": int((self._ref > 1).sum()),
            "num_sequences": len(self._tables),
            "logical_tokens": sum(self._lengths.values()),
            "physical_tokens": physical,
            "reserved_bytes": reserved,
            "used_bytes": used,
            "waste_bytes": reserved - used,
            "waste_fraction": (reserved - used) / reserved if reserved else 0.0,
        }
        out.update(self._c)
        return out

    def close(self) -> None:
        """Return the pool to the caching allocator it came from (no-op for a numpy pool)."""
        if self._allocator is not None and self._pool_block is not None:
            self._allocator.free(self._pool_block)
            self._pool_block = None

    def check_invariants(self) -> None:
        """Assert the bookkeeping is consistent: no block leaked or double-owned, fills match lengths."""
        owners = np.zeros(self.num_blocks, np.int64)
        bs = self.block_size
        fills: dict[int, int] = {}
        for s, table in self._tables.items():
            length = self._lengths[s]
            assert len(table) == self.blocks_for(length), f"seq {s}: {len(table)} blocks for {length} tokens"
            for i, b in enumerate(table):
                owners[b] += 1
                fill = min(bs, length - i * bs)
                assert fills.setdefault(b, fill) == fill, f"block {b}: owners disagree on its fill"
        free = set(self._free)
        assert len(free) == len(self._free), "a block is on the free list twice"
        assert np.array_equal(owners, self._ref), "refcounts differ from the block tables"
        for b in range(self.num_blocks):
            assert (b in free) == (owners[b] == 0), f"block {b}: free={b in free}, owners={owners[b]}"
            assert self._fill[b] == fills.get(b, 0), f"block {b}: fill {self._fill[b]} vs {fills.get(b, 0)}"

    # ------------------------------------------------------------------ internals

    def _copy_block(self, src: int) -> int:
        dst = self._free.pop()
        self.pool[:, :, dst] = self.pool[:, :, src]
        self._ref[src] -= 1
        self._ref[dst] = 1
        self._fill[dst] = self._fill[src]
        self._c["num_cow_copies"] += 1
        return dst

    def _check_seq(self, seq: int, op: str) -> int:
        if seq not in self._tables:
            raise InvalidArgument(
                f"PagedKVCache.{op}", f"unknown sequence id {seq!r} (live: {sorted(self._tables)[:10]})",
                "use an id returned by add_sequence() or fork() that has not been freed",
            )  # fmt: skip
        return seq

    def _check_layer(self, layer: int, op: str) -> None:
        if not 0 <= layer < self.num_layers:
            raise InvalidArgument(
                f"PagedKVCache.{op}", f"layer must be in [0, {self.num_layers}), got {layer}"
            )

    def _full(self, seqs: list[int], n: int, need: int) -> KVCacheFullError:
        held = self.num_blocks - len(self._free)
        return KVCacheFullError(
            f"PagedKVCache ({self.num_blocks} blocks of {self.block_size} tokens, {_kib(self.bytes_per_block)} each)",
            f"out of blocks: appending {n} token(s) to {len(seqs)} sequence(s) needs {need} free block(s), "
            f"{len(self._free)} free ({held} held by {len(self._tables)} sequences)",
            "free finished sequences (cache.free(seq)), generate fewer tokens or sequences at once "
            "(max_new_tokens, num_return_sequences, batch), or create the cache with more num_blocks",
        )

    def __repr__(self) -> str:
        s = self.stats()
        return (
            f"PagedKVCache({s['used_blocks']}/{self.num_blocks} blocks of {self.block_size} used, "
            f"{s['num_sequences']} sequences, waste {s['waste_fraction']:.1%})"
        )
