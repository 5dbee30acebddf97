"""The accuracy contract: quantize(model, calibration_data, scheme, accuracy_budget) -> QuantizedModel with a
per-node / per-output report, the budget's put-backs, bad input errors, atomic save and a runnable session."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
from _quant_models import convnet, cosine, feeds, mlp, run_opstrata, run_ort
from onnx import TensorProto as T, helper as h, numpy_helper as nh

from opstrata.quant import (
    AccuracyError,
    CalibrationError,
    QuantError,
    QuantizationReport,
    QuantizedModel,
    params_from_range,
    quantize,
    quantize_array,
)
from opstrata.quant._node_metrics import FloatReference, measure, quantized_nodes

MLP_NODES = ["fc1", "fc2", "fc3"]


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return mlp()


@pytest.fixture(scope="module")
def cal() -> list:
    return feeds((8, 64), 8, seed=10)


def _token_model(vocab: int = 24, d: int = 16, seed: int = 0) -> onnx.ModelProto:
    """ids[batch, T] -> Gather(embedding) -> MatMul -> Relu -> MatMul -> logits[batch, T, vocab]."""
    r = np.random.default_rng(seed)
    inits = {
        "emb": r.standard_normal((vocab, d)).astype(np.float32),
        "w1": (r.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32),
        "wo": (r.standard_normal((d, vocab)) * 2 / np.sqrt(d)).astype(np.float32),
    }
    nodes = [
        h.make_node("Gather", ["emb", "ids"], ["e"], name="embed"),
        h.make_node("MatMul", ["e", "w1"], ["h1"], name="proj"),
        h.make_node("Relu", ["h1"], ["a1"], name="relu"),
        h.make_node("MatMul", ["a1", "wo"], ["logits"], name="lm_head"),
    ]
    g = h.make_graph(
        nodes, "tok", [h.make_tensor_value_info("ids", T.INT64, ["batch", "seq"])],
        [h.make_tensor_value_info("logits", T.FLOAT, ["batch", "seq", vocab])],
        [nh.from_array(a, n) for n, a in inits.items()],
    )  # fmt: skip
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return m


# ----------------------------------------------------------------------------------- schemes and report


@pytest.mark.parametrize(
    ("scheme", "min_cos", "ratio"),
    [("w8a8", 0.9998, 3.5), ("w8a8-dynamic", 0.9998, 3.5), ("w8", 0.9998, 3.5), ("w4-g32", 0.98, 5.5),
     ("fp8", 0.995, 3.5)],
)  # fmt: skip
def test_each_scheme_reports_nodes_outputs_and_sizes(
    model, cal, scheme: str, min_cos: float, ratio: float
) -> None:
    qm = quantize(model, cal, scheme)
    assert isinstance(qm, QuantizedModel) and isinstance(qm.report, QuantizationReport)
    r = qm.report
    assert [n.node for n in r.nodes] == MLP_NODES and not any(n.kept_float for n in r.nodes)
    assert [n.op for n in r.nodes] == ["MatMul", "MatMul", "Gemm"]
    for n in r.nodes:  # quantized: finite SQNR, cosine below 1 but close
        assert 10 < n.sqnr_db < 80 and min_cos - 0.01 < n.cosine < 1.0, n
        assert 10 < n.local_sqnr_db < 80
    assert r.nodes[0].sqnr_db == pytest.approx(r.nodes[0].local_sqnr_db)  # fc1 reads the graph input
    (out,) = r.outputs
    assert out.name == "y" and min_cos < out.cosine < 1.0 and out.max_abs > 0
    assert out.cosine == pytest.approx(r.nodes[-1].cosine)  # fc3 writes y
    assert 0.5 <= out.top1_agreement <= 1.0  # y is [batch, 16]: class scores
    # the report's figures are the real ones: recompute the output cosine by hand
    ref, got = run_opstrata(model, cal)[0], run_opstrata(qm.model, cal)[0]
    assert out.cosine == pytest.approx(cosine(ref, got), abs=1e-9)
    assert r.size_float == sum(a.nbytes for a in map(nh.to_array, model.graph.initializer))
    assert r.size_float / r.size_quantized > ratio
    assert r.batches == 8 and r.data == "calibration_data" and r.budget is None
    meta = {p.key: p.value for p in qm.model.metadata_props}
    assert meta["opstrata.quant.scheme"] == scheme
    d = json.loads(json.dumps(qm.report.to_dict(), allow_nan=False))
    assert d["kind"] == "quant" and d["scheme"] == scheme
    assert [set(n) >= {"node", "op", "sqnr_db", "cosine", "kept_float", "reason"} for n in d["nodes"]] == [
        True
    ] * 3
    assert d["size_bytes"] == {"float": r.size_float, "quantized": r.size_quantized}
    assert d["outputs"][0]["name"] == "y" and d["fallback"] == []
    text = str(qm.report)
    assert all(n in text for n in MLP_NODES) and "SQNR" in text and "smaller" in text


def test_scheme_specifics_in_the_graph(model, cal) -> None:
    fp8 = quantize(model, cal, "fp8").model
    assert any(t.data_type == T.FLOAT8E4M3FN for t in fp8.graph.initializer)
    w4 = quantize(model, scheme="w4-g32").model
    assert any(t.data_type == T.INT4 for t in w4.graph.initializer)
    blocks = [
        a.i
        for n in w4.graph.node
        if n.op_type == "DequantizeLinear"
        for a in n.attribute
        if a.name == "block_size"
    ]
    assert blocks and set(blocks) == {32}
    w4c = quantize(model, scheme="w4").model
    assert not any(a.name == "block_size" for n in w4c.graph.node for a in n.attribute)
    dyn = quantize(model, scheme="w8a8-dynamic").model
    assert [n.op_type for n in dyn.graph.node].count("MatMulInteger") == 3


def test_identical_models_measure_exact(model, cal) -> None:
    q = quantize(model, cal, "w8a8").model
    nodes = quantized_nodes(model, q)
    assert [n.name for n in nodes] == MLP_NODES
    ref = FloatReference(model, cal, [n.output for n in nodes], top1=lambda _n, a: a.ndim == 2, lm=None)
    same = measure(ref, model, nodes)  # the float model against itself
    for m in (*same.nodes.values(), *same.outputs.values()):
        assert m.sqnr_db == float("inf") and m.cosine == pytest.approx(1.0, abs=1e-12) and m.max_abs == 0.0
    assert same.top1 == {"y": 1.0}
    assert quantized_nodes(model, model) == []
    diff = measure(ref, q, nodes)
    assert all(m.sqnr_db < float("inf") for m in diff.nodes.values())


def test_no_data_means_not_measured(model) -> None:
    qm = quantize(model, scheme="w8a8-dynamic")
    r = qm.report
    assert [n.node for n in r.nodes] == MLP_NODES and all(n.sqnr_db is None for n in r.nodes)
    assert r.outputs == [] and r.batches == 0 and any("not measured" in x for x in r.notes)
    d = json.loads(json.dumps(r.to_dict(), allow_nan=False))
    assert d["nodes"][0]["sqnr_db"] is None


def test_caller_exclusions_and_eval_data(model, cal) -> None:
    ev = feeds((4, 64), 3, seed=99)
    qm = quantize(model, cal, "w8a8", eval_data=ev, exclude=["fc2"])
    r = qm.report
    assert [(n.node, n.kept_float) for n in r.nodes] == [("fc1", False), ("fc2", True), ("fc3", False)]
    assert "excluded by the caller" in r.nodes[1].reason and r.nodes[1].sqnr_db is None
    assert r.batches == 3 and r.data == "eval_data"
    fc2 = next(n for n in qm.model.graph.node if n.name == "fc2")
    assert fc2.input[1] == "w2"  # float weight kept


# ----------------------------------------------------------------------------------- accuracy budget


def test_budget_puts_worst_local_nodes_back_until_it_holds(model, cal) -> None:
    free = quantize(model, cal, "w4-g32").report
    assert free.min_cosine < 0.995  # the budget below is missed at first
    by_local = [n.node for n in sorted(free.nodes, key=lambda n: n.local_sqnr_db)]
    qm = quantize(model, cal, "w4-g32", 0.995)
    r = qm.report
    assert r.budget == {"min_cosine": 0.995} and r.budget_met is True
    assert r.min_cosine >= 0.995
    back = [n.node for n in r.fallback]
    assert back == by_local[: len(back)] and 1 <= len(back) < 3
    for n in r.fallback:
        assert (
            n.kept_float and n.reason.startswith("budget: min_cosine=0.995 missed") and n.sqnr_db is not None
        )
    assert [n.node for n in r.quantized] == [n for n in MLP_NODES if n not in back]
    assert r.to_dict()["fallback"] == back
    inits = {t.name for t in qm.model.graph.initializer}
    for name in back:  # the node reads its float weight again
        node = next(n for n in qm.model.graph.node if n.name == name)
        assert node.input[1] in inits and not node.input[1].endswith("_dequantized")
    # the dict form is the same budget; the report's output cosine is the model's
    again = quantize(model, cal, "w4-g32", {"min_cosine": 0.995}).report
    assert [n.node for n in again.fallback] == back
    assert cosine(run_opstrata(model, cal)[0], run_opstrata(qm.model, cal)[0]) >= 0.995


def test_budget_blames_the_node_that_adds_the_error(model, cal) -> None:
    """fc2 (4-bit per channel) adds the most error, fc3 (4-bit groups) has the lowest output SQNR because it
    inherits fc2's: the budget puts fc2 back first (local SQNR), not fc3."""
    ov = {"fc2": {"group_size": None}}
    free = quantize(model, cal, "w4-g32", overrides=ov).report
    assert min(free.nodes, key=lambda n: n.sqnr_db).node == "fc3"
    assert min(free.nodes, key=lambda n: n.local_sqnr_db).node == "fc2"
    r = quantize(model, cal, "w4-g32", 0.99, overrides=ov).report
    assert r.fallback[0].node == "fc2" and r.budget_met and r.min_cosine >= 0.99


def test_budget_terms_top1_and_max_abs(model, cal) -> None:
    r = quantize(model, cal, "w4-g32", {"min_top1": 0.95, "max_abs": 0.2}).report
    assert r.outputs[0].top1_agreement >= 0.95 and r.outputs[0].max_abs <= 0.2 and r.fallback
    assert "min_top1=0.95 missed" in r.fallback[0].reason


def test_unreachable_budget_raises_with_best_value(model, cal) -> None:
    with pytest.raises(AccuracyError, match=r"0\.99999.*cannot be met with any node quantized: best achieved "
                       r"cosine 0\.99\d+.*Fix: loosen the budget") as info:  # fmt: skip
        quantize(model, cal, "w4-g32", 0.99999)
    rep = info.value.report
    assert isinstance(rep, QuantizationReport) and len(rep.fallback) == 2 and rep.budget_met is False


def test_perplexity_delta_for_token_models() -> None:
    m = _token_model(seed=1)
    r = np.random.default_rng(3)
    data = [{"ids": r.integers(0, 24, (2, 7)).astype(np.int64)} for _ in range(3)]
    rep = quantize(m, data, "w4-g16", task="lm").report
    p = rep.perplexity
    assert p is not None and p["logits"] == "logits" and p["labels"] == "ids"

    def ppl(model: onnx.ModelProto) -> float:
        nll, n = 0.0, 0
        for f, lg in zip(data, (run_opstrata(model, [f])[0] for f in data), strict=True):
            lg = lg[:, :-1].astype(np.float64)
            tgt = f["ids"][:, 1:]
            lse = np.log(np.exp(lg - lg.max(-1, keepdims=True)).sum(-1)) + lg.max(-1)
            nll += float((lse - np.take_along_axis(lg, tgt[..., None], -1)[..., 0]).sum())
            n += tgt.size
        return float(np.exp(nll / n))

    qm = quantize(m, data, "w4-g16", task="lm")
    assert p["float"] == pytest.approx(ppl(m), rel=1e-9)
    assert p["quantized"] == pytest.approx(ppl(qm.model), rel=1e-9)
    assert p["delta"] == pytest.approx(p["quantized"] - p["float"]) and p["delta"] > 0
    assert rep.outputs[0].top1_agreement is None  # [batch, seq, vocab] is not auto-detected as classes
    assert "perplexity" in str(rep)
    assert quantize(m, data, "w4-g16", task="classifier").report.outputs[0].top1_agreement > 0.5
    budget = quantize(m, data, "w4-g16", {"max_ppl_delta": p["delta"] / 2}, task="lm").report
    assert [n.node for n in budget.fallback] == ["proj"] and budget.perplexity["delta"] <= p["delta"] / 2


# ----------------------------------------------------------------------------------- bad input


def test_calibration_data_that_does_not_fit(model, cal) -> None:
    x = cal[0]["x"]
    cases = [
        ([{"z": x}], r"no value for model input\(s\) \['x'\] \(it has \['z'\]\)"),
        ([{"x": x, "extra": x}], r"feeds \['extra'\], which are not inputs"),
        ([{"x": x.astype(np.float64)}], r"input 'x': expected dtype float32 .*float32\[batch, 64\].* got float64"
                                        r".*Fix: cast it"),
        ([{"x": x[:, :63]}], r"input 'x': dim 1 must be 64 .*got shape \[8, 63\]"),
        ([{"x": x[0]}], r"input 'x': expected rank 2 .*got shape \[64\]"),
        ([], r"the data set is empty.*Fix: pass at least one feed dict"),
        (iter([]), "the data set is empty"),
        (42, "expected an iterable of feed dicts .*, got int"),
        ([x], r"batch 0 is a ndarray, not a dict"),
    ]  # fmt: skip
    for data, pattern in cases:
        with pytest.raises(CalibrationError, match=pattern):
            quantize(model, data, "w8a8")
    with pytest.raises(CalibrationError, match=r"static.*Fix: pass calibration_data=.*'w8a8-dynamic'"):
        quantize(model, scheme="w8a8")
    with pytest.raises(CalibrationError, match=r"eval_data.*dim 1 must be 64"):
        quantize(model, cal, "w8", eval_data=[{"x": x[:, :10]}])


def test_bad_scheme_budget_options_and_models(model, cal) -> None:
    with pytest.raises(
        QuantError,
        match=r"unknown scheme 'int8'.*Fix: use one of w8a8, w8a8-dynamic, w8a8-dynamic-token, w8, w4",
    ):
        quantize(model, cal, "int8")
    with pytest.raises(QuantError, match="unknown scheme 'w4-g1'"):
        quantize(model, cal, "w4-g1")
    with pytest.raises(QuantError, match=r"unknown budget term 'cosine'.*min_cosine"):
        quantize(model, cal, "w8", {"cosine": 0.9})
    with pytest.raises(QuantError, match=r"min_cosine must lie in \[-1.0, 1.0\], got 2"):
        quantize(model, cal, "w8", 2)
    with pytest.raises(QuantError, match=r"the budget needs data.*Fix: pass calibration_data="):
        quantize(model, scheme="w8", accuracy_budget=0.99)
    with pytest.raises(QuantError, match="max_ppl_delta needs task='lm'"):
        quantize(model, cal, "w8", {"max_ppl_delta": 1.0})
    with pytest.raises(QuantError, match=r"scheme 'w8' sets bits=8.*Fix: drop bits="):
        quantize(model, scheme="w8", bits=4)
    with pytest.raises(
        QuantError, match=r"takes no option 'activation_dtype'.*Fix: use among .*group_size|storage"
    ):
        quantize(model, scheme="w8", activation_dtype="int8")
    with pytest.raises(QuantError, match="accuracy_budget"):
        quantize(model, cal, "w8", min_cosine=0.9)
    with pytest.raises(QuantError, match="unknown task 'llm'"):
        quantize(model, cal, "w8", task="llm")
    relu = h.make_model(h.make_graph(
        [h.make_node("Relu", ["x"], ["y"])], "g", [h.make_tensor_value_info("x", T.FLOAT, [2])],
        [h.make_tensor_value_info("y", T.FLOAT, [2])]), opset_imports=[h.make_opsetid("", 17)])  # fmt: skip
    with pytest.raises(
        QuantError, match=r"nothing to quantize: the model has no MatMul/Gemm/Conv node \(its ops: Relu\)"
    ):
        quantize(relu, [{"x": np.ones(2, np.float32)}], "w8a8")
    with pytest.raises(QuantError, match="nothing to quantize"):
        quantize(model, cal, "w8", exclude=MLP_NODES)
    with pytest.raises(QuantError, match="no such file"):
        quantize("/nonexistent/model.onnx", cal)
    p = params_from_range(-1.0, 1.0, "int8", symmetric=True)
    with pytest.raises(QuantError, match=r"now quantize_array\(x, params\)"):
        quantize(np.zeros(3, np.float32), p)
    assert quantize_array(np.array([0.5], np.float32), p).tolist() == [64]


# ----------------------------------------------------------------------------------- save / session


def test_save_is_atomic_and_reloads(model, cal, tmp_path, monkeypatch) -> None:
    qm = quantize(model, cal, "w8a8")
    path = tmp_path / "q.onnx"
    assert qm.save(path) == path
    assert onnx.load(str(path)).SerializeToString() == qm.model.SerializeToString()
    before = path.read_bytes()
    other = quantize(model, cal, "w4-g32")

    def boom(_fd: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError, match="disk full"):
        other.save(path)
    assert path.read_bytes() == before  # the old file is whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.onnx"]  # no temp file left
    monkeypatch.undo()
    with pytest.raises(QuantError, match="does not exist"):
        qm.save(tmp_path / "missing" / "q.onnx")


@pytest.mark.parametrize(("scheme", "exact"), [("w8", True), ("w8a8", False)])
def test_session_agrees_with_onnxruntime_on_the_saved_file(
    model, cal, tmp_path, scheme: str, exact: bool
) -> None:
    qm = quantize(model, cal, scheme)
    path = qm.save(tmp_path / "q.onnx")
    sess = qm.session()
    ours = np.concatenate([sess.run(None, f)[0] for f in cal])
    theirs = run_ort(onnx.load(str(path)), cal, level="none")[0]
    if exact:  # weight-only: DQ then the float op, no rounding to flip
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
    else:  # activation codes may flip by one quantization step
        assert cosine(ours, theirs) > 0.99999
        assert np.linalg.norm(ours - theirs) / np.linalg.norm(theirs) < 5e-3
    assert [i.name for i in sess.get_inputs()] == ["x"]


def test_conv_model_and_path_input(tmp_path) -> None:
    path = tmp_path / "conv.onnx"
    onnx.save(convnet(), str(path))
    qm = quantize(str(path), feeds((4, 3, 16, 16), 3, seed=1), "w8a8", task="classifier")
    assert [n.node for n in qm.report.nodes] == ["conv1", "conv2", "head"]
    assert qm.report.outputs[0].top1_agreement >= 0.75 and qm.report.min_cosine > 0.999
