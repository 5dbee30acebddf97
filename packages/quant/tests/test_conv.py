"""The native int8 convolution (``qconv2d``, ops' ``qconv`` registered from quant) and QuantizeLinear:
exact integer parts against ops' reference on every code path, the registered kernels' hand-offs, and a
quantized CNN that runs its Conv nodes as QConv on them."""

from __future__ import annotations

import functools
import warnings
from typing import Any

import numpy as np
import pytest
from _native import needs_native
from hypothesis import given, settings, strategies as st

import opstrata.ops as ops
import opstrata.quant as oq
import opstrata.runtime as rt
from opstrata.ops.testing import TOLERANCES
from opstrata.quant.native import _library

pytestmark = needs_native
RTOL, ATOL = TOLERANCES[np.dtype(np.float32)]


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 2), c_per_group=st.integers(1, 6), groups=st.sampled_from([1, 2, 3, "depthwise"]),
    mult=st.integers(1, 3), h=st.integers(1, 9), w=st.integers(1, 9), kh=st.integers(1, 4), kw=st.integers(1, 4),
    stride=st.tuples(st.integers(1, 3), st.integers(1, 3)), pads=st.tuples(*[st.integers(0, 2)] * 4),
    dilation=st.tuples(st.integers(1, 2), st.integers(1, 2)), x_dt=st.sampled_from([np.uint8, np.int8]),
    w_dt=st.sampled_from([np.int8, np.uint8]), per_channel_zp=st.booleans(), with_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)  # fmt: skip
def test_qconv2d_equals_ops_reference_on_every_path(
    n, c_per_group, groups, mult, h, w, kh, kw, stride, pads, dilation, x_dt, w_dt, per_channel_zp, with_bias, seed
) -> None:  # fmt: skip
    """conv(x - x_zp, w - w_zp) exactly in int32, scaled per output channel (+ bias): any geometry
    (asymmetric pads, strides, dilations), grouped and depthwise, int8/uint8 on both sides."""
    g = c_per_group if groups == "depthwise" else groups
    cg = 1 if groups == "depthwise" else c_per_group
    c, oc = cg * g, g * (1 if groups == "depthwise" else mult)
    if (
        h + pads[0] + pads[2] < dilation[0] * (kh - 1) + 1
        or w + pads[1] + pads[3] < dilation[1] * (kw - 1) + 1
    ):
        return  # an empty output: nothing to compare
    r = np.random.default_rng(seed)
    xi, wi = np.iinfo(x_dt), np.iinfo(w_dt)
    x = r.integers(xi.min, xi.max + 1, (n, c, h, w)).astype(x_dt)
    wt = r.integers(wi.min, wi.max + 1, (oc, cg, kh, kw)).astype(w_dt)
    x_zp = np.asarray(r.integers(xi.min, xi.max + 1), x_dt)
    w_zp = r.integers(wi.min, wi.max + 1, oc if per_channel_zp else ()).astype(w_dt)
    scale = r.uniform(1e-3, 1e-1, oc).astype(np.float32)
    bias = r.standard_normal(oc).astype(np.float32) if with_bias else None
    geo = {"stride": list(stride), "pads": list(pads), "dilation": list(dilation)}
    want = ops.qconv(x, x_zp, wt, w_zp, scale, bias, groups=g, device="ref", **geo)
    packed = oq.prepack_conv(wt, w_zp, g)
    assert packed.depthwise == (cg == 1 and oc == g)
    tol = ATOL * max(1.0, float(np.abs(want).max()))
    for path in _library.available_paths():
        got = oq.qconv2d(x, packed, x_zp, scale, bias, path=path, **geo)
        assert got.shape == want.shape and got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=tol, err_msg=path)


def _depthwise_int64(x, x_zp, wt, w_zp, scale, bias, stride, pads, dilation) -> np.ndarray:
    """The depthwise integer sum in int64, then float32 ``acc * scale (+ bias)`` rounded as the kernels do."""
    n, c, h, w = x.shape
    kh, kw = wt.shape[2:]
    xp = np.pad(x.astype(np.int64) - int(x_zp), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    wc = wt.reshape(c, kh, kw).astype(np.int64) - np.asarray(w_zp, np.int64).reshape(-1, 1, 1)
    oh = (h + pads[0] + pads[2] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (w + pads[1] + pads[3] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    acc = np.zeros((n, c, oh, ow), np.int64)
    for i in range(kh):
        for j in range(kw):
            r, q = i * dilation[0], j * dilation[1]
            tap = xp[
                :,
                :,
                r : r + stride[0] * (oh - 1) + 1 : stride[0],
                q : q + stride[1] * (ow - 1) + 1 : stride[1],
            ]
            acc += tap * wc[None, :, i, j, None, None]
    out = acc.astype(np.float32) * scale.reshape(1, -1, 1, 1)
    return out if bias is None else out + bias.reshape(1, -1, 1, 1)


@pytest.mark.parametrize(
    ("n", "c", "hw", "k", "stride", "dilation"),
    [
        (2, 24, 20, 3, 1, 1),  # planes of 20 columns: the float plane kernel
        (1, 40, 33, 5, 2, 1),  # stride 2: the phase-split scratch, 17 columns
        (1, 9, 50, 3, 3, 2),  # stride 3, dilated
        (2, 37, 8, 5, 1, 1),  # 8 columns: 16 channels in lanes, a partial block
        (1, 20, 5, 3, 2, 1),
        (1, 3, 2, 5, 1, 1),
        (1, 18, 18, 17, 1, 1),  # 289 taps: past float32's exact range, the int32 kernels
    ],
)
def test_depthwise_is_exact_and_the_same_on_every_path(n, c, hw, k, stride, dilation) -> None:
    """Every depthwise kernel (float32 planes or lanes, exact while every partial sum is an integer below
    2^24; the int32 channels-last rows) gives the int64 sum scaled as float32 -- the same bits on every path
    and thread count, uint8 and int8 activations."""
    r = np.random.default_rng(c * hw + k)
    pads = (k // 2, k // 2, k // 2, k // 2)
    for x_dt in (np.uint8, np.int8):
        xi = np.iinfo(x_dt)
        x = r.integers(xi.min, xi.max + 1, (n, c, hw, hw)).astype(x_dt)
        wt = r.integers(-128, 128, (c, 1, k, k)).astype(np.int8)
        x_zp = np.asarray(xi.max if x_dt == np.uint8 else xi.min, x_dt)  # the largest |x - zp|: 255
        w_zp = r.integers(-128, 128, c).astype(np.int8)
        scale = r.uniform(1e-3, 1e-1, c).astype(np.float32)
        bias = r.standard_normal(c).astype(np.float32)
        geo = {"stride": [stride] * 2, "pads": list(pads), "dilation": [dilation] * 2}
        want = _depthwise_int64(x, x_zp, wt, w_zp, scale, bias, (stride,) * 2, pads, (dilation,) * 2)
        packed = oq.prepack_conv(wt, w_zp, c)
        for path in _library.available_paths():
            for threads in (1, 2):
                got = oq.qconv2d(x, packed, x_zp, scale, bias, threads=threads, path=path, **geo)
                np.testing.assert_array_equal(got, want, err_msg=f"{x_dt.__name__} {path} {threads}")


@pytest.mark.parametrize(
    ("n", "c", "oc", "hw", "k", "stride"),
    [
        (1, 64, 40, 9, 1, 1),
        (2, 128, 72, 7, 1, 1),
        (3, 3, 16, 13, 3, 2),
        (2, 16, 96, 8, 1, 1),
        (2, 24, 33, 6, 3, 1),
    ],
)
def test_qconv2d_larger_layers_on_every_path(n: int, c: int, oc: int, hw: int, k: int, stride: int) -> None:
    """Layers big enough for the GEMM's 32-row blocks, inside one image and across two: the plain 1x1
    (the image read in place, K a multiple of 64), the RGB stem read tap by tap from NCHW, channel counts
    off the 16-lane vectors; NCHW float32 written plane by plane."""
    r = np.random.default_rng(c * oc + hw)
    x = r.integers(0, 256, (n, c, hw, hw)).astype(np.uint8)
    wt = r.integers(-128, 128, (oc, c, k, k)).astype(np.int8)
    scale = r.uniform(1e-3, 1e-1, oc).astype(np.float32)
    bias = r.standard_normal(oc).astype(np.float32)
    geo = {"stride": [stride, stride], "pads": [k // 2] * 4, "dilation": [1, 1]}
    want = ops.qconv(x, np.uint8(7), wt, np.int8(0), scale, bias, groups=1, device="ref", **geo)
    packed = oq.prepack_conv(wt, np.int8(0), 1)
    tol = ATOL * max(1.0, float(np.abs(want).max()))
    for path in _library.available_paths():
        got = oq.qconv2d(x, packed, np.uint8(7), scale, bias, path=path, **geo)
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=tol, err_msg=path)


def test_registered_qconv_runs_native_and_hands_off_what_it_does_not_cover() -> None:
    r = np.random.default_rng(1)
    x = r.integers(0, 256, (2, 4, 7, 7)).astype(np.uint8)
    w = r.integers(-127, 128, (6, 2, 3, 3)).astype(np.int8)
    scale, bias = np.full(6, 0.01, np.float32), np.arange(6, dtype=np.float32)
    oq.reset_native_stats()
    got = ops.qconv(x, np.uint8(5), w, np.int8(0), scale, bias, pads=1, groups=2)
    want = ops.qconv(x, np.uint8(5), w, np.int8(0), scale, bias, pads=1, groups=2, device="ref")
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL * float(np.abs(want).max()))
    out = np.empty_like(want)
    assert ops.qconv(x, np.uint8(5), w, np.int8(0), scale, bias, pads=1, groups=2, out=out) is out
    np.testing.assert_array_equal(out, got)
    assert oq.native_status().calls["qconv"] == {"native": 2, "numpy": 0}
    x1 = r.integers(0, 256, (1, 4, 9)).astype(np.uint8)  # a 1-D convolution: ops' kernel
    w1 = r.integers(-127, 128, (3, 4, 3)).astype(np.int8)
    y1 = ops.qconv(x1, np.uint8(0), w1, np.int8(0), np.float32(0.5))
    np.testing.assert_array_equal(
        y1, ops.qconv(x1, np.uint8(0), w1, np.int8(0), np.float32(0.5), device="ref")
    )
    assert oq.native_status().calls["qconv"] == {"native": 2, "numpy": 1}


def test_prepack_conv_and_qconv2d_errors() -> None:
    w = np.ones((4, 2, 3, 3), np.int8)
    with pytest.raises(oq.QuantError, match="4-D int8/uint8"):
        oq.prepack_conv(w.astype(np.float32))
    with pytest.raises(oq.QuantError, match="groups=3 must divide the 4 output channels"):
        oq.prepack_conv(w, None, 3)
    packed = oq.prepack_conv(w)
    with pytest.raises(oq.QuantError, match=r"x must be \(N, 2, H, W\)"):
        oq.qconv2d(np.ones((1, 3, 5, 5), np.uint8), packed, 0, np.float32(1))
    with pytest.raises(oq.QuantError, match="pads"):
        oq.qconv2d(np.ones((1, 2, 5, 5), np.uint8), packed, 0, np.float32(1), pads=[1, 1])
    with pytest.raises(oq.QuantError, match="scale must be a scalar or one per output channel"):
        oq.qconv2d(np.ones((1, 2, 5, 5), np.uint8), packed, 0, np.ones(3, np.float32))


@settings(max_examples=30, deadline=None)
@given(
    size=st.integers(0, 300), out_dt=st.sampled_from([np.uint8, np.int8, None]),
    scale=st.floats(1e-3, 10.0), zp=st.integers(-128, 255), seed=st.integers(0, 2**16),
)  # fmt: skip
def test_quantize_linear_native_is_bit_identical(size, out_dt, scale, zp, seed) -> None:
    """Division, round half to even, + zero point, saturation, NaN -> 0 and infinities as ops' kernel."""
    r = np.random.default_rng(seed)
    x = (r.standard_normal(size) * r.uniform(0.1, 500)).astype(np.float32)
    special = np.array([np.nan, np.inf, -np.inf, 0.5 * scale, 1.5 * scale, -2.5 * scale], np.float32)
    x[: min(size, 6)] = special[: min(size, 6)]
    zero = (
        None
        if out_dt is None
        else np.asarray(np.clip(zp, *((0, 255) if out_dt == np.uint8 else (-128, 127))), out_dt)
    )
    oq.reset_native_stats()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = ops.quantize_linear(x, np.float32(scale), zero)
        want = ops.quantize_linear(x, np.float32(scale), zero, device="ref")
    assert got.dtype == want.dtype and np.array_equal(got, want)
    assert oq.native_status().calls["quantize_linear"] == {"native": 1, "numpy": 0}


@settings(max_examples=40, deadline=None)
@given(
    scale=st.one_of(st.floats(2.0**-20, 1024.0, width=32), st.floats(-10.0, -(2.0**-10), width=32),
                    st.sampled_from([1e-40, 3e-39, 1e38, np.inf, 0.0])),
    zp=st.integers(-128, 255), signed=st.booleans(), seed=st.integers(0, 2**16),
)  # fmt: skip
def test_quantize_linear_multiplies_by_the_reciprocal_yet_rounds_as_the_division(
    scale, zp, signed, seed
) -> None:
    """The kernel multiplies by 1 / scale and divides only the lanes next to a half-integer: on values at,
    one ulp either side of and between ties, at every magnitude up to saturation and past it, and for
    scales with no normal reciprocal (subnormal, huge, zero, infinite, negative), the bytes equal the
    division's (ops' reference: rint(x / s) + zp, saturated, NaN -> 0)."""
    r = np.random.default_rng(seed)
    s = np.float32(scale)
    k = r.integers(-1100, 1100, 400).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        ties = ((k + np.float32(0.5)) * s).astype(np.float32)
        x = np.concatenate([
            ties, np.nextafter(ties, np.float32(np.inf)), np.nextafter(ties, np.float32(-np.inf)),
            (k * s).astype(np.float32), (r.standard_normal(300) * 3000 * np.float32(abs(scale) or 1)).astype(np.float32),
            np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 3e38, -3e38], np.float32),
        ])  # fmt: skip
    dt = np.int8 if signed else np.uint8
    zero = np.asarray(np.clip(zp, *((-128, 127) if signed else (0, 255))), dt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = ops.quantize_linear(x, s, zero, device="ref")
        got = ops.quantize_linear(x, s, zero)
    np.testing.assert_array_equal(got, want)


def test_quantize_linear_per_axis_goes_to_ops_kernel() -> None:
    x = np.ones((2, 3), np.float32)
    oq.reset_native_stats()
    got = ops.quantize_linear(x, np.array([1.0, 2.0], np.float32), np.zeros(2, np.uint8), axis=0)
    assert got.tolist() == [[1, 1, 1], [0, 0, 0]] and got.dtype == np.uint8
    assert oq.native_status().calls["quantize_linear"] == {"native": 0, "numpy": 1}


def test_quantized_cnn_runs_its_convs_as_native_qconv() -> None:
    """quantize(..., "w8a8") of a CNN: every Conv becomes a QConv in the session, run natively, and the
    outputs stay within a quantization step of onnxruntime on the same QDQ model."""
    from _quant_models import convnet, feeds, run_ort

    from opstrata.runtime import InferenceSession

    calib = feeds((4, 3, 16, 16), 4, seed=0)
    qm = oq.quantize(convnet(), calib, "w8a8")
    slow = getattr(rt, "SlowKernelWarning", None)  # opstrata-runtime >= 0.5.41 warns without native kernels
    with warnings.catch_warnings():
        if slow is not None:
            warnings.simplefilter("error", slow)  # quant's kernels are registered: nothing to warn about
        sess = qm.session()
    counts = sess.plan.graph.op_counts()  # a graph with fuse_qconv_quantize folds a Conv's QuantizeLinear in
    assert counts.get("ai.opstrata::QConv", 0) + counts.get("ai.opstrata::QConvQuantize", 0) == 2
    held = feeds((4, 3, 16, 16), 2, seed=9)
    oq.reset_native_stats()
    ours = np.concatenate([sess.run(None, f)[0] for f in held])
    calls = oq.native_status().calls.get("qconv", {"native": 0, "numpy": 0})
    assert calls["numpy"] == 0
    if _runtime_binds_qconv():  # the steady-state run: QConv / QuantizeLinear on their bound C calls
        _assert_bound_qconv(sess)  # (a call inside ops' native batch is not counted)
    else:
        assert calls["native"] == 4
    theirs = run_ort(qm.model, held, level="none")[0]
    np.testing.assert_allclose(ours, theirs, atol=0.05 * float(np.abs(theirs).max()))
    assert isinstance(InferenceSession(qm.model), InferenceSession)


def _runtime_version() -> tuple[int, ...]:
    from importlib.metadata import version

    return tuple(int(p) for p in version("opstrata-runtime").split(".")[:3])


def _runtime_binds_qconv() -> bool:
    """opstrata-runtime >= 0.5.33 binds QConv / QuantizeLinear steps through ops.bind (older: per node)."""
    return _runtime_version() >= (0, 5, 33)


def _assert_bound_qconv(sess: Any) -> None:
    (bound,) = sess._bound.values()
    kinds = {
        sess._schedule.steps[i].node.op_type: c.name if isinstance(c, ops.NativeCall) else c.__qualname__
        for i, c in zip(bound.index, bound.calls, strict=True)
    }
    if "QConvQuantize" in kinds:  # QConv -> (Relu) -> QuantizeLinear fused (graph >= 0.4.24, ops >= 0.4.64)
        assert kinds["QConvQuantize"] == "opstrata_qconv_quantize_packed", kinds
    if hasattr(ops, "foreign_call"):  # ops >= 0.4.56 and a runtime freezing zero points: C calls in a batch
        if kinds.get("QConv") == "opstrata_qconv2d_packed":
            assert kinds["QuantizeLinear"] == "opstrata_quantize_linear_packed", kinds
            if "QMatMul" in kinds and hasattr(ops, "qmatmul") and _runtime_version() >= (0, 5, 40):
                assert kinds["QMatMul"] == "opstrata_qgemm_packed", kinds  # the quantized head too
            return
    assert kinds["QConv"].startswith("_bind_qconv_native"), kinds
    assert kinds["QuantizeLinear"].startswith("_bind_quantize_linear_native"), kinds


@pytest.mark.skipif(not hasattr(ops, "bind"), reason="opstrata-ops without ops.bind (before 0.4.14)")
def test_qconv_and_quantize_linear_bind_to_the_eager_kernels_bits() -> None:
    """ops.bind("qconv") / ops.bind("quantize_linear") on the registered native kernels: one call per run
    into ``out``, the same bits as the eager call, the zero point read when the call runs; arrays the C
    code cannot take are not bound (the runtime keeps the per-node path)."""
    r = np.random.default_rng(5)
    x = r.integers(0, 256, (2, 8, 9, 9)).astype(np.uint8)
    wt = r.integers(-128, 128, (16, 8, 3, 3)).astype(np.int8)
    x_zp, w_zp = np.array(3, np.uint8), np.array(0, np.int8)
    scale, bias = r.uniform(1e-3, 1e-2, 16).astype(np.float32), r.standard_normal(16).astype(np.float32)
    geo = {"stride": [2, 2], "pads": [1, 1, 1, 1], "dilation": [1, 1], "groups": 1}
    out = np.empty((2, 16, 5, 5), np.float32)
    call = ops.bind("qconv", x, x_zp, wt, w_zp, scale, bias, out=out, **geo)
    assert call is not None and call() is out
    np.testing.assert_array_equal(out, ops.qconv(x, x_zp, wt, w_zp, scale, bias, **geo))
    x_zp[...] = 9  # read at call time
    call()
    np.testing.assert_array_equal(out, ops.qconv(x, x_zp, wt, w_zp, scale, bias, **geo))
    strided = np.empty((2, 16, 5, 10), np.float32)[..., ::2]
    fallback = ops.bind("qconv", x, x_zp, wt, w_zp, scale, bias, out=strided, **geo)
    assert isinstance(fallback, functools.partial)  # the eager kernel with out=: its own checks each call

    # a read-only weight (a session's): the C arguments made once, the zero points still read per run
    for w_ro, g in ((wt.copy(), 1), (r.integers(-128, 128, (8, 1, 3, 3)).astype(np.int8), 8)):
        w_ro.flags.writeable = False
        oc = w_ro.shape[0]
        o = np.empty((2, oc, 5, 5), np.float32)
        wzp = np.zeros(oc, np.int8)
        sc, bi = scale[:oc].copy(), bias[:oc].copy()
        fixed = ops.bind("qconv", x, x_zp, w_ro, wzp, sc, bi, out=o, **{**geo, "groups": g})
        assert fixed is not None and fixed() is o
        np.testing.assert_array_equal(o, ops.qconv(x, x_zp, w_ro, wzp, sc, bi, **{**geo, "groups": g}))
        x_zp[...] = 11
        wzp[...] = 2  # a writeable weight zero point that changes: packed again
        fixed()
        np.testing.assert_array_equal(o, ops.qconv(x, x_zp, w_ro, wzp, sc, bi, **{**geo, "groups": g}))

    f = (r.standard_normal((4, 33)) * 3).astype(np.float32)
    s, zp = np.array(0.05, np.float32), np.array(-3, np.int8)
    q = np.empty(f.shape, np.int8)
    qcall = ops.bind("quantize_linear", f, s, zp, out=q)
    assert qcall is not None and qcall() is q
    np.testing.assert_array_equal(q, ops.quantize_linear(f, s, zp))
    zp[...] = 5
    qcall()
    np.testing.assert_array_equal(q, ops.quantize_linear(f, s, zp))
    assert ops.bind("quantize_linear", f, s, zp, out=np.empty(f.shape, np.uint8)) is None  # dtype mismatch


@pytest.mark.skipif(
    not hasattr(ops, "foreign_call"), reason="opstrata-ops without foreign calls (before 0.4.56)"
)
@pytest.mark.parametrize("groups", [1, 8])
def test_bound_qconv_and_quantize_linear_are_native_calls_that_batch_with_ops(groups: int) -> None:
    """A read-only weight with read-only zero points (a session's): the bound QConv is one packed C call
    (``ops.foreign_call``) and so is QuantizeLinear; merged into one ops.NativeBatch with an ops kernel
    between them they give the eager kernels' bits, and the activation zero point / scale are still read
    when the batch runs."""
    r = np.random.default_rng(11)
    x = r.integers(0, 256, (2, 8, 9, 9)).astype(np.uint8)
    w = r.integers(-128, 128, (16, 8 // groups, 3, 3)).astype(np.int8)
    wzp = np.zeros(16, np.int8)
    w.flags.writeable = wzp.flags.writeable = False
    x_zp = np.array(3, np.uint8)
    scale, bias = r.uniform(1e-3, 1e-2, 16).astype(np.float32), r.standard_normal(16).astype(np.float32)
    geo = {"stride": [2, 2], "pads": [1, 1, 1, 1], "dilation": [1, 1], "groups": groups}
    conv_out = np.empty((2, 16, 5, 5), np.float32)
    act = np.empty_like(conv_out)
    q = np.empty(conv_out.shape, np.uint8)
    y_scale, y_zp = np.array(0.02, np.float32), np.array(7, np.uint8)
    qconv = ops.bind("qconv", x, x_zp, w, wzp, scale, bias, out=conv_out, **geo)
    relu = ops.bind("bias_act", conv_out, None, None, out=act, act="relu")
    quant = ops.bind("quantize_linear", act, y_scale, y_zp, out=q)
    assert isinstance(qconv, ops.NativeCall) and qconv.name == "opstrata_qconv2d_packed"
    assert isinstance(quant, ops.NativeCall) and quant.name == "opstrata_quantize_linear_packed"
    assert qconv() is conv_out and quant() is q  # alone, each returns its destination
    runner, owners = ops.merge_bound_calls([qconv, relu, quant])
    assert len(runner) == 1 and isinstance(runner[0], ops.NativeBatch) and owners == [[0, 1, 2]]

    def eager() -> np.ndarray:
        y = ops.qconv(x, x_zp, w, wzp, scale, bias, **geo)
        return ops.quantize_linear(np.where(y < 0, np.float32(0), y), y_scale, y_zp)

    for zx, ys, yz in ((3, 0.02, 7), (200, 0.005, 0), (0, float("nan"), 9)):
        x_zp[...], y_scale[...], y_zp[...] = zx, ys, yz  # read when the batch runs
        q[...] = 123
        runner[0]()
        np.testing.assert_array_equal(q, eager())
    np.testing.assert_array_equal(conv_out, ops.qconv(x, x_zp, w, wzp, scale, bias, **geo))

    # an int8 activation: its zero point read as int8
    xs = (x.astype(np.int16) - 128).astype(np.int8)
    zs = np.array(-5, np.int8)
    signed = ops.bind("qconv", xs, zs, w, wzp, scale, bias, out=conv_out, **geo)
    assert isinstance(signed, ops.NativeCall)
    signed()
    np.testing.assert_array_equal(conv_out, ops.qconv(xs, zs, w, wzp, scale, bias, **geo))


def test_qconv_native_call_failure_names_the_kernel_and_input() -> None:
    """A packed call the C code refuses (here a code path id no CPU has) raises a QuantError naming
    qconv2d, the failure and the activation -- alone and from inside a native batch."""
    if not hasattr(ops, "foreign_call"):
        pytest.skip("opstrata-ops without foreign calls (before 0.4.56)")
    from opstrata.quant._conv import conv_geometry, prepack_conv, qconv_call, qconv_native_call

    r = np.random.default_rng(2)
    x = r.integers(0, 256, (1, 4, 6, 6)).astype(np.uint8)
    packed = prepack_conv(r.integers(-128, 128, (8, 4, 3, 3)).astype(np.int8), None, 1)
    geometry = conv_geometry(x.shape, packed, [1, 1], [1, 1, 1, 1], [1, 1])
    sc, out = np.full(8, 0.01, np.float32), np.empty((1, 8, 6, 6), np.float32)
    fn, head, tail = qconv_call(x, packed, sc, None, geometry, 1, None, out)
    bad = qconv_native_call((fn, (99, *head[1:]), tail), None, x, (packed, sc, out), out)
    assert bad is not None
    with pytest.raises(oq.QuantError, match=r"qconv2d.*code path is not available.*uint8\[1, 4, 6, 6\]"):
        bad()
    (batch,), _ = ops.merge_bound_calls([bad, bad])
    with pytest.raises(ops.NativeBatchError) as err:
        batch()
    assert err.value.index == 0 and isinstance(err.value.__cause__, oq.QuantError)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 2), c_per_group=st.integers(16, 40), groups=st.sampled_from([1, 2]), oc=st.integers(1, 70),
    h=st.integers(1, 20), w=st.integers(1, 20), k=st.sampled_from([1, 3]), stride=st.integers(1, 2),
    pad=st.integers(0, 1), x_dt=st.sampled_from([np.uint8, np.int8]), seed=st.integers(0, 2**16),
)  # fmt: skip
def test_wide_channel_convolutions_give_the_exact_integer_sums(
    n, c_per_group, groups, oc, h, w, k, stride, pad, x_dt, seed
) -> None:
    """16+ channels per group: the image goes channels-last in 16 x 16 byte blocks (any leftover channels
    and pixels byte by byte), 1x1 stride-1 convolutions straight from it with rows padded to the K groups,
    others through the patch rows; with scale 1 the output is the integer sum itself, exactly, on every
    code path and at two threads."""
    if h + 2 * pad < k or w + 2 * pad < k:
        return
    r = np.random.default_rng(seed)
    xi = np.iinfo(x_dt)
    c, oc = c_per_group * groups, oc * groups
    x = r.integers(xi.min, xi.max + 1, (n, c, h, w)).astype(x_dt)
    wt = r.integers(-127, 128, (oc, c_per_group, k, k)).astype(np.int8)
    x_zp = np.asarray(r.integers(xi.min, xi.max + 1), x_dt)
    geo = {"stride": [stride] * 2, "pads": [pad] * 4, "dilation": [1, 1]}
    want = ops.qconv(x, x_zp, wt, None, np.float32(1.0), None, groups=groups, device="ref", **geo)
    packed = oq.prepack_conv(wt, None, groups)
    for path in _library.available_paths():
        for threads in (1, 2):
            got = oq.qconv2d(x, packed, x_zp, np.float32(1.0), None, path=path, threads=threads, **geo)
            np.testing.assert_array_equal(got, want, err_msg=f"{path} threads={threads}")


def test_threads_split_over_ops_pool_or_their_own_threads_with_the_same_bits() -> None:
    """With ops' worker pool handed over (opstrata-ops >= 0.4.59) the jobs run on its workers; without it
    on threads started per call -- the same bits either way, and as one thread."""
    lib = _library.library()
    r = np.random.default_rng(4)
    x = r.integers(0, 256, (8, 32, 32, 32)).astype(np.uint8)  # enough work for two threads on both
    wt = r.integers(-128, 128, (48, 32, 3, 3)).astype(np.int8)
    dw = r.integers(-128, 128, (32, 1, 3, 3)).astype(np.int8)
    geo = {"stride": [1, 1], "pads": [1, 1, 1, 1], "dilation": [1, 1]}
    cases = [(oq.prepack_conv(wt, None, 1), np.full(48, 0.01, np.float32)),
             (oq.prepack_conv(dw, None, 32), np.full(32, 0.01, np.float32))]  # fmt: skip
    want = [oq.qconv2d(x, p, np.uint8(7), s, None, threads=1, **geo) for p, s in cases]
    try:
        for pool in ("ops", "own threads"):
            if pool != "ops":
                lib.opstrata_qgemm_set_pool(None)
            for (p, s), w in zip(cases, want, strict=True):
                np.testing.assert_array_equal(
                    oq.qconv2d(x, p, np.uint8(7), s, None, threads=2, **geo), w, err_msg=pool
                )
    finally:
        _library._share_pool(lib)
