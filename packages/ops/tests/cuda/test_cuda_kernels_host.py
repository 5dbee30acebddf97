"""The cuda device's kernels, run on the CPU with numpy as their array module, against ``ref``.

``CudaOps`` is written against the array API CuPy and numpy share; registered here on a stand-in
device over numpy, its composed paths (every op without an NVRTC kernel, and each NVRTC kernel's
fallback for masks, strides and dtypes it does not take) are checked on every CI run. The NVRTC
kernels themselves run only on a GPU (test_cuda_device.py, tools/gpu_check.sh).
"""

from __future__ import annotations

import numpy as np
import pytest
from _cuda_cases import DTYPES, check_against_ref, rand
from hypothesis import given, settings, strategies as st

import opstrata.ops as ops
from opstrata.ops._cuda import register_cuda
from opstrata.ops._cuda._kernels import CudaOps, op_table
from opstrata.ops.kernels.erf import erf_cpu

DEV = "_cuda_np"


@pytest.fixture(autouse=True)
def stand_in():
    register_cuda(DEV, np, erf=erf_cpu)
    ops.set_fallback_policy("error")  # every op below must run on the stand-in's own kernel


def check(op, *args, **kwargs):
    return check_against_ref(op, DEV, args, kwargs)


def test_every_op_in_the_table_is_registered_native():
    table = op_table(CudaOps(np, erf=erf_cpu))
    assert {"matmul", "linear", "gemm", "softmax", "layer_norm", "rms_norm", "gelu", "silu", "bias_act",
            "embedding", "conv2d", "attention"} <= set(table)  # fmt: skip
    for op in table:
        assert ops.dispatch_path(op, DEV, "float32") == "native", op
        assert ops.dispatch_path(op, DEV, "bfloat16") == "native", op
    assert ops.dispatch_path("add", DEV, "float8_e4m3fn") == "device:cpu"  # no float8 CuPy arrays


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "pow"])
def test_binary(op, dtype):
    a = rand((3, 4), dtype, 1, 0.5, 2.0)
    check(op, a, rand((4,), dtype, 2, 0.5, 2.0))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "op", ["neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "erf", "silu"]
)
def test_unary(op, dtype):
    lo = 0.1 if op in ("log", "sqrt", "rsqrt") else -3.0
    check(op, rand((5, 7), dtype, 3, lo, 3.0))


@settings(max_examples=30, deadline=None)
@given(
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    op=st.sampled_from(["sum", "mean", "max", "min"]),
    keepdims=st.booleans(),
    data=st.data(),
)
def test_reductions(shape, op, keepdims, data):
    axis = data.draw(st.sampled_from([None, *range(len(shape))]))
    check(op, rand(shape, np.float32, 4), axis=axis, keepdims=keepdims)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_with_masked_rows(op, dtype):
    x = rand((3, 4, 6), dtype, 5) * 4
    x[1, 2, :] = -np.inf  # a fully masked row: zeros / -inf, never NaN
    x[0, 0, 1] = -np.inf
    for axis in (-1, 1):
        check(op, x, axis=axis)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_norms(dtype):
    x = rand((2, 3, 8), dtype, 6) + 1.5
    w, b = rand((8,), dtype, 7), rand((8,), dtype, 8)
    check("layer_norm", x, w, b, eps=1e-5)
    check("layer_norm", x, rand((3, 8), dtype, 9), None, axis=-2)
    check("rms_norm", x, w, eps=1e-6)
    r = rand((2, 3, 8), dtype, 10)
    check("add_layer_norm", x, r, w, b, eps=1e-5, return_sum=True)
    check("add_rms_norm", x, r, w, return_sum=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("act", ["relu", "gelu", "gelu_tanh", "silu"])
def test_bias_act(act, dtype):
    x = rand((4, 6), dtype, 11)
    check("bias_act", x, rand((6,), dtype, 12), rand((4, 6), dtype, 13), act=act)
    check("bias_act", x, None, None, act=act)
    check("gelu", x, approximate="tanh" if act == "gelu_tanh" else "none")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gemms(dtype):
    check("matmul", rand((2, 3, 5), dtype, 14), rand((5, 4), dtype, 15))
    check("linear", rand((3, 5), dtype, 16), rand((4, 5), dtype, 17), rand((4,), dtype, 18))
    check("gemm", rand((5, 3), dtype, 19), rand((4, 5), dtype, 20), rand((3, 4), dtype, 21),
          alpha=0.5, beta=2.0, trans_a=True, trans_b=True)  # fmt: skip


@settings(max_examples=25, deadline=None)
@given(
    stride=st.integers(1, 2),
    pad=st.integers(0, 2),
    dil=st.integers(1, 2),
    groups=st.sampled_from([1, 2]),
    k=st.integers(1, 3),
    bias=st.booleans(),
)
def test_conv2d(stride, pad, dil, groups, k, bias):
    x = rand((2, 4, 7, 6), np.float32, 22)
    w = rand((6, 4 // groups, k, k), np.float32, 23)
    b = rand((6,), np.float32, 24) if bias else None
    check("conv2d", x, w, b, stride=stride, padding=pad, dilation=dil, groups=groups)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask", [None, "bool", "float"])
def test_attention(dtype, causal, mask):
    q, k, v = rand((2, 4, 5, 8), dtype, 25), rand((2, 2, 7, 8), dtype, 26), rand((2, 2, 7, 8), dtype, 27)
    m = None
    if mask == "bool":
        m = np.random.default_rng(28).random((5, 7)) > 0.3
        m[2] = False  # a query row with no key: zeros and lse -inf
    elif mask == "float":
        m = rand((1, 4, 5, 7), dtype, 29)
    check("attention", q, k, v, causal=causal, mask=m, return_lse=True)
    check("attention", q, k, v, causal=causal, mask=m, scale=0.3)


@settings(max_examples=25, deadline=None)
@given(k=st.integers(1, 3), stride=st.integers(1, 2), pad=st.integers(0, 1), ceil=st.booleans())
def test_max_pool2d(k, stride, pad, ceil):
    if pad > k // 2:
        pad = 0
    check(
        "max_pool2d",
        rand((2, 3, 9, 8), np.float32, 33),
        kernel_size=k,
        stride=stride,
        padding=pad,
        ceil_mode=ceil,
    )


@settings(max_examples=25, deadline=None)
@given(
    k=st.integers(1, 3),
    stride=st.integers(1, 2),
    pad=st.integers(0, 1),
    ceil=st.booleans(),
    include_pad=st.booleans(),
    dtype=st.sampled_from(DTYPES),
)
def test_avg_pool2d(k, stride, pad, ceil, include_pad, dtype):
    if pad > k // 2:
        pad = 0
    check(
        "avg_pool2d",
        rand((2, 3, 9, 8), dtype, 36),
        kernel_size=(k, k + 1 if k < 3 else k),
        stride=stride,
        padding=pad,
        ceil_mode=ceil,
        count_include_pad=include_pad,
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_compare_gather_expand_rope(dtype):
    a, b = rand((3, 4), dtype, 34), rand((4,), dtype, 35)
    for op in ("greater", "less", "equal"):
        check(op, a, b)
    check("equal", a, a.copy())
    check("gather", rand((2, 5, 3), dtype, 36), np.array([[4, -1], [0, 2]], np.int64), axis=1)
    check("expand", rand((3, 1), dtype, 37), shape=(2, 3, 4))
    x, cos, sin = rand((2, 4, 6, 8), dtype, 38), rand((6, 8), dtype, 39), rand((6, 8), dtype, 40)
    check("rope_rotate_half", x, cos, sin)


def test_embedding_and_layout():
    w = rand((10, 4), np.float32, 30)
    check("embedding", np.array([[0, 9], [3, 3]], np.int64), w)
    x = rand((2, 3, 4), np.float32, 31)
    check("transpose", x, perm=(2, 0, 1))
    check("reshape", x, shape=(6, 4))
    check("concat", [x, x], axis=1)
    check("where", x > 0, x, -x)
    check("cast", x, dtype=np.float16)


def test_errors_name_the_op_and_argument():
    with pytest.raises(ops.OpError, match=r"embedding.*indices.*\[0, 10\)"):
        ops.call("embedding", np.array([10]), rand((10, 4), np.float32), device=DEV)
    with pytest.raises(ops.OpError, match=r"embedding.*indices.*\[0, 10\).*\[-1, 10\]"):  # both ends read
        ops.call("embedding", np.array([[3, -1], [10, 2]]), rand((10, 4), np.float32), device=DEV)
    with pytest.raises(ops.OpError, match=r"gather.*indices.*\[-4, 4\).*\[-5, 1\]"):
        ops.call("gather", rand((4, 3), np.float32), np.array([1, -5]), axis=0, device=DEV)
    with pytest.raises(ops.OpError, match=r"bias_act.*act"):
        ops.call("bias_act", rand((2, 2), np.float32), act="tanh", device=DEV)
    with pytest.raises(ops.OpError, match=r"layer_norm.*weight.*\(8,\)"):
        ops.call("layer_norm", rand((2, 8), np.float32), rand((4,), np.float32), device=DEV)
    with pytest.raises(ops.OpError, match=r"linear.*weight"):
        ops.call("linear", rand((2, 8), np.float32), rand((3, 5), np.float32), device=DEV)


def test_an_op_without_a_cuda_kernel_falls_back_and_is_reported():
    ops.set_fallback_policy("allow")
    x = rand((3, 4), np.float32, 32)
    np.testing.assert_array_equal(ops.call("cumsum", x, axis=1, device=DEV), ops.call("cumsum", x, axis=1))
    (rec,) = ops.fallback_report().records
    assert (rec.op, rec.device, rec.path) == ("cumsum", DEV, "device:cpu")
    with ops.fallback_policy("error"), pytest.raises(ops.FallbackError, match="cumsum on _cuda_np"):
        ops.call("cumsum", x, axis=1, device=DEV)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_scalar_operands_stay_kernel_arguments(dtype):
    """A fused constant reaches the ufunc as a Python number (no device copy a recorded graph would not
    repeat), rounded as the node's dtype rounds it, on either side."""
    k = CudaOps(np, erf=erf_cpu)
    x = rand((3, 4), dtype, 37)
    c = dtype.type(0.1)
    ua, ub, dt = k._operands(c, x)
    assert type(ua) is float and ua == float(c) and dt == dtype
    ua, ub, dt = k._operands(x, c)
    assert type(ub) is float and ub == float(c) and dt == dtype
    check("sub", c, x)
    check("div", x, c)
    check("greater", x, c)
