"""Shape and index ops (concat, split, slice, transpose, reshape, expand, gather, embedding, top_k, cumsum).

ref is checked against an independent formula (python slicing, numpy take/lexsort/cumsum in
float64), cpu against ref, over random shapes for every registered dtype.
"""

from __future__ import annotations

import itertools
import sys

import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

import opstrata.ops as ops
from opstrata.ops._dtypes import ALL_DTYPES, NUMERIC_DTYPES
from opstrata.ops.testing import assert_close

SETTINGS = settings(max_examples=8, deadline=None)
ALL = pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
NUMERIC = pytest.mark.parametrize("dtype", NUMERIC_DTYPES, ids=str)
DEVICES = pytest.mark.parametrize("device", ["ref", "cpu"])
shapes = st.lists(st.integers(0, 4), min_size=1, max_size=4).map(tuple)
seeds = st.integers(0, 2**16)


def data(shape: tuple[int, ...], dtype, seed: int, *, low: int = -3, high: int = 4) -> np.ndarray:
    """Small values, many ties; non-negative for unsigned ints, 0/1 for bool."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if dt.kind == "u":
        return rng.integers(0, high - low, shape).astype(dt)
    if dt.kind == "i":
        return rng.integers(low, high, shape).astype(dt)
    return rng.uniform(low, high, shape).astype(dt)


def same(actual: np.ndarray, expected: np.ndarray) -> None:
    """Bit-exact equality (these ops move values, they do not round them), dtype and shape included."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert_close(actual, expected, rtol=0, atol=0)


def both(op, *args, **kw) -> np.ndarray:
    """Run op on ref and cpu; check they agree exactly; return ref's result."""
    ref = op(*args, device="ref", **kw)
    cpu = op(*args, device="cpu", **kw)
    if isinstance(ref, (list, tuple)):
        assert len(ref) == len(cpu)
        for r, c in zip(ref, cpu, strict=True):
            same(c, r)
    else:
        same(cpu, ref)
    return ref


# ---------------------------------------------------------------------------------------------
# concat, split, slice, transpose, reshape, expand
# ---------------------------------------------------------------------------------------------


@ALL
@SETTINGS
@given(
    shape=shapes,
    sizes=st.lists(st.integers(0, 3), min_size=1, max_size=3),
    axis=st.integers(-4, 3),
    seed=seeds,
)
def test_concat(dtype, shape, sizes, axis, seed) -> None:
    assume(-len(shape) <= axis < len(shape))
    parts = []
    for i, s in enumerate(sizes):
        sh = list(shape)
        sh[axis] = s
        parts.append(data(tuple(sh), dtype, seed + i))
    same(both(ops.concat, parts, axis=axis), np.concatenate(parts, axis=axis))


@ALL
@SETTINGS
@given(
    shape=shapes,
    sizes=st.lists(st.integers(0, 3), min_size=1, max_size=3),
    axis=st.integers(-4, 3),
    seed=seeds,
)
def test_concat_kernels(dtype, shape, sizes, axis, seed) -> None:
    """The kernels themselves, bypassing dispatch."""
    from opstrata.ops.kernels.shape import concat_cpu, concat_ref

    assume(-len(shape) <= axis < len(shape))
    parts = []
    for i, s in enumerate(sizes):
        sh = list(shape)
        sh[axis] = s
        parts.append(data(tuple(sh), dtype, seed + i))
    ref = concat_ref(parts, axis=axis)
    same(ref, np.concatenate(parts, axis=axis))
    same(concat_cpu(parts, axis=axis), ref)


@ALL
@SETTINGS
@given(shape=shapes, chunk=st.integers(1, 5), axis=st.integers(0, 3), seed=seeds)
def test_split_chunks_and_sizes(dtype, shape, chunk, axis, seed) -> None:
    assume(axis < len(shape))
    x = data(shape, dtype, seed)
    dim = shape[axis]
    pieces = both(ops.split, x, chunk, axis=axis)
    bounds = [*range(0, dim, chunk), dim] if dim else [0, 0]
    chunks = [b - a for a, b in itertools.pairwise(bounds)]
    assert [p.shape[axis] for p in pieces] == chunks
    sizes = chunks[::-1]  # an uneven list of sizes
    starts = np.cumsum([0, *sizes])
    for i, p in enumerate(both(ops.split, x, sizes, axis=axis)):
        same(p, x[(slice(None),) * axis + (slice(starts[i], starts[i + 1]),)])


@st.composite
def slice_args(draw: st.DrawFn, ndim: int) -> dict:
    axes = draw(
        st.lists(st.integers(-ndim, ndim - 1), min_size=1, max_size=ndim, unique_by=lambda a: a % ndim)
    )
    big = st.integers(-8, 8) | st.sampled_from([sys.maxsize, -sys.maxsize])  # ONNX INT_MAX/INT_MIN clamp
    n = len(axes)
    return dict(
        starts=draw(st.lists(big, min_size=n, max_size=n)),
        ends=draw(st.lists(big, min_size=n, max_size=n)),
        axes=axes,
        steps=draw(st.lists(st.integers(-3, 3).filter(bool), min_size=n, max_size=n)),
    )


@ALL
@SETTINGS
@given(shape=shapes, seed=seeds, data_=st.data())
def test_slice_matches_python_slicing(dtype, shape, seed, data_) -> None:
    x = data(shape, dtype, seed)
    kw = data_.draw(slice_args(len(shape)))
    index = [slice(None)] * x.ndim
    for a, s, e, st_ in zip(kw["axes"], kw["starts"], kw["ends"], kw["steps"], strict=True):
        # python slicing clamps as ONNX Slice does, except one case the spec spells out: a backward
        # slice starting before the first element starts *at* it (start clamps to [0, dim - 1]);
        # python would return nothing. onnxruntime follows the spec.
        s = 0 if st_ < 0 and s < -x.shape[a % x.ndim] else s
        index[a % x.ndim] = slice(s, e, st_)
    same(both(ops.slice, x, **kw), x[tuple(index)])


@ALL
@SETTINGS
@given(shape=shapes, seed=seeds, data_=st.data())
def test_transpose_reshape_expand(dtype, shape, seed, data_) -> None:
    x = data(shape, dtype, seed)
    perm = data_.draw(st.permutations(range(x.ndim)))
    same(both(ops.transpose, x, perm=perm), np.transpose(x, perm))
    same(both(ops.transpose, x), x.T)
    target = list(reversed(shape))
    if x.size:
        target[data_.draw(st.integers(0, x.ndim - 1))] = -1
    same(both(ops.reshape, x, shape=target), x.reshape(target))
    grown = [data_.draw(st.sampled_from([d, 1])) if d != 1 else data_.draw(st.integers(0, 3)) for d in shape]
    lead = data_.draw(st.lists(st.integers(0, 2), max_size=2))
    expected = np.broadcast_to(x, np.broadcast_shapes(x.shape, (*lead, *grown)))
    same(both(ops.expand, x, shape=[*lead, *grown]), np.array(expected))


# ---------------------------------------------------------------------------------------------
# gather, embedding, top_k, cumsum
# ---------------------------------------------------------------------------------------------


@ALL
@SETTINGS
@given(
    shape=shapes,
    idx_shape=st.lists(st.integers(0, 3), max_size=2).map(tuple),
    axis=st.integers(-4, 3),
    seed=seeds,
)
@pytest.mark.parametrize("idx_dtype", [np.int32, np.int64], ids=str)
def test_gather_with_negative_indices(dtype, idx_dtype, shape, idx_shape, axis, seed) -> None:
    assume(-len(shape) <= axis < len(shape) and shape[axis] > 0)
    x = data(shape, dtype, seed)
    dim = shape[axis]
    idx = np.random.default_rng(seed).integers(-dim, dim, idx_shape).astype(idx_dtype)
    same(both(ops.gather, x, idx, axis=axis), np.take(x, idx % dim, axis=axis))


@ALL
@SETTINGS
@given(
    num=st.integers(1, 5),
    dim=st.integers(0, 3),
    idx_shape=st.lists(st.integers(0, 3), max_size=3).map(tuple),
    seed=seeds,
)
def test_embedding(dtype, num, dim, idx_shape, seed) -> None:
    weight = data((num, dim), dtype, seed)
    idx = np.random.default_rng(seed).integers(0, num, idx_shape)
    out = both(ops.embedding, idx, weight)
    assert out.shape == (*idx_shape, dim)
    same(out, weight[idx])


@NUMERIC
@SETTINGS
@given(
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple),
    largest=st.booleans(),
    seed=seeds,
    data_=st.data(),
)
def test_top_k_breaks_ties_by_lower_index(dtype, shape, largest, seed, data_) -> None:
    x = data(shape, dtype, seed, low=0, high=3)  # few distinct values: many ties
    axis = data_.draw(st.integers(-len(shape), len(shape) - 1))
    k = data_.draw(st.integers(0, shape[axis]))
    values, indices = both(ops.top_k, x, k=k, axis=axis, largest=largest)
    xs = np.moveaxis(x, axis, -1).astype(np.float64)
    rows = xs.reshape(-1, xs.shape[-1])
    pos = np.arange(rows.shape[-1])
    expected = np.array([np.lexsort((pos, -r if largest else r))[:k] for r in rows]).reshape(
        *xs.shape[:-1], k
    )
    expected = np.moveaxis(expected, -1, axis)
    assert indices.dtype == np.int64
    same(indices, expected.astype(np.int64))
    same(values, np.take_along_axis(x, expected, axis=axis))


@DEVICES
def test_top_k_nan_ranks_highest_and_k_is_checked(device) -> None:
    x = np.array([1.0, np.nan, 3.0, 3.0, np.nan, -1.0])
    _, indices = ops.top_k(x, k=4, device=device)
    assert indices.tolist() == [1, 4, 2, 3]
    assert ops.top_k(x, k=2, largest=False, device=device)[1].tolist() == [5, 0]
    with pytest.raises(ops.OpError, match=r"top_k: argument 'k' expected an int in \[0, 6\].*got 7"):
        ops.top_k(x, k=7, device=device)


@NUMERIC
@SETTINGS
@given(shape=shapes, exclusive=st.booleans(), reverse=st.booleans(), seed=seeds, data_=st.data())
def test_cumsum_onnx_modes(dtype, shape, exclusive, reverse, seed, data_) -> None:
    x = data(shape, dtype, seed)
    axis = data_.draw(st.integers(-len(shape), len(shape) - 1))
    xs = np.flip(x, axis) if reverse else x
    acc = np.cumsum(xs.astype(np.float64 if x.dtype.kind not in "iu" else np.int64), axis=axis)
    if exclusive:  # shift by one along axis, a zero first
        shifted = np.zeros_like(acc)
        np.moveaxis(shifted, axis, 0)[1:] = np.moveaxis(acc, axis, 0)[:-1]
        acc = shifted
    expected = (np.flip(acc, axis) if reverse else acc).astype(dtype)
    ref = ops.cumsum(x, axis=axis, exclusive=exclusive, reverse=reverse, device="ref")
    cpu = ops.cumsum(x, axis=axis, exclusive=exclusive, reverse=reverse, device="cpu")
    if x.dtype.kind in "iu":
        same(ref, expected)
        same(cpu, ref)
    else:
        assert_close(ref, expected)
        assert_close(cpu, ref)


@DEVICES
def test_cumsum_low_precision_accumulates_in_float32(device) -> None:
    import ml_dtypes

    x = np.ones(1024, ml_dtypes.bfloat16)  # a bfloat16 running sum stalls at 256
    assert float(ops.cumsum(x, axis=0, device=device)[-1]) == 1024.0


# ---------------------------------------------------------------------------------------------
# views, empty inputs and errors
# ---------------------------------------------------------------------------------------------


def test_cpu_returns_views_and_ref_returns_copies() -> None:
    x = np.arange(12).reshape(3, 4)
    assert np.shares_memory(ops.transpose(x, device="cpu"), x)
    assert np.shares_memory(ops.slice(x, starts=[1], ends=[3], device="cpu"), x)
    assert not ops.expand(x, shape=[2, 3, 4], device="cpu").flags.writeable
    for op, kw in [(ops.transpose, {}), (ops.reshape, {"shape": [-1]}), (ops.expand, {"shape": [2, 1, 1]})]:
        assert not np.shares_memory(op(x, device="ref", **kw), x)


@DEVICES
@pytest.mark.parametrize(
    ("fn", "pattern"),
    [
        (lambda d: ops.concat([], device=d), r"concat: argument 'arrays' expected at least one array"),
        (
            lambda d: ops.concat([np.ones((2, 3)), np.ones((2, 4))], device=d),
            r"concat: argument 'arrays\[1\]' expected shape \(2, 3\) except along axis 0",
        ),
        (
            lambda d: ops.concat([np.ones(2), np.ones(2, np.int32)], device=d),
            r"concat: argument 'arrays\[1\]' expected dtype float64",
        ),
        (
            lambda d: ops.split(np.ones(5), [2, 2], device=d),
            r"split: argument 'sections' expected sizes >= 0 summing to 5",
        ),
        (
            lambda d: ops.split(np.ones(5), 0, device=d),
            r"split: argument 'sections' expected a chunk size >= 1",
        ),
        (
            lambda d: ops.slice(np.ones(5), starts=[0], ends=[2], steps=[0], device=d),
            r"slice: argument 'steps' expected non-zero",
        ),
        (
            lambda d: ops.slice(np.ones((2, 2)), starts=[0, 0], ends=[1, 1], axes=[0, -2], device=d),
            r"slice: argument 'axes' expected distinct",
        ),
        (
            lambda d: ops.slice(np.ones(5), starts=[0], ends=[1, 2], device=d),
            r"slice: argument 'ends' expected 1 entries",
        ),
        (
            lambda d: ops.transpose(np.ones((2, 3)), perm=[0, 0], device=d),
            r"transpose: argument 'perm' expected a permutation of range\(2\)",
        ),
        (
            lambda d: ops.reshape(np.ones((2, 3)), shape=[4, 2], device=d),
            r"reshape: argument 'shape' expected 6 elements.*\(4, 2\) with 8 elements",
        ),
        (
            lambda d: ops.reshape(np.ones((2, 3)), shape=[-1, -1], device=d),
            r"reshape: argument 'shape' expected dims >= 0 with at most one -1",
        ),
        (
            lambda d: ops.reshape(np.ones((2, 3)), shape=[4, -1], device=d),
            r"reshape: argument 'shape' expected a shape whose -1 can be inferred for 6",
        ),
        (
            lambda d: ops.expand(np.ones((2, 3)), shape=[4, 3], device=d),
            r"expand: argument 'shape' expected a shape broadcastable with x.shape \(2, 3\)",
        ),
        (
            lambda d: ops.gather(np.ones((2, 3)), np.array([0, 3]), axis=1, device=d),
            r"gather: argument 'indices' expected values in \[-3, 2\].*got 3 at position \(1,\)",
        ),
        (
            lambda d: ops.gather(np.ones((2, 3)), np.array([0.0]), device=d),
            r"gather: argument 'indices' expected one of \(int32, int64\)",
        ),
        (
            lambda d: ops.gather(np.ones((2, 3)), np.array([0]), axis=2, device=d),
            r"gather: argument 'axis' expected an int in \[-2, 1\]",
        ),
        (
            lambda d: ops.embedding(np.array([[0, 5]]), np.ones((3, 2)), device=d),
            r"embedding: argument 'indices' expected values in \[0, 2\].*got 5 at position \(0, 1\)",
        ),
        (
            lambda d: ops.embedding(np.array([-1]), np.ones((3, 2)), device=d),
            r"embedding: argument 'indices'.*got -1",
        ),
        (
            lambda d: ops.embedding(np.array([0]), np.ones(3), device=d),
            r"embedding: argument 'weight' expected 2 dims",
        ),
        (lambda d: ops.top_k(np.ones((2, 3)), k=1, axis=2, device=d), r"top_k: argument 'axis'"),
        (
            lambda d: ops.cumsum(np.ones(()), axis=0, device=d),
            r"cumsum: argument 'x' expected at least 1 dims",
        ),
    ],
)
def test_errors_name_op_and_argument(device, fn, pattern) -> None:
    with pytest.raises(ops.OpError, match=pattern):
        fn(device)


# ---------------------------------------------------------------- ONNX string tensors (object arrays)

_WORDS = np.array(["", "a", "bb", "ccc", "d", "ee"], dtype=object)


def _strings(shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return _WORDS[rng.integers(0, len(_WORDS), size=shape)].astype(object)


_STRING_CASES = {  # op -> (call, numpy reference) on a (2, 3) string array x
    "reshape": (lambda x, d: ops.reshape(x, shape=(3, 2), device=d), lambda x: x.reshape(3, 2)),
    "transpose": (lambda x, d: ops.transpose(x, perm=(1, 0), device=d), lambda x: x.T),
    "concat": (lambda x, d: ops.concat([x, x], axis=1, device=d), lambda x: np.concatenate([x, x], 1)),
    "split": (lambda x, d: ops.split(x, [1, 2], axis=1, device=d)[1], lambda x: x[:, 1:]),
    "slice": (lambda x, d: ops.slice(x, starts=[0], ends=[1], axes=[0], device=d), lambda x: x[:1]),
    "expand": (lambda x, d: ops.expand(x, shape=(2, 2, 3), device=d), lambda x: np.broadcast_to(x, (2, 2, 3))),
    "gather": (lambda x, d: ops.gather(x, np.array([2, 0]), axis=1, device=d), lambda x: x[:, [2, 0]]),
    "tile": (lambda x, d: ops.tile(x, [2, 1], device=d), lambda x: np.tile(x, (2, 1))),
    "pad": (lambda x, d: ops.pad(x, [0, 1, 0, 0], device=d), lambda x: np.pad(x, ((0, 0), (1, 0)), constant_values="")),
    "where": (
        lambda x, d: ops.where(np.array([True, False, True]), x, np.array("-", object), device=d),
        lambda x: np.where([True, False, True], x, "-").astype(object),
    ),
    "equal": (lambda x, d: ops.equal(x, x[::-1], device=d), lambda x: (x == x[::-1]).astype(bool)),
}  # fmt: skip


@DEVICES
@pytest.mark.parametrize("op", sorted(_STRING_CASES))
@given(seed=seeds)
@SETTINGS
def test_data_movement_kernels_take_strings(op: str, device: str, seed: int) -> None:
    """Data movement and selection accept ONNX string tensors and equal numpy on the object array."""
    call, reference = _STRING_CASES[op]
    x = _strings((2, 3), seed)
    got, want = call(x, device), reference(x)
    assert got.dtype == want.dtype and got.shape == want.shape and got.tolist() == want.tolist()


def test_arithmetic_still_refuses_strings() -> None:
    x = _strings((2, 3), 0)
    assert ops.STRING_DTYPE in ops.TENSOR_DTYPES and ops.STRING_DTYPE not in ops.ALL_DTYPES
    with pytest.raises(ops.OpError, match=r"add: argument 'a' expected one of .*got object"):
        ops.add(x, x)
    with pytest.raises(ops.OpError, match=r"pad: argument 'value' expected a str to pad a string tensor"):
        ops.pad(x, [0, 1, 0, 0], value=3)
