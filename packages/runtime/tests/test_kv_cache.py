"""PagedKVCache: append/gather against contiguous arrays, copy-on-write forks, exact stats, errors, random traces."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from opstrata.runtime import CachingAllocator, InvalidArgument, KVCacheFullError, PagedKVCache

L, HKV, D, BS = 2, 2, 3, 4


def _cache(num_blocks: int = 16, **kw: object) -> PagedKVCache:
    return PagedKVCache(
        num_layers=L, num_kv_heads=HKV, head_dim=D, block_size=BS, num_blocks=num_blocks, **kw
    )


def _kv(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    return tuple(rng.standard_normal((L, n, HKV, D)).astype(np.float32) for _ in range(2))  # type: ignore[return-value]


def _gathered(cache: PagedKVCache, seq: int, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """One sequence's K/V as (M, Hkv, D)."""
    k, v, lengths = cache.gather(layer, [seq])
    assert lengths.tolist() == [cache.length(seq)]
    return k[0].transpose(1, 0, 2), v[0].transpose(1, 0, 2)


def test_append_in_chunks_then_gather_equals_the_contiguous_tensors() -> None:
    rng = np.random.default_rng(0)
    cache = _cache()
    seqs = [cache.add_sequence() for _ in range(3)]
    ref: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {s: [] for s in seqs}
    for chunk in (3, 1, 5, 1, 2):
        for s in seqs:
            k, v = _kv(rng, chunk)
            cache.append(s, k, v)
            ref[s].append((k, v))
    for layer in range(L):
        k, v, lengths = cache.gather(layer, seqs)
        assert k.shape == (3, HKV, 12, D) and lengths.tolist() == [12, 12, 12]
        for i, s in enumerate(seqs):
            want_k = np.concatenate([kk[layer] for kk, _ in ref[s]])  # (M, Hkv, D)
            want_v = np.concatenate([vv[layer] for _, vv in ref[s]])
            np.testing.assert_array_equal(k[i].transpose(1, 0, 2), want_k)
            np.testing.assert_array_equal(v[i].transpose(1, 0, 2), want_v)
    assert [len(cache.block_table(s)) for s in seqs] == [3, 3, 3]
    cache.check_invariants()


def test_gather_pads_shorter_sequences_and_reports_lengths() -> None:
    rng = np.random.default_rng(1)
    cache = _cache()
    a, b = cache.add_sequence(), cache.add_sequence()
    ka, va = _kv(rng, 7)
    kb, vb = _kv(rng, 2)
    cache.append(a, ka, va)
    cache.append(b, kb, vb)
    tables = cache.padded_tables([b, a])
    assert tables[0].shape == (2, 2) and tables[1].tolist() == [2, 7]
    k, v, lengths = cache.gather(1, tables=tables)
    assert k.shape == v.shape == (2, HKV, 7, D) and lengths.tolist() == [2, 7]
    np.testing.assert_array_equal(k[0, :, :2].transpose(1, 0, 2), kb[1])
    np.testing.assert_array_equal(v[1].transpose(1, 0, 2), va[1])


def test_reserve_and_write_per_layer_like_a_decoder() -> None:
    cache = _cache()
    seqs = [cache.add_sequence() for _ in range(2)]
    slots = cache.reserve(seqs, 3)
    assert slots.shape == (6,) and len(set(slots.tolist())) == 6
    for layer in range(L):
        k = np.full((6, HKV, D), layer + 1.0, np.float32)
        cache.write(layer, slots, k, -k)
    k, v, _ = cache.gather(1, seqs)
    assert (k == 2.0).all() and (v == -2.0).all()


def test_fork_shares_blocks_until_a_shared_partial_block_is_written() -> None:
    rng = np.random.default_rng(2)
    cache = _cache()
    parent = cache.add_sequence()
    k, v = _kv(rng, 6)  # blocks: [full, 2 of 4]
    cache.append(parent, k, v)
    child = cache.fork(parent)
    assert cache.block_table(child) == cache.block_table(parent)
    assert [cache.refcount(b) for b in cache.block_table(parent)] == [2, 2]
    s = cache.stats()
    assert (s["used_blocks"], s["shared_blocks"], s["logical_tokens"], s["physical_tokens"]) == (2, 2, 12, 6)

    k1, v1 = _kv(rng, 1)
    cache.append(child, k1, v1)  # writes into the shared partial block: copy on write
    full, last = cache.block_table(parent)
    assert cache.block_table(child)[0] == full and cache.block_table(child)[1] != last
    assert cache.refcount(full) == 2 and cache.refcount(last) == 1
    assert cache.stats()["num_cow_copies"] == 1
    pk, _ = _gathered(cache, parent, 0)
    ck, cv = _gathered(cache, child, 1)
    np.testing.assert_array_equal(pk, k[0])  # the parent never sees the child's token
    np.testing.assert_array_equal(ck, np.concatenate([k[1], k1[1]]))
    np.testing.assert_array_equal(cv, np.concatenate([v[1], v1[1]]))

    cache.append(parent, *_kv(rng, 1))  # the parent's last block is its own now: written in place
    assert cache.block_table(parent)[1] == last and cache.stats()["num_cow_copies"] == 1
    cache.check_invariants()


def test_fork_at_a_block_boundary_needs_no_copy() -> None:
    rng = np.random.default_rng(3)
    cache = _cache()
    parent = cache.add_sequence()
    cache.append(parent, *_kv(rng, 8))
    children = [cache.fork(parent) for _ in range(3)]
    for c in children:
        cache.append(c, *_kv(rng, 1))
    s = cache.stats()
    assert s["num_cow_copies"] == 0 and s["used_blocks"] == 2 + 3 and s["shared_blocks"] == 2
    cache.free(parent)  # the children keep the prefix alive
    assert cache.stats()["used_blocks"] == 5 and [
        cache.refcount(b) for b in cache.block_table(children[0])[:2]
    ] == [3, 3]
    for c in children:
        cache.free(c)
    assert cache.stats()["used_blocks"] == 0 and cache.num_free_blocks == 16
    cache.check_invariants()


def test_a_batch_reserve_counts_only_the_copies_it_makes() -> None:
    cache = _cache(num_blocks=3)
    a = cache.add_sequence()
    cache.reserve(a, 2)
    b, c = cache.fork(a), cache.fork(a)
    cache.reserve([a, b, c], 1)  # a and b copy the shared block, c then owns it alone: 2 blocks, not 3
    assert cache.num_free_blocks == 0 and cache.stats()["num_cow_copies"] == 2
    assert sorted(cache.block_table(s)[0] for s in (a, b, c)) == [0, 1, 2]
    cache.check_invariants()


def test_stats_are_exact_on_a_constructed_case() -> None:
    cache = _cache(num_blocks=10)
    slot = 2 * L * HKV * D * 4  # K and V, every layer, float32
    assert cache.bytes_per_slot == slot and cache.bytes_per_block == BS * slot
    a, b = cache.add_sequence(), cache.add_sequence()
    cache.reserve(a, 5)  # 2 blocks, 3 slots wasted
    cache.reserve(b, 8)  # 2 full blocks
    s = cache.stats()
    assert (s["bytes_per_slot"], s["bytes_per_block"], s["pool_bytes"]) == (slot, BS * slot, 10 * BS * slot)
    assert (s["used_blocks"], s["free_blocks"], s["num_sequences"]) == (4, 6, 2)
    assert s["reserved_bytes"] == 4 * BS * slot and s["used_bytes"] == 13 * slot
    assert s["waste_bytes"] == 3 * slot and s["waste_fraction"] == pytest.approx(3 / 16)
    assert s["num_appended_tokens"] == 13 and s["peak_used_blocks"] == 4
    cache.free(a)
    s = cache.stats()
    assert (s["used_blocks"], s["waste_bytes"], s["waste_fraction"], s["peak_used_blocks"]) == (2, 0, 0.0, 4)
    assert "2/10 blocks" in repr(cache)


def test_out_of_blocks_error_names_the_need_and_changes_nothing() -> None:
    cache = _cache(num_blocks=3)
    a = cache.add_sequence()
    cache.reserve(a, 6)  # 2 blocks, the last one half full
    b = cache.fork(a)
    before = (cache.stats(), cache.block_table(a), cache.block_table(b), cache.length(b))
    with pytest.raises(KVCacheFullError) as err:
        cache.reserve([a, b], 4)  # a: a copy + 1 new block; b (then sole owner): 1 new block -> 3 > 1 free
    text = str(err.value)
    assert "needs 3 free block(s), 1 free" in text and "2 sequences" in text
    assert "cache.free(seq)" in text and "num_blocks" in text
    assert isinstance(err.value, MemoryError)
    assert (cache.stats(), cache.block_table(a), cache.block_table(b), cache.length(b)) == before
    cache.reserve(b, 1)  # a copy of the shared last block fits exactly
    assert cache.num_free_blocks == 0
    with pytest.raises(KVCacheFullError, match="needs 1 free block"):
        cache.reserve(a, 3)
    cache.check_invariants()


def test_bad_arguments_are_clear_errors() -> None:
    cache = _cache()
    s = cache.add_sequence()
    with pytest.raises(InvalidArgument, match="unknown sequence id 99"):
        cache.reserve(99, 1)
    cache.free(s)
    with pytest.raises(InvalidArgument, match="unknown sequence id"):
        cache.free(s)  # double free
    s = cache.add_sequence()
    with pytest.raises(InvalidArgument, match=r"shape \(num_layers, tokens, Hkv, D\) = \(2, n, 2, 3\)"):
        cache.append(s, np.zeros((2, 1, 3, 3)), np.zeros((2, 1, 3, 3)))
    with pytest.raises(InvalidArgument, match="layer must be in"):
        cache.gather(2, [s])
    with pytest.raises(InvalidArgument, match="repeat"):
        cache.reserve([s, s], 1)
    with pytest.raises(InvalidArgument, match=r"shape \(tokens, Hkv, D\)"):
        cache.write(0, cache.reserve(s, 2), np.zeros((1, HKV, D)), np.zeros((1, HKV, D)))
    with pytest.raises(InvalidArgument, match="num_blocks must be an int >= 1"):
        PagedKVCache(num_layers=1, num_kv_heads=1, head_dim=1, num_blocks=0)
    with pytest.raises(InvalidArgument, match="float dtype"):
        PagedKVCache(num_layers=1, num_kv_heads=1, head_dim=1, num_blocks=1, dtype=np.int32)


def test_pool_can_live_in_the_caching_allocator() -> None:
    alloc = CachingAllocator()
    cache = _cache(num_blocks=8, allocator=alloc)
    assert alloc.stats()["requested_bytes"] == cache.stats()["pool_bytes"]
    s = cache.add_sequence()
    cache.append(s, *_kv(np.random.default_rng(4), 5))
    cache.close()
    assert alloc.stats()["allocated_bytes"] == 0


ops = st.lists(
    st.tuples(
        st.sampled_from(["add", "append", "append", "fork", "free"]), st.integers(0, 50), st.integers(0, 9)
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(ops=ops, num_blocks=st.integers(1, 12))
def test_random_append_fork_free_traces_keep_the_invariants(ops: list, num_blocks: int) -> None:
    """After every step: no block leaked or double-owned, and every sequence reads back what it wrote."""
    rng = np.random.default_rng(0)
    cache = _cache(num_blocks=num_blocks)
    ref: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for op, pick, n in ops:
        live = sorted(ref)
        if op == "add" or not live:
            ref[cache.add_sequence()] = (np.zeros((L, 0, HKV, D), np.float32),) * 2
            continue
        s = live[pick % len(live)]
        if op == "append":
            k, v = _kv(rng, n)
            before = cache.stats()
            try:
                cache.append(s, k, v)
            except KVCacheFullError:
                assert cache.stats() == before  # all or nothing
            else:
                ref[s] = (np.concatenate([ref[s][0], k], axis=1), np.concatenate([ref[s][1], v], axis=1))
        elif op == "batch":  # every live sequence at once, as a decode step does
            before = cache.stats()
            try:
                slots = cache.reserve(live, n)
            except KVCacheFullError:
                assert cache.stats() == before
                continue
            k, v = _kv(rng, len(live) * n)
            for layer in range(L):
                cache.write(layer, slots, k[layer], v[layer])
            for i, t in enumerate(live):
                rows = slice(i * n, (i + 1) * n)
                ref[t] = tuple(
                    np.concatenate([r, new[:, rows]], axis=1) for r, new in zip(ref[t], (k, v), strict=True)
                )
        elif op == "fork":
            ref[cache.fork(s)] = ref[s]
        else:
            cache.free(s)
            del ref[s]
        cache.check_invariants()
        assert cache.stats()["used_blocks"] + cache.num_free_blocks == num_blocks
    for s, (k, v) in ref.items():
        for layer in range(L):
            gk, gv = _gathered(cache, s, layer)
            np.testing.assert_array_equal(gk, k[layer])
            np.testing.assert_array_equal(gv, v[layer])
    for s in list(ref):
        cache.free(s)
    assert cache.num_free_blocks == num_blocks and cache.stats()["physical_tokens"] == 0
