"""The native QConvQuantize: the int8 convolution, an activation and QuantizeLinear as one call, with the
bytes of ops' reference (qconv -> Relu / HardSwish -> quantize_linear), eager, bound and in a session."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
from _native import needs_native
from hypothesis import given, settings, strategies as st

import opstrata.ops as ops
import opstrata.quant as oq

pytestmark = [
    needs_native,
    pytest.mark.skipif(
        not hasattr(ops, "qconv_quantize"), reason="opstrata-ops without qconv_quantize (< 0.4.64)"
    ),
]


def _operands(
    seed: int, *, depthwise: bool, out_dt: Any, k: int = 3, c: int = 8, hw: int = 9
) -> dict[str, Any]:
    r = np.random.default_rng(seed)
    groups = c if depthwise else 1
    oc = c if depthwise else 2 * c
    zp = 128 if out_dt == np.uint8 else -7
    return {
        "x": r.integers(0, 256, (2, c, hw, hw)).astype(np.uint8), "x_zp": np.array(r.integers(0, 256), np.uint8),
        "w": r.integers(-128, 128, (oc, c // groups, k, k)).astype(np.int8), "w_zp": np.zeros(oc, np.int8),
        "scale": r.uniform(2e-4, 2e-3, oc).astype(np.float32), "bias": r.standard_normal(oc).astype(np.float32),
        "y_scale": np.array(0.03, np.float32), "y_zp": np.array(zp, out_dt), "groups": groups,
    }  # fmt: skip


def _act_kw(activation: str) -> dict[str, Any]:
    """The activation and its parameters (clip: a band narrow enough that both bounds bite)."""
    return {"activation": activation, **({"alpha": -0.5, "beta": 1.5} if activation == "clip" else {})}


def _call(o: dict[str, Any], activation: str, geo: dict[str, Any], **kw: Any) -> np.ndarray:
    kw = {**_act_kw(activation), **kw}
    return ops.qconv_quantize(o["x"], o["x_zp"], o["w"], o["w_zp"], o["scale"], o["bias"], o["y_scale"], o["y_zp"],
                              groups=o["groups"], **geo, **kw)  # fmt: skip


@settings(max_examples=30, deadline=None)
@given(
    depthwise=st.booleans(), activation=st.sampled_from(["none", "relu", "hardswish", "clip"]),
    out_dt=st.sampled_from([np.uint8, np.int8]), k=st.sampled_from([1, 3, 5]), stride=st.integers(1, 2),
    y_scale=st.floats(0.002, 0.5), threads=st.sampled_from([1, 2]), seed=st.integers(0, 2**16),
)  # fmt: skip
def test_native_qconv_quantize_gives_the_reference_bytes(
    depthwise, activation, out_dt, k, stride, y_scale, threads, seed
) -> None:
    """Eager calls (the native convolution, then the threaded C activation + quantization) against ops'
    reference; a quarter of the float results are moved onto rounding ties of y_scale."""
    o = _operands(seed, depthwise=depthwise, out_dt=out_dt, k=k, hw=12)
    o["y_scale"] = np.array(y_scale, np.float32)
    geo = {"stride": [stride, stride], "pads": [k // 2] * 4}
    y = ops.qconv(o["x"], o["x_zp"], o["w"], o["w_zp"], o["scale"], None, groups=o["groups"], **geo)
    # biases that put channel 0's first outputs on half-integers of y_scale (ties of the rounding)
    o["bias"][0] = np.float32((np.rint(y[0, 0, 0, 0] / y_scale) + 0.5) * y_scale - y[0, 0, 0, 0])
    want = _call(o, activation, geo, device="ref")
    before = oq.get_qgemm_threads()
    oq.set_qgemm_threads(threads)
    try:
        oq.reset_native_stats()
        got = _call(o, activation, geo)
    finally:
        oq.set_qgemm_threads(before)
    assert got.dtype == np.dtype(out_dt)
    np.testing.assert_array_equal(got, want)
    assert oq.native_status().calls["qconv_quantize"] == {"native": 1, "numpy": 0}


def test_large_outputs_split_over_threads_with_the_same_bytes() -> None:
    """An output past the requantization's threading threshold (128K values per thread: 2 x 32 x 64 x 64)
    on 1, 2 and 3 threads: same bytes."""
    o = _operands(3, depthwise=False, out_dt=np.uint8, c=16, hw=64)
    geo = {"stride": [1, 1], "pads": [1, 1, 1, 1]}
    want = _call(o, "hardswish", geo, device="ref")
    before = oq.get_qgemm_threads()
    try:
        for t in (1, 2, 3):
            oq.set_qgemm_threads(t)
            np.testing.assert_array_equal(_call(o, "hardswish", geo), want, err_msg=f"{t} threads")
    finally:
        oq.set_qgemm_threads(before)


def test_what_the_native_kernel_does_not_cover_goes_to_ops_kernel() -> None:
    """A NaN output scale, a 1-D convolution: ops' kernel (counted as numpy), same result as the reference."""
    o = _operands(4, depthwise=False, out_dt=np.uint8)
    geo = {"stride": [1, 1], "pads": [1, 1, 1, 1]}
    o["y_scale"] = np.array(np.nan, np.float32)
    oq.reset_native_stats()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = _call(o, "relu", geo)
        np.testing.assert_array_equal(got, _call(o, "relu", geo, device="ref"))
    assert not got.any()  # NaN codes are 0
    x1 = o["x"][:, :, 0]
    w1 = o["w"][:, :, 0]
    got1 = ops.qconv_quantize(x1, o["x_zp"], w1, o["w_zp"], o["scale"], o["bias"], np.float32(0.03), o["y_zp"],
                              pads=[1, 1])  # fmt: skip
    want1 = ops.qconv_quantize(x1, o["x_zp"], w1, o["w_zp"], o["scale"], o["bias"], np.float32(0.03), o["y_zp"],
                               pads=[1, 1], device="ref")  # fmt: skip
    np.testing.assert_array_equal(got1, want1)
    assert oq.native_status().calls["qconv_quantize"] == {"native": 0, "numpy": 2}


@pytest.mark.skipif(not hasattr(ops, "foreign_call"), reason="opstrata-ops without foreign calls")
@pytest.mark.parametrize("depthwise", [False, True])
@pytest.mark.parametrize("activation", ["none", "relu", "hardswish", "clip"])
def test_bound_call_is_one_native_call_reading_scale_and_zero_points_when_it_runs(
    depthwise, activation
) -> None:
    """A session's read-only weight: ops.bind gives one packed C call (the convolution into a per-thread
    scratch, then the requantization), merged into ops' native batch; the activation zero point, output
    scale and output zero point are read when it runs (a NaN scale: every code 0)."""
    o = _operands(7, depthwise=depthwise, out_dt=np.uint8)
    o["w"].flags.writeable = o["w_zp"].flags.writeable = False
    geo = {"stride": [2, 2], "pads": [1, 1, 1, 1], "dilation": [1, 1]}
    out = np.empty((2, o["w"].shape[0], 5, 5), np.uint8)
    call = ops.bind("qconv_quantize", o["x"], o["x_zp"], o["w"], o["w_zp"], o["scale"], o["bias"], o["y_scale"],
                    o["y_zp"], **_act_kw(activation), groups=o["groups"], out=out, **geo)  # fmt: skip
    assert isinstance(call, ops.NativeCall) and call.name == "opstrata_qconv_quantize_packed"
    copy = ops.bind("relu", np.zeros(4, np.float32), out=np.empty(4, np.float32))
    runner, owners = ops.merge_bound_calls([call, copy])
    assert len(runner) == 1 and isinstance(runner[0], ops.NativeBatch) and owners == [[0, 1]]
    for zx, ys, yz in ((3, 0.03, 128), (200, 0.004, 0), (9, float("nan"), 77)):
        o["x_zp"][...], o["y_scale"][...], o["y_zp"][...] = zx, ys, yz
        out[...] = 1
        runner[0]()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            np.testing.assert_array_equal(
                out, _call(o, activation, geo, device="ref"), err_msg=str((zx, ys, yz))
            )


@pytest.mark.parametrize("bound", [False, True])
@pytest.mark.parametrize("activation", ["none", "relu", "hardswish", "clip"])
def test_residual_is_added_before_the_activation_eager_and_bound(bound, activation) -> None:
    """``residual=``: act(conv + r) quantized, the reference's bytes, eager and as the bound native call
    (r read when it runs); a residual of another shape goes to ops' kernel, which names it."""
    o = _operands(12, depthwise=False, out_dt=np.uint8, c=16, hw=33)
    geo = {"stride": [1, 1], "pads": [1, 1, 1, 1], "dilation": [1, 1]}
    res = np.random.default_rng(1).standard_normal((2, 32, 33, 33)).astype(np.float32)
    want = _call(o, activation, geo, residual=res, device="ref")
    if bound:
        o["w"].flags.writeable = o["w_zp"].flags.writeable = False
        out = np.empty(want.shape, np.uint8)
        call = ops.bind("qconv_quantize", o["x"], o["x_zp"], o["w"], o["w_zp"], o["scale"], o["bias"], o["y_scale"],
                        o["y_zp"], **_act_kw(activation), residual=res, groups=1, out=out, **geo)  # fmt: skip
        assert isinstance(call, ops.NativeCall)
        call()
        np.testing.assert_array_equal(out, want)
        res += 1.0  # read when the call runs
        call()
        np.testing.assert_array_equal(out, _call(o, activation, geo, residual=res, device="ref"))
    else:
        np.testing.assert_array_equal(_call(o, activation, geo, residual=res), want)
        with pytest.raises(ops.OpError, match=r"qconv_quantize.*residual"):
            _call(o, activation, geo, residual=res[:, :, :3])


@pytest.mark.skipif(not hasattr(ops, "foreign_call"), reason="opstrata-ops without foreign calls")
@pytest.mark.parametrize("groups", [1, 2])
def test_bound_call_on_every_code_path(groups, monkeypatch) -> None:
    """The bound call on each code path this CPU runs ($OPSTRATA_QGEMM_PATH), grouped or not, with a
    residual, hardswish and int8 codes: the reference's bytes on every path."""
    from opstrata.quant.native import _library

    o = _operands(21, depthwise=False, out_dt=np.int8, c=8, hw=11)
    o["w"] = o["w"][:, : 8 // groups].copy()  # an array of its own: a view of a writeable one is not frozen
    o["groups"] = groups
    o["w"].flags.writeable = o["w_zp"].flags.writeable = False
    geo = {"stride": [1, 1], "pads": [1, 1, 1, 1], "dilation": [1, 1]}
    res = np.random.default_rng(2).standard_normal((2, 16, 11, 11)).astype(np.float32)
    want = _call(o, "hardswish", geo, residual=res, device="ref")
    for path in _library.available_paths():
        monkeypatch.setenv(_library.ENV_PATH, path)
        out = np.empty(want.shape, np.int8)
        call = ops.bind("qconv_quantize", o["x"], o["x_zp"], o["w"], o["w_zp"], o["scale"], o["bias"], o["y_scale"],
                        o["y_zp"], activation="hardswish", residual=res, groups=groups, out=out, **geo)  # fmt: skip
        assert isinstance(call, ops.NativeCall)
        call()
        np.testing.assert_array_equal(out, want, err_msg=path)


def test_writeable_weight_is_not_bound_natively() -> None:
    """A weight that may change between runs keeps the eager kernel (its checks and packing each call)."""
    o = _operands(8, depthwise=False, out_dt=np.int8)
    geo = {"stride": [1, 1], "pads": [1, 1, 1, 1], "dilation": [1, 1]}
    out = np.empty((2, 16, 9, 9), np.int8)
    call = ops.bind("qconv_quantize", o["x"], o["x_zp"], o["w"], o["w_zp"], o["scale"], o["bias"], o["y_scale"],
                    o["y_zp"], activation="relu", groups=1, out=out, **geo)  # fmt: skip
    assert not isinstance(call, ops.NativeCall)
    assert call() is out
    np.testing.assert_array_equal(out, _call(o, "relu", geo, device="ref"))


def test_quantized_mobile_cnn_session_runs_fused_convs_with_the_unfused_bytes(monkeypatch) -> None:
    """quantize(..., "w8a8") of the MobileNet idioms (Conv + HardSwish, depthwise + Clip, squeeze-excite,
    residual): the session fuses Conv -> act -> QuantizeLinear into QConvQuantize and gives the same output
    as the same session without that fusion, at one and two threads."""
    import opstrata.runtime as rt

    try:
        from opstrata.graph.passes import fuse_qdq
    except ImportError:
        pytest.skip("opstrata-graph without the pass module")
    if not hasattr(fuse_qdq, "fuse_qconv_quantize"):
        pytest.skip("opstrata-graph without fuse_qconv_quantize (< 0.4.24)")
    from opstrata.graph.testing import mobile_cnn_model

    r = np.random.default_rng(0)
    feeds = [{"x": r.standard_normal((2, 3, 16, 16)).astype(np.float32)} for _ in range(3)]
    qm = oq.quantize(mobile_cnn_model(), feeds, "w8a8")
    # intra-op threads: opstrata-runtime >= 0.5.27 (older ones: their default options only)
    threaded = "intra_op_num_threads" in getattr(rt.SessionOptions, "__dataclass_fields__", {})
    for threads in (1, 2) if threaded else (None,):
        opts = rt.SessionOptions(intra_op_num_threads=threads) if threads else rt.SessionOptions()
        fused = rt.InferenceSession(qm.model, opts)
        n_fused = fused.plan.graph.op_counts().get("ai.opstrata::QConvQuantize", 0)
        assert n_fused >= 2  # Conv + HardSwish and the depthwise Conv + Clip(0, 6) at least
        with monkeypatch.context() as mp:
            mp.setattr(fuse_qdq, "fuse_qconv_quantize", lambda g: g.copy())
            plain = rt.InferenceSession(qm.model, opts)
        assert "ai.opstrata::QConvQuantize" not in plain.plan.graph.op_counts()
        for f in feeds:
            for _ in range(2):  # the first run, then the bound steady state
                np.testing.assert_array_equal(fused.run(None, f)[0], plain.run(None, f)[0])
