"""calibrate(): one pass through opstrata's runtime collecting every quantizable activation, checked
against the same statistics computed from numpy; calibration data errors."""

from __future__ import annotations

import numpy as np
import pytest
from _quant_models import convnet, feeds, mlp

from opstrata.quant import CalibrationError, QuantError, calibrate


def _np_mlp(m, x: np.ndarray) -> dict[str, np.ndarray]:
    from onnx import numpy_helper as nh

    w = {t.name: nh.to_array(t) for t in m.graph.initializer}
    a1 = np.maximum(x @ w["w1"] + w["b1"], 0)
    a2 = np.maximum(a1 @ w["w2"], 0)
    return {"x": x, "a1": a1, "a2": a2}


def test_minmax_calibration_matches_numpy_statistics() -> None:
    m, data = mlp(), feeds((8, 64), 5, seed=1)
    params = calibrate(m, data)
    assert list(params) == ["x", "a1", "a2"]  # MatMul/Gemm activation inputs, graph order
    vals = [_np_mlp(m, d["x"]) for d in data]
    for name, p in params.items():
        allv = np.concatenate([v[name].ravel() for v in vals])
        lo, hi = min(allv.min(), 0), max(allv.max(), 0)
        assert float(p.scale) == pytest.approx((hi - lo) / 255, rel=1e-5), name
        assert int(p.zero_point) == int(np.clip(np.rint(-lo / ((hi - lo) / 255)), 0, 255)), name


def test_conv_calibration_options() -> None:
    params = calibrate(convnet(), feeds((2, 3, 16, 16), 3, seed=2), observer="percentile", dtype="int8",
                       symmetric=True, percentile=99.9)  # fmt: skip
    assert list(params) == ["x", "r1", "f"]
    assert all(p.dtype == np.int8 and int(p.zero_point) == 0 for p in params.values())
    only = calibrate(convnet(), feeds((2, 3, 16, 16), 2, seed=2), tensors=["r2"], op_types=("Conv",))
    assert list(only) == ["r2"]


def test_generator_data_and_progress_bar(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("tqdm")
    gen = (d for d in feeds((4, 64), 3, seed=3))
    params = calibrate(mlp(), gen, progress=True)
    assert set(params) == {"x", "a1", "a2"}
    assert "calibrate" in capsys.readouterr().err


def test_missing_input_names_it_and_the_fix() -> None:
    with pytest.raises(
        CalibrationError, match=r"batch 0 has no value for model input\(s\) \['x'\].*Fix: add 'x'"
    ):
        calibrate(mlp(), [{"input": np.zeros((2, 64), np.float32)}])


def test_bad_calibration_data() -> None:
    with pytest.raises(CalibrationError, match=r"feeds \['z'\], which are not inputs"):
        calibrate(mlp(), [{"x": np.zeros((2, 64), np.float32), "z": np.zeros(1)}])
    with pytest.raises(CalibrationError, match="empty"):
        calibrate(mlp(), [])
    with pytest.raises(CalibrationError, match="batch 0 is a ndarray"):
        calibrate(mlp(), [np.zeros((2, 64), np.float32)])
    with pytest.raises(CalibrationError, match="iterable of feed dicts"):
        calibrate(mlp(), 3)
    with pytest.raises(QuantError, match="tensor 'nope' is not a value"):
        calibrate(mlp(), feeds((2, 64), 1, 0), tensors=["nope"])
    with pytest.raises(QuantError, match="unknown observer 'histogram'"):
        calibrate(mlp(), feeds((2, 64), 1, 0), observer="histogram")
    with pytest.raises(QuantError, match="no such file"):
        calibrate("/nonexistent/model.onnx", [])


def test_model_argument_forms(tmp_path) -> None:
    m, data = mlp(), feeds((2, 64), 1, 0)
    path = tmp_path / "mlp.onnx"
    path.write_bytes(m.SerializeToString())
    assert set(calibrate(str(path), data)) == set(calibrate(m.SerializeToString(), data)) == {"x", "a1", "a2"}
    with pytest.raises(QuantError, match="the bytes are not an ONNX model"):
        calibrate(b"not a model", data)
    with pytest.raises(QuantError, match=r"expected a path, bytes or onnx\.ModelProto, got int"):
        calibrate(3, data)
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00garbage")
    with pytest.raises(QuantError, match="is not a readable ONNX model"):
        calibrate(bad, data)
