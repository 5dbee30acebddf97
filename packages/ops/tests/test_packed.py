"""Packed native calls (two ctypes arguments instead of a dozen) and merged runs of them: the same
results as the unpacked calls, failures that name the call inside a batch."""

from __future__ import annotations

import ctypes
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import opstrata.ops as ops
from opstrata.ops import codegen as cg
from opstrata.ops.native.library import library
from opstrata.ops.native.packed import pack_args

NUMPY_MAJOR = int(np.__version__.split(".")[0])
pytestmark = pytest.mark.skipif(library() is None, reason="no native library on this machine (no C compiler)")


def test_pack_args_encodes_pointers_ints_and_floats() -> None:
    block = pack_args([None, 7, True, 1e-5, np.float32(0.5)])
    assert block.dtype == np.int64 and block[:3].tolist() == [0, 7, 1]
    assert struct.unpack("<d", struct.pack("<q", int(block[3])))[0] == 1e-5
    assert struct.unpack("<d", struct.pack("<q", int(block[4])))[0] == 0.5


def _chain(n: int = 64):
    """Three bound native calls: a VM program, a layer norm and an RMS norm, each reading the last."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, n)).astype(np.float32)
    a, b, c = (np.empty_like(x) for _ in range(3))
    w = rng.standard_normal(n).astype(np.float32)
    vm = cg.compile_expr(cg.apply("mul", cg.apply("sigmoid", cg.var("x")), cg.var("x")), np.float32)
    calls = [
        vm.bind(a, {"x": x}),
        ops.bind("layer_norm", a, w, None, out=b, eps=1e-3),
        ops.bind("rms_norm", b, w, out=c, eps=1e-6),
    ]
    return x, (a, b, c), calls


def test_merged_native_calls_give_the_separate_calls_results() -> None:
    x, outs, calls = _chain()
    assert all(isinstance(c, ops.NativeCall) for c in calls)
    for c in calls:
        c()
    want = [o.copy() for o in outs]
    for o in outs:
        o[...] = np.nan
    runner, owners = ops.merge_bound_calls(calls)
    assert len(runner) == 1 and isinstance(runner[0], ops.NativeBatch) and owners == [[0, 1, 2]]
    runner[0]()
    for got, w in zip(outs, want, strict=True):
        np.testing.assert_array_equal(got, w)
    np.testing.assert_allclose(want[0], x / (1 + np.exp(-x)), rtol=1e-6, atol=1e-6)


def test_a_python_step_splits_the_batch_and_bound_steps_open_up() -> None:
    _x, _outs, calls = _chain()
    seen = []
    runner, owners = ops.merge_bound_calls(
        [ops.BoundSteps([calls[0], lambda: seen.append(1)]), calls[1], calls[2]]
    )
    assert owners == [[0], [0], [1, 2]]
    assert isinstance(runner[0], ops.NativeCall) and isinstance(runner[2], ops.NativeBatch)
    for r in runner:
        r()
    assert seen == [1]


def test_a_failing_call_in_a_batch_is_named_by_its_index() -> None:
    _x, _outs, calls = _chain()
    calls[1].code = 999  # an id the library does not know: it returns an error code
    (batch,), _ = ops.merge_bound_calls(calls)
    with pytest.raises(ops.NativeBatchError) as info:
        batch()
    assert info.value.index == 1
    assert "opstrata_layer_norm_f32: native call failed with code -1000" in str(info.value.__cause__)
    with pytest.raises(RuntimeError, match="code -1000"):
        calls[1]()


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 40), k=st.integers(1, 40), n=st.integers(1, 40), batch=st.integers(1, 3),
    groups=st.sampled_from([1, 2]), seed=st.integers(0, 999),
)  # fmt: skip
def test_gemm_from_c_gives_numpys_bits_or_declines(m, k, n, batch, groups, seed) -> None:
    """numpy's own sgemm (sgemv for a single column) called from C with numpy's arguments: np.matmul's
    exact bits; a product numpy special-cases otherwise (one row, an inner dim of 1, a batch of groups
    beside a batch of images) is declined."""
    from opstrata.ops.native.blas import gemm_call, linear_call

    lib = library()
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((groups, m, k) if groups > 1 else (m, k)).astype(np.float32)
    b = rng.standard_normal((batch, groups, k, n)).astype(np.float32)
    out = np.full((batch, groups, m, n), np.nan, np.float32)
    call = gemm_call(lib, a, b, out)
    if min(m, k) < 2 or (groups > 1 and batch > 1):
        assert call is None  # numpy's vector / outer-product special cases, or a batch it broadcasts
        return
    if call is None:  # numpy's BLAS is not one C can call here (an MKL / Accelerate build)
        pytest.skip("numpy's sgemm is not reachable from C on this build")
    call()
    np.testing.assert_array_equal(out, np.matmul(a, b))
    x, w = a.reshape(-1, k)[:m], rng.standard_normal((n, k)).astype(np.float32)
    y = np.empty((m, n), np.float32)
    lin = linear_call(lib, np.ascontiguousarray(x), w, y)
    if n < 2:
        assert lin is None  # numpy's gemv for one output column is not taken for Linear
        return
    assert lin is not None
    lin()
    np.testing.assert_array_equal(y, np.matmul(np.ascontiguousarray(x), w.T))


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div"])
def test_binary_binders_give_the_ufuncs_bits_in_place_too(name: str) -> None:
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((3, 50)).astype(np.float32), rng.standard_normal((3, 50)).astype(np.float32)
    b[0, :3] = [0.0, np.inf, np.nan]
    want = getattr(ops, name)(a, b)
    out = np.empty_like(a)
    call = ops.bind(name, a, b, out=out)
    assert isinstance(call, ops.NativeCall)
    with np.errstate(all="ignore"):
        call()
    np.testing.assert_array_equal(out, want)
    a2 = a.copy()
    ops.bind(name, a2, b, out=a2)()  # in place
    np.testing.assert_array_equal(a2, want)
    broadcast = ops.bind(name, a, b[:1], out=out)  # not equal shapes: the kernel with its arguments
    assert not isinstance(broadcast, ops.NativeCall)
    broadcast()
    np.testing.assert_array_equal(out, getattr(ops, name)(a, b[:1]))


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(["add", "sub", "mul", "div"]), lead=st.lists(st.integers(1, 4), min_size=1, max_size=2),
    tail=st.lists(st.integers(1, 6), min_size=1, max_size=2), small_first=st.booleans(), in_place=st.booleans(),
    seed=st.integers(0, 99),
)  # fmt: skip
def test_a_per_row_operand_runs_natively_with_the_ufuncs_bits(
    name: str, lead: list[int], tail: list[int], small_first: bool, in_place: bool, seed: int
) -> None:
    """(N, C, 1, 1) against (N, C, H, W) (squeeze-excitation's gate): one C loop, numpy's broadcast bits."""
    if not ops.native_status().available or all(t == 1 for t in tail):
        return
    rng = np.random.default_rng(seed)
    full = rng.standard_normal((*lead, *tail)).astype(np.float32)
    small = rng.standard_normal((*lead, *[1] * len(tail))).astype(np.float32)
    small.flat[0] = [0.0, np.inf, np.nan][seed % 3]
    a, b = (small, full) if small_first else (full, small)
    with np.errstate(all="ignore"):
        want = getattr(np, {"add": "add", "sub": "subtract", "mul": "multiply", "div": "divide"}[name])(a, b)
        out = full if in_place else np.empty_like(full)
        call = ops.bind(name, a, b, out=out)
        assert isinstance(call, ops.NativeCall) and call.name == "row_binary_f32"
        call()
    np.testing.assert_array_equal(out, want)


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=5), dtype=st.sampled_from(["float32", "int64", "bool"]),
       data=st.data())  # fmt: skip
def test_bind_copy_copies_any_view(shape, dtype, data) -> None:
    rng = np.random.default_rng(0)
    base = rng.standard_normal([d * 2 for d in shape]).astype(dtype)
    view = base[tuple(slice(None, None, 2) for _ in shape)]
    perm = data.draw(st.permutations(range(len(shape))))
    view = view.transpose(perm)
    dst = np.empty(view.shape, view.dtype)
    call = ops.bind_copy(dst, view)
    assert isinstance(call, ops.NativeCall)
    call()
    np.testing.assert_array_equal(dst, view)
    base[...] = 0  # the view's current values are read at each call
    call()
    np.testing.assert_array_equal(dst, np.zeros_like(dst))


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=6), data=st.data())
def test_bind_copy_of_slices_merges_contiguous_dims(shape, data) -> None:
    """Slices of contiguous arrays along one axis on both sides (Concat's pieces into their part of the
    output): dims contiguous on both sides are merged into one block, size-1 dims dropped; the copy is
    the same as numpy's."""
    rng = np.random.default_rng(1)
    axis = data.draw(st.integers(0, len(shape) - 1))
    pad_src, pad_dst = data.draw(st.integers(0, 3)), data.draw(st.integers(0, 3))
    big_src = rng.standard_normal([d + (pad_src if i == axis else 0) for i, d in enumerate(shape)])
    big_dst = np.zeros([d + (pad_dst if i == axis else 0) for i, d in enumerate(shape)])
    lo_s, lo_d = data.draw(st.integers(0, pad_src)), data.draw(st.integers(0, pad_dst))
    sl = lambda lo: tuple(slice(lo, lo + d) if i == axis else slice(None) for i, d in enumerate(shape))  # noqa: E731
    src, dst = big_src[sl(lo_s)], big_dst[sl(lo_d)]
    call = ops.bind_copy(dst, src)
    assert isinstance(call, ops.NativeCall)
    call()
    want = np.zeros_like(big_dst)
    want[sl(lo_d)] = src
    np.testing.assert_array_equal(big_dst, want)  # the slice written, nothing around it


def test_bind_take_gathers_rows_and_checks_indices() -> None:
    rng = np.random.default_rng(2)
    table = rng.standard_normal((10, 4, 3)).astype(np.float32)
    idx = np.array([[0, 9, -1], [3, 3, -10]], np.int64)
    for axis in (0, 1):
        ids = idx % table.shape[axis] if axis else idx
        out = np.empty(np.take(table, ids, axis=axis).shape, np.float32)
        call = ops.bind_take(table, ids, axis, out)
        assert isinstance(call, ops.NativeCall)
        call()
        np.testing.assert_array_equal(out, np.take(table, ids, axis=axis))
    out = np.empty((2, 3, 4, 3), np.float32)
    call = ops.bind_take(table, idx, 0, out)
    idx[1, 2] = 10  # out of range now
    with pytest.raises(IndexError, match="out of bounds for axis 0 with size 10"):
        call()
    with pytest.raises(IndexError):
        np.take(table, idx, axis=0)


@settings(max_examples=50, deadline=None)
@given(shape=st.lists(st.integers(1, 300), min_size=1, max_size=4), k=st.integers(1, 4), keepdims=st.booleans(),
       scale=st.floats(0.01, 1e4), seed=st.integers(0, 999))  # fmt: skip
def test_mean_over_trailing_axes_is_one_native_call_with_numpys_bits(shape, k, keepdims, scale, seed) -> None:
    """numpy's pairwise summation order reproduced in C: the same bits as ops.mean (np.sum / count)."""
    if int(np.prod(shape)) > 200_000:
        return
    k = min(k, len(shape))
    axes = tuple(range(len(shape) - k, len(shape)))
    x = (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)
    want = ops.mean(x, axis=axes, keepdims=keepdims)
    out = np.empty_like(want)
    call = ops.bind("mean", x, out=out, axis=axes, keepdims=keepdims)
    # numpy 2 reduces a C-contiguous trailing block pairwise per row, as the C loop does; an older numpy
    # that orders some shapes differently keeps its own call (checked when bound)
    assert isinstance(call, ops.NativeCall) or NUMPY_MAJOR < 2
    call()
    np.testing.assert_array_equal(out, want)


def test_mean_over_leading_axes_stays_on_numpy() -> None:
    x = np.random.default_rng(0).standard_normal((4, 5, 6)).astype(np.float32)
    out = np.empty((5, 6), np.float32)
    call = ops.bind("mean", x, out=out, axis=0)
    assert call is not None and not isinstance(call, ops.NativeCall)
    call()
    np.testing.assert_array_equal(out, ops.mean(x, axis=0))


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_bind_concat_copies_each_piece_into_its_slice(axis: int) -> None:
    rng = np.random.default_rng(3)
    sizes = (2, 1, 3)
    pieces = []
    for s in sizes:
        shape = [2, 3, 4]
        shape[axis] = s
        pieces.append(rng.standard_normal(shape).astype(np.float32))
    want = np.concatenate(pieces, axis=axis)
    out = np.full_like(want, np.nan)
    call = ops.bind_concat(pieces, axis, out)
    assert isinstance(call, ops.BoundSteps) and all(isinstance(c, ops.NativeCall) for c in call.steps)
    call()
    np.testing.assert_array_equal(out, want)
    pieces[0][...] = 7.0  # the pieces' values at call time
    call()
    np.testing.assert_array_equal(out, np.concatenate(pieces, axis=axis))
    bad = ops.bind_concat(pieces[:2], axis, out)  # shapes that do not add up: numpy's call and its error
    with pytest.raises(ValueError):
        bad()


def test_calls_of_different_libraries_are_not_batched_together() -> None:
    """A batch runs in one library (its ids are that library's): a call into another native library (an
    upper package's) ends the run."""
    import types

    _x, _outs, calls = _chain()
    seen = []
    other = types.SimpleNamespace(
        opstrata_call_packed=lambda code, ptr: seen.append(code) or 0,
        opstrata_call_batch=lambda *a: pytest.fail("a foreign batch was formed"),
    )
    foreign = ops.NativeCall(other, "opstrata_ew_run_f32", [0], keep=None)
    runner, owners = ops.merge_bound_calls([calls[0], calls[1], foreign, calls[2]])
    assert owners == [[0, 1], [2], [3]]
    assert isinstance(runner[0], ops.NativeBatch) and runner[1] is foreign and runner[2] is calls[2]
    for r in runner:
        r()
    assert seen == [1]


@pytest.mark.parametrize("lead", [(1, 4), (2, 3), (2, 2, 2)])
def test_stacked_matmul_binds_natively_with_numpys_bits(lead: tuple[int, ...]) -> None:
    """Attention's (B, H, M, K) @ (B, H, K, N): one C call of numpy's own sgemm per slice."""
    if not ops.native_status().available:
        pytest.skip("no native library")
    rng = np.random.default_rng(len(lead))
    a = rng.standard_normal((*lead, 9, 16)).astype(np.float32)
    b = rng.standard_normal((*lead, 16, 7)).astype(np.float32)
    out = np.empty((*lead, 9, 7), np.float32)
    call = ops.bind("matmul", a, b, out=out)
    if call is None or not isinstance(call, ops.NativeCall):
        pytest.skip("numpy's sgemm is not reachable from C on this build")
    call()
    np.testing.assert_array_equal(out, np.matmul(a, b))
    broadcast = (
        ops.bind("matmul", a, b[:1], out=out) if lead[0] > 1 else None
    )  # (1, H) against (B, H): not this path
    assert broadcast is None or not isinstance(broadcast, ops.NativeCall) or broadcast.name != "batched_sgemm"


def test_softmax_binds_the_native_row_loop_with_the_kernels_bits() -> None:
    if not ops.native_status().available:
        pytest.skip("no native library")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 5, 33)).astype(np.float32)
    x[0, 0, 0, :4] = [np.inf, -np.inf, np.nan, 0.0]
    out = np.empty_like(x)
    call = ops.bind("softmax", x, out=out, axis=-1)
    assert isinstance(call, ops.NativeCall) and call.name == "opstrata_softmax_rows_f32"
    call()
    np.testing.assert_array_equal(out, ops.softmax(x, axis=-1))
    assert ops.bind("softmax", x, out=out, axis=1) is None  # not the last axis: the kernel's own path
    assert ops.bind("softmax", x[..., ::2], out=np.empty((2, 3, 5, 17), np.float32), axis=-1) is None


_PACKED_ENTRY = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int64))


def test_a_foreign_entry_point_runs_inside_a_batch_in_order() -> None:
    """``ops.foreign_call``: another library's ``int fn(const int64_t *args)`` (here a ctypes callback)
    runs from ops' batch between ops' own calls, with its packed arguments, in order; a non-zero code
    stops the batch there and raises the call's own error, named by its index."""
    _x, (a, b, _c), calls = _chain()
    seen: list[tuple[int, ...]] = []
    codes = [0]

    def entry(args: Any) -> int:
        seen.append((args[0], args[1], float(b[0, 0]) == float(b[0, 0])))
        return codes[0]

    fn = _PACKED_ENTRY(entry)
    address = ctypes.cast(fn, ctypes.c_void_p).value
    foreign = ops.foreign_call(
        address,
        [7, a.ctypes.data],
        (fn, a),
        lambda rc: ValueError(f"the entry said {rc}"),
        result=a,
        name="entry",
    )
    assert isinstance(foreign, ops.NativeCall) and foreign.name == "entry"
    assert foreign() is a and seen == [(7, a.ctypes.data, True)]
    runner, owners = ops.merge_bound_calls([calls[0], foreign, calls[1], calls[2]])
    assert len(runner) == 1 and owners == [[0, 1, 2, 3]]
    b[...] = np.nan
    runner[0]()
    assert seen[-1] == (7, a.ctypes.data, False)  # ran after the VM, before the layer norm wrote b
    assert not np.isnan(b).any()
    codes[0] = 5
    with pytest.raises(ops.NativeBatchError) as info:
        runner[0]()
    assert info.value.index == 1 and str(info.value.__cause__) == "the entry said 5"
    assert ops.foreign_call(0, [], None) is None  # no address: nothing to call


def test_native_pool_address_runs_another_librarys_tasks_once_each() -> None:
    """``ops.native_pool_address()``: ops' persistent pool as a C entry point other native libraries call
    (``void pool_run(void (*fn)(void *, int64_t), void *ctx, int64_t ntasks, int nthreads)``); every task
    runs exactly once, on the caller and the workers."""
    address = ops.native_pool_address()
    assert address != 0
    task = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)
    pool_run = ctypes.CFUNCTYPE(None, task, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int)(address)
    seen: list[int] = []
    cb = task(lambda ctx, t: seen.append(int(t)))
    for ntasks, threads in ((1, 1), (8, 2), (37, 4)):
        seen.clear()
        pool_run(cb, None, ntasks, threads)
        assert sorted(seen) == list(range(ntasks))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 300), seed=st.integers(0, 2**16), in_place=st.booleans())
def test_bound_relu_is_one_native_call_with_numpys_bits(n: int, seed: int, in_place: bool) -> None:
    """``ops.bind("relu")`` on float32: a packed C loop with ``np.maximum(x, 0)``'s bits -- NaN kept, -0
    and +0 both +0 -- in place too; other dtypes and overlapping views are not bound."""
    r = np.random.default_rng(seed)
    x = (r.standard_normal(n) * 10).astype(np.float32)
    x[: min(n, 6)] = np.array([np.nan, -0.0, 0.0, np.inf, -np.inf, -1e-45], np.float32)[: min(n, 6)]
    want = np.maximum(x, np.float32(0))
    out = x if in_place else np.empty_like(x)
    call = ops.bind("relu", x, out=out)
    assert isinstance(call, ops.NativeCall) and call.name == "relu_f32"
    assert call() is out
    np.testing.assert_array_equal(out, want)
    assert np.array_equal(np.signbit(out), np.signbit(want))
    np.testing.assert_array_equal(ops.relu(want), want)  # the kernel it stands for gives the same
    assert ops.bind("relu", x.astype(np.float64), out=np.empty(n)) is None
    if n > 2:  # x[1:] and x[:-1] overlap from three elements on (at two they are one element each, apart)
        assert ops.bind("relu", x[1:], out=x[:-1]) is None
