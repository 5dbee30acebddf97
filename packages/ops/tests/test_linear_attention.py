"""linear_attention and roi_align against the ONNX reference evaluator (onnx.reference), plus error paths."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import opstrata.ops as ops
from opstrata.ops import OpError

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

# the reference accumulates LinearAttention in float32 whatever the input dtype, so float64 compares at
# float32 tolerance (test_linear_attention_linear_rule_is_causal_sum checks float64 to 1e-12)
_TOL = {np.float16: (2e-2, 2e-2), np.float32: (1e-4, 1e-5), np.float64: (1e-5, 1e-6)}
_ELEM = {np.float16: TensorProto.FLOAT16, np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE}


def _reference(
    op: str, opset: int, inputs: dict[str, np.ndarray | None], n_out: int, **attrs: object
) -> list:
    """Run one ONNX node on onnx's reference evaluator (``None`` inputs are omitted)."""
    names = [k if v is not None else "" for k, v in inputs.items()]
    while names and not names[-1]:
        names.pop()
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, **attrs)
    feeds = {k: v for k, v in inputs.items() if v is not None}
    g = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in feeds.items()],
        [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outs],
    )  # fmt: skip
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    return ReferenceEvaluator(model).run(None, feeds)


def _la_inputs(rng, b, t, hq, hkv, dk, dv, rule, dtype, past, per_head_decay, scalar_beta):
    q = rng.standard_normal((b, t, hq * dk)).astype(dtype)
    k = (rng.standard_normal((b, t, hkv * dk)) / np.sqrt(dk)).astype(dtype)
    v = rng.standard_normal((b, t, hkv * dv)).astype(dtype)
    st_ = rng.standard_normal((b, hkv, dk, dv)).astype(dtype) if past else None
    decay = beta = None
    if rule in ("gated", "gated_delta"):
        decay = -rng.random((b, t, hkv if per_head_decay else hkv * dk)).astype(dtype)
    if rule in ("delta", "gated_delta"):
        beta = rng.random((b, t, 1 if scalar_beta else hkv)).astype(dtype)
    return {"query": q, "key": k, "value": v, "past_state": st_, "decay": decay, "beta": beta}


@settings(max_examples=30, deadline=None)
@given(
    rule=st.sampled_from(["linear", "gated", "delta", "gated_delta"]),
    dtype=st.sampled_from([np.float32, np.float64, np.float16]),
    b=st.integers(1, 2), t=st.integers(1, 5), hkv=st.integers(1, 3), group=st.integers(1, 2),
    dk=st.integers(1, 4), dv=st.integers(1, 4), past=st.booleans(), per_head=st.booleans(),
    scalar_beta=st.booleans(), scale=st.sampled_from([0.0, 0.5]), seed=st.integers(0, 2**16),
)  # fmt: skip
def test_linear_attention_matches_reference(
    rule, dtype, b, t, hkv, group, dk, dv, past, per_head, scalar_beta, scale, seed
):
    rng = np.random.default_rng(seed)
    hq = hkv * group
    feeds = _la_inputs(rng, b, t, hq, hkv, dk, dv, rule, dtype, past, per_head, scalar_beta)
    y, s = ops.linear_attention(
        *feeds.values(), q_num_heads=hq, kv_num_heads=hkv, update_rule=rule, scale=scale
    )
    ry, rs = _reference(
        "LinearAttention", 27, feeds, 2, q_num_heads=hq, kv_num_heads=hkv, update_rule=rule, scale=scale
    )
    rtol, atol = _TOL[dtype]
    assert y.dtype == dtype and y.shape == ry.shape and s.shape == rs.shape
    np.testing.assert_allclose(y.astype(np.float64), ry.astype(np.float64), rtol=rtol, atol=atol)
    np.testing.assert_allclose(s.astype(np.float64), rs.astype(np.float64), rtol=rtol, atol=atol)


def test_linear_attention_linear_rule_is_causal_sum():
    """Linear rule, scale 1: o_t = q_t . sum_{s<=t} k_s v_s^T (a hand-checkable identity)."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 4, 3)) for _ in range(3))
    y, s = ops.linear_attention(q, k, v, q_num_heads=1, kv_num_heads=1, update_rule="linear", scale=1.0)
    scores = np.tril(q[0] @ k[0].T)
    np.testing.assert_allclose(y[0], scores @ v[0], rtol=1e-12)
    np.testing.assert_allclose(s[0, 0], k[0].T @ v[0], rtol=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "arg"),
    [
        ({"update_rule": "bogus"}, "update_rule"),
        ({"q_num_heads": 3, "kv_num_heads": 2}, "q_num_heads"),
        ({"update_rule": "gated"}, "decay"),
        ({"update_rule": "linear", "beta": np.ones((1, 2, 1), np.float32)}, "beta"),
        ({"update_rule": "linear", "past_state": np.zeros((1, 1, 3, 3), np.float32)}, "past_state"),
    ],
)
def test_linear_attention_errors_name_argument(kwargs, arg):
    x = np.ones((1, 2, 4), np.float32)
    kw = {"q_num_heads": 1, "kv_num_heads": 1, **kwargs}
    with pytest.raises(OpError, match=f"linear_attention: argument '{arg}'"):
        ops.linear_attention(x, x, x, **kw)


def test_linear_attention_rejects_int_inputs():
    x = np.ones((1, 2, 4), np.int32)
    with pytest.raises(OpError, match="query"):
        ops.linear_attention(x, x, x, q_num_heads=1, kv_num_heads=1, update_rule="linear")


# ----------------------------------------------------------------------------------------- roi_align


@settings(max_examples=30, deadline=None)
@given(
    mode=st.sampled_from(["avg", "max"]), half=st.booleans(), ratio=st.integers(0, 3),
    oh=st.integers(1, 4), ow=st.integers(1, 4), scale=st.sampled_from([1.0, 0.5, 0.25]),
    dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**16),
)  # fmt: skip
def test_roi_align_matches_reference(mode, half, ratio, oh, ow, scale, dtype, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 3, 7, 9)).astype(dtype)
    lo = rng.uniform(-3, 12, (4, 2))
    rois = np.concatenate([lo, lo + rng.uniform(0, 10, (4, 2))], axis=1)[:, [0, 1, 2, 3]].astype(dtype)
    idx = rng.integers(0, 2, 4).astype(np.int64)
    ctm = "half_pixel" if half else "output_half_pixel"
    got = ops.roi_align(
        x, rois, idx, output_height=oh, output_width=ow, sampling_ratio=ratio, spatial_scale=scale, mode=mode,
        half_pixel=half,
    )  # fmt: skip
    (want,) = _reference(
        "RoiAlign", 16, {"X": x, "rois": rois, "batch_indices": idx}, 1, output_height=oh, output_width=ow,
        sampling_ratio=ratio, spatial_scale=scale, mode=mode, coordinate_transformation_mode=ctm,
    )  # fmt: skip
    rtol, atol = _TOL[dtype]
    assert got.dtype == dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize(
    ("args", "kwargs", "arg"),
    [
        (((2, 2, 4, 4), (1, 4), [0]), {"mode": "sum"}, "mode"),
        (((2, 2, 4), (1, 4), [0]), {}, "x"),
        (((2, 2, 4, 4), (1, 5), [0]), {}, "rois"),
        (((2, 2, 4, 4), (1, 4), [2]), {}, "batch_indices"),
        (((2, 2, 4, 4), (1, 4), [0]), {"output_height": 0}, "output_height"),
    ],
)
def test_roi_align_errors_name_argument(args, kwargs, arg):
    xs, rs, idx = args
    with pytest.raises(OpError, match=f"roi_align: argument '{arg}'"):
        ops.roi_align(np.zeros(xs, np.float32), np.zeros(rs, np.float32), np.array(idx), **kwargs)


def test_roi_align_rejects_int_input():
    with pytest.raises(OpError, match="roi_align: argument 'x'"):
        ops.roi_align(np.zeros((1, 1, 2, 2), np.int32), np.zeros((1, 4), np.float32), np.array([0]))
