"""Whole models built with onnx.helper: import, run on opstrata.ops, compare with onnxruntime; round trip."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from opstrata.graph import (  # noqa: E402
    from_onnx,
    run_graph,
    testing as T,
    to_onnx,
)

RTOL, ATOL = 1e-4, 1e-5

MODELS = {
    "mlp": (T.mlp_model, {"batch": 3}),
    "cnn": (T.cnn_model, {"batch": 2}),
    "bert": (T.bert_block_model, {"batch": 2, "seq": 5}),
    "bert_fused_ln": (
        lambda opset: T.bert_block_model(opset=opset, decomposed_ln=False),
        {"batch": 2, "seq": 5},
    ),
    "gpt": (T.gpt_block_model, {"batch": 2, "seq": 7}),
}
OPSETS = [13, 14, 17, 18, 21, onnx.defs.onnx_opset_version()]


def _cases() -> list[tuple[str, int]]:
    out = []
    for name in MODELS:
        for opset in OPSETS:
            if (name == "gpt" and opset < 14) or (name == "bert_fused_ln" and opset < 17):
                continue
            out.append((name, opset))
    return out


def _check(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        np.testing.assert_allclose(got[k], want[k], rtol=RTOL, atol=ATOL, err_msg=k)


@pytest.mark.parametrize(("name", "opset"), _cases())
def test_import_matches_onnxruntime_and_round_trips(name: str, opset: int) -> None:
    build, dims = MODELS[name]
    model = build(opset=opset)
    feeds = T.random_feeds(model, dims, int_high=50)
    want = T.ort_run(model, feeds)
    graph = from_onnx(model)
    _check(run_graph(graph, feeds), want)
    exported = to_onnx(graph)
    onnx.checker.check_model(exported, full_check=True)
    _check(T.ort_run(exported, feeds), want)
    again = from_onnx(exported)  # a second trip keeps the graph (functions are inlined back)
    _check(run_graph(again, feeds), want)


def test_symbolic_dims_are_inferred_through_the_models() -> None:
    g = from_onnx(T.bert_block_model())
    assert g.value("y").shape == ("batch", "seq", 32)
    reshapes = [n for n in g.nodes if n.op_type == "Reshape"]
    assert {g.value(n.outputs[0]).shape for n in reshapes} == {("batch", "seq", 4, 8), ("batch", "seq", 32)}
    g = from_onnx(T.gpt_block_model())
    assert g.value("logits").shape == ("batch", "seq", 50)
    assert g.value("logits").dtype == np.float32


@pytest.mark.parametrize("opset", [13, 17, 18, onnx.defs.onnx_opset_version()])
def test_opset_variants_axes_attribute_vs_input(opset: int) -> None:
    model = T.opset_variant_model(opset)
    forms = {n.op_type: [i for i in n.input] for n in model.graph.node}
    attrs = {n.op_type: [a.name for a in n.attribute] for n in model.graph.node}
    if opset < 18:
        assert "axes" in attrs["ReduceMean"] and len(forms["ReduceMean"]) == 1
    else:
        assert len(forms["ReduceMean"]) == 2 and "axes" not in attrs["ReduceMean"]
    g = from_onnx(model)
    reduce_mean = next(n for n in g.nodes if n.op_type == "ReduceMean")
    assert reduce_mean.attrs["axes"] == [1] and len(reduce_mean.inputs) == 1  # one canonical form
    feeds = T.random_feeds(model, {"batch": 3})
    want = T.ort_run(model, feeds)
    _check(run_graph(g, feeds), want)
    for target in (13, 17, 18, onnx.defs.onnx_opset_version()):
        exported = to_onnx(g, opset=target)
        onnx.checker.check_model(exported, full_check=True)
        _check(T.ort_run(exported, feeds), want)


def test_file_path_and_bytes_inputs(tmp_path) -> None:
    model = T.mlp_model()
    path = tmp_path / "mlp.onnx"
    onnx.save(model, path)
    feeds = T.random_feeds(model)
    want = T.ort_run(model, feeds)
    for src in (path, str(path), model.SerializeToString()):
        _check(run_graph(from_onnx(src), feeds), want)


def test_external_data_is_loaded_from_the_path(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # some onnx releases resolve `location` against the working directory
    model = T.cnn_model()
    feeds = T.random_feeds(model)
    want = T.ort_run(model, feeds)
    path = tmp_path / "cnn.onnx"
    onnx.save(
        model,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="cnn.data",
        size_threshold=0,
    )
    assert (tmp_path / "cnn.data").is_file()
    _check(run_graph(from_onnx(path), feeds), want)
