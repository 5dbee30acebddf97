"""Fused kernels: cpu vs ref vs the decomposition (fp32/bf16/fp16, odd sizes, broadcasting); AdamW vs a
textbook numpy update over several steps, in place; errors."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import opstrata.ops as ops
from opstrata.ops import OpError
from opstrata.ops._dtypes import bfloat16, float16, float32
from opstrata.ops.kernels import chunking as _chunking
from opstrata.ops.testing import TOLERANCES, assert_close

DTYPES = (float32, bfloat16, float16)
ACTS = ("gelu", "gelu_tanh", "silu", "relu")


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of 96 elements, so test shapes span several blocks and end on a partial one."""
    monkeypatch.setattr(_chunking, "BLOCK_ELEMS", 96)


def rnd(shape: tuple[int, ...], dtype: Any, seed: int = 0, scale: float = 2.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


def close(actual: Any, expected: Any, dtype: Any, loose: float = 1.0) -> None:
    rtol, atol = TOLERANCES[np.dtype(dtype)]
    assert np.asarray(actual).dtype == np.dtype(dtype)
    assert_close(actual, expected, rtol=rtol * loose, atol=max(atol, rtol) * loose)


def decomposed(op: str, *args: Any, **kw: Any) -> Any:
    """Run ``op`` through its registered decomposition (a device without a native kernel)."""
    from opstrata.ops._registry import _REGISTRY

    return _REGISTRY.decomps[op].fn(*args, **kw)


# --------------------------------------------------------------------------- bias_act


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize(
    ("xs", "bs", "rs"),
    [
        ((7, 33), (33,), (7, 33)),
        ((3, 5, 17), (17,), (5, 17)),
        ((301,), None, None),
        ((4, 50), (1, 50), (4, 1)),
    ],
)
def test_bias_act_cpu_ref_decomposition(dtype: Any, act: str, xs: Any, bs: Any, rs: Any) -> None:
    x = rnd(xs, dtype)
    b = None if bs is None else rnd(bs, dtype, 1)
    r = None if rs is None else rnd(rs, dtype, 2)
    ref = ops.bias_act(x, b, r, act=act, device="ref")
    close(ops.bias_act(x, b, r, act=act, device="cpu"), ref, dtype)
    close(decomposed("bias_act", x, b, r, act=act), ref, dtype, loose=4.0)  # rounds between steps


def test_bias_act_against_formula_and_mixed_dtypes() -> None:
    x, b, r = rnd((9, 31), float32), rnd((31,), np.float64, 1), rnd((9, 31), bfloat16, 2)
    h = x.astype(np.float64) + b
    want = 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3))) + r.astype(np.float64)
    got = ops.bias_act(x, b, r, act="gelu_tanh")
    assert got.dtype == float32
    assert_close(got.astype(np.float64), want, rtol=1e-5, atol=1e-5)


def test_bias_act_extremes_and_empty() -> None:
    x = np.array([[-1e4, -100.0, 0.0, 100.0, 1e4, np.inf, -np.inf]], np.float32)
    for act in ACTS:
        close(ops.bias_act(x, act=act), ops.bias_act(x, act=act, device="ref"), float32)
    assert ops.bias_act(np.zeros((0, 4), np.float32), np.zeros(4, np.float32)).shape == (0, 4)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 9),
    cols=st.integers(1, 70),
    act=st.sampled_from(ACTS),
    dtype=st.sampled_from(DTYPES),
    with_bias=st.booleans(),
)
def test_bias_act_out_in_place_equals_fresh(
    rows: int, cols: int, act: str, dtype: Any, with_bias: bool
) -> None:
    x = rnd((rows, cols), dtype, seed=rows * 97 + cols)
    b = rnd((cols,), dtype, 1) if with_bias else None
    want = ops.bias_act(x, b, act=act, device="cpu")
    close(want, ops.bias_act(x, b, act=act, device="ref"), dtype)
    y = x.copy()
    got = ops.bias_act(y, b, act=act, out=y)  # the GEMM-epilogue use: in place on the GEMM's result
    assert got is y
    np.testing.assert_array_equal(got, want)
    other = np.empty_like(x)
    assert ops.bias_act(x, b, act=act, out=other) is other
    np.testing.assert_array_equal(other, want)
    ref_out = np.empty_like(x)  # ref and the decomposition fill out= as well
    close(ops.bias_act(x, b, act=act, out=ref_out, device="ref"), want, dtype)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bias_act_gelu_is_bit_identical_to_gelu_of_the_sum(approximate: str) -> None:
    """The runtime's Linear epilogue (bias_act) and its generic path (linear, then gelu) agree exactly."""
    x, b = rnd((37, 130), float32), rnd((130,), float32, 1)
    act = "gelu" if approximate == "none" else "gelu_tanh"
    np.testing.assert_array_equal(ops.bias_act(x, b, act=act), ops.gelu(x + b, approximate=approximate))


def test_bias_act_out_errors() -> None:
    x = rnd((4, 6), float32)
    with pytest.raises(OpError, match="bias_act: argument 'out' expected an ndarray of shape \\(4, 6\\)"):
        ops.bias_act(x, out=np.empty((4, 5), np.float32))
    with pytest.raises(OpError, match=r"argument 'out' expected an ndarray of shape .* and dtype float32"):
        ops.bias_act(x, out=np.empty((4, 6), np.float64))
    big = rnd((5, 6), float32)
    with pytest.raises(
        OpError, match="argument 'out' expected a buffer that is x itself or does not overlap x"
    ):
        ops.bias_act(big[1:], out=big[:-1])  # shifted by a row: tiles would read what they wrote
    b = rnd((6,), float32)
    with pytest.raises(OpError, match="does not overlap bias"):
        ops.bias_act(np.broadcast_to(b, (4, 6)).copy(), b, out=np.broadcast_to(b, (4, 6)))
    strided = np.empty((4, 12), np.float32)[:, ::2]  # out= that rows cannot view: filled by a copy
    np.testing.assert_array_equal(ops.bias_act(x, act="relu", out=strided), np.maximum(x, 0))


def test_bias_act_errors() -> None:
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(OpError, match="bias_act: argument 'act' expected one of"):
        ops.bias_act(x, act="tanh")
    with pytest.raises(
        OpError, match="argument 'bias' expected a shape broadcastable to x's shape \\(2, 3\\)"
    ):
        ops.bias_act(x, np.zeros(4, np.float32))
    with pytest.raises(OpError, match="argument 'residual'"):
        ops.bias_act(x, None, np.zeros((4, 2, 3), np.float32))  # would enlarge x
    with pytest.raises(OpError, match="argument 'x' expected"):
        ops.bias_act(np.zeros(3, np.int32))


# --------------------------------------------------------------------------- add + norm


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("xs", "rs"), [((5, 37), (5, 37)), ((2, 3, 41), (3, 41)), ((1, 200), (200,))])
@pytest.mark.parametrize("affine", [False, True])
def test_add_layer_norm(dtype: Any, xs: Any, rs: Any, affine: bool) -> None:
    n = xs[-1]
    x, r = rnd(xs, dtype), rnd(rs, dtype, 1)
    w, b = (rnd((n,), dtype, 2), rnd((n,), dtype, 3)) if affine else (None, None)
    y_ref, s_ref = ops.add_layer_norm(x, r, w, b, return_sum=True, device="ref")
    y, s = ops.add_layer_norm(x, r, w, b, return_sum=True)
    close(y, y_ref, dtype, loose=2.0)
    close(s, s_ref, dtype)
    close(s, ops.add(x, r), dtype)
    close(decomposed("add_layer_norm", x, r, w, b), y_ref, dtype, loose=8.0)
    # the oracle: layer_norm of the float64 sum
    s64 = x.astype(np.float64) + r.astype(np.float64)
    want = (s64 - s64.mean(-1, keepdims=True)) / np.sqrt(s64.var(-1, keepdims=True) + 1e-5)
    if affine:
        want = want * w.astype(np.float64) + b.astype(np.float64)
    close(y_ref, want.astype(dtype), dtype, loose=2.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("affine", [False, True])
def test_add_rms_norm(dtype: Any, affine: bool) -> None:
    x, r = rnd((7, 53), dtype), rnd((53,), dtype, 1)
    w = rnd((53,), dtype, 2) if affine else None
    y_ref = ops.add_rms_norm(x, r, w, device="ref")
    y, s = ops.add_rms_norm(x, r, w, return_sum=True)
    close(y, y_ref, dtype, loose=2.0)
    close(s, ops.add(x, r), dtype)
    close(decomposed("add_rms_norm", x, r, w), y_ref, dtype, loose=8.0)
    s64 = x.astype(np.float64) + r.astype(np.float64)
    want = (
        s64 / np.sqrt((s64 * s64).mean(-1, keepdims=True) + 1e-6) * (1 if w is None else w.astype(np.float64))
    )
    close(y_ref, want.astype(dtype), dtype, loose=2.0)


def test_add_norm_errors() -> None:
    x = np.zeros((2, 4), np.float32)
    with pytest.raises(OpError, match="add_layer_norm: argument 'weight' expected"):
        ops.add_layer_norm(x, x, np.ones(3, np.float32))
    with pytest.raises(OpError, match="argument 'residual' expected an array"):
        ops.add_rms_norm(x, None)
    with pytest.raises(OpError, match="argument 'eps'"):
        ops.add_layer_norm(x, x, eps=-1.0)


# --------------------------------------------------------------------------- scale_mask_softmax


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mask_kind", [None, "bool", "float"])
@pytest.mark.parametrize("axis", [-1, 1])
def test_scale_mask_softmax(dtype: Any, mask_kind: Any, axis: int) -> None:
    x = rnd((2, 3, 11, 13), dtype)
    mask: Any = None
    rng = np.random.default_rng(5)
    if mask_kind == "bool":
        mask = rng.random((1, 1, 11, 13)) > 0.3
        mask[0, 0, 4] = False  # one fully masked row -> zeros
    elif mask_kind == "float":
        mask = np.where(rng.random((11, 13)) > 0.3, 0.0, -np.inf).astype(np.float32)
    ref = ops.scale_mask_softmax(x, mask, scale=0.125, axis=axis, device="ref")
    close(ops.scale_mask_softmax(x, mask, scale=0.125, axis=axis), ref, dtype)
    close(decomposed("scale_mask_softmax", x, mask, scale=0.125, axis=axis), ref, dtype, loose=4.0)
    if mask_kind == "bool" and axis == -1:
        assert np.all(ref[:, :, 4].astype(np.float32) == 0)
    if mask_kind is None:
        close(ref, ops.softmax(ops.mul(x, np.asarray(0.125, dtype)), axis=axis, device="ref"), dtype)


def test_scale_mask_softmax_errors() -> None:
    x = np.zeros((2, 4), np.float32)
    with pytest.raises(OpError, match="argument 'mask' expected a floating or bool dtype"):
        ops.scale_mask_softmax(x, np.zeros(4, np.int32))
    with pytest.raises(OpError, match="argument 'scale' expected a finite number"):
        ops.scale_mask_softmax(x, scale=float("nan"))
    with pytest.raises(OpError, match="argument 'axis'"):
        ops.scale_mask_softmax(x, axis=2)


# --------------------------------------------------------------------------- adamw


def textbook_adamw(p, g, m, v, *, lr, beta1, beta2, eps, wd, step):
    """Loshchilov & Hutter's AdamW as torch implements it, in float64 numpy, returning new arrays."""
    p = p * (1 - lr * wd)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    m_hat, v_hat = m / (1 - beta1**step), v / (1 - beta2**step)
    return p - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


@pytest.mark.parametrize("device", ["cpu", "ref", "decomposition"])
@pytest.mark.parametrize("grad_dtype", DTYPES, ids=str)
def test_adamw_matches_textbook_in_place(device: str, grad_dtype: Any) -> None:
    shape = (13, 29)  # 377 elements: several 96-element chunks and a partial one
    p = rnd(shape, float32, 0, 1.0)
    m, v = np.zeros(shape, float32), np.zeros(shape, float32)
    ids = (id(p), id(m), id(v))
    p64, m64, v64 = p.astype(np.float64), m.astype(np.float64), v.astype(np.float64)
    hp = {"lr": 1e-2, "beta1": 0.9, "beta2": 0.99, "eps": 1e-8}
    for step in range(1, 6):
        g = rnd(shape, grad_dtype, step, 1.0)
        if device == "decomposition":
            decomposed("adamw_step", p, g, m, v, **hp, weight_decay=0.1, step=step)
        else:
            assert ops.adamw_step(p, g, m, v, **hp, weight_decay=0.1, step=step, device=device) is None
        p64, m64, v64 = textbook_adamw(p64, g.astype(np.float64), m64, v64, **hp, wd=0.1, step=step)
    assert (id(p), id(m), id(v)) == ids and p.dtype == float32
    assert_close(m, m64.astype(float32), rtol=1e-5, atol=1e-6)
    assert_close(v, v64.astype(float32), rtol=1e-5, atol=1e-7)
    assert_close(p, p64.astype(float32), rtol=1e-5, atol=1e-6)


def test_adamw_errors() -> None:
    p, m, v = (np.zeros(4, np.float32) for _ in range(3))
    g = np.zeros(4, np.float32)
    with pytest.raises(OpError, match="adamw_step: argument 'step' expected an int >= 1"):
        ops.adamw_step(p, g, m, v, lr=0.1, step=0)
    with pytest.raises(OpError, match="argument 'exp_avg' expected param's shape"):
        ops.adamw_step(p, g, np.zeros(5, np.float32), v, lr=0.1, step=1)
    with pytest.raises(OpError, match="argument 'param' expected float32 or float64"):
        ops.adamw_step(p.astype(bfloat16), g, m, v, lr=0.1, step=1)
    with pytest.raises(OpError, match="argument 'param' expected a C-contiguous"):
        ops.adamw_step(np.zeros((4, 2), np.float32)[:, 0], g, m, v, lr=0.1, step=1)
    with pytest.raises(OpError, match=r"argument 'beta1' expected a finite number in \[0.0, 1.0\)"):
        ops.adamw_step(p, g, m, v, lr=0.1, beta1=1.0, step=1)
    with pytest.raises(OpError, match="argument 'grad' expected param's shape"):
        ops.adamw_step(p, np.zeros(3, np.float32), m, v, lr=0.1, step=1)
    with pytest.raises(OpError, match="three distinct arrays"):
        ops.adamw_step(p, g, m, m, lr=0.1, step=1)


def test_registered_on_ref_and_cpu_with_decompositions() -> None:
    for op in ("bias_act", "add_layer_norm", "add_rms_norm", "scale_mask_softmax", "adamw_step"):
        assert {e.device for e in ops.kernels(op)} == {"ref", "cpu"}
        assert ops.dispatch_path(op, "cpu") == "native"


@pytest.mark.parametrize("has_copy", [True, False])
def test_reshape_view_never_copies_on_any_numpy(monkeypatch, has_copy: bool) -> None:
    """Both paths (numpy >= 2.1's reshape(copy=False), older numpy's in-place shape) view or refuse."""
    if has_copy and not _chunking._RESHAPE_HAS_COPY:
        pytest.skip(f"np.reshape(copy=...) needs numpy >= 2.1, this is {np.__version__}")
    monkeypatch.setattr(_chunking, "_RESHAPE_HAS_COPY", has_copy)
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    v = _chunking.reshape_view(a, (6, 4))
    assert np.shares_memory(v, a) and v.shape == (6, 4)
    assert _chunking.reshape_view(a, (-1, 4)).shape == (6, 4)
    with pytest.raises(ValueError):
        _chunking.reshape_view(a.transpose(2, 0, 1), (8, 3))  # strides cannot express it: no silent copy
    b = np.broadcast_to(np.ones(4, np.float32), (3, 4))
    assert _chunking.as_rows(b, (3, 4)).shape == (3, 4)
