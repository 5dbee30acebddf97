"""A QDQ model whose fused int8 nodes would run on opstrata-ops' numpy references warns once, naming the
nodes and the fix; with a native kernel registered (what opstrata.quant does) it does not."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import onnx.helper as oh  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402

import opstrata.ops as ops  # noqa: E402
from opstrata.runtime import InferenceSession, SessionOptions, SlowKernelWarning  # noqa: E402


def _qdq_conv() -> onnx.ModelProto:
    """x -> QuantizeLinear -> DequantizeLinear -> Conv(DequantizeLinear(int8 weight)): a QConv once fused."""
    r = np.random.default_rng(0)
    inits = [
        nh.from_array(np.array(0.05, np.float32), "xs"), nh.from_array(np.array(128, np.uint8), "xz"),
        nh.from_array(r.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8), "w"),
        nh.from_array(np.full(4, 0.01, np.float32), "ws"),
    ]  # fmt: skip
    nodes = [
        oh.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        oh.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        oh.make_node("DequantizeLinear", ["w", "ws"], ["wd"], axis=0),
        oh.make_node("Conv", ["xd", "wd"], ["y"], pads=[1, 1, 1, 1]),
    ]
    g = oh.make_graph(nodes, "qdq", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 6, 6])],
                      [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], inits)  # fmt: skip
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])


def _fast_qconv(*args, **kwargs):  # a stand-in native kernel, defined outside opstrata.ops
    return ops.qconv(*args, device="ref", **kwargs)


def test_int8_nodes_on_reference_kernels_warn_with_the_fix() -> None:
    if not str(getattr(ops.resolve_kernel("qconv", np.uint8, "cpu"), "__module__", "")).startswith(
        "opstrata.ops"
    ):
        pytest.skip("a native qconv kernel is registered in this process (opstrata.quant imported)")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", SlowKernelWarning)
        sess = InferenceSession(_qdq_conv())
    if not any(n.op_type == "QConv" for n in sess.plan.graph.nodes):
        pytest.skip("this opstrata-graph does not fuse QDQ Convs (< 0.4.7): nothing runs on int8 kernels")
    slow = [str(w.message) for w in seen if issubclass(w.category, SlowKernelWarning)]
    assert len(slow) == 1 and re.search(r"QConv x1.*numpy reference.*import opstrata.quant", slow[0]), slow
    x = np.random.default_rng(1).standard_normal((1, 3, 6, 6)).astype(np.float32)
    assert sess.run(None, {"x": x})[0].shape == (1, 4, 6, 6)  # it still runs, correctly, just slowly


def test_no_warning_with_a_native_kernel_or_without_fused_int8_nodes() -> None:
    ops.register("qconv", device="cpu", dtypes=(np.uint8, np.int8), priority=7)(_fast_qconv)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", SlowKernelWarning)
            InferenceSession(_qdq_conv())
    finally:
        ops.unregister("qconv", device="cpu", kernel=_fast_qconv)
    with warnings.catch_warnings():  # level 0: no fusion, no QConv node, nothing to say
        warnings.simplefilter("error", SlowKernelWarning)
        InferenceSession(_qdq_conv(), SessionOptions(graph_optimization_level=0))


def _qdq_conv_hardswish_quantized() -> onnx.ModelProto:
    """:func:`_qdq_conv`, then HardSwish -> QuantizeLinear -> DequantizeLinear: a QConvQuantize once fused."""
    m = _qdq_conv()
    g = m.graph
    g.node[-1].output[0] = "conv_y"
    g.initializer.extend(
        [nh.from_array(np.array(0.02, np.float32), "ys"), nh.from_array(np.array(7, np.uint8), "yz")]
    )
    g.node.extend([
        oh.make_node("HardSwish", ["conv_y"], ["h"]),
        oh.make_node("QuantizeLinear", ["h", "ys", "yz"], ["yq"]),
        oh.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"]),
    ])  # fmt: skip
    return m


def test_fused_conv_quantize_runs_in_a_session_with_the_graphs_codes(monkeypatch) -> None:
    """A session on QConv -> HardSwish -> QuantizeLinear (fused into QConvQuantize by graph >= 0.4.24):
    the first run and the bound steady state give the unfused graph's codes; on ops' numpy kernels the
    warning names the fused node."""
    import opstrata.graph as og

    fuse_qdq = pytest.importorskip("opstrata.graph.passes.fuse_qdq")
    if not hasattr(fuse_qdq, "fuse_qconv_quantize") or not hasattr(ops, "qconv_quantize"):
        pytest.skip("opstrata-graph < 0.4.24 or opstrata-ops < 0.4.64: no QConvQuantize")
    reference = str(getattr(ops.resolve_kernel("qconv_quantize", np.uint8, "cpu"), "__module__", ""))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", SlowKernelWarning)
        sess = InferenceSession(_qdq_conv_hardswish_quantized())
    if reference.startswith("opstrata.ops"):
        assert any("QConvQuantize x1" in str(w.message) for w in seen)
    assert sess.plan.graph.op_counts().get("ai.opstrata::QConvQuantize") == 1
    monkeypatch.setattr(fuse_qdq, "fuse_qconv_quantize", lambda g: g.copy())
    plain, _ = og.optimize(og.from_onnx(_qdq_conv_hardswish_quantized()), 2)
    assert "QConvQuantize" not in [n.op_type for n in plain.nodes]
    r = np.random.default_rng(2)
    for _ in range(3):
        x = (r.standard_normal((1, 3, 6, 6)) * 2).astype(np.float32)
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], og.run_graph(plain, {"x": x})["y"])
