"""conv2d: ref against a direct 7-loop float64 convolution, cpu (im2col) against ref, every float dtype."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import opstrata.ops as ops
from opstrata.ops._dtypes import FLOAT_DTYPES
from opstrata.ops.testing import assert_close, tolerances

SETTINGS = settings(max_examples=20, deadline=None)
DTYPES = pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)


def close(actual: np.ndarray, expected: np.ndarray) -> None:
    """assert_close with the dtype's tolerances; float8 also allows one subnormal step near zero."""
    rtol, atol = tolerances(expected.dtype)
    if "float8" in expected.dtype.name:
        atol = max(atol, float(ml_dtypes.finfo(expected.dtype).smallest_subnormal))
    assert_close(actual, expected, rtol=rtol, atol=atol)


def conv_loops(x, w, b, stride, pads, dilation, groups) -> np.ndarray:
    """The definition, one multiply-add at a time in float64 (torch/ONNX Conv, zero padding)."""
    n_, _, h, wd = x.shape
    o_, cg, kh, kw = w.shape
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = stride, dilation, pads
    ho = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    wo = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    og = o_ // groups
    out = np.zeros((n_, o_, ho, wo))
    for n in range(n_):
        for o in range(o_):
            g = o // og
            for i in range(ho):
                for j in range(wo):
                    total = 0.0 if b is None else float(b[o])
                    for c in range(cg):
                        for p in range(kh):
                            for q in range(kw):
                                r, s = i * sh - pt + p * dh, j * sw - pl + q * dw
                                if 0 <= r < h and 0 <= s < wd:
                                    total += float(x[n, g * cg + c, r, s]) * float(w[o, c, p, q])
                    out[n, o, i, j] = total
    return out


@st.composite
def conv_cases(draw: st.DrawFn) -> dict:
    groups = draw(st.integers(1, 3))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pads = draw(
        st.one_of(
            st.integers(0, 2).map(lambda p: (p,) * 4),
            st.tuples(st.integers(0, 2), st.integers(0, 2)).map(lambda p: p * 2),
            st.tuples(*[st.integers(0, 2)] * 4),
        )
    )
    eff_h, eff_w = dilation[0] * (kh - 1) + 1, dilation[1] * (kw - 1) + 1
    h = draw(st.integers(max(1, eff_h - pads[0] - pads[2]), 7))
    w = draw(st.integers(max(1, eff_w - pads[1] - pads[3]), 7))
    return dict(
        x_shape=(draw(st.integers(0, 2)), groups * draw(st.integers(1, 2)), h, w),
        w_shape=(groups * draw(st.integers(1, 2)), 0, kh, kw),
        stride=(draw(st.integers(1, 3)), draw(st.integers(1, 3))),
        pads=pads,
        dilation=dilation,
        groups=groups,
        bias=draw(st.booleans()),
    )


def make(case: dict, dtype, seed: int):
    rng = np.random.default_rng(seed)
    x_shape, (o, _, kh, kw) = case["x_shape"], case["w_shape"]
    x = rng.uniform(-1, 1, x_shape).astype(dtype)
    w = rng.uniform(-1, 1, (o, x_shape[1] // case["groups"], kh, kw)).astype(dtype)
    b = rng.uniform(-1, 1, (o,)).astype(dtype) if case["bias"] else None
    attrs = dict(
        stride=case["stride"], padding=case["pads"], dilation=case["dilation"], groups=case["groups"]
    )
    return x, w, b, attrs


@DTYPES
@SETTINGS
@given(case=conv_cases(), seed=st.integers(0, 2**16))
def test_conv2d_ref_matches_direct_loops(dtype, case, seed) -> None:
    x, w, b, attrs = make(case, dtype, seed)
    expected = conv_loops(x, w, b, case["stride"], case["pads"], case["dilation"], case["groups"])
    close(ops.conv2d(x, w, b, device="ref", **attrs), expected.astype(dtype))


@DTYPES
@SETTINGS
@given(case=conv_cases(), seed=st.integers(0, 2**16))
def test_conv2d_cpu_matches_ref(dtype, case, seed) -> None:
    x, w, b, attrs = make(case, dtype, seed)
    ref = ops.conv2d(x, w, b, device="ref", **attrs)
    cpu = ops.conv2d(x, w, b, device="cpu", **attrs)
    assert cpu.dtype == ref.dtype == dtype
    close(cpu, ref)


@pytest.mark.parametrize("device", ["ref", "cpu"])
def test_padding_forms_agree(device) -> None:
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((1, 2, 5, 5)), rng.standard_normal((3, 2, 3, 3))
    one = ops.conv2d(x, w, padding=1, device=device)
    assert_close(ops.conv2d(x, w, padding=(1, 1), device=device), one)
    assert_close(ops.conv2d(x, w, padding=(1, 1, 1, 1), device=device), one)
    assert one.shape == (1, 3, 5, 5)
    lopsided = ops.conv2d(x, w, padding=(0, 1, 2, 0), device=device)  # (top, left, bottom, right)
    assert lopsided.shape == (1, 3, 5, 4)


@pytest.mark.parametrize("device", ["ref", "cpu"])
def test_depthwise_and_empty_dims(device) -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 4, 6, 6)).astype(np.float32)
    w = rng.standard_normal((8, 1, 3, 3)).astype(np.float32)  # depthwise, multiplier 2
    y = ops.conv2d(x, w, groups=4, padding=1, device=device)
    assert_close(y[:, 2:4], ops.conv2d(x[:, 1:2], w[2:4], padding=1, device=device), rtol=1e-5, atol=1e-5)
    assert ops.conv2d(x[:0], w, groups=4, device=device).shape == (0, 8, 4, 4)
    assert ops.conv2d(x, w[:0].reshape(0, 4, 3, 3), device=device).shape == (2, 0, 4, 4)


@pytest.mark.parametrize("device", ["ref", "cpu"])
def test_low_precision_accumulates_in_float32(device) -> None:
    x = np.ones((1, 1024, 1, 1), ml_dtypes.bfloat16)  # 1024 ones: a bfloat16 accumulator stalls at 256
    w = np.ones((1, 1024, 1, 1), ml_dtypes.bfloat16)
    assert float(ops.conv2d(x, w, device=device)[0, 0, 0, 0]) == 1024.0


@pytest.mark.parametrize("device", ["ref", "cpu"])
@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        (dict(x=np.ones((2, 3, 4))), r"conv2d: argument 'x' expected 4 dims \(NCHW\), got 3 dims"),
        (dict(w=np.ones((2, 2, 3, 3))), r"conv2d: argument 'weight' expected dim 1 = C_in / groups = 3"),
        (dict(w=np.ones((2, 3, 3, 3), np.float32)), r"conv2d: argument 'weight' expected dtype float64"),
        (dict(groups=2), r"conv2d: argument 'groups' expected a divisor of C_in \(3\)"),
        (dict(b=np.ones(3)), r"conv2d: argument 'bias' expected shape \(2,\)"),
        (dict(padding=(1, 2, 3)), r"conv2d: argument 'padding' expected"),
        (dict(stride=0), r"conv2d: argument 'stride' expected an int >= 1"),
        (
            dict(x=np.ones((1, 3, 2, 2))),
            r"conv2d: argument 'x' expected padded H, W at least the dilated kernel",
        ),
    ],
)
def test_errors_name_op_and_argument(device, kwargs, pattern) -> None:
    args = dict(x=np.ones((1, 3, 5, 5)), w=np.ones((2, 3, 3, 3)), b=None)
    attrs = {k: v for k, v in kwargs.items() if k not in args}
    args.update({k: v for k, v in kwargs.items() if k in args})
    with pytest.raises(ops.OpError, match=pattern):
        ops.conv2d(args["x"], args["w"], args["b"], device=device, **attrs)
