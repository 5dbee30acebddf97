"""The cuda device on a GPU: every cuda kernel (NVRTC ones included) against ``ref``, fallbacks with copies.

Skipped where CuPy or a GPU is missing (CI, the development machines); run on the GPU machine by
``tools/gpu_check.sh``, which saves the results beside the benchmark figures.
"""

from __future__ import annotations

import numpy as np
import pytest
from _cuda_cases import DTYPES, check_against_ref, rand

import opstrata.ops as ops
from opstrata.ops._cuda import cuda_status

pytestmark = pytest.mark.skipif(not cuda_status().available, reason=f"no cuda device: {cuda_status().reason}")
cp = pytest.importorskip("cupy") if cuda_status().available else None


@pytest.fixture(autouse=True)
def strict():
    ops.set_fallback_policy("error")  # every call below must run on a cuda kernel


def check(op, *args, rtol=None, **kwargs):
    return check_against_ref(
        op, "cuda", args, kwargs, to_device=cp.asarray, to_host=cp.asnumpy, array_type=cp.ndarray, rtol=rtol
    )


def test_device_is_registered_with_its_memory():
    rows = {s.name: s for s in ops.device_status()}
    assert rows["cuda"].available and rows["cuda"].memory.startswith("cuda:")
    assert "cuda" in ops.list_devices()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "pow"])
def test_binary(op, dtype):
    check(op, rand((3, 4), dtype, 1, 0.5, 2.0), rand((4,), dtype, 2, 0.5, 2.0))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "op", ["neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "erf", "silu"]
)
def test_unary(op, dtype):
    lo = 0.1 if op in ("log", "sqrt", "rsqrt") else -3.0
    check(op, rand((5, 700), dtype, 3, lo, 3.0))


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_reductions(op, axis):
    check(op, rand((37, 129), np.float32, 4), axis=axis, keepdims=axis == 1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("cols", [1, 7, 256, 1000, 4096])
def test_softmax_rows_kernel(op, dtype, cols):
    x = rand((5, cols), dtype, 5) * 4
    x[1, :] = -np.inf
    x[2, 0] = -np.inf
    check(op, x)
    check(op, rand((3, cols, 4), dtype, 6), axis=1)  # moved last, run, moved back


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cols", [8, 255, 768, 4096])
def test_norm_row_kernels(dtype, cols):
    x = rand((2, 3, cols), dtype, 6) + 1.5
    w, b, r = rand((cols,), dtype, 7), rand((cols,), dtype, 8), rand((2, 3, cols), dtype, 10)
    check("layer_norm", x, w, b, eps=1e-5)
    check("layer_norm", x, None, None)
    check("rms_norm", x, w, eps=1e-6)
    check("add_layer_norm", x, r, w, b, eps=1e-5, return_sum=True)
    check("add_rms_norm", x, r, w, return_sum=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("act", ["relu", "gelu", "gelu_tanh", "silu"])
def test_bias_act_kernel(act, dtype):
    x = rand((64, 96), dtype, 11)
    check("bias_act", x, rand((96,), dtype, 12), rand((64, 96), dtype, 13), act=act)
    check("bias_act", x, None, None, act=act)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gemms(dtype):
    rtol = {"float32": 1e-4}.get(dtype.name)  # cuBLAS sums in another order than numpy
    check("matmul", rand((2, 33, 65), dtype, 14), rand((65, 40), dtype, 15), rtol=rtol)
    check("linear", rand((17, 65), dtype, 16), rand((40, 65), dtype, 17), rand((40,), dtype, 18), rtol=rtol)
    check("gemm", rand((65, 17), dtype, 19), rand((40, 65), dtype, 20), rand((17, 40), dtype, 21),
          alpha=0.5, beta=2.0, trans_a=True, trans_b=True, rtol=rtol)  # fmt: skip


@pytest.mark.parametrize("groups", [1, 2, 6])
def test_conv2d(groups):
    x = rand((2, 6, 15, 13), np.float32, 22)
    w = rand((12, 6 // groups, 3, 3), np.float32, 23)
    check(
        "conv2d", x, w, rand((12,), np.float32, 24), stride=2, padding=1, dilation=1, groups=groups, rtol=1e-4
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_pooling(dtype):
    x = rand((2, 6, 15, 13), dtype, 40)
    check("max_pool2d", x, kernel_size=3, stride=2, padding=1, ceil_mode=True)
    check("avg_pool2d", x, kernel_size=(3, 2), stride=2, padding=1, ceil_mode=True, count_include_pad=False)
    check("avg_pool2d", x, kernel_size=2, stride=1, padding=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize(
    ("n", "m", "h", "hkv"), [(1, 77, 8, 2), (100, 100, 4, 4), (130, 300, 8, 1), (64, 33, 2, 2)]
)
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention(dtype, d, n, m, h, hkv, causal):
    q, k, v = rand((2, h, n, d), dtype, 25), rand((2, hkv, m, d), dtype, 26), rand((2, hkv, m, d), dtype, 27)
    check("attention", q, k, v, causal=causal, return_lse=True)


@pytest.mark.parametrize("mask", ["bool", "float"])
def test_attention_with_mask_composed(mask):
    q, k, v = (
        rand((2, 4, 5, 8), np.float32, 25),
        rand((2, 2, 7, 8), np.float32, 26),
        rand((2, 2, 7, 8), np.float32, 27),
    )
    m = (
        np.random.default_rng(28).random((5, 7)) > 0.3
        if mask == "bool"
        else rand((1, 4, 5, 7), np.float32, 29)
    )
    check("attention", q, k, v, causal=True, mask=m, return_lse=True, rtol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_compare_gather_expand_rope(dtype):
    a, b = rand((33, 40), dtype, 34), rand((40,), dtype, 35)
    for op in ("greater", "less", "equal", "sin", "cos"):
        check(op, a, b) if op in ("greater", "less", "equal") else check(op, a)
    check("gather", rand((2, 50, 3), dtype, 36), np.array([[49, -1], [0, 2]], np.int64), axis=1)
    check("expand", rand((3, 1), dtype, 37), shape=(2, 3, 64))
    check(
        "rope_rotate_half",
        rand((2, 4, 16, 64), dtype, 38),
        rand((16, 64), dtype, 39),
        rand((16, 64), dtype, 40),
    )


def test_embedding_and_layout():
    w = rand((1000, 64), np.float32, 30)
    check("embedding", np.array([[0, 999], [3, 3]], np.int64), w)
    x = rand((2, 3, 4), np.float32, 31)
    check("transpose", x, perm=(2, 0, 1))
    check("reshape", x, shape=(6, 4))
    check("concat", [x, x], axis=1)
    check("where", x > 0, x, -x)


def test_op_without_a_cuda_kernel_falls_back_with_copies_counted():
    ops.reset_fallback_report()
    x = rand((64, 128), np.float32, 32)
    with ops.fallback_policy("allow"):
        got = ops.call("cumsum", cp.asarray(x), axis=1, device="cuda")
    assert isinstance(got, cp.ndarray)
    np.testing.assert_allclose(cp.asnumpy(got), np.cumsum(x, axis=1), rtol=1e-5, atol=1e-5)
    (rec,) = ops.fallback_report().records
    assert (rec.op, rec.device, rec.path) == ("cumsum", "cuda", "device:cpu")
    assert rec.bytes_copied == 2 * x.nbytes and rec.copy_seconds > 0
    with pytest.raises(ops.FallbackError, match="cumsum on cuda"):
        ops.call("cumsum", cp.asarray(x), axis=1, device="cuda")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gemms_through_cublas_while_recording(dtype):
    """Under ops.capturing() the matmul calls cuBLAS through ctypes (CuPy's wrappers refuse during capture)."""
    x = cp.asarray(rand((2, 7, 16), dtype, 50))
    w = cp.asarray(rand((24, 16), dtype, 51))
    q = cp.asarray(rand((2, 3, 5, 8), dtype, 52))
    k = cp.asarray(rand((2, 3, 6, 8), dtype, 53))
    with ops.device("cuda"):
        want = [ops.linear(x, w), ops.matmul(q, k.swapaxes(-1, -2)), ops.matmul(x[0], w.T)]
        with ops.capturing():
            got = [ops.linear(x, w), ops.matmul(q, k.swapaxes(-1, -2)), ops.matmul(x[0], w.T)]
    for g, e in zip(got, want, strict=True):
        np.testing.assert_allclose(cp.asnumpy(g).astype(np.float64), cp.asnumpy(e).astype(np.float64),
                                   rtol=2e-2 if dtype.itemsize == 2 else 1e-4, atol=1e-3)  # fmt: skip


def test_a_cuda_graph_replays_on_new_input_values():
    mem = ops.device_memory("cuda")
    x = cp.asarray(rand((8, 64), np.float32, 60))
    w = cp.asarray(rand((32, 64), np.float32, 61))
    ids = cp.asarray(np.array([1, 2, 3]))

    def work():
        with ops.device("cuda"), ops.capturing() as checks:
            return ops.softmax(ops.gelu(ops.linear(x, w)), axis=-1), ops.embedding(ids, w), list(checks)

    g = mem.capture(work)
    y, e, (chk,) = g.result
    for seed in range(3):
        fresh = rand((8, 64), np.float32, 70 + seed)
        x.set(fresh)
        ids.set(np.array([seed, 40, 2]))  # 40 is out of range: clamped, the flag raised
        g.replay()
        mem.synchronize()
        want = ops.softmax(ops.gelu(ops.linear(fresh, cp.asnumpy(w))), axis=-1, device="ref")
        np.testing.assert_allclose(cp.asnumpy(y), want, rtol=1e-4, atol=1e-6)
        assert bool(cp.asnumpy(chk.flag))
        np.testing.assert_array_equal(cp.asnumpy(e), cp.asnumpy(w)[[seed, 31, 2]])


def test_cuda_events_time_the_queue():
    mem = ops.device_memory("cuda")
    a = mem.mark()
    cp.ones((2048, 2048), cp.float32) @ cp.ones((2048, 2048), cp.float32)
    b = mem.mark()
    mem.synchronize()
    assert mem.elapsed_ms(a, b) > 0.0
