"""ops' ``qmatmul`` (graph's QMatMul: a QDQ MatMul / Gemm fused) on quant's native int8 GEMM: the same bits
as ops' reference on every shape, eager and as the one packed C call a session binds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import opstrata.ops as ops
import opstrata.quant as oq

pytestmark = pytest.mark.skipif(
    not hasattr(ops, "qmatmul"), reason="opstrata-ops without qmatmul (before 0.4.57)"
)


def _operands(seed: int, lead: tuple[int, ...], k: int, n: int, a_dt=np.uint8, per_column: bool = True):
    r = np.random.default_rng(seed)
    ai = np.iinfo(a_dt)
    a = r.integers(ai.min, ai.max + 1, (*lead, k)).astype(a_dt)
    w = r.integers(-128, 128, (k, n)).astype(np.int8)
    a_zp = np.asarray(r.integers(ai.min, ai.max + 1), a_dt)
    w_zp = r.integers(-4, 5, n if per_column else ()).astype(np.int8)
    scale = r.uniform(1e-4, 1e-2, n if per_column else ()).astype(np.float32)
    bias = r.standard_normal(n).astype(np.float32)
    return a, a_zp, w, w_zp, scale, bias


@settings(max_examples=30, deadline=None)
@given(
    lead=st.sampled_from([(), (1,), (7,), (2, 9), (40,)]), k=st.integers(1, 300), n=st.integers(1, 150),
    a_dt=st.sampled_from([np.uint8, np.int8]), per_column=st.booleans(), with_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)  # fmt: skip
def test_native_qmatmul_gives_the_reference_bits(lead, k, n, a_dt, per_column, with_bias, seed) -> None:
    a, a_zp, w, w_zp, scale, bias = _operands(seed, lead, k, n, a_dt, per_column)
    bias = bias if with_bias else None
    want = ops.qmatmul(a, a_zp, w, w_zp, scale, bias, device="ref")
    oq.reset_native_stats()
    got = ops.qmatmul(a, a_zp, w, w_zp, scale, bias)
    assert oq.native_status().calls["qmatmul"] == {"native": 1, "numpy": 0}
    np.testing.assert_array_equal(got, want)
    out = np.empty_like(want)
    assert ops.qmatmul(a, a_zp, w, w_zp, scale, bias, out=out) is out
    np.testing.assert_array_equal(out, want)


def test_what_the_native_kernel_does_not_cover_goes_to_ops_kernel() -> None:
    """A per-row activation zero point or a non-finite scale: ops' numpy kernel, counted as such."""
    a, a_zp, w, w_zp, scale, bias = _operands(1, (4,), 16, 8)
    oq.reset_native_stats()
    per_row = np.arange(4, dtype=np.uint8)
    np.testing.assert_array_equal(
        ops.qmatmul(a, per_row, w, w_zp, scale, bias),
        ops.qmatmul(a, per_row, w, w_zp, scale, bias, device="ref"),
    )
    inf_scale = scale.copy()
    inf_scale[0] = np.inf
    np.testing.assert_array_equal(
        ops.qmatmul(a, a_zp, w, w_zp, inf_scale), ops.qmatmul(a, a_zp, w, w_zp, inf_scale, device="ref")
    )
    assert oq.native_status().calls["qmatmul"] == {"native": 0, "numpy": 2}


@pytest.mark.skipif(not hasattr(ops, "foreign_call"), reason="opstrata-ops without foreign calls")
def test_a_sessions_qmatmul_binds_to_one_packed_call_in_a_native_batch() -> None:
    """Read-only weight and zero points (as a session holds them): ``ops.bind`` gives the packed C call,
    which runs inside a NativeBatch with ops' kernels and gives the eager bits; writeable zero points
    keep the eager kernel (they may change between runs)."""
    a, a_zp, w, w_zp, scale, bias = _operands(3, (6,), 96, 70)
    want = ops.qmatmul(a, a_zp, w, w_zp, scale, bias, device="ref")
    out = np.empty_like(want)
    writeable = ops.bind("qmatmul", a, a_zp, w, w_zp, scale, bias, out=out)
    assert writeable is not None and not isinstance(writeable, ops.NativeCall)
    for v in (w, a_zp, w_zp):
        v.flags.writeable = False
    call = ops.bind("qmatmul", a, a_zp, w, w_zp, scale, bias, out=out)
    assert isinstance(call, ops.NativeCall) and call.name == "opstrata_qgemm_packed"
    relu_out = np.empty_like(out)
    relu = ops.bind("bias_act", out, None, None, out=relu_out, act="relu")
    (batch,), _ = ops.merge_bound_calls([call, relu])
    out[...] = np.nan
    batch()
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(relu_out, np.where(want < 0, 0, want))
    a[...] = 0  # the activation is read when the call runs
    batch()
    np.testing.assert_array_equal(out, ops.qmatmul(a, a_zp, w, w_zp, scale, bias, device="ref"))
    strided = np.empty((6, 140), np.float32)[:, ::2]
    assert not isinstance(ops.bind("qmatmul", a, a_zp, w, w_zp, scale, bias, out=strided), ops.NativeCall)
