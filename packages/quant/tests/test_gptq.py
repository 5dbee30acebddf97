"""GPTQ: error-compensating rounding of MatMul/Gemm weights, against round-to-nearest on the same layers."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from _quant_models import cosine, feeds, mlp, run_opstrata, run_ort
from hypothesis import given, settings, strategies as st

from opstrata.quant import CalibrationError, QuantError, quantize, quantize_weights
from opstrata.quant._gptq import HessianObserver, gptq_quantize, layer_sqnr_db
from opstrata.quant._qparams import params_from_range


def _rtn(w_t: np.ndarray, group: int, dtype: str = "int4") -> np.ndarray:
    """Round-to-nearest of ``w_t`` [N, K] with the same scales GPTQ starts from (dequantized)."""
    n, k = w_t.shape
    g = group or k
    blocks = w_t.astype(np.float64).reshape(n, k // g, g)
    p = params_from_range(blocks.min(2), blocks.max(2), dtype, symmetric=True)
    s = p.scale.astype(np.float64)[:, :, None]
    lim = p.qtype
    return (np.clip(np.rint(blocks / s), lim.qmin, lim.qmax) * s).reshape(n, k)


def _correlated(seed: int, m: int, k: int) -> np.ndarray:
    """Activations whose channels are mixed and of very different scales (as real layer inputs are)."""
    r = np.random.default_rng(seed)
    mix = r.standard_normal((k, k)) * (r.random(k) ** 3)[None, :]
    return r.standard_normal((m, k)) @ mix


@settings(max_examples=8, deadline=None)
@given(
    seed=st.integers(0, 10_000), group=st.sampled_from([0, 16, 32]), dtype=st.sampled_from(["int4", "int8"])
)
def test_gptq_beats_round_to_nearest_on_the_layer_output(seed: int, group: int, dtype: str) -> None:
    k, n = 64, 48
    x = _correlated(seed, 512, k)
    w = (np.random.default_rng(seed + 1).standard_normal((k, n)) * 0.1).astype(np.float32)
    obs = HessianObserver(k)
    obs.observe(x[:200])
    obs.observe(x[200:])  # batches accumulate
    want = 2 * x.T @ x / len(x)
    np.testing.assert_allclose(obs.hessian(), want, rtol=1e-9, atol=1e-12 * float(np.abs(want).max()))
    r = gptq_quantize(w.T, obs.hessian(), dtype=dtype, group_size=group)
    gptq_db = layer_sqnr_db(x, w, r.dequantized.T)
    rtn_db = layer_sqnr_db(x, w, _rtn(w.T, group, dtype).T)
    assert gptq_db > rtn_db + 0.5, (gptq_db, rtn_db)
    # the result is a valid quantization: integers in range, dequantized exactly from q, scale, zero point
    assert r.q.dtype.name == dtype
    rep = k // r.scale.shape[1]
    deq = (r.q.astype(np.float64) - r.zero_point.astype(np.float64).repeat(rep, 1)) * r.scale.repeat(rep, 1)
    np.testing.assert_allclose(r.dequantized, deq, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("group", [0, 16])
def test_with_uncorrelated_inputs_gptq_is_round_to_nearest(group: int) -> None:
    """A diagonal Hessian leaves no other channel to absorb an error: GPTQ must round exactly as RTN."""
    w = np.random.default_rng(3).standard_normal((8, 32)).astype(np.float32)
    r = gptq_quantize(w, 2.0 * np.eye(32), dtype="int4", group_size=group)
    np.testing.assert_allclose(r.dequantized, _rtn(w, group), rtol=1e-6, atol=1e-7)


def test_dead_channels_and_errors() -> None:
    w = np.ones((4, 8), np.float32)
    h = np.eye(8)
    h[3, 3] = 0.0  # channel 3 never active
    r = gptq_quantize(w, h, group_size=0)
    assert np.all(r.dequantized[:, 3] == 0)
    with pytest.raises(QuantError, match="does not fit a weight with 8 input channels"):
        gptq_quantize(w, np.eye(7))
    with pytest.raises(QuantError, match="group_size 3 does not divide the 8 input channels"):
        gptq_quantize(w, h, group_size=3)
    with pytest.raises(QuantError, match="no activations were observed"):
        HessianObserver(8).hessian()


def _layer_inputs(m: onnx.ModelProto, data: list[dict]) -> dict[str, np.ndarray]:
    ext = onnx.ModelProto()
    ext.CopyFrom(m)
    for name in ("a1", "a2"):
        ext.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    _, a1, a2 = run_opstrata(ext, data)
    x = np.concatenate([d["x"] for d in data])
    return {"fc1": x, "fc2": a1, "fc3": a2}


def _dequantized(q: onnx.ModelProto, data: list[dict]) -> dict[str, np.ndarray]:
    """The weights each MatMul/Gemm reads in the quantized model (DequantizeLinear outputs)."""
    readers = {n.input[1]: n.name for n in q.graph.node if n.op_type in ("MatMul", "Gemm")}
    names = [n.output[0] for n in q.graph.node if n.op_type == "DequantizeLinear" and n.output[0] in readers]
    ext = onnx.ModelProto()
    ext.CopyFrom(q)
    for name in names:
        ext.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    values = run_opstrata(ext, data[:1])[1:]
    return {readers[n]: v for n, v in zip(names, values, strict=True)}


def test_quantize_weights_gptq_improves_every_layer_and_runs_in_onnxruntime() -> None:
    m = mlp()
    calib, ev = feeds((64, 64), 8, seed=10), feeds((8, 64), 4, seed=20)
    rtn = quantize_weights(m, bits=4, group_size=32)
    gq = quantize_weights(m, bits=4, group_size=32, method="gptq", calibration_data=calib)
    assert {p.key: p.value for p in gq.metadata_props}["opstrata.quant.scheme"] == "w4-g32-gptq"
    floats = {t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer}
    weights = {"fc1": floats["w1"], "fc2": floats["w2"], "fc3": floats["w3"].T}  # as [K, N]
    inputs = _layer_inputs(m, calib)  # GPTQ's objective: each layer's output on the calibration inputs
    ours, theirs = _dequantized(gq, ev), _dequantized(rtn, ev)
    for layer, w in weights.items():
        fix = (lambda a: a.T) if layer == "fc3" else (lambda a: a)  # Gemm transB stores [N, K]
        g_db = layer_sqnr_db(inputs[layer], w, fix(ours[layer]))
        r_db = layer_sqnr_db(inputs[layer], w, fix(theirs[layer]))
        assert g_db > r_db, (layer, g_db, r_db)
    base = run_opstrata(m, ev)[0]
    assert cosine(run_opstrata(gq, ev)[0], base) > cosine(run_opstrata(rtn, ev)[0], base) - 1e-4
    np.testing.assert_allclose(run_ort(gq, ev)[0], run_opstrata(gq, ev)[0], rtol=1e-4, atol=1e-4)


def test_quantize_scheme_w4_gptq_needs_calibration_and_reports() -> None:
    m = mlp()
    calib = feeds((16, 64), 6, seed=11)
    qm = quantize(m, calib, "w4-g32-gptq")
    assert qm.report.scheme == "w4-g32-gptq" and len(qm.report.quantized) == 3
    assert qm.report.min_cosine > 0.98
    with pytest.raises(CalibrationError, match="static"):
        quantize(m, None, "w4-g32-gptq")


def test_gptq_bad_input() -> None:
    m = mlp()
    with pytest.raises(CalibrationError, match="GPTQ needs calibration_data"):
        quantize_weights(m, bits=4, method="gptq")
    with pytest.raises(QuantError, match="unknown method 'optq'"):
        quantize_weights(m, bits=4, method="optq")
    with pytest.raises(QuantError, match=r"damp must be in \(0, 1\)"):
        quantize_weights(m, bits=4, method="gptq", damp=0.0, calibration_data=feeds((4, 64), 1, seed=0))
