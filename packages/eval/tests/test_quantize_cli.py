"""`opstrata quantize`: .npz calibration data in both layouts, the model and report written, exit codes
0 (done), 1 (budget cannot be met) and 2 (bad input, one line naming it and the fix)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper as h, numpy_helper as nh

from opstrata.eval import _cli


def _mlp(seed: int = 0) -> onnx.ModelProto:
    r = np.random.default_rng(seed)
    inits = {
        "w1": (r.standard_normal((64, 128)) / 8).astype(np.float32),
        "w2": (r.standard_normal((128, 16)) / 11).astype(np.float32),
    }
    nodes = [
        h.make_node("MatMul", ["x", "w1"], ["h1"], name="fc1"),
        h.make_node("Relu", ["h1"], ["a1"], name="relu"),
        h.make_node("MatMul", ["a1", "w2"], ["y"], name="fc2"),
    ]
    g = h.make_graph(
        nodes, "mlp", [h.make_tensor_value_info("x", T.FLOAT, ["batch", 64])],
        [h.make_tensor_value_info("y", T.FLOAT, ["batch", 16])], [nh.from_array(a, n) for n, a in inits.items()],
    )  # fmt: skip
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    model = tmp_path / "mlp.onnx"
    onnx.save(_mlp(), str(model))
    r = np.random.default_rng(1)
    batches = tmp_path / "batches.npz"
    np.savez(batches, x=r.standard_normal((4, 8, 64)).astype(np.float32))  # [batches, *input shape]
    samples = tmp_path / "samples.npz"
    np.savez(samples, x=r.standard_normal((40, 64)).astype(np.float32))  # [samples, 64]
    return {"model": model, "batches": batches, "samples": samples, "dir": tmp_path}


def _err_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_quantize_writes_model_and_report(files, capsys) -> None:
    out, rep = files["dir"] / "q.onnx", files["dir"] / "r.json"
    argv = ["quantize", str(files["model"]), "--calib", str(files["batches"]), "--scheme", "w8a8", "-o", str(out),
            "--report-json", str(rep)]  # fmt: skip
    assert _cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "fc1" in text and "fc2" in text and f"wrote {out}" in text
    q = onnx.load(str(out))
    assert "QuantizeLinear" in [n.op_type for n in q.graph.node]
    d = json.loads(rep.read_text())
    assert d["kind"] == "quant" and d["scheme"] == "w8a8" and d["batches"] == 4 and d["output"] == str(out)
    assert [n["node"] for n in d["nodes"]] == ["fc1", "fc2"] and not any(n["kept_float"] for n in d["nodes"])
    assert d["outputs"][0]["cosine"] > 0.999 and d["size_bytes"]["quantized"] < d["size_bytes"]["float"]
    assert not [p.name for p in files["dir"].iterdir() if p.name.endswith(".tmp")]


def test_sample_layout_json_format_and_default_output(files, capsys) -> None:
    argv = ["quantize", str(files["model"]), "--calib", str(files["samples"]), "--batch-size", "16",
            "--scheme", "w4-g32", "--format", "json"]  # fmt: skip
    assert _cli.main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["batches"] == 3  # 40 samples in batches of 16, 16, 8
    assert d["output"] == str(files["dir"] / "mlp.w4-g32.onnx") and Path(d["output"]).is_file()
    # several files: their batches in order; weight-only schemes run without data too
    argv = ["quantize", str(files["model"]), "--calib", str(files["batches"]), "--calib", str(files["samples"]),
            "--scheme", "w8", "--format", "json"]  # fmt: skip
    assert _cli.main(argv) == 0
    assert json.loads(capsys.readouterr().out)["batches"] == 4 + 2  # default batch size 32: 32 + 8
    assert _cli.main(["quantize", str(files["model"]), "--scheme", "w8a8-dynamic"]) == 0


def test_budget_fallback_and_unreachable_budget(files, capsys) -> None:
    rep = files["dir"] / "r.json"
    base = ["quantize", str(files["model"]), "--calib", str(files["batches"]), "--scheme", "w4-g32"]
    assert _cli.main([*base, "--format", "json"]) == 0
    cos = json.loads(capsys.readouterr().out)["outputs"][0]["cosine"]
    assert cos < 0.995
    assert (
        _cli.main([*base, "--budget", "0.995", "--format", "json", "-o", str(files["dir"] / "b.onnx")]) == 0
    )
    d = json.loads(capsys.readouterr().out)
    assert len(d["fallback"]) == 1 and d["budget_met"] is True and d["outputs"][0]["cosine"] >= 0.995
    assert _cli.main([*base, "--budget", "0.9999999", "--report-json", str(rep)]) == 1
    err = _err_line(capsys)
    assert "cannot be met with any node quantized" in err and "Fix:" in err
    assert json.loads(rep.read_text())["budget_met"] is False


def test_bad_input_exits_2_with_one_line(files, capsys) -> None:
    d = files["dir"]
    wrong_key, wrong_dtype, npy, ragged = d / "k.npz", d / "t.npz", d / "a.npy", d / "r.npz"
    np.savez(wrong_key, z=np.zeros((2, 8, 64), np.float32))
    np.savez(wrong_dtype, x=np.zeros((2, 8, 64), np.float64))
    np.save(npy, np.zeros((2, 8, 64), np.float32))
    np.savez(ragged, x=np.zeros((2, 2, 8, 64), np.float32))
    model = str(files["model"])
    cases = [
        ([model, "--calib", str(d / "none.npz")], "no such file"),
        ([model, "--calib", str(wrong_key)], r"arrays ['z'] do not match the model inputs ['x']"),
        ([model, "--calib", str(wrong_dtype)], "expected dtype float32"),
        ([model, "--calib", str(npy)], "holds one unnamed array"),
        ([model, "--calib", str(ragged)], "has rank 4; the input has rank 2"),
        ([model], "static"),
        ([model, "--calib", str(files["batches"]), "--scheme", "int8"], "unknown scheme 'int8'"),
        ([model, "--calib", str(files["batches"]), "--exclude", "fc9"], "'fc9'"),
        ([str(d / "missing.onnx"), "--scheme", "w8"], "no such model file"),
        ([model, "--scheme", "w8", "-o", str(d / "no" / "q.onnx")], "does not exist"),
        ([model, "--scheme", "w8", "-o", model], "is the input model"),
    ]
    for argv, needle in cases:
        assert _cli.main(["quantize", *argv]) == 2, argv
        err = _err_line(capsys)
        assert err.startswith("opstrata quantize: error:") and needle in err, (argv, err)


def test_listed_in_help(capsys) -> None:
    assert "quantize" in [c.name for c in _cli.COMMANDS]
    with pytest.raises(SystemExit):
        _cli.main(["quantize", "--help"])
    assert "--calib" in capsys.readouterr().out
