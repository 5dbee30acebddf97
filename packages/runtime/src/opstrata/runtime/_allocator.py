"""Caching allocator over large numpy byte segments, after PyTorch's CUDA caching allocator.

Requests are rounded to 512 B; small ones (<= 1 MiB) come from 2 MiB segments, large ones from
20 MiB segments (or a segment of their own rounded to 2 MiB above 10 MiB). A free block is found
best-fit, split when the rest is worth keeping, and coalesced with free neighbours when freed.
Segments stay cached until ``empty_cache()``; an optional capacity limit simulates device memory.
"""

from __future__ import annotations

import bisect
import itertools
import math
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._errors import InvalidArgument, OutOfMemoryError

__all__ = ["Block", "CachingAllocator"]

MIN_BLOCK = 512  # every block size is a multiple of this
SMALL_SIZE = 1 << 20  # requests up to 1 MiB use the small pool
SMALL_SEGMENT = 2 << 20  # small-pool segment size
LARGE_SEGMENT = 20 << 20  # large-pool segment for requests under MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 << 20  # requests this big get their own segment ...
ROUND_LARGE = 2 << 20  # ... rounded up to 2 MiB


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.2f} MiB" if n >= 1 << 20 else f"{n} B"


class Block:
    """A byte range ``[offset, offset + size)`` of one segment; ``.array(shape, dtype)`` views it."""

    __slots__ = ("allocated", "next", "offset", "pool", "prev", "requested", "segment", "size")

    def __init__(self, segment: _Segment, offset: int, size: int, pool: str) -> None:
        self.segment, self.offset, self.size, self.pool = segment, offset, size, pool
        self.requested = 0
        self.allocated = False
        self.prev: Block | None = None
        self.next: Block | None = None

    def _key(self) -> tuple[int, int, int]:
        return (self.size, self.segment.id, self.offset)

    def bytes(self) -> np.ndarray:
        """The block's requested bytes as a uint8 view of the segment."""
        return self.segment.buf[self.offset : self.offset + self.requested]

    def array(self, shape: Sequence[int], dtype: Any) -> np.ndarray:
        """A view of the block as an array of ``shape`` and ``dtype`` (must fit in the block)."""
        dt = np.dtype(dtype)
        n = math.prod(shape) * dt.itemsize
        if n > self.size:
            raise InvalidArgument("Block.array", f"{tuple(shape)} {dt} needs {n} B, block has {self.size} B")
        return self.segment.buf[self.offset : self.offset + n].view(dt).reshape(shape)

    def __repr__(self) -> str:
        state = "allocated" if self.allocated else "free"
        return f"Block(segment={self.segment.id}, offset={self.offset}, size={self.size}, {state})"


class _Segment:
    """One numpy byte buffer backing a chain of blocks."""

    __slots__ = ("buf", "head", "id", "pool", "size")

    def __init__(self, sid: int, size: int, pool: str) -> None:
        self.id, self.size, self.pool = sid, size, pool
        self.buf = np.empty(size, np.uint8)
        self.head: Block | None = None  # the block at offset 0


class CachingAllocator:
    """Size-rounded, split/coalesce, two-pool caching allocator with an optional capacity limit.

    >>> a = CachingAllocator()
    >>> x = a.empty((4, 8), np.float32)
    >>> a.free(x); a.stats()["allocated_bytes"]
    0
    """

    def __init__(self, limit_bytes: int | None = None) -> None:
        if limit_bytes is not None and (not isinstance(limit_bytes, int) or limit_bytes <= 0):
            raise InvalidArgument(
                "CachingAllocator", f"limit_bytes must be a positive int, got {limit_bytes!r}"
            )
        self.limit_bytes = limit_bytes
        self._free: dict[str, list[tuple[int, int, int]]] = {"small": [], "large": []}  # sorted keys
        self._free_blocks: dict[tuple[int, int, int], Block] = {}
        self._segments: dict[int, _Segment] = {}
        self._by_addr: dict[int, Block] = {}  # data address of arrays handed out by empty()
        self._empty_arrays: dict[int, weakref.ref[np.ndarray]] = {}  # zero-size arrays from empty(), by id
        self._ids = itertools.count()
        self._c = dict.fromkeys(
            ("allocated_bytes", "requested_bytes", "reserved_bytes", "active_blocks", "peak_allocated_bytes",
             "peak_reserved_bytes", "num_alloc", "num_free", "cache_hits", "cache_misses", "num_segment_alloc",
             "num_segment_free", "num_ooms"),
            0,
        )  # fmt: skip

    # ------------------------------------------------------------------ sizes

    @staticmethod
    def round_size(nbytes: int) -> int:
        """Bytes actually reserved for a request: a multiple of 512, at least 512."""
        return MIN_BLOCK if nbytes < MIN_BLOCK else -(-nbytes // MIN_BLOCK) * MIN_BLOCK

    @staticmethod
    def segment_size(size: int) -> int:
        """Segment to reserve for a rounded request that no cached block fits."""
        if size <= SMALL_SIZE:
            return SMALL_SEGMENT
        if size < MIN_LARGE_ALLOC:
            return LARGE_SEGMENT
        return -(-size // ROUND_LARGE) * ROUND_LARGE

    # ------------------------------------------------------------------ allocate / free

    def allocate(self, nbytes: int) -> Block:
        """A block of at least ``nbytes`` (cached when possible); raises OutOfMemoryError past the limit."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
            raise InvalidArgument("CachingAllocator.allocate", f"nbytes must be an int >= 0, got {nbytes!r}")
        nbytes = int(nbytes)
        size = self.round_size(nbytes)
        pool = "small" if size <= SMALL_SIZE else "large"
        block = self._take_free(pool, size)
        if block is None:
            self._c["cache_misses"] += 1
            block = self._new_segment(size, pool, nbytes)
        else:
            self._c["cache_hits"] += 1
        self._split(block, size)
        block.allocated, block.requested = True, nbytes
        c = self._c
        c["allocated_bytes"] += block.size
        c["requested_bytes"] += nbytes
        c["active_blocks"] += 1
        c["num_alloc"] += 1
        c["peak_allocated_bytes"] = max(c["peak_allocated_bytes"], c["allocated_bytes"])
        return block

    def empty(self, shape: Sequence[int] | int, dtype: Any = np.float32) -> np.ndarray:
        """An uninitialised array backed by an allocator block; give it back with ``free(array)``."""
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
        dt = np.dtype(dtype)
        if math.prod(shape) == 0:  # no bytes: nothing to cache (zero-size views would share one address)
            arr = np.empty(shape, dt)
            self._empty_arrays[id(arr)] = weakref.ref(arr)
            return arr
        block = self.allocate(math.prod(shape) * dt.itemsize)
        arr = block.array(shape, dt)
        self._by_addr[self._addr(block)] = block
        return arr

    def free(self, x: Block | np.ndarray) -> None:
        """Return a block (or an array from ``empty``) to the cache, coalescing with free neighbours."""
        if isinstance(x, np.ndarray) and x.size == 0:
            ref = self._empty_arrays.pop(id(x), None)
            if ref is None or ref() is not x:
                raise InvalidArgument(
                    "CachingAllocator.free", "the zero-size array was not returned by this allocator's empty() (or is freed)",
                    "free only arrays from allocator.empty(), once each",
                )  # fmt: skip
            return
        if isinstance(x, np.ndarray):
            block = self._by_addr.pop(x.__array_interface__["data"][0], None)
            if block is None:
                raise InvalidArgument(
                    "CachingAllocator.free", "the array was not returned by this allocator's empty() (or is freed)",
                    "free only arrays from allocator.empty(), once each",
                )  # fmt: skip
        else:
            block = x
        if not isinstance(block, Block) or not block.allocated or block.segment.id not in self._segments:
            raise InvalidArgument(
                "CachingAllocator.free", f"{block!r} is not an allocated block of this allocator"
            )
        c = self._c
        c["allocated_bytes"] -= block.size
        c["requested_bytes"] -= block.requested
        c["active_blocks"] -= 1
        c["num_free"] += 1
        block.allocated, block.requested = False, 0
        for nb in (block.prev, block.next):
            if nb is not None and not nb.allocated:
                self._remove_free(nb)
                block = self._merge(block, nb)
        self._insert_free(block)

    def empty_cache(self) -> int:
        """Release every segment with no allocated block; returns the bytes released."""
        released = 0
        for sid, seg in list(self._segments.items()):
            key = (seg.size, sid, 0)
            if key in self._free_blocks:  # one free block spanning the whole segment
                self._remove_free(self._free_blocks[key])
                del self._segments[sid]
                released += seg.size
                self._c["num_segment_free"] += 1
        self._c["reserved_bytes"] -= released
        return released

    # ------------------------------------------------------------------ stats

    def stats(self) -> dict[str, float | int]:
        """Counters in the spirit of ``torch.cuda.memory_stats()`` (bytes, blocks, counts, fragmentation)."""
        out: dict[str, float | int] = dict(self._c)
        free_bytes = out["reserved_bytes"] - out["allocated_bytes"]
        largest = max((k[0] for pool in self._free.values() for k in pool[-1:]), default=0)
        out["free_bytes"] = free_bytes
        out["largest_free_block"] = largest
        out["inactive_blocks"] = len(self._free_blocks)
        out["num_segments"] = len(self._segments)
        out["fragmentation"] = 1.0 - largest / free_bytes if free_bytes else 0.0
        return out

    def reset_peak_stats(self) -> None:
        """Set the peaks to the current values."""
        self._c["peak_allocated_bytes"] = self._c["allocated_bytes"]
        self._c["peak_reserved_bytes"] = self._c["reserved_bytes"]

    def blocks(self) -> list[Block]:
        """Every block of every segment, in address order (for tests and debugging)."""
        out = []
        for seg in self._segments.values():
            b = seg.head
            while b is not None:
                out.append(b)
                b = b.next
        return out

    def memory_summary(self) -> str:
        """A few human-readable lines of the stats."""
        s = self.stats()
        return (
            f"allocated {_mib(int(s['allocated_bytes']))} in {s['active_blocks']} blocks, reserved "
            f"{_mib(int(s['reserved_bytes']))} in {s['num_segments']} segments, free {_mib(int(s['free_bytes']))} "
            f"(largest block {_mib(int(s['largest_free_block']))}, fragmentation {s['fragmentation']:.3f}), "
            f"peak {_mib(int(s['peak_allocated_bytes']))}, hits {s['cache_hits']} / misses {s['cache_misses']}"
        )

    # ------------------------------------------------------------------ internals

    @staticmethod
    def _addr(block: Block) -> int:
        return block.segment.buf.__array_interface__["data"][0] + block.offset

    def _take_free(self, pool: str, size: int) -> Block | None:
        keys = self._free[pool]
        i = bisect.bisect_left(keys, (size, -1, -1))
        if i == len(keys):
            return None
        key = keys.pop(i)
        return self._free_blocks.pop(key)

    def _insert_free(self, block: Block) -> None:
        key = block._key()
        bisect.insort(self._free[block.pool], key)
        self._free_blocks[key] = block

    def _remove_free(self, block: Block) -> None:
        key = block._key()
        keys = self._free[block.pool]
        del keys[bisect.bisect_left(keys, key)]
        del self._free_blocks[key]

    def _new_segment(self, size: int, pool: str, nbytes: int) -> Block:
        seg_size = self.segment_size(size)
        if self.limit_bytes is not None and self._c["reserved_bytes"] + seg_size > self.limit_bytes:
            self.empty_cache()  # as PyTorch: release cached segments, then retry once
            if self._c["reserved_bytes"] + seg_size > self.limit_bytes:
                seg_size = size  # an exact-size segment may still fit under the limit
            if self._c["reserved_bytes"] + seg_size > self.limit_bytes:
                self._c["num_ooms"] += 1
                raise self._oom(nbytes, size)
        sid = next(self._ids)
        seg = _Segment(sid, seg_size, pool)
        block = Block(seg, 0, seg_size, pool)
        seg.head = block
        self._segments[sid] = seg
        c = self._c
        c["reserved_bytes"] += seg_size
        c["num_segment_alloc"] += 1
        c["peak_reserved_bytes"] = max(c["peak_reserved_bytes"], c["reserved_bytes"])
        return block

    def _split(self, block: Block, size: int) -> None:
        rest = block.size - size
        # small pool: keep any 512 B remainder; large pool: only a remainder worth a small request
        if rest >= (MIN_BLOCK if block.pool == "small" else SMALL_SIZE + 1):
            tail = Block(block.segment, block.offset + size, rest, block.pool)
            tail.prev, tail.next = block, block.next
            if block.next is not None:
                block.next.prev = tail
            block.next = tail
            block.size = size
            self._insert_free(tail)

    def _merge(self, block: Block, nb: Block) -> Block:
        first, second = (block, nb) if nb is block.next else (nb, block)
        first.size += second.size
        first.next = second.next
        if second.next is not None:
            second.next.prev = first
        return first

    def _oom(self, nbytes: int, size: int) -> OutOfMemoryError:
        s = self.stats()
        return OutOfMemoryError(
            f"CachingAllocator (limit {_mib(int(self.limit_bytes or 0))})",
            f"out of memory: tried to allocate {_mib(nbytes)} (rounded to {_mib(size)}); "
            f"{_mib(int(s['allocated_bytes']))} allocated, {_mib(int(s['reserved_bytes']))} reserved, "
            f"{_mib(int(s['free_bytes']))} free in the cache, largest free block {_mib(int(s['largest_free_block']))}",
            "call empty_cache() to release cached segments, free tensors you no longer need, use a smaller "
            "batch or sequence, or raise the limit (SessionOptions.memory_limit_bytes / limit_bytes)",
        )
