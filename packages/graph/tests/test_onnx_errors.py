"""Malformed and unsupported ONNX input: each gives a clear error naming the thing, expected, actual, fix."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper as oh  # noqa: E402

from opstrata.graph import GraphError, UnsupportedOpError, from_onnx  # noqa: E402
from opstrata.graph.testing import mlp_model  # noqa: E402

FLOAT = TensorProto.FLOAT


def _model(nodes: list[Any], inits: list[Any] = (), opset: int = 17, out_shape: Any = None) -> Any:
    g = oh.make_graph(
        nodes, "g", [oh.make_tensor_value_info("x", FLOAT, ["batch", 4])],
        [oh.make_tensor_value_info("y", FLOAT, out_shape)], list(inits),
    )  # fmt: skip
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", opset)])


def test_unsupported_op_names_everything() -> None:
    m = _model([oh.make_node("ImageDecoder", ["x"], ["y"], name="upsample")])
    with pytest.raises(UnsupportedOpError) as info:
        from_onnx(m)
    msg = str(info.value)
    assert "node 'upsample' (ai.onnx::ImageDecoder, opset 17)" in msg
    assert "op type 'ImageDecoder' (domain 'ai.onnx', opset 17) is not supported" in msg
    assert "supported ops in domain 'ai.onnx': Abs, " in msg and "Einsum" in msg
    assert info.value.op_type == "ImageDecoder" and info.value.node == "upsample" and info.value.opset == 17


def test_unsupported_domain() -> None:
    m = _model([oh.make_node("FusedGemm", ["x"], ["y"], name="fg", domain="com.microsoft")])
    m.opset_import.append(oh.make_opsetid("com.microsoft", 1))
    with pytest.raises(
        UnsupportedOpError, match=r"node 'fg' \(com.microsoft::FusedGemm, opset 17\).*domain 'com.microsoft'"
    ):
        from_onnx(m)


def test_op_missing_from_the_models_opset() -> None:
    m = _model([oh.make_node("Gelu", ["x"], ["y"], name="g")], opset=17)
    with pytest.raises(UnsupportedOpError, match="op type 'Gelu' does not exist in opset 17"):
        from_onnx(m)


def test_unsupported_form_of_a_supported_op() -> None:
    bn = oh.make_node(
        "BatchNormalization", ["x", "s", "s", "s", "s"], ["y", "m", "v"], name="bn", training_mode=1
    )
    with pytest.raises(UnsupportedOpError, match="training mode"):
        from_onnx(_model([bn], opset=13))  # training outputs before opset 14: refused with the fix


def test_garbage_bytes() -> None:
    with pytest.raises(GraphError, match=r"from_onnx.*(not a valid ONNX ModelProto|not an ONNX model).*Fix"):
        from_onnx(b"\xff\xfe this is not a protobuf \x00\x01" * 5)


def test_truncated_bytes() -> None:
    data = mlp_model().SerializeToString()
    for cut in (len(data) // 2, len(data) - 7, 3):
        with pytest.raises(
            GraphError, match=r"from_onnx.*(not a valid ONNX ModelProto|not an ONNX model|dangling|missing)"
        ):
            from_onnx(data[:cut])


def test_bytes_that_parse_but_are_no_model() -> None:
    with pytest.raises(GraphError, match=r"not an ONNX model \(ir_version=0, graph missing\)"):
        from_onnx(b"")


def test_missing_file_and_wrong_type(tmp_path) -> None:
    with pytest.raises(GraphError, match="no such file"):
        from_onnx(tmp_path / "nope.onnx")
    (tmp_path / "bad.onnx").write_bytes(b"\x0a\xff\xff\xff\xff\xff")
    with pytest.raises(GraphError, match=r"bad\.onnx"):
        from_onnx(tmp_path / "bad.onnx")
    with pytest.raises(GraphError, match=r"expected a path, bytes or onnx\.ModelProto, got int"):
        from_onnx(123)


def test_missing_initializer() -> None:
    m = _model([oh.make_node("MatMul", ["x", "w"], ["y"], name="mm")])
    with pytest.raises(
        GraphError, match=r"node 'mm' \(MatMul\): input 'w' is dangling.*Fix: add 'w' as an initializer"
    ):
        from_onnx(m)


def test_cycle() -> None:
    nodes = [oh.make_node("Add", ["x", "b"], ["a"], name="n1"), oh.make_node("Relu", ["a"], ["b"], name="n2")]
    nodes.append(oh.make_node("Identity", ["b"], ["y"], name="n3"))
    with pytest.raises(
        GraphError, match=r"cycle: .*'n1' \(Add\).*'n2' \(Relu\).*Fix: a dataflow graph must be acyclic"
    ):
        from_onnx(_model(nodes))


def test_unsorted_but_acyclic_model_is_reordered() -> None:
    nodes = [
        oh.make_node("Relu", ["a"], ["y"], name="second"),
        oh.make_node("Neg", ["x"], ["a"], name="first"),
    ]
    g = from_onnx(_model(nodes))
    assert [n.name for n in g.nodes] == ["first", "second"]


def test_inconsistent_shapes() -> None:
    w = onnx.numpy_helper.from_array(np.zeros((5, 3), np.float32), "w")
    with pytest.raises(
        GraphError, match=r"node 'mm' \(MatMul\): inconsistent shapes: inner dims must match.*\(4 != 5\)"
    ):
        from_onnx(_model([oh.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [w]))
    with pytest.raises(
        GraphError, match=r"node 'r' \(Relu\): inconsistent shapes: output 'y' is annotated \('batch', 5\)"
    ):
        from_onnx(_model([oh.make_node("Relu", ["x"], ["y"], name="r")], out_shape=["batch", 5]))


def test_duplicate_producer() -> None:
    nodes = [oh.make_node("Relu", ["x"], ["y"], name="a"), oh.make_node("Neg", ["x"], ["y"], name="b")]
    with pytest.raises(
        GraphError, match=r"value 'y' is defined twice: by node 'a' \(Relu\) and by node 'b' \(Neg\)"
    ):
        from_onnx(_model(nodes))


def test_type_mismatch() -> None:
    i = onnx.numpy_helper.from_array(np.ones(4, np.int64), "i")
    with pytest.raises(
        GraphError, match=r"node 'add' \(Add\): type mismatch: input 'x' is float32 but input 'i' is int64"
    ):
        from_onnx(_model([oh.make_node("Add", ["x", "i"], ["y"], name="add")], [i]))


def test_opset_out_of_range() -> None:
    """Opsets older than 13 are converted on import (test_onnx_old_opsets.py); newer than onnx knows fail."""
    newest = onnx.defs.onnx_opset_version()
    with pytest.raises(
        GraphError, match=rf"opset {newest + 1} is outside the supported range 1\.\.{newest}.*re-export"
    ):
        from_onnx(_model([oh.make_node("Relu", ["x"], ["y"])], opset=newest + 1))


def test_external_data_without_a_path(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # some onnx releases resolve `location` against the working directory
    m = mlp_model()
    onnx.save(m, tmp_path / "m.onnx", save_as_external_data=True, location="m.data", size_threshold=0)
    loaded = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    with pytest.raises(
        GraphError, match=r"keeps its data in an external file \('m.data'\).*pass the .onnx file path"
    ):
        from_onnx(loaded)
    with pytest.raises(GraphError, match="external file"):
        from_onnx(loaded.SerializeToString())


def test_external_data_file_missing(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # some onnx releases resolve `location` against the working directory
    m = mlp_model()
    onnx.save(m, tmp_path / "m.onnx", save_as_external_data=True, location="m.data", size_threshold=0)
    (tmp_path / "m.data").unlink()
    with pytest.raises(GraphError, match=r"from_onnx\('.*m.onnx'\).*external data"):
        from_onnx(tmp_path / "m.onnx")


@pytest.mark.parametrize(
    ("inputs", "outputs", "attrs", "match"),
    [
        (["x", "x", "x"], ["y"], {"q_num_heads": 2}, "only one of the two given"),
    ],
)
def test_unsupported_attention_forms(inputs, outputs, attrs, match) -> None:
    node = oh.make_node("Attention", inputs, outputs, name="attn", **attrs)
    extra = [oh.make_node("Identity", [o], [f"{o}_copy"]) for o in outputs[1:]]
    g = oh.make_graph(
        [node, *extra], "g", [oh.make_tensor_value_info(n, FLOAT, [1, 2, 3, 4]) for n in ("x", "pk", "pv")],
        [oh.make_tensor_value_info("y", FLOAT, None)] + [oh.make_tensor_value_info(f"{o}_copy", FLOAT, None) for o in outputs[1:]],
    )  # fmt: skip
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 25)])
    with pytest.raises(UnsupportedOpError, match=r"node 'attn' \(ai.onnx::Attention, opset 25\)") as info:
        from_onnx(m)
    assert info.match(match)


def test_rms_normalization_stash_type_other_than_float32_is_unsupported() -> None:
    inits = [oh.make_tensor("w", FLOAT, [4], [1.0] * 4)]
    m = _model(
        [oh.make_node("RMSNormalization", ["x", "w"], ["y"], name="rms", stash_type=11)], inits, opset=23
    )
    with pytest.raises(UnsupportedOpError, match=r"node 'rms'.*stash_type=11.*float32"):
        from_onnx(m)
