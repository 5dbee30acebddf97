"""FlashAttention-2 on cpu: forward, lse and backward against ``ref``; backward against finite differences."""

from __future__ import annotations

import tracemalloc

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import opstrata.ops as ops
from opstrata.ops.kernels import flash_attention as fa
from opstrata.ops.kernels.flash_attention import attention_backward_cpu, attention_cpu
from opstrata.ops.testing import assert_close, tolerances

DTYPES = [np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]
ODD_SIZES = [(1, 1), (7, 7), (129, 129), (7, 129), (129, 7), (1, 129), (33, 1)]  # (N, M)


def inputs(b, h, hkv, n, m, d, dtype, *, dv=None, seed=0, mask_kind="none", mask_shape=None):
    rng = np.random.default_rng(seed)
    q = rng.uniform(-1, 1, (b, h, n, d)).astype(dtype)
    k = rng.uniform(-1, 1, (b, hkv, m, d)).astype(dtype)
    v = rng.uniform(-1, 1, (b, hkv, m, dv or d)).astype(dtype)
    shape = mask_shape or (n, m)
    keep = rng.random(shape) > 0.3
    mask = {
        "none": None,
        "bool": keep,
        "float": np.where(keep, rng.uniform(-2, 2, shape), -np.inf).astype(np.float32),
        "float_q": rng.uniform(-1, 1, shape).astype(dtype),  # finite, in q's dtype: cast per tile
    }[mask_kind]
    return q, k, v, mask


def close_low(actual: np.ndarray, expected: np.ndarray, rel: float) -> None:
    """Closeness scaled to the tensor's magnitude (gradients in low precision have cancellation)."""
    a, e = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    scale = max(1.0, float(np.abs(e).max(initial=0.0)))
    np.testing.assert_allclose(a, e, rtol=rel, atol=rel * scale)


def lse_close(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    assert np.array_equal(np.isneginf(actual), np.isneginf(expected))
    tol = 1e-12 if expected.dtype == np.float64 else 2e-5
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol)


# ---------------------------------------------------------------------------------------------
# forward against ref
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("n", "m"), ODD_SIZES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "float"])
def test_forward_matches_ref_at_odd_sizes(dtype, n, m, causal, mask_kind) -> None:
    q, k, v, mask = inputs(1, 4, 2, n, m, 16, dtype, mask_kind=mask_kind, seed=n * 1000 + m)
    ref, ref_lse = ops.attention(q, k, v, causal=causal, mask=mask, device="ref", return_lse=True)
    for blocks in ({}, {"block_q": 16, "block_k": 32}, {"block_q": 5, "block_k": 3}):
        out, lse = attention_cpu(q, k, v, causal=causal, mask=mask, return_lse=True, **blocks)
        assert out.dtype == dtype and out.shape == ref.shape
        assert_close(out, ref, rtol=tolerances(dtype)[0], atol=max(tolerances(dtype)[1], 1e-6))
        lse_close(lse, ref_lse)


@st.composite
def cases(draw: st.DrawFn) -> dict:
    b, hkv, group = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    n, m = draw(st.integers(0, 40)), draw(st.integers(0, 40))
    full = (b, hkv * group, n, m)
    mask_shape = tuple(draw(st.sampled_from([s, 1])) for s in full)[draw(st.integers(0, 2)) :]
    return dict(
        shape=(b, hkv * group, hkv, n, m, draw(st.integers(1, 8))),
        dv=draw(st.integers(1, 5)),
        dtype=draw(st.sampled_from([np.float64, np.float32])),
        mask_kind=draw(st.sampled_from(["none", "bool", "float", "float_q"])),
        mask_shape=mask_shape,
        kw=dict(causal=draw(st.booleans()), scale=draw(st.sampled_from([None, 0.3]))),
        tiles=dict(
            block_q=draw(st.integers(1, 17)),
            block_k=draw(st.integers(1, 17)),
            workers=draw(st.integers(1, 3)),
        ),
    )


@settings(max_examples=40, deadline=None)
@given(case=cases(), seed=st.integers(0, 2**16))
def test_forward_and_backward_match_ref_over_shapes_and_tiles(case, seed) -> None:
    q, k, v, mask = inputs(
        *case["shape"],
        case["dtype"],
        dv=case["dv"],
        seed=seed,
        mask_kind=case["mask_kind"],
        mask_shape=case["mask_shape"],
    )
    kw = dict(case["kw"], mask=mask)
    ref, ref_lse = ops.attention(q, k, v, device="ref", return_lse=True, **kw)
    out, lse = attention_cpu(q, k, v, return_lse=True, **kw, **case["tiles"])
    assert_close(out, ref)
    lse_close(lse, ref_lse)
    go = np.random.default_rng(seed + 1).uniform(-1, 1, out.shape).astype(q.dtype)
    expected = ops.attention_backward(q, k, v, ref, go, ref_lse, device="ref", **kw)
    got = attention_backward_cpu(q, k, v, out, go, lse, **kw, **case["tiles"])
    rel = 1e-10 if q.dtype == np.float64 else 2e-4
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == q.dtype
        close_low(g, e, rel)


def test_gqa_equals_repeated_kv_heads_and_group_rows_keep_their_positions() -> None:
    q, k, v, _ = inputs(2, 6, 2, 37, 53, 8, np.float64, seed=3)
    for causal in (False, True):
        gqa = attention_cpu(q, k, v, causal=causal, block_q=4, block_k=8)
        mha = attention_cpu(q, np.repeat(k, 3, axis=1), np.repeat(v, 3, axis=1), causal=causal)
        assert_close(gqa, mha)


def test_fully_masked_rows_are_zero_with_neg_inf_lse_and_zero_grads() -> None:
    q, k, v, _ = inputs(1, 2, 1, 9, 4, 8, np.float32, seed=4)
    keep = np.ones((9, 4), bool)
    keep[[2, 5]] = False
    go = np.ones((1, 2, 9, 8), np.float32)
    for mask in (keep, np.where(keep, 0.0, -np.inf).astype(np.float32)):
        out, lse = attention_cpu(q, k, v, mask=mask, return_lse=True, block_q=2, block_k=3)
        assert np.all(out[:, :, [2, 5]] == 0) and np.isfinite(out).all()
        assert np.all(np.isneginf(lse[:, :, [2, 5]])) and np.isfinite(lse[:, :, [0, 1, 3]]).all()
        dq, dk, dv = attention_backward_cpu(q, k, v, out, go, lse, mask=mask, block_q=2, block_k=3)
        assert np.all(dq[:, :, [2, 5]] == 0) and all(np.isfinite(g).all() for g in (dq, dk, dv))
    # causal with N > M: the first N - M queries see no key (bottom-right alignment)
    out, lse = attention_cpu(q, k, v, causal=True, return_lse=True, block_q=2, block_k=2)
    assert np.all(out[:, :, :5] == 0) and np.all(np.isneginf(lse[:, :, :5]))
    assert_close(out, ops.attention(q, k, v, causal=True, device="ref"))


def test_causal_skips_tiles_above_the_diagonal_and_masks_only_the_diagonal(monkeypatch) -> None:
    visited: list[tuple[tuple[int, int], tuple[int, int]]] = []
    real = fa._scores

    def spy(qi, kj, buf, mask5, t, rows, cols):
        visited.append((rows, cols))
        return real(qi, kj, buf, mask5, t, rows, cols)

    monkeypatch.setattr(fa, "_scores", spy)
    q, k, v, _ = inputs(1, 1, 1, 64, 64, 4, np.float64)
    attention_cpu(q, k, v, causal=True, block_q=16, block_k=16, workers=1)
    assert sorted(visited) == [
        ((i, i + 16), (j, j + 16)) for i in range(0, 64, 16) for j in range(0, i + 1, 16)
    ]
    visited.clear()
    attention_cpu(q[:, :, 60:], k, v, causal=True, block_q=16, block_k=16, workers=1)  # N=4 decoding, M=64
    assert [c for _, c in visited] == [(j, j + 16) for j in range(0, 64, 16)]


@pytest.mark.parametrize("workers", [1, 4])
def test_never_materialises_the_score_matrix(workers: int) -> None:
    """Peak memory is a few score tiles per worker, not the (N, M) matrix, on any core count.

    The worker count is given, so the bound does not depend on the machine: each worker holds one
    (rows x keys) float32 score tile plus its exp/rescale temporaries (measured at 1.5-2.5 tiles), and
    the call allocates the output, the lse and a scaled copy of q (4 x q's bytes covers them).
    """
    q, k, v, _ = inputs(1, 1, 1, 2048, 2048, 16, np.float32)
    attention_cpu(q, k, v, causal=True)  # warm up imports and pools
    tile = fa.DEFAULT_TILE_ROWS * fa.DEFAULT_BLOCK_K * 4
    bound = 3 * workers * tile + 4 * q.nbytes
    scores = 2048 * 2048 * 4
    assert bound <= scores / 4, "the bound must stay well below the score matrix to prove anything"
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        attention_cpu(q, k, v, workers=workers)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert peak < bound, (
        f"peak {peak} bytes with {workers} workers: at most {bound} expected ({scores} = scores)"
    )


def test_workers_do_not_change_the_result() -> None:
    q, k, v, mask = inputs(2, 4, 2, 100, 90, 8, np.float32, mask_kind="bool", seed=5)
    one = attention_cpu(q, k, v, causal=True, mask=mask, workers=1, block_q=8)
    assert np.array_equal(one, attention_cpu(q, k, v, causal=True, mask=mask, workers=2, block_q=8))
    go = np.ones_like(one)
    _, lse = attention_cpu(q, k, v, causal=True, mask=mask, return_lse=True)
    g1 = attention_backward_cpu(q, k, v, one, go, lse, causal=True, mask=mask, workers=1, block_q=8)
    g2 = attention_backward_cpu(q, k, v, one, go, lse, causal=True, mask=mask, workers=2, block_q=8)
    assert all(np.array_equal(a, b) for a, b in zip(g1, g2, strict=True))


# ---------------------------------------------------------------------------------------------
# backward
# ---------------------------------------------------------------------------------------------


def finite_difference(f, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + eps
        up = f()
        x[idx] = old - eps
        down = f()
        x[idx] = old
        grad[idx] = (up - down) / (2 * eps)
    return grad


@pytest.mark.parametrize("device", ["ref", "cpu"])
@pytest.mark.parametrize(
    ("causal", "mask_kind"), [(False, "none"), (True, "none"), (True, "float"), (False, "bool")]
)
def test_backward_matches_finite_differences(device, causal, mask_kind) -> None:
    q, k, v, mask = inputs(1, 4, 2, 5, 7, 3, np.float64, dv=2, seed=6, mask_kind=mask_kind)
    w = np.random.default_rng(7).standard_normal((1, 4, 5, 2))
    kw = dict(causal=causal, mask=mask, scale=0.7)

    def loss() -> float:
        return float((ops.attention(q, k, v, device=device, **kw) * w).sum())

    out, lse = ops.attention(q, k, v, device=device, return_lse=True, **kw)
    grads = ops.attention_backward(q, k, v, out, w, lse, device=device, **kw)
    for g, x in zip(grads, (q, k, v), strict=True):
        np.testing.assert_allclose(g, finite_difference(loss, x), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("n", "m"), [(7, 7), (129, 129), (33, 70), (70, 33)])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_matches_ref(dtype, n, m, causal) -> None:
    q, k, v, mask = inputs(1, 4, 2, n, m, 16, dtype, seed=n + m, mask_kind="bool")
    go = np.random.default_rng(8).uniform(-1, 1, (1, 4, n, 16)).astype(dtype)
    out, lse = ops.attention(q, k, v, causal=causal, mask=mask, return_lse=True)  # the registry's cpu kernel
    expected = ops.attention_backward(q, k, v, out, go, lse, causal=causal, mask=mask, device="ref")
    got = ops.attention_backward(q, k, v, out, go, lse, causal=causal, mask=mask)
    rel = {np.float64: 1e-10, np.float32: 1e-4}.get(dtype.type, 3e-2)  # low precision: O is rounded
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == dtype and g.shape == e.shape
        close_low(g, e, rel)


def test_public_api() -> None:
    assert "attention_backward" in ops.__all__ and ops.attention_backward is not None
    for dt in ("float32", "bfloat16", "float8_e4m3fn"):
        assert (
            ops.dispatch_path("attention_backward", "cpu", dt)
            == ops.dispatch_path("attention", "cpu", dt)
            == "native"
        )
    q, k, v, _ = inputs(1, 2, 1, 3, 4, 8, np.float32)
    out = ops.attention(q, k, v)
    out2, lse = ops.attention(q, k, v, return_lse=True)
    assert np.array_equal(out, out2) and lse.shape == (1, 2, 3) and lse.dtype == np.float32
    _, lse16 = ops.attention(
        q.astype(np.float16), k.astype(np.float16), v.astype(np.float16), return_lse=True
    )
    assert lse16.dtype == np.float32  # the accumulation dtype


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "pattern"),
    [
        ({"block_q": 0}, r"attention: argument 'block_q' expected an int >= 1.*got 0"),
        ({"block_k": -3}, r"attention: argument 'block_k' expected an int >= 1.*got -3"),
        ({"block_q": 2.5}, r"attention: argument 'block_q' expected an int >= 1.*got 2.5"),
        ({"block_q": True}, r"attention: argument 'block_q' expected an int >= 1.*got True"),
        ({"workers": 0}, r"attention: argument 'workers' expected an int >= 1.*got 0"),
    ],
)
def test_tile_and_worker_errors(kw, pattern) -> None:
    q, k, v, _ = inputs(1, 2, 1, 3, 4, 8, np.float32)
    with pytest.raises(ops.OpError, match=pattern):
        attention_cpu(q, k, v, **kw)
    out, lse = attention_cpu(q, k, v, return_lse=True)
    with pytest.raises(ops.OpError, match=pattern.replace("attention:", "attention_backward:")):
        attention_backward_cpu(q, k, v, out, out, lse, **kw)


@pytest.mark.parametrize("device", ["ref", "cpu"])
@pytest.mark.parametrize(
    ("what", "pattern"),
    [
        (
            "lse_shape",
            r"attention_backward: argument 'lse' expected shape \(B, H, N\) = \(1, 2, 3\), got \(1, 2\)",
        ),
        (
            "go_shape",
            r"attention_backward: argument 'grad_out' expected shape \(B, H, N, Dv\) = \(1, 2, 3, 8\)",
        ),
        ("out_dtype", r"attention_backward: argument 'out' expected dtype float32 .*got float64"),
        ("k_heads", r"attention_backward: argument 'k' expected a head count dividing q's H = 2"),
    ],
)
def test_backward_errors_name_op_argument_expected_actual(device, what, pattern) -> None:
    q, k, v, _ = inputs(1, 2, 1, 3, 4, 8, np.float32)
    out, lse = ops.attention(q, k, v, return_lse=True)
    go = np.ones_like(out)
    if what == "lse_shape":
        lse = lse[..., 0]
    elif what == "go_shape":
        go = go[:, :, :2]
    elif what == "out_dtype":
        out = out.astype(np.float64)
    else:
        k, v = (np.concatenate([t] * 3, axis=1) for t in (k, v))
    with pytest.raises(ops.OpError, match=pattern):
        ops.attention_backward(q, k, v, out, go, lse, device=device)


@pytest.mark.parametrize("dtype", [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2], ids=str)
def test_float8_accumulates_in_float32(dtype) -> None:
    q, k, v, mask = inputs(1, 4, 2, 40, 70, 16, dtype, mask_kind="bool", seed=9)
    ref, ref_lse = ops.attention(q, k, v, causal=True, mask=mask, device="ref", return_lse=True)
    out, lse = attention_cpu(q, k, v, causal=True, mask=mask, return_lse=True, block_q=8, block_k=16)
    assert out.dtype == dtype and lse.dtype == np.float32
    rtol, atol = tolerances(dtype)
    assert_close(out, ref, rtol=rtol, atol=max(atol, float(ml_dtypes.finfo(dtype).smallest_subnormal)))
    lse_close(lse, ref_lse)


def test_num_threads_env(monkeypatch) -> None:
    from opstrata.ops.kernels.parallel import default_workers

    monkeypatch.setenv("OPSTRATA_NUM_THREADS", "3")
    assert default_workers() == 3
    monkeypatch.setenv("OPSTRATA_NUM_THREADS", "two")
    with pytest.raises(ValueError, match=r"OPSTRATA_NUM_THREADS: expected an int >= 1, got 'two'"):
        default_workers()


def test_without_threadpoolctl_tiles_run_serially(monkeypatch) -> None:
    from opstrata.ops.kernels import parallel as _parallel

    monkeypatch.delenv("OPSTRATA_NUM_THREADS", raising=False)
    monkeypatch.setattr(_parallel, "_CONTROLLER", [None])  # as if threadpoolctl were missing
    assert _parallel.default_workers() == 1
    q, k, v, _ = inputs(1, 2, 1, 300, 300, 8, np.float32)
    assert_close(attention_cpu(q, k, v, causal=True), ops.attention(q, k, v, causal=True, device="ref"))


def test_backward_splits_query_tiles_when_kv_heads_are_fewer_than_workers() -> None:
    from opstrata.ops.kernels.attention import AttnShape
    from opstrata.ops.kernels.flash_attention import Tiling, _backward_units

    q, k, v, mask = inputs(1, 4, 1, 70, 50, 8, np.float64, mask_kind="bool", seed=10)  # MQA: one kv head
    s_units = _backward_units(AttnShape(1, 4, 1, 70, 50, 8, 8), Tiling(4, 8, 16, 1, -20, True), nw=3)
    assert len(s_units) == 3 and sorted(t for _, _, ts in s_units for t in ts) == [
        (i, min(i + 8, 70)) for i in range(0, 70, 8)
    ]
    out, lse = attention_cpu(q, k, v, causal=True, mask=mask, return_lse=True)
    go = np.random.default_rng(11).standard_normal(out.shape)
    expected = ops.attention_backward(q, k, v, out, go, lse, causal=True, mask=mask, device="ref")
    for workers in (1, 3):
        got = attention_backward_cpu(
            q, k, v, out, go, lse, causal=True, mask=mask, block_q=2, workers=workers
        )
        for g, e in zip(got, expected, strict=True):
            close_low(g, e, 1e-10)


# ---------------------------------------------------------------------------------------------
# single-tile path (short sequences): scores materialised, same answers as the tiled loop
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mask_kind", ["none", "bool", "float", "float_q"])
@pytest.mark.parametrize("causal", [False, True])
def test_single_tile_path_matches_tiled_and_ref(monkeypatch, dtype, mask_kind, causal) -> None:
    calls = []
    real = fa.attention_single_tile
    monkeypatch.setattr(fa, "attention_single_tile", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(fa, "bind_small_attention", lambda *a, **kw: None)  # numpy's path (native: test_bind)
    q, k, v, mask = inputs(2, 6, 2, 12, 20, 8, dtype, dv=5, mask_kind=mask_kind, seed=7)
    if mask is not None:
        mask[3] = False if mask.dtype == np.bool_ else -np.inf  # a fully masked query row
    ref, ref_lse = ops.attention(q, k, v, causal=causal, mask=mask, device="ref", return_lse=True)
    one, one_lse = attention_cpu(q, k, v, causal=causal, mask=mask, return_lse=True)
    assert calls == [1], "12 x 20 with default tiles is one tile"
    tiled, tiled_lse = attention_cpu(q, k, v, causal=causal, mask=mask, return_lse=True, block_q=4, block_k=8)
    assert calls == [1], "explicit smaller tiles take the tiled loop"
    tol = dict(rtol=tolerances(dtype)[0], atol=max(tolerances(dtype)[1], 1e-6))
    assert one.dtype == dtype and one.shape == ref.shape == (2, 6, 12, 5)
    assert_close(one, ref, **tol)
    assert_close(one, tiled, **tol)
    lse_close(one_lse, ref_lse)
    lse_close(one_lse, tiled_lse)
    if mask is not None:
        assert (one[:, :, 3] == 0).all() and np.isneginf(one_lse[:, :, 3]).all()


def test_single_tile_not_used_beyond_one_tile(monkeypatch) -> None:
    monkeypatch.setattr(fa, "attention_single_tile", lambda *a: pytest.fail("not a single tile"))
    q, k, v, _ = inputs(1, 2, 2, 200, 40, 8, np.float32)  # 200 queries > 128 rows per tile
    ref = ops.attention(q, k, v, device="ref")
    assert_close(attention_cpu(q, k, v), ref, rtol=1e-5, atol=1e-6)


def test_intra_op_threads_limit_the_workers(monkeypatch) -> None:
    """A caller's ops.intra_op_threads (what a session sets per run) beats OPSTRATA_NUM_THREADS; it nests,
    is restored when the block raises, and stays in its own thread and context."""
    import contextvars
    import threading

    from opstrata.ops.kernels import parallel

    monkeypatch.setenv("OPSTRATA_NUM_THREADS", "3")
    monkeypatch.setattr(parallel, "_controller", lambda: object())  # as if BLAS can be pinned
    assert ops.intra_op_thread_limit() is None and parallel.default_workers() == 3
    with ops.intra_op_threads(2):
        assert parallel.default_workers() == 2 and ops.intra_op_thread_limit() == 2
        with ops.intra_op_threads(1):
            assert parallel.default_workers() == 1
        assert parallel.default_workers() == 2
        other: list[int | None] = []
        t = threading.Thread(target=lambda: other.append(ops.intra_op_thread_limit()))
        t.start()
        t.join()
        assert other == [None]  # a plain thread starts from a fresh context
        assert contextvars.copy_context().run(ops.intra_op_thread_limit) == 2  # a copied one carries it
    with pytest.raises(RuntimeError), ops.intra_op_threads(4):
        raise RuntimeError("boom")
    assert ops.intra_op_thread_limit() is None
    monkeypatch.setattr(parallel, "_controller", lambda: None)  # BLAS cannot be pinned: serial
    with ops.intra_op_threads(4):
        assert parallel.default_workers() == 1
    for bad in (0, -1, 2.0, True, "2"):
        with pytest.raises(ops.OpError, match="intra_op_threads"), ops.intra_op_threads(bad):  # type: ignore[arg-type]
            pass


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_low_precision_backward_agrees_with_the_reference(dtype, causal) -> None:
    """out and lse handed over in float16/bfloat16 are rounded; the cpu backward recomputes them in float32,
    so it agrees with ref (which recomputes P from q and k) at the dtype's tolerance (the conformance
    matrix found it 1.5-3x further off before)."""
    r = np.random.default_rng(3)
    q, k, v, go = (r.standard_normal((2, 2, 16, 8)).astype(np.float32) * 3 for _ in range(4))
    q, k, v, go = (t.astype(dtype) for t in (q, k, v, go))
    out, lse = ops.attention(q, k, v, causal=causal, return_lse=True, device="ref")
    got = ops.attention_backward(q, k, v, out, go, lse, causal=causal, device="cpu")
    want = ops.attention_backward(q, k, v, out, go, lse, causal=causal, device="ref")
    rtol = 1e-3 if dtype == np.float16 else 1.6e-2
    for g, w in zip(got, want, strict=True):
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        np.testing.assert_allclose(g64, w64, rtol=rtol, atol=rtol * float(np.abs(w64).max()))
