"""The native weight-only GEMM (``dq_matmul``, ops' ``dequant_matmul`` registered from quant): int4/uint4/
int8/uint8 codes dequantized tile by tile, against ops' reference on every layout and size, and a
weight-only quantized model that runs its MatMuls on it."""

from __future__ import annotations

import os
import shutil
import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import opstrata.ops as ops
import opstrata.quant as oq

pytestmark = pytest.mark.skipif(
    shutil.which((os.environ.get("CC") or "cc").split()[0]) is None
    or os.environ.get("OPSTRATA_NATIVE") == "off",
    reason="no C compiler on this machine (or OPSTRATA_NATIVE=off): the int8 library cannot be built",
)
_DT = {"int4": (ml_dtypes.int4, -8, 8), "uint4": (ml_dtypes.uint4, 0, 16), "int8": (np.int8, -128, 128),
       "uint8": (np.uint8, 0, 256)}  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(
    m=st.sampled_from([1, 2, 4, 5, 8, 13]), k=st.integers(1, 300), n=st.integers(1, 40),
    dtype=st.sampled_from(list(_DT)), layout=st.sampled_from(["tensor", "column", "block"]),
    block=st.sampled_from([7, 16, 32, 128]), zp=st.booleans(), bias=st.booleans(), seed=st.integers(0, 2**16),
)  # fmt: skip
def test_dq_matmul_equals_ops_reference(m, k, n, dtype, layout, block, zp, bias, seed) -> None:
    """Few rows (the decode path: codes straight into FMAs, scales per group) and many (float tiles), odd
    K and groups that start on odd rows of packed int4 pairs: x @ dequantize_linear(w) to float32 rounding."""
    dt, lo, hi = _DT[dtype]
    r = np.random.default_rng(seed)
    w = r.integers(lo, hi, (k, n)).astype(dt)
    axis, bs = (0, block) if layout == "block" else (1, 0)
    shape = (-(-k // block), n) if layout == "block" else ((n,) if layout == "column" else ())
    s = r.uniform(0.01, 0.1, shape).astype(np.float32)
    z = r.integers(lo, hi, shape).astype(dt) if zp else None
    b = r.standard_normal(n).astype(np.float32) if bias else None
    x = r.standard_normal((m, k)).astype(np.float32)
    want = ops.dequant_matmul(x, w, s, z, axis=axis, block_size=bs, device="ref") + (0 if b is None else b)
    got = oq.dq_matmul(x, oq.prepack_dq_weight(w, s, z, axis=axis, block_size=bs), b)
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6 * scale * np.sqrt(k))


def test_registered_dequant_matmul_runs_native_and_hands_off_what_it_does_not_cover() -> None:
    r = np.random.default_rng(2)
    x = r.standard_normal((3, 64)).astype(np.float32)
    w = r.integers(-8, 8, (64, 10)).astype(ml_dtypes.int4)
    s = r.uniform(0.01, 0.1, (2, 10)).astype(np.float32)
    oq.reset_native_stats()
    got = ops.dequant_matmul(x, w, s, axis=0, block_size=32)
    want = ops.dequant_matmul(x, w, s, axis=0, block_size=32, device="ref")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
    out = np.empty_like(want)
    assert ops.dequant_matmul(x, w, s, axis=0, block_size=32, out=out) is out
    np.testing.assert_array_equal(out, got)
    assert oq.native_status().calls["dequant_matmul"] == {"native": 2, "numpy": 0}
    s_rows = r.uniform(0.01, 0.1, 64).astype(np.float32)  # one scale per row of K: not a layout it packs
    y = ops.dequant_matmul(x, w, s_rows, axis=0)
    np.testing.assert_array_equal(y, ops.dequant_matmul(x, w, s_rows, axis=0, device="ref"))
    assert oq.native_status().calls["dequant_matmul"] == {"native": 2, "numpy": 1}


def test_prepack_dq_weight_errors() -> None:
    w = np.ones((8, 4), np.int8)
    with pytest.raises(oq.QuantError, match="2-D int4/uint4/int8/uint8"):
        oq.prepack_dq_weight(w.astype(np.float32), np.float32(1))
    with pytest.raises(oq.QuantError, match="blocked scales"):
        oq.prepack_dq_weight(w, np.ones((3, 4), np.float32), axis=0, block_size=4)
    with pytest.raises(oq.QuantError, match="per-channel scales"):
        oq.prepack_dq_weight(w, np.ones(8, np.float32), axis=0)
    packed = oq.prepack_dq_weight(w, np.float32(1))
    with pytest.raises(oq.QuantError, match="x must be float32"):
        oq.dq_matmul(np.ones((2, 7), np.float32), packed)


def test_weight_only_model_runs_on_the_native_kernel() -> None:
    """quantize(..., "w4-g32"): the MatMuls become DequantMatMul nodes run natively (weights stay 4-bit in
    the session) and agree with onnxruntime on the same model."""
    from _quant_models import feeds, mlp, run_ort

    qm = oq.quantize(mlp(), scheme="w4-g32")
    sess = qm.session()
    nodes = [n for n in sess.plan.graph.nodes if n.op_type == "DequantMatMul"]
    assert len(nodes) == 2
    assert all(sess._schedule.template[sess._schedule.slot[n.inputs[1]]].dtype.name == "int4" for n in nodes)
    ev = feeds((8, 64), 2, seed=4)
    oq.reset_native_stats()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = np.concatenate([sess.run(None, f)[0] for f in ev])
    assert oq.native_status().calls["dequant_matmul"]["native"] == 4
    theirs = run_ort(qm.model, ev)[0]
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4 * float(np.abs(theirs).max()))
