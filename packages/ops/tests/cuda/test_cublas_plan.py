"""The column-major cuBLAS call the cuda matmul makes while a device graph is recorded (CuPy's own cuBLAS
wrappers refuse to run during stream capture), checked on the CPU: numpy reads each operand's memory the
way ``cublasGemmStridedBatchedEx`` would (op, leading dimension, batch stride) and must get ``a @ b``."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from opstrata.ops._cuda._cublas import OP_N, gemm_plan


def _stored(x: np.ndarray, rows: int, cols: int, ld: int, batch_stride: int, count: int) -> np.ndarray:
    """(count, rows, cols) column-major matrices from x's memory: element (p, q) of batch t at
    t * batch_stride + p + q * ld elements from x's first element."""
    item = x.itemsize
    return np.lib.stride_tricks.as_strided(x, (count, rows, cols), (batch_stride * item, item, ld * item))


def _emulate(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    item = a.itemsize
    plan = gemm_plan(
        a.shape, tuple(s // item for s in a.strides), b.shape, tuple(s // item for s in b.strides)
    )
    if plan is None:
        return None
    ops = []
    for x, o, rows, cols in ((b, plan.first, plan.m, plan.k), (a, plan.second, plan.k, plan.n)):
        shape = (rows, cols) if o.op == OP_N else (cols, rows)
        m = _stored(x, *shape, o.ld, o.batch_stride, plan.count)
        ops.append(m if o.op == OP_N else m.transpose(0, 2, 1))
    ct = ops[0] @ ops[1]  # (count, N, M): C^T column-major per batch
    return ct.transpose(0, 2, 1).reshape(*plan.batch, plan.n, plan.m)


def _layout(x: np.ndarray, transposed: bool) -> np.ndarray:
    """``x`` with the same values, stored with its last two axes swapped when ``transposed``."""
    if not transposed:
        return x
    return np.ascontiguousarray(np.swapaxes(x, -1, -2)).swapaxes(-1, -2)


@settings(max_examples=200, deadline=None)
@given(
    m=st.integers(1, 5), k=st.integers(1, 6), n=st.integers(1, 5),
    a_batch=st.sampled_from([(), (3,), (2, 3), (1, 3), (2, 1)]),
    b_batch=st.sampled_from([(), (3,), (2, 3), (1,), (2, 1)]),
    ta=st.booleans(), tb=st.booleans(), sliced=st.booleans(),
)  # fmt: skip
def test_the_plan_reads_every_layout_as_numpy_matmul(m, k, n, a_batch, b_batch, ta, tb, sliced):
    try:
        np.broadcast_shapes(a_batch, b_batch)
    except ValueError:
        return
    rng = np.random.default_rng(m * 1000 + k * 100 + n * 10 + len(a_batch))
    a = _layout(rng.standard_normal((*a_batch, m, k)), ta)
    b = _layout(rng.standard_normal((*b_batch, k, n)), tb)
    if sliced:  # a row-strided view: ld larger than the row length
        a = rng.standard_normal((*a_batch, m, k + 3))[..., :k]
    got = _emulate(a, b)
    want = np.matmul(a, b)
    if got is None:  # the kernel copies such operands to plain row-major first: that layout must plan
        batch = np.broadcast_shapes(a_batch, b_batch)
        a2 = np.ascontiguousarray(np.broadcast_to(a, (*batch, m, k)))
        b2 = np.ascontiguousarray(np.broadcast_to(b, (*batch, k, n)))
        got = _emulate(a2, b2)
        assert got is not None
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_common_session_layouts_need_no_copy():
    x = np.zeros((4, 7, 16))  # activations (B, S, K)
    w = np.zeros((32, 16))  # a Linear weight, used as w.T
    assert gemm_plan(x.shape, tuple(s // 8 for s in x.strides), w.T.shape, tuple(s // 8 for s in w.T.strides))
    q = np.zeros((2, 4, 7, 8))
    kt = np.zeros((2, 4, 7, 8)).swapaxes(-1, -2)  # attention's K^T view
    assert gemm_plan(q.shape, tuple(s // 8 for s in q.strides), kt.shape, tuple(s // 8 for s in kt.strides))
    assert gemm_plan((3, 4), (4, 1), (5, 6), (6, 1)) is None  # K mismatch
