"""Layer diff and drift: `opstrata diff` and diff_model/drift_model on small ONNX models built in code.

A model with one Mul constant perturbed (fed as OTHER.onnx) must be named at exactly that node; a
normal model agrees with onnxruntime, ref and float64 within tolerance; the demo GPT in bfloat16
prints the drift table; bad input is one line naming the problem and the fix, exit code 2.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from opstrata.eval import DiffError, DiffReport, _cli, diff_model, drift_model  # noqa: E402
from opstrata.eval._onnx_edit import cast_model, expose_intermediates  # noqa: E402
from opstrata.graph.testing import ModelBuilder, bert_block_model, gpt_block_model, mlp_model  # noqa: E402

HAS_ORT = importlib.util.find_spec("onnxruntime") is not None
needs_ort = pytest.mark.skipif(not HAS_ORT, reason="onnxruntime is not installed (the [peers] extra)")


def _scaled_mlp(scale: float = 0.5, *, bump: float | None = None) -> object:
    """x -> Linear -> Relu -> Mul(scale) -> Linear -> Tanh; ``bump`` replaces the Mul constant's values."""
    b = ModelBuilder("scaled_mlp", seed=0)
    x = b.input("x", ["batch", 8])
    h = b.op("Relu", [b.linear(x, 8, 16)])
    h = b.op("Mul", [h, b.const(np.full([16], scale if bump is None else bump, np.float32), "scale")])
    b.output(b.op("Tanh", [b.linear(h, 16, 4)]))
    return b.build()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("diff")
    paths = {
        "base": d / "base.onnx", "perturbed": d / "perturbed.onnx", "mlp": d / "mlp.onnx",
        "gpt": d / "gpt.onnx", "renamed": d / "renamed.onnx",
    }  # fmt: skip
    onnx.save(_scaled_mlp(), paths["base"])
    onnx.save(_scaled_mlp(bump=0.55), paths["perturbed"])
    onnx.save(mlp_model(), paths["mlp"])
    onnx.save(gpt_block_model(hidden=64, heads=4, vocab=97), paths["gpt"])  # the demo's GPT
    renamed = mlp_model()
    renamed.graph.input[0].name = "features"
    for n in renamed.graph.node:
        n.input[:] = ["features" if i == "x" else i for i in n.input]
    onnx.save(renamed, paths["renamed"])
    np.savez(d / "feeds.npz", x=np.linspace(-1, 1, 4 * 8, dtype=np.float32).reshape(4, 8))
    np.savez(d / "wrong_name.npz", y=np.zeros((4, 8), np.float32))
    np.savez(d / "wrong_dtype.npz", x=np.zeros((4, 8), np.float64))
    (d / "corrupt.onnx").write_bytes(b"\x08\x07garbage" * 10)
    return {**paths, "dir": d, "feeds": d / "feeds.npz", "wrong_name": d / "wrong_name.npz",
            "wrong_dtype": d / "wrong_dtype.npz", "corrupt": d / "corrupt.onnx"}  # fmt: skip


def _main(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = _cli.main(["diff", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------- the perturbed node is named first


def test_perturbed_constant_is_named_as_the_first_divergence(files) -> None:
    report = diff_model(files["base"], against=files["perturbed"], dims={"batch": 4})
    first = report.first
    assert first is not None and (first.node, first.op) == ("Mul_11", "Mul")
    before = [r for r in report.rows if r.index < first.index]
    assert before and all(r.within for r in before)
    inputs = dict(report.first_inputs())
    assert inputs["relu_7"] is not None and inputs["relu_7"].within  # the activation agrees...
    scale = inputs["scale_9"]
    assert scale is not None and scale.op == "initializer" and not scale.within  # ...the constant does not
    assert scale.metrics is not None and scale.metrics.max_abs == pytest.approx(0.05)
    assert "perturbed.onnx" in report.actual and "base.onnx" in report.expected


def test_cli_names_the_node_and_its_inputs_exit_1(files, capsys) -> None:
    code, out, err = _main(capsys, files["base"], "--against", files["perturbed"], "--inputs", files["feeds"])
    assert code == 1, err
    assert "first divergence: node 'Mul_11' (Mul), output 'mul_10'" in out
    assert "scale_9 (initializer)" in out and "OUT of tolerance" in out
    assert "the divergence comes in through them" in out
    assert "x: float32[4, 8] from" in out  # the feeds file was used


def test_a_shape_difference_is_a_divergence(files) -> None:
    b = ModelBuilder(
        "scaled_mlp", seed=0
    )  # the same model, but the Mul constant broadcasts to [2, batch, 16]
    x = b.input("x", ["batch", 8])
    h = b.op("Relu", [b.linear(x, 8, 16)])
    h = b.op("Mul", [h, b.const(np.full([2, 1, 16], 0.5, np.float32), "scale")])
    b.output(b.op("Tanh", [b.linear(h, 16, 4)]))
    report = diff_model(files["base"], against=b.build())
    first = report.first
    assert first is not None and first.node == "Mul_11" and first.metrics is None and first.differs
    assert first.note == "shape differs: actual [2, 1, 16], expected [1, 16]"


def test_identical_models_agree_exactly(files) -> None:
    report = diff_model(files["base"], against=files["base"])
    assert report.ok and all(r.metrics is not None and r.metrics.max_abs == 0 for r in report.rows)


# ---------------------------------------------------------------- normal models agree with the peers


@needs_ort
@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_against_onnxruntime_everything_within_tolerance(files, name) -> None:
    report = diff_model(files[name], "onnxruntime", dims={"batch": 2, "seq": 5})
    assert report.ok, report.first
    model = onnx.load(files[name])
    produced = [o for n in model.graph.node for o in n.output if o]
    assert [r.name for r in report.rows] == produced and not report.unmatched
    assert "onnxruntime" in report.expected


@needs_ort
def test_fused_runs_the_optimised_graph(files, capsys) -> None:
    """--fused measures the fused kernels (Linear, Attention, SkipLayerNorm) at the names that survive."""
    onnx.save(bert_block_model(), files["dir"] / "bert.onnx")
    report = diff_model(files["dir"] / "bert.onnx", "onnxruntime", dims={"batch": 2, "seq": 4}, fused=True)
    assert report.ok, report.first
    notes = {r.note for r in report.rows}
    assert {"computed by fused Attention", "computed by fused SkipLayerNorm"} <= notes
    assert "fused" in report.actual
    # every value fused away is accounted for by the passes' provenance: where it went, not just "missing"
    where = dict(report.whereabouts)
    produced = [o for n in onnx.load(files["dir"] / "bert.onnx").graph.node for o in n.output if o]
    assert set(produced) == {r.name for r in report.rows} | set(where) | set(report.unmatched)
    assert any(w.startswith("inside fused Attention '") for w in where.values())
    assert any(w.startswith("inside fused SkipLayerNorm '") for w in where.values())
    unfused = diff_model(files["dir"] / "bert.onnx", "onnxruntime", dims={"batch": 2, "seq": 4})
    assert len(unfused.rows) > len(report.rows) and not any(r.note for r in unfused.rows)
    assert not unfused.whereabouts
    code, out, _ = _main(capsys, files["dir"] / "bert.onnx", "--fused", "--dim", "seq=4")
    assert code == 0 and "computed by fused Attention" in out
    assert "where the passes put the values not compared" in out


def _merged_model(perturb: bool = False) -> object:
    """Softmax twice (CSE merges them), an Identity (removed), a constant product (folded), concatenated."""
    b = ModelBuilder("merged", seed=0)
    x = b.input("x", [2, 8])
    s1, s2 = b.op("Softmax", [x], axis=-1), b.op("Softmax", [x], axis=-1)
    ident = b.op("Identity", [s2])
    k = b.const(np.full([2, 8], 1.75 if perturb else 1.5, np.float32), "k")
    folded = b.op("Mul", [k, b.const(np.full([2, 8], 2.0, np.float32), "two")])
    b.output(b.op("Concat", [s1, ident, folded], axis=0))
    return b.build()


def test_fused_compares_merged_and_folded_values_through_provenance(tmp_path) -> None:
    """A value merged away (CSE, Identity) is compared as the value holding it; a folded one as its constant."""
    onnx.save(_merged_model(), tmp_path / "m.onnx")
    onnx.save(_merged_model(perturb=True), tmp_path / "p.onnx")
    report = diff_model(tmp_path / "p.onnx", tmp_path / "m.onnx", fused=True)
    rows = {r.name: r for r in report.rows}
    notes = {name: r.note for name, r in rows.items()}
    proto = onnx.load(tmp_path / "m.onnx")
    second, identity, folded = (proto.graph.node[k].output[0] for k in (1, 2, 3))
    first = proto.graph.node[0].output[0]
    assert notes[second] == notes[identity] == f"same tensor as '{first}' after the passes"
    assert rows[second].within and rows[identity].within and not report.unmatched
    assert notes[folded] == "folded to a constant at compile time"
    assert not rows[folded].within and rows[folded].metrics.max_abs == pytest.approx(0.5)  # 3.5 vs 3.0
    assert report.first.name == folded  # the first divergence is found even though the node was folded


@pytest.mark.parametrize("against", ["ref", "float64"])
def test_against_ref_and_float64_within_tolerance(files, against) -> None:
    report = diff_model(files["gpt"], against, dims={"seq": 6})
    assert report.ok, report.first
    ints = [r for r in report.rows if r.metrics is not None and r.metrics.dtype.kind == "i"]
    assert ints and all(r.metrics.max_abs == 0 for r in ints)  # shape arithmetic compared exactly


@pytest.mark.parametrize("against", ["bfloat16", "float16"])
def test_low_precision_copy_is_the_actual_side(files, against) -> None:
    report = diff_model(files["mlp"], against, dims={"batch": 8})
    assert f"cast to {against}" in report.actual
    assert {r.metrics.dtype.name for r in report.rows if r.metrics is not None} == {against}
    assert report.first is not None  # MatMul in bf16/fp16 leaves float32's default tolerance...
    assert all(r.metrics.cosine > 0.999 for r in report.rows if r.metrics is not None)  # ...but only just


def test_given_tolerance_overrides_the_defaults(files) -> None:
    loose = diff_model(files["mlp"], "bfloat16", dims={"batch": 8}, rtol=0.1, atol=0.05)
    assert loose.ok and loose.rtol == 0.1


def test_random_feeds_are_seeded_and_dims_apply(files) -> None:
    a = diff_model(files["mlp"], "ref", seed=5, dims={"batch": 3})
    b = diff_model(files["mlp"], "ref", seed=5, dims={"batch": 3})
    assert a.to_dict() == b.to_dict()
    assert a.rows[0].metrics is not None and a.rows[0].metrics.shape[0] == 3
    assert a.feeds == ("x: random float32[3, 16] (seed 5; batch=3)",)


# ---------------------------------------------------------------- formats and drift


def test_json_and_markdown_formats(files, tmp_path, capsys) -> None:
    code, out, _ = _main(capsys, files["base"], "--against", files["perturbed"], "--dim", "batch=4",
                         "--format", "json", "--output", tmp_path / "r.json")  # fmt: skip
    data = json.loads(out)
    assert code == 1 and data["first_divergence"]["node"] == "Mul_11" and not data["ok"]
    assert json.loads((tmp_path / "r.json").read_text()) == data
    code, out, _ = _main(capsys, files["base"], "--against", "ref", "--format", "markdown")
    assert code == 0
    assert "| # | node | op | output | shape | max abs | max rel | cosine | ok | note |" in out


def test_drift_on_the_demo_gpt_in_bfloat16(files, capsys) -> None:
    code, out, err = _main(capsys, files["gpt"], "--drift", "--dim", "seq=8")
    assert code == 0, err
    assert "in bfloat16 against float64" in out
    for op in ("LayerNormalization", "Softmax", "MatMul", "Tanh"):
        assert f" {op} " in out
    assert "largest growth:" in out and "logits" in out
    report = drift_model(files["gpt"], "bfloat16", dims={"seq": 8})
    assert report.rows and all(0 <= r.error < 0.1 for r in report.rows)
    assert report.rows[-1].output == "logits" and report.rows[-1].error > 1e-4  # bf16 rounding shows
    assert report.top_growth is not None and report.top_growth.growth > 1
    code, out, _ = _main(capsys, files["gpt"], "--drift", "--against", "float16", "--format", "json")
    assert json.loads(out)["dtype"] == "float16"


def test_drift_plot_svg(files, tmp_path, capsys) -> None:
    code, out, err = _main(capsys, files["mlp"], "--drift", "--plot", tmp_path / "drift.svg")
    assert code == 0, err
    svg = (tmp_path / "drift.svg").read_text()
    rows = len(drift_model(files["mlp"]).rows)
    assert svg.startswith("<svg") and f'data-points="{rows}"' in svg and "plot: " in out
    code, out, err = _main(capsys, files["mlp"], "--drift", "--plot", tmp_path / "drift.gif")
    assert code == 2 and out == "" and "expected a .svg or .png file name" in err


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="matplotlib is not installed")
def test_drift_plot(files, tmp_path, capsys) -> None:
    code, _, err = _main(capsys, files["mlp"], "--drift", "--plot", tmp_path / "drift.png")
    assert code == 0, err
    assert (tmp_path / "drift.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------- the edits the diff relies on


def test_expose_and_cast_edits() -> None:
    b = ModelBuilder("edits")
    x = b.input("x", [2, 3])
    c = b.op("Cast", [b.op("Relu", [x])], to=onnx.TensorProto.FLOAT)
    k = b.op("Constant", [], value_float=2.0)
    b.output(b.op("Mul", [c, k]))
    model = b.build()
    exposed = expose_intermediates(model)
    assert [o.name for o in exposed.graph.output][1:] == [n.output[0] for n in model.graph.node][:-1]
    cast = cast_model(model, np.float64)
    assert cast.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.DOUBLE
    assert next(n for n in cast.graph.node if n.op_type == "Cast").attribute[0].i == onnx.TensorProto.DOUBLE
    const = next(n for n in cast.graph.node if n.op_type == "Constant").attribute[0]
    assert const.name == "value" and const.t.data_type == onnx.TensorProto.DOUBLE
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT  # a copy was edited


def test_cast_keeps_resize_scales_float32() -> None:
    b = ModelBuilder("resize", opset=13)
    x = b.input("x", [1, 1, 2, 2])
    scales = b.const(np.array([1, 1, 2, 2], np.float32), "scales")
    b.output(b.op("Resize", [x, "", scales], mode="nearest"))
    cast = cast_model(b.build(), np.float16)
    kept = {t.name: t.data_type for t in cast.graph.initializer}
    assert kept[scales] == onnx.TensorProto.FLOAT
    assert cast.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["{dir}/missing.onnx"], r"model: no such file '.*missing\.onnx'; pass the path of an \.onnx model"),
        (["{corrupt}"], r"cannot be read as an ONNX model .*onnx\.checker\.check_model"),
        (["{mlp}", "--against", "tpu"], r"unknown peer 'tpu'; expected one of onnxruntime, ref, float64, "
                                        r"bfloat16, float16 or the path of an \.onnx model file"),
        (["{mlp}", "--against", "{dir}/other.onnx"], r"--against: no such file '.*other\.onnx'"),
        (["{mlp}", "--inputs", "{wrong_name}"], r"'y', which the model has no input for; the model's inputs are "
                                                r"x: float32\[batch, 16\]; name each array after an input"),
        (["{mlp}", "--inputs", "{dir}/nofeeds.npz"], r"--inputs: no such file '.*nofeeds\.npz'; pass an \.npz"),
        (["{mlp}", "--inputs", "{wrong_dtype}"], r"input 'x' \(from .*wrong_dtype\.npz\): expected dtype float32, "
                                                 r"got float64; save it as x\.astype\('float32'\)"),
        (["{mlp}", "--against", "{renamed}"], r"the models have different inputs: only in the model \['x'\], "
                                              r"only in .*renamed\.onnx \['features'\]"),
        (["{mlp}", "--drift", "--against", "onnxruntime"], r"--drift compares a low-precision copy against "
                                                           r"float64, so --against must be one of bfloat16"),
        (["{mlp}", "--plot", "p.png"], r"--plot draws the --drift table; add --drift"),
        (["{mlp}", "--drift", "--fused"], r"--fused applies to the layer diff"),
        (["{mlp}", "--rtol", "0.1"], r"--rtol and --atol go together"),
        (["{mlp}", "--dim", "batch"], r"--dim expects NAME=VALUE"),
        (["{mlp}", "--device", "tpu"], r"--device: unknown device 'tpu'; registered devices are"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_exit_2(files, capsys, args, expected) -> None:
    fmt = {k: str(v) for k, v in files.items()}
    code, out, err = _main(capsys, *(a.format(**fmt) for a in args))
    assert code == 2 and out == ""
    assert err.startswith("opstrata diff: error: ") and err.count("\n") == 1
    assert re.search(expected, err), err


def test_library_errors_are_diff_errors(files) -> None:
    with pytest.raises(DiffError, match=r"expected a path, bytes or onnx\.ModelProto, got int"):
        diff_model(3)
    with pytest.raises(DiffError, match="drift: dtype must be one of bfloat16, float16, got 'int8'"):
        drift_model(files["mlp"], "int8")
    with pytest.raises(DiffError, match="'features', which the model has no input for"):
        diff_model(files["mlp"], "ref", feeds={"features": np.zeros((1, 16), np.float32)})
    report = diff_model(onnx.load(files["mlp"]), "ref")  # a ModelProto works too
    assert isinstance(report, DiffReport) and report.model == "<model 'mlp'>"


@pytest.mark.parametrize("elem", [16, 17, 10])  # BFLOAT16, FLOAT8E4M3FN, FLOAT16
def test_input_specs_keep_low_precision_input_dtypes(elem: int) -> None:
    """bfloat16/float8 inputs are ml_dtypes on any onnx (onnx < 1.19 maps them to float32 itself)."""
    from onnx import helper as oh

    from opstrata.eval._diff_inputs import input_specs
    from opstrata.graph import dtype_from_onnx

    g = oh.make_graph(
        [oh.make_node("Identity", ["x"], ["y"])], "g",
        [oh.make_tensor_value_info("x", elem, ["n", 2])], [oh.make_tensor_value_info("y", elem, ["n", 2])],
    )  # fmt: skip
    (spec,) = input_specs(oh.make_model(g))
    assert spec.dtype == dtype_from_onnx(elem, "x") and spec.shape == ("n", 2)
