"""`opstrata conformance ops`: the cpu device agrees with ref; a deliberately wrong kernel deviates."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest

import opstrata.ops as ops
from opstrata.eval import _cli, conformance_ops


@pytest.fixture
def wrong_relu() -> Iterator[object]:
    """A float32 relu on cpu that is 1% off, registered above the real one for the test's duration."""

    def bad(x: np.ndarray) -> np.ndarray:
        return np.maximum(x, x.dtype.type(0)) * x.dtype.type(1.01)

    ops.register("relu", device="cpu", dtypes=[np.float32], priority=100)(bad)
    try:
        yield bad
    finally:
        ops.unregister("relu", device="cpu", kernel=bad)


def test_a_wrong_kernel_deviates_with_a_reproducer(wrong_relu, tmp_path) -> None:
    report = conformance_ops("cpu", op_names=["relu"], dtypes=["float32", "float64"], out_dir=tmp_path)
    bad, good = report.cells[("relu", "float32")], report.cells[("relu", "float64")]
    assert bad.status == "deviates" and good.status == "native"
    assert bad.max_error == pytest.approx(0.01, rel=1e-3) and "outside float32 tolerance" in bad.detail
    data = np.load(bad.repro)
    assert list(data["meta"]) == ["relu", "cpu", "ref", bad.detail.split(":")[0]]
    with ops.device("cpu"):  # the file reproduces the deviation
        again = ops.relu(data["arg0"])
    np.testing.assert_array_equal(again, data["actual0"])
    assert not np.allclose(again, data["expected0"])


def test_cli_matrix_exit_1_on_a_deviation(wrong_relu, tmp_path, capsys) -> None:
    code = _cli.main(
        ["conformance", "ops", "--ops", "relu,abs", "--dtypes", "float32,int8", "--out", str(tmp_path)]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "relu  DEV" in out and "abs   ok" in out
    assert "DEVIATES relu float32" in out and str(tmp_path) in out


def test_cpu_agrees_with_ref_on_common_ops(tmp_path, capsys) -> None:
    names = ["abs", "add", "matmul", "softmax", "exp", "sum", "transpose", "gelu"]
    report = conformance_ops("cpu", op_names=names, out_dir=tmp_path)
    assert not report.deviations, report.deviations
    assert report.cells[("matmul", "float32")].status == "native"
    assert report.cells[("matmul", "float32")].variants >= 4  # normal, size-1, empty, broadcast, nan/inf, ...
    assert report.cells[("exp", "int32")].status == "missing"
    code = _cli.main(
        ["conformance", "ops", "--ops", ",".join(names), "--format", "json", "--out", str(tmp_path)]
    )
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["ops"]["add"]["bfloat16"]["status"] == "native"
    assert not list(tmp_path.iterdir())  # no deviation, no reproducer


def test_ops_without_a_generated_sample_are_listed_not_judged() -> None:
    cell = conformance_ops("cpu", op_names=["where"], dtypes=["float32"]).cells[("where", "float32")]
    assert cell.status == "no-sample" and "3 required tensor arguments" in cell.detail


def test_bad_input(capsys) -> None:
    with pytest.raises(ValueError, match=r"unknown op\(s\) \['nope'\]"):
        conformance_ops("cpu", op_names=["nope"])
    with pytest.raises(ValueError, match="unknown device 'tpu'; registered devices are"):
        conformance_ops("tpu")
    assert _cli.main(["conformance", "ops", "--dtypes", "float33"]) == 2
    assert "unknown dtype 'float33'" in capsys.readouterr().err


def test_onnx_backend_node_tests_through_the_runtimes_runner(capsys) -> None:
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    assert _cli.main(["conformance", "onnx", "--ops", "Relu", "--against", "onnxruntime"]) == 0
    out = capsys.readouterr().out
    assert "| Relu | 2 | 2 | 2 | 2 | 2/2 |" in out and "wrong answers: 0" in out
    assert _cli.main(["conformance", "onnx", "--ops", "Nope"]) == 2
    assert "no backend node tests for ['Nope']" in capsys.readouterr().err
    assert _cli.main(["conformance", "onnx", "--against", "ref"]) == 2
    assert "--against must be onnxruntime or omitted" in capsys.readouterr().err
