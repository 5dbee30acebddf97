"""CachingAllocator: rounding, pools, split/coalesce, cache hits, capacity limit, stats; random traces."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from opstrata.runtime import CachingAllocator, InvalidArgument, OutOfMemoryError
from opstrata.runtime._allocator import LARGE_SEGMENT, MIN_BLOCK, SMALL_SEGMENT

MiB = 1 << 20


def test_rounding_and_segment_sizes() -> None:
    r = CachingAllocator.round_size
    assert [r(0), r(1), r(512), r(513), r(4096)] == [512, 512, 512, 1024, 4096]
    s = CachingAllocator.segment_size
    assert s(512) == s(MiB) == SMALL_SEGMENT
    assert s(MiB + 512) == s(9 * MiB) == LARGE_SEGMENT
    assert s(11 * MiB) == 12 * MiB  # own segment, rounded to 2 MiB


def test_small_and_large_pools_and_split() -> None:
    a = CachingAllocator()
    x = a.allocate(100)
    y = a.allocate(3 * MiB)
    assert x.pool == "small" and x.size == MIN_BLOCK and x.segment.size == SMALL_SEGMENT
    assert y.pool == "large" and y.segment.size == LARGE_SEGMENT
    assert x.segment is not y.segment
    z = a.allocate(1000)  # split from the rest of x's segment: a cache hit
    assert z.segment is x.segment and z.offset == x.offset + x.size
    s = a.stats()
    assert (s["cache_misses"], s["cache_hits"], s["num_segments"]) == (2, 1, 2)
    assert s["allocated_bytes"] == 512 + 3 * MiB + 1024 and s["requested_bytes"] == 100 + 3 * MiB + 1000
    assert s["reserved_bytes"] == SMALL_SEGMENT + LARGE_SEGMENT


def test_free_coalesces_and_reuses() -> None:
    a = CachingAllocator()
    blocks = [a.allocate(4096) for _ in range(4)]
    for b in blocks[1:3]:
        a.free(b)
    mid = [b for b in a.blocks() if not b.allocated and b.offset == blocks[1].offset]
    assert mid and mid[0].size == 8192  # the two freed neighbours merged
    again = a.allocate(8000)
    assert again.offset == blocks[1].offset  # best fit reuses the hole
    for b in (blocks[0], blocks[3], again):
        a.free(b)
    assert len(a.blocks()) == 1 and a.stats()["fragmentation"] == 0.0


def test_arrays_views_and_free_by_array() -> None:
    a = CachingAllocator()
    x = a.empty((3, 4), np.float32)
    y = a.empty(10, np.int64)
    x[:] = 1.5
    y[:] = 7
    assert x.sum() == 18 and y.sum() == 70 and not np.shares_memory(x, y)
    a.free(x)
    a.free(y)
    assert a.stats()["allocated_bytes"] == 0
    with pytest.raises(InvalidArgument, match="not returned by this allocator"):
        a.free(x)  # double free
    with pytest.raises(InvalidArgument, match="not returned by this allocator"):
        a.free(np.zeros(3))


def test_empty_cache_releases_unused_segments() -> None:
    a = CachingAllocator()
    keep = a.allocate(100)
    drop = a.allocate(5 * MiB)
    a.free(drop)
    assert a.empty_cache() == LARGE_SEGMENT
    s = a.stats()
    assert s["reserved_bytes"] == SMALL_SEGMENT and s["num_segments"] == 1
    a.free(keep)
    a.empty_cache()
    assert a.stats()["reserved_bytes"] == 0


def test_out_of_memory_message() -> None:
    a = CachingAllocator(limit_bytes=4 * MiB)
    a.allocate(MiB)  # a 2 MiB small segment
    with pytest.raises(OutOfMemoryError) as info:
        a.allocate(3 * MiB)
    msg = str(info.value)
    for part in (
        "CachingAllocator (limit 4.00 MiB)",
        "tried to allocate 3.00 MiB",
        "1.00 MiB allocated",
        "2.00 MiB reserved",
        "1.00 MiB free in the cache",
        "largest free block 1.00 MiB",
        "empty_cache()",
        "smaller batch",
        "raise the limit",
    ):
        assert part in msg, (part, msg)
    assert isinstance(info.value, MemoryError)
    assert a.stats()["num_ooms"] == 1


def test_limit_releases_cache_before_failing() -> None:
    a = CachingAllocator(limit_bytes=24 * MiB)
    a.free(a.allocate(3 * MiB))  # a cached 20 MiB segment
    b = a.allocate(100)  # needs a 2 MiB small segment: fits (22 MiB)
    a.free(b)
    big = a.allocate(21 * MiB)  # over the limit with the cache, fits once the cache is released
    assert big.size == 22 * MiB and a.stats()["reserved_bytes"] <= 24 * MiB


def test_bad_requests() -> None:
    with pytest.raises(InvalidArgument, match="limit_bytes must be a positive int"):
        CachingAllocator(limit_bytes=0)
    with pytest.raises(InvalidArgument, match="nbytes must be an int >= 0"):
        CachingAllocator().allocate(-1)


def _check_invariants(a: CachingAllocator, live: list) -> None:
    spans = sorted((b.segment.id, b.offset, b.offset + b.size) for b in live)
    for (s1, _, e1), (s2, o2, _) in itertools.pairwise(spans):
        assert s1 != s2 or e1 <= o2, "live blocks overlap"
    blocks = a.blocks()
    st_ = a.stats()
    assert sum(b.size for b in blocks if b.allocated) == st_["allocated_bytes"]
    assert sum(b.size for b in blocks) == st_["reserved_bytes"]
    assert st_["active_blocks"] == len(live) == sum(b.allocated for b in blocks)
    assert st_["num_alloc"] - st_["num_free"] == len(live)
    assert 0.0 <= st_["fragmentation"] <= 1.0
    assert st_["peak_allocated_bytes"] >= st_["allocated_bytes"]
    for b in blocks:  # no two free neighbours left uncoalesced
        if not b.allocated and b.next is not None:
            assert b.next.allocated


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 3 * MiB), st.integers(0, 10**6)), max_size=60))
def test_random_traces_keep_invariants(trace) -> None:
    a = CachingAllocator()
    live: list = []
    for alloc, size, pick in trace:
        if alloc or not live:
            b = a.allocate(size)
            b.segment.buf[b.offset : b.offset + b.size] = len(live) % 251  # writes stay in the block
            live.append(b)
        else:
            a.free(live.pop(pick % len(live)))
        _check_invariants(a, live)
    for b in live:
        a.free(b)
    segs = {b.segment.id for b in a.blocks()}
    assert len(a.blocks()) == len(segs)  # every segment coalesced back to one free block
    assert a.stats()["allocated_bytes"] == 0
    a.empty_cache()
    assert a.stats()["reserved_bytes"] == 0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 2 * MiB), min_size=1, max_size=30), st.integers(3, 12))
def test_random_traces_under_a_limit(sizes, limit_mib) -> None:
    a = CachingAllocator(limit_bytes=limit_mib * MiB)
    live = []
    for n in sizes:
        try:
            live.append(a.allocate(n))
        except OutOfMemoryError as exc:
            assert "tried to allocate" in str(exc)
            a.free(live.pop(0)) if live else None
        assert a.stats()["reserved_bytes"] <= limit_mib * MiB
        _check_invariants(a, live)


def test_zero_size_arrays_come_back_and_free_once() -> None:
    """A Loop with zero iterations asks for empty arrays: each is its own, freed once, no block used."""
    from opstrata.runtime import CachingAllocator

    alloc = CachingAllocator()
    x, y = alloc.empty((0, 3), np.float32), alloc.empty((2, 0), np.int64)
    assert x.shape == (0, 3) and y.dtype == np.int64
    alloc.free(x)
    alloc.free(y)
    with pytest.raises(Exception, match="zero-size array was not returned"):
        alloc.free(x)
    with pytest.raises(Exception, match="zero-size array was not returned"):
        alloc.free(np.empty((0,), np.float32))
