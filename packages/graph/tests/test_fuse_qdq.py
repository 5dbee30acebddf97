"""fuse_qdq_matmul: QDQ MatMul / Gemm -> ai.opstrata::QMatMul (exact int32 product, scaled once), equal
to the unfused QDQ graph and to onnxruntime; what it must leave alone; constant folding keeps its weights."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

onnx = pytest.importorskip("onnx")

import onnx.helper as oh  # noqa: E402
from onnx import numpy_helper as nh  # noqa: E402

import opstrata.graph as og  # noqa: E402

T = onnx.TensorProto


def _qdq_model(
    k: int,
    n: int,
    *,
    act_dtype: Any = np.uint8,
    per_column: bool = True,
    gemm: bool = False,
    w_zero: bool = False,
    seed: int = 0,
    block: int = 0,
) -> Any:
    """x (float) -> QuantizeLinear -> DequantizeLinear -> MatMul / Gemm(transB, bias) with an int8 weight."""
    rng = np.random.default_rng(seed)
    w = rng.integers(-127, 128, size=(n, k) if gemm else (k, n)).astype(np.int8)
    cols = n if per_column else 1
    w_scale = (rng.random(cols) * 0.02 + 0.005).astype(np.float32).reshape(-1 if per_column else ())
    zp_a = np.array(128 if act_dtype == np.uint8 else 3, act_dtype)
    inits = [
        nh.from_array(np.array(0.05, np.float32), "x_scale"),
        nh.from_array(zp_a, "x_zp"),
        nh.from_array(w, "w_q"),
        nh.from_array(w_scale if not block else np.full((n, k // block) if gemm else (k // block, n), 0.01, np.float32), "w_scale"),
    ]  # fmt: skip
    dq_w_inputs = ["w_q", "w_scale"]
    if w_zero:
        inits.append(nh.from_array(np.zeros(w_scale.shape, np.int8), "w_zp"))
        dq_w_inputs.append("w_zp")
    dq_attrs = {"axis": (0 if gemm else 1)} if per_column else {}
    if block:
        dq_attrs = {"axis": 1 if gemm else 0, "block_size": block}
    nodes = [
        oh.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["x_q"], name="q_x"),
        oh.make_node("DequantizeLinear", ["x_q", "x_scale", "x_zp"], ["x_dq"], name="dq_x"),
        oh.make_node("DequantizeLinear", dq_w_inputs, ["w_dq"], name="dq_w", **dq_attrs),
    ]
    if gemm:
        inits.append(nh.from_array(rng.standard_normal(n).astype(np.float32), "bias"))
        nodes.append(oh.make_node("Gemm", ["x_dq", "w_dq", "bias"], ["y"], name="fc", transB=1))
    else:
        nodes.append(oh.make_node("MatMul", ["x_dq", "w_dq"], ["y"], name="fc"))
    g = oh.make_graph(
        nodes, "qdq", [oh.make_tensor_value_info("x", T.FLOAT, ["batch", k])],
        [oh.make_tensor_value_info("y", T.FLOAT, ["batch", n])], inits,
    )  # fmt: skip
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 21 if block else 17)])


def _ops(graph: og.Graph) -> list[str]:
    return [n.op_type for n in graph.nodes]


def _run(model: Any, level: int, x: np.ndarray) -> np.ndarray:
    g, _ = og.optimize(og.from_onnx(model), level)
    return og.run_graph(g, {"x": x})["y"]


@settings(max_examples=20, deadline=None)
@given(
    k=st.integers(1, 40),
    n=st.integers(1, 24),
    batch=st.integers(1, 5),
    act=st.sampled_from([np.uint8, np.int8]),
    per_column=st.booleans(),
    gemm=st.booleans(),
    w_zero=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_fused_equals_the_qdq_graph(k, n, batch, act, per_column, gemm, w_zero, seed) -> None:
    m = _qdq_model(k, n, act_dtype=act, per_column=per_column, gemm=gemm, w_zero=w_zero, seed=seed)
    fused, report = og.optimize(og.from_onnx(m), 2)
    assert _ops(fused) == ["QuantizeLinear", "QMatMul"] and report.matched("fuse_qdq_matmul") == 1
    x = np.random.default_rng(seed + 1).standard_normal((batch, k)).astype(np.float32)
    want = _run(m, 0, x)
    got = og.run_graph(fused, {"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max())))


def test_fused_matches_onnxruntime() -> None:
    ort = pytest.importorskip("onnxruntime")
    m = _qdq_model(64, 32, gemm=True, seed=3)
    x = np.random.default_rng(4).standard_normal((8, 64)).astype(np.float32)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    np.testing.assert_allclose(_run(m, 2, x), want, rtol=1e-5, atol=1e-5)


def test_fold_keeps_fusable_weight_dq_and_folds_the_rest() -> None:
    """Level 1 keeps a weight DequantizeLinear the extended level fuses (onnxruntime's constant folding
    skips DQ too); a weight-only DQ (float activations) is folded into a float weight."""
    basic, _ = og.optimize(og.from_onnx(_qdq_model(8, 4)), 1)
    assert _ops(basic).count("DequantizeLinear") == 2
    m = _qdq_model(8, 4)
    m.graph.node[3].input[0] = "x"  # MatMul reads the float input: weight-only quantization
    g, _ = og.optimize(og.from_onnx(m), 2)
    assert "QMatMul" not in _ops(g) and "DequantizeLinear" not in _ops(g)


@pytest.mark.parametrize(
    "change",
    ["block", "shared_weight", "per_axis_activation", "gemm_alpha"],
)
def test_patterns_it_leaves_alone(change: str) -> None:
    m = _qdq_model(8, 4, gemm=change == "gemm_alpha", block=4 if change == "block" else 0)
    if change == "shared_weight":  # the dequantized weight is also a graph output: it must stay float
        m.graph.output.append(oh.make_tensor_value_info("w_dq", T.FLOAT, [8, 4]))
    if change == "per_axis_activation":
        m.graph.initializer[0].CopyFrom(nh.from_array(np.full(8, 0.05, np.float32), "x_scale"))
        m.graph.initializer[1].CopyFrom(nh.from_array(np.full(8, 128, np.uint8), "x_zp"))
        for node in m.graph.node[:2]:
            node.attribute.append(oh.make_attribute("axis", 1))
    if change == "gemm_alpha":
        m.graph.node[3].attribute.append(oh.make_attribute("alpha", 0.5))
    g, _ = og.optimize(og.from_onnx(m), 2)
    assert "QMatMul" not in _ops(g)
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    np.testing.assert_allclose(og.run_graph(g, {"x": x})["y"], _run(m, 0, x), rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------- fuse_dynamic_qmatmul


def _dynamic_model(
    k: int,
    n: int,
    *,
    consumers: int = 1,
    bias: bool = True,
    w_zp: bool = True,
    per_column: bool = True,
    signed: bool = True,
    seed: int = 0,
) -> Any:
    """x -> DynamicQuantizeLinear -> ``consumers`` x (MatMulInteger -> Cast -> Mul(x_scale * w_scale) [-> Add])
    -> Concat, as onnxruntime's and opstrata.quant's quantize_dynamic write it."""
    rng = np.random.default_rng(seed)
    dt = np.int8 if signed else np.uint8
    info = np.iinfo(dt)
    nodes = [oh.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], name="dql")]
    inits, outs = [], []
    for c in range(consumers):
        w = rng.integers(info.min, info.max + 1, (k, n)).astype(dt)
        ws = (rng.random(n if per_column else ()) * 0.02 + 0.005).astype(np.float32)
        inits += [nh.from_array(w, f"w{c}"), nh.from_array(ws, f"ws{c}")]
        mi_in = ["xq", f"w{c}", "xz"]
        if w_zp:
            inits.append(
                nh.from_array(
                    rng.integers(info.min, info.max + 1, n if per_column else ()).astype(dt), f"wz{c}"
                )
            )
            mi_in.append(f"wz{c}")
        nodes += [
            oh.make_node("MatMulInteger", mi_in, [f"acc{c}"], name=f"mm{c}"),
            oh.make_node("Cast", [f"acc{c}"], [f"accf{c}"], to=T.FLOAT, name=f"cast{c}"),
            oh.make_node("Mul", ["xs", f"ws{c}"], [f"s{c}"], name=f"scale{c}"),
            oh.make_node("Mul", [f"accf{c}", f"s{c}"], [f"y{c}"], name=f"mul{c}"),
        ]
        out = f"y{c}"
        if bias:
            inits.append(nh.from_array(rng.standard_normal(n).astype(np.float32), f"b{c}"))
            nodes.append(oh.make_node("Add", [out, f"b{c}"], [f"yb{c}"], name=f"add{c}"))
            out = f"yb{c}"
        outs.append(out)
    nodes.append(oh.make_node("Concat", outs, ["y"], axis=-1, name="cat"))
    g = oh.make_graph(
        nodes, "dyn", [oh.make_tensor_value_info("x", T.FLOAT, ["batch", k])],
        [oh.make_tensor_value_info("y", T.FLOAT, ["batch", n * consumers])], inits,
    )  # fmt: skip
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])


@settings(max_examples=20, deadline=None)
@given(
    k=st.integers(1, 48), n=st.integers(1, 24), batch=st.integers(1, 6), consumers=st.integers(1, 3),
    bias=st.booleans(), w_zp=st.booleans(), per_column=st.booleans(), signed=st.booleans(),
    seed=st.integers(0, 2**16),
)  # fmt: skip
def test_dynamic_fused_equals_the_unfused_graph(
    k, n, batch, consumers, bias, w_zp, per_column, signed, seed
) -> None:
    m = _dynamic_model(k, n, consumers=consumers, bias=bias, w_zp=w_zp, per_column=per_column, signed=signed,
                       seed=seed)  # fmt: skip
    fused, report = og.optimize(og.from_onnx(m), 2)
    assert _ops(fused) == ["DynamicQMatMul"] * consumers + [
        "Concat"
    ]  # the shared DQL and scale Muls are gone
    assert report.matched("fuse_dynamic_qmatmul") == consumers
    x = (np.random.default_rng(seed + 1).standard_normal((batch, k)) * 3).astype(np.float32)
    want = _run(m, 0, x)
    got = og.run_graph(fused, {"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max())))
    inner = fused.resolve_fused("acc0")  # provenance: the int32 product now lives inside the fused node
    assert inner in {o for node in fused.nodes for o in node.outputs}


def test_dynamic_fused_matches_onnxruntime() -> None:
    ort = pytest.importorskip("onnxruntime")
    m = _dynamic_model(32, 16, consumers=2)
    x = (np.random.default_rng(5).standard_normal((4, 32)) * 2).astype(np.float32)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(_run(m, 2, x), sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("change", ["scale_from_input", "scale_not_from_x", "two_readers", "no_x_zero_point"])
def test_dynamic_patterns_it_leaves_alone(change: str) -> None:
    m = _dynamic_model(8, 4, consumers=1, bias=False)
    g = m.graph
    if change == "scale_from_input":  # the weight scale is not a constant
        g.input.append(oh.make_tensor_value_info("ws0_in", T.FLOAT, []))
        g.node[3].input[1] = "ws0_in"
    elif change == "scale_not_from_x":  # Mul(w_scale, w_scale): not x's dynamic scale
        g.node[3].input[0] = "ws0"
    elif change == "two_readers":  # the int32 product is also a graph output
        g.output.append(oh.make_tensor_value_info("acc0", T.INT32, None))
    else:
        del g.node[1].input[2]
    fused, report = og.optimize(og.from_onnx(m), 2)
    assert report.matched("fuse_dynamic_qmatmul") == 0 and "DynamicQMatMul" not in _ops(fused)


# --------------------------------------------------------------------------- QDQ Conv -> QConv


def _qdq_conv_model(
    c: int, oc: int, k: int, *, groups: int = 1, stride: int = 1, pad: int = 0, dilation: int = 1,
    act_dtype: Any = np.uint8, per_channel: bool = True, bias: bool = True, seed: int = 0,
    auto_pad: str | None = None,
) -> Any:  # fmt: skip
    """x (N, C, H, W) float -> QuantizeLinear -> DequantizeLinear -> Conv(DQ(int8 weight)[, bias])."""
    rng = np.random.default_rng(seed)
    w = rng.integers(-127, 128, size=(oc, c // groups, k, k)).astype(np.int8)
    w_scale = (rng.random(oc if per_channel else 1) * 0.02 + 0.005).astype(np.float32)
    inits = [
        nh.from_array(np.array(0.05, np.float32), "x_scale"),
        nh.from_array(np.array(128 if act_dtype == np.uint8 else 3, act_dtype), "x_zp"),
        nh.from_array(w, "w_q"),
        nh.from_array(w_scale if per_channel else w_scale.reshape(()), "w_scale"),
    ]
    conv_in = ["x_dq", "w_dq"]
    if bias:
        inits.append(nh.from_array(rng.standard_normal(oc).astype(np.float32), "bias"))
        conv_in.append("bias")
    attrs: dict[str, Any] = {"group": groups, "strides": [stride, stride], "dilations": [dilation, dilation]}
    if auto_pad:
        attrs["auto_pad"] = auto_pad
    else:
        attrs["pads"] = [pad] * 4
    nodes = [
        oh.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["x_q"], name="q_x"),
        oh.make_node("DequantizeLinear", ["x_q", "x_scale", "x_zp"], ["x_dq"], name="dq_x"),
        oh.make_node("DequantizeLinear", ["w_q", "w_scale"], ["w_dq"], name="dq_w", **({"axis": 0} if per_channel else {})),
        oh.make_node("Conv", conv_in, ["y"], name="conv", **attrs),
    ]  # fmt: skip
    g = oh.make_graph(
        nodes, "qdq_conv", [oh.make_tensor_value_info("x", T.FLOAT, ["n", c, "h", "w"])],
        [oh.make_tensor_value_info("y", T.FLOAT, None)], inits,
    )  # fmt: skip
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])


@settings(max_examples=20, deadline=None)
@given(
    c=st.sampled_from([1, 3, 4, 8]), mult=st.integers(1, 3), k=st.integers(1, 3), depthwise=st.booleans(),
    stride=st.integers(1, 2), pad=st.integers(0, 1), act=st.sampled_from([np.uint8, np.int8]),
    per_channel=st.booleans(), bias=st.booleans(), seed=st.integers(0, 2**16),
)  # fmt: skip
def test_conv_fused_equals_the_qdq_graph(
    c, mult, k, depthwise, stride, pad, act, per_channel, bias, seed
) -> None:
    groups = c if depthwise else 1
    m = _qdq_conv_model(c, c * mult, k, groups=groups, stride=stride, pad=pad, act_dtype=act,
                        per_channel=per_channel, bias=bias, seed=seed)  # fmt: skip
    fused, report = og.optimize(og.from_onnx(m), 2)
    assert _ops(fused) == ["QuantizeLinear", "QConv"] and report.matched("fuse_qdq_conv") == 1
    x = np.random.default_rng(seed + 1).standard_normal((2, c, 6, 5)).astype(np.float32)
    want = _run(m, 0, x)
    got = og.run_graph(fused, {"x": x})["y"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max())))


def test_conv_fused_matches_onnxruntime() -> None:
    ort = pytest.importorskip("onnxruntime")
    m = _qdq_conv_model(8, 16, 3, pad=1, seed=5)
    x = np.random.default_rng(6).standard_normal((2, 8, 9, 9)).astype(np.float32)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    np.testing.assert_allclose(_run(m, 2, x), want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("change", ["auto_pad", "float_activation", "per_axis_activation", "shared_weight"])
def test_conv_patterns_it_leaves_alone(change: str) -> None:
    m = _qdq_conv_model(4, 8, 3, auto_pad="SAME_UPPER" if change == "auto_pad" else None)
    if change == "float_activation":  # weight-only: the DQ'd weight is folded, the Conv stays float
        m.graph.node[3].input[0] = "x"
    if change == "per_axis_activation":
        m.graph.initializer[0].CopyFrom(nh.from_array(np.full(4, 0.05, np.float32), "x_scale"))
        m.graph.initializer[1].CopyFrom(nh.from_array(np.full(4, 128, np.uint8), "x_zp"))
        for node in m.graph.node[:2]:
            node.attribute.append(oh.make_attribute("axis", 1))
    if change == "shared_weight":
        m.graph.output.append(oh.make_tensor_value_info("w_dq", T.FLOAT, None))
    g, _ = og.optimize(og.from_onnx(m), 2)
    assert "QConv" not in _ops(g) and "Conv" in _ops(g)


# --------------------------------------------------------------------------- QConv -> act -> Q: QConvQuantize


def _qconv_quantize_model(
    activation: str, *, out_dtype: Any = np.uint8, depthwise: bool = False, y_scale: float = 0.04, seed: int = 0
) -> Any:  # fmt: skip
    """The QDQ Conv of :func:`_qdq_conv_model`, then [Relu | HardSwish] -> QuantizeLinear -> DequantizeLinear."""
    m = _qdq_conv_model(4, 4 if depthwise else 8, 3, groups=4 if depthwise else 1, pad=1, seed=seed)
    g = m.graph
    g.output[0].name = "y"
    g.node[-1].output[0] = "conv_y"
    src = "conv_y"
    if activation == "Clip":  # Relu6, bounds as constant inputs (opset 11 on)
        g.initializer.extend(
            [nh.from_array(np.array(0.0, np.float32), "lo"), nh.from_array(np.array(6.0, np.float32), "hi")]
        )
        g.node.append(oh.make_node("Clip", ["conv_y", "lo", "hi"], ["act_y"], name="act"))
        src = "act_y"
    elif activation != "none":
        g.node.append(oh.make_node(activation, ["conv_y"], ["act_y"], name="act"))
        src = "act_y"
    zp = 128 if out_dtype == np.uint8 else -5
    g.initializer.extend([nh.from_array(np.array(y_scale, np.float32), "y_scale"),
                          nh.from_array(np.array(zp, out_dtype), "y_zp")])  # fmt: skip
    g.node.extend([
        oh.make_node("QuantizeLinear", [src, "y_scale", "y_zp"], ["y_q"], name="q_y"),
        oh.make_node("DequantizeLinear", ["y_q", "y_scale", "y_zp"], ["y"], name="dq_y"),
    ])  # fmt: skip
    return m


def _with_residual(m: Any, *, first: bool, shape: list[Any] | None = None) -> Any:
    """An Add of a second float input ``r`` onto the convolution's result, before the rest (``first``: r on
    the left). ``shape``: r's declared shape (default: the result's)."""
    g = m.graph
    conv = next(n for n in g.node if n.op_type == "Conv")
    conv.output[0] = "conv_raw"
    g.node.insert(list(g.node).index(conv) + 1, oh.make_node(
        "Add", ["r", "conv_raw"] if first else ["conv_raw", "r"], ["conv_y"], name="residual"))  # fmt: skip
    g.input.append(oh.make_tensor_value_info("r", T.FLOAT, shape or ["n", 8, "h", "w"]))
    return m


def _without_qconv_quantize(monkeypatch: Any) -> None:
    from opstrata.graph.passes import fuse_qdq

    monkeypatch.setattr(fuse_qdq, "fuse_qconv_quantize", lambda g: g.copy())


@pytest.mark.parametrize("activation", ["none", "Relu", "HardSwish", "Clip"])
@pytest.mark.parametrize("out_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("depthwise", [False, True])
def test_qconv_quantize_gives_the_unfused_codes(activation, out_dtype, depthwise, monkeypatch) -> None:
    """QConv -> [Relu | HardSwish | Clip(0, 6)] -> QuantizeLinear becomes one QConvQuantize with the same
    codes (the float result never written); the pass report counts it."""
    m = _qconv_quantize_model(activation, out_dtype=out_dtype, depthwise=depthwise)
    fused, report = og.optimize(og.from_onnx(m), 2)
    assert _ops(fused) == ["QuantizeLinear", "QConvQuantize", "DequantizeLinear"]
    assert report.matched("fuse_qconv_quantize") == 1
    node = fused.nodes[1]
    assert (
        node.attrs["activation"]
        == {"none": "none", "Relu": "relu", "HardSwish": "hardswish", "Clip": "clip"}[activation]
    )
    if activation == "Clip":
        assert (node.attrs["alpha"], node.attrs["beta"]) == (0.0, 6.0)
    x = (np.random.default_rng(3).standard_normal((2, 4, 7, 6)) * 3).astype(np.float32)
    got = og.run_graph(fused, {"x": x})["y"]
    _without_qconv_quantize(monkeypatch)
    plain, _ = og.optimize(og.from_onnx(m), 2)
    assert "QConvQuantize" not in _ops(plain) and "QConv" in _ops(plain)
    np.testing.assert_array_equal(got, og.run_graph(plain, {"x": x})["y"])


@pytest.mark.parametrize("first", [False, True])
@pytest.mark.parametrize("activation", ["none", "Relu", "HardSwish"])
def test_qconv_quantize_takes_a_residual_add(first, activation, monkeypatch) -> None:
    """QConv -> Add(r) -> [act] -> QuantizeLinear (a residual connection, r either side of the Add): one
    QConvQuantize with r as its seventh input, the same codes; a broadcast r stays a separate Add."""
    m = _with_residual(_qconv_quantize_model(activation), first=first)
    fused, report = og.optimize(og.from_onnx(m), 2)
    assert _ops(fused) == ["QuantizeLinear", "QConvQuantize", "DequantizeLinear"]
    assert fused.nodes[1].inputs[6] == "r" and report.matched("fuse_qconv_quantize") == 1
    rng = np.random.default_rng(5)
    feeds = {"x": (rng.standard_normal((2, 4, 7, 6)) * 3).astype(np.float32),
             "r": rng.standard_normal((2, 8, 7, 6)).astype(np.float32)}  # fmt: skip
    got = og.run_graph(fused, feeds)["y"]
    _without_qconv_quantize(monkeypatch)
    plain, _ = og.optimize(og.from_onnx(m), 2)
    assert "Add" in _ops(plain)
    np.testing.assert_array_equal(got, og.run_graph(plain, feeds)["y"])
    monkeypatch.undo()
    bcast = _with_residual(_qconv_quantize_model(activation), first=first, shape=[1, 8, 1, 1])
    g, _ = og.optimize(og.from_onnx(bcast), 2)
    assert "Add" in _ops(g) and "QConvQuantize" not in _ops(g)


def test_qconv_quantize_matches_onnxruntime() -> None:
    ort = pytest.importorskip("onnxruntime")
    m = _qconv_quantize_model("HardSwish", y_scale=0.05, seed=4)
    x = (np.random.default_rng(8).standard_normal((2, 4, 9, 9)) * 2).astype(np.float32)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    got = _run(m, 2, x)
    assert np.abs(got - want).max() <= 0.05 + 1e-6  # one quantization step (float conv vs exact int32)
    assert np.mean(got == want) > 0.95


@pytest.mark.parametrize("change", ["conv_read_twice", "act_read_twice", "per_axis_output", "leaky_relu",
                                    "fed_output_scale", "no_output_zero_point", "fed_clip_bound"])  # fmt: skip
def test_qconv_quantize_patterns_it_leaves_alone(change: str) -> None:
    kind = {"conv_read_twice": "none", "per_axis_output": "none", "fed_clip_bound": "Clip"}.get(
        change, "Relu"
    )
    m = _qconv_quantize_model(kind)
    g = m.graph
    if change == "fed_clip_bound":  # a bound the graph computes: not a constant
        i = next(i for i, t in enumerate(g.initializer) if t.name == "hi")
        del g.initializer[i]
        g.input.append(oh.make_tensor_value_info("hi", T.FLOAT, []))
    if change == "conv_read_twice":
        g.output.append(oh.make_tensor_value_info("conv_y", T.FLOAT, None))
    if change == "act_read_twice":
        g.output.append(oh.make_tensor_value_info("act_y", T.FLOAT, None))
    if change == "per_axis_output":
        for i, init in enumerate(g.initializer):
            if init.name in ("y_scale", "y_zp"):
                arr = nh.to_array(init)
                g.initializer[i].CopyFrom(nh.from_array(np.full(8, arr, arr.dtype), init.name))
        for node in g.node[-2:]:
            node.attribute.append(oh.make_attribute("axis", 1))
    if change == "leaky_relu":
        next(n for n in g.node if n.name == "act").op_type = "LeakyRelu"
    if change == "fed_output_scale":  # a scale the graph does not hold as a constant
        i = next(i for i, t in enumerate(g.initializer) if t.name == "y_scale")
        del g.initializer[i]
        g.input.append(oh.make_tensor_value_info("y_scale", T.FLOAT, []))
    if change == "no_output_zero_point":
        for node in g.node[-2:]:
            del node.input[2]
    fused, report = og.optimize(og.from_onnx(m), 2)
    assert "QConvQuantize" not in _ops(fused) and "QConv" in _ops(fused)
    assert report.matched("fuse_qconv_quantize") == 0


# --------------------------------------------------------------------------- per-token dynamic quantization


def _token_model(
    k: int, n: int, *, eps: float | None = None, bias: bool = True, opset: int = 18, seed: int = 0
) -> Any:
    """x -> symmetric int8 per row (Abs, ReduceMax, Div 127, Max eps, Div, Round, Clip, Cast) ->
    MatMulInteger(int8 W) -> Cast -> Mul(s) -> Mul(W_scale) [-> Add(bias)], as opstrata.quant writes it."""
    rng = np.random.default_rng(seed)
    tiny = float(np.finfo(np.float32).tiny) if eps is None else eps
    inits = [
        nh.from_array(np.array(127, np.float32), "c127"), nh.from_array(np.array(-127, np.float32), "cm127"),
        nh.from_array(np.array(tiny, np.float32), "tiny"),
        nh.from_array(rng.integers(-127, 128, (k, n)).astype(np.int8), "w_q"),
        nh.from_array((rng.random(n) * 0.02 + 0.005).astype(np.float32), "w_scale"),
    ]  # fmt: skip
    red = (oh.make_node("ReduceMax", ["a", "axes"], ["amax"], keepdims=1) if opset >= 18
           else oh.make_node("ReduceMax", ["a"], ["amax"], axes=[-1], keepdims=1))  # fmt: skip
    if opset >= 18:
        inits.append(nh.from_array(np.array([-1], np.int64), "axes"))
    nodes = [
        oh.make_node("Abs", ["x"], ["a"]), red, oh.make_node("Div", ["amax", "c127"], ["t"]),
        oh.make_node("Max", ["t", "tiny"], ["s"]), oh.make_node("Div", ["x", "s"], ["xs"]),
        oh.make_node("Round", ["xs"], ["xr"]), oh.make_node("Clip", ["xr", "cm127", "c127"], ["xc"]),
        oh.make_node("Cast", ["xc"], ["xq"], to=T.INT8), oh.make_node("MatMulInteger", ["xq", "w_q"], ["acc"]),
        oh.make_node("Cast", ["acc"], ["accf"], to=T.FLOAT), oh.make_node("Mul", ["accf", "s"], ["ys"]),
        oh.make_node("Mul", ["ys", "w_scale"], ["y" if not bias else "yw"]),
    ]  # fmt: skip
    if bias:
        inits.append(nh.from_array(rng.standard_normal(n).astype(np.float32), "bias"))
        nodes.append(oh.make_node("Add", ["yw", "bias"], ["y"]))
    g = oh.make_graph(
        nodes, "token", [oh.make_tensor_value_info("x", T.FLOAT, ["batch", "seq", k])],
        [oh.make_tensor_value_info("y", T.FLOAT, ["batch", "seq", n])], inits,
    )  # fmt: skip
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", opset)])


@settings(max_examples=15, deadline=None)
@given(k=st.integers(1, 40), n=st.integers(1, 20), bias=st.booleans(), opset=st.sampled_from([13, 18]),
       seed=st.integers(0, 2**16))  # fmt: skip
def test_token_fused_equals_the_unfused_graph(k, n, bias, opset, seed) -> None:
    m = _token_model(k, n, bias=bias, opset=opset, seed=seed)
    fused, _ = og.optimize(og.from_onnx(m), 2)
    assert _ops(fused) == ["DynamicQMatMul"] and fused.nodes[0].attrs.get("per_token") == 1
    r = np.random.default_rng(seed + 1)
    x = (r.standard_normal((2, 3, k)) * r.uniform(0.01, 50, (2, 3, 1))).astype(np.float32)
    x[0, 0] = 0.0  # an all-zero row: the scale floor
    want = _run(m, 0, x)
    got = og.run_graph(fused, {"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max())))


def test_token_form_matches_onnxruntime() -> None:
    ort = pytest.importorskip("onnxruntime")
    m = _token_model(32, 16, seed=7)
    x = np.random.default_rng(8).standard_normal((2, 5, 32)).astype(np.float32)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    np.testing.assert_allclose(_run(m, 2, x), want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def test_token_form_with_another_epsilon_is_left_alone() -> None:
    """The fused kernel floors the scale at float32's smallest normal; another floor stays unfused."""
    g, _ = og.optimize(og.from_onnx(_token_model(8, 4, eps=1e-8)), 2)
    assert "DynamicQMatMul" not in _ops(g) and "MatMulInteger" in _ops(g)


# --------------------------------------------------------------------------- weight-only: DequantMatMul


def _wonly_model(
    k: int, n: int, *, dtype: Any = np.int8, layout: str = "column", zp: bool = False, seed: int = 0
) -> Any:
    """x (float) -> MatMul(x, DequantizeLinear(W_q)) with W_q int8/uint8/int4/uint4 per tensor, column or block."""
    rng = np.random.default_rng(seed)
    lo, hi = {"int8": (-128, 128), "uint8": (0, 256), "int4": (-8, 8), "uint4": (0, 16)}[np.dtype(dtype).name]
    w = rng.integers(lo, hi, (k, n)).astype(dtype)
    attrs: dict[str, Any] = {}
    if layout == "block":
        shape: tuple[int, ...] = (-(-k // 16), n)
        attrs = {"axis": 0, "block_size": 16}
    else:
        shape = (n,) if layout == "column" else ()
        attrs = {"axis": 1} if layout == "column" else {}
    scale = (rng.random(shape) * 0.05 + 0.01).astype(np.float32)
    inits = [nh.from_array(w, "w_q") if np.dtype(dtype).name not in ("int4", "uint4") else
             oh.make_tensor("w_q", T.INT4 if np.dtype(dtype).name == "int4" else T.UINT4, w.shape,
                            w.astype(np.int8).ravel().tolist()),
             nh.from_array(scale, "w_scale")]  # fmt: skip
    dq_in = ["w_q", "w_scale"]
    if zp:
        z = rng.integers(lo, hi, shape).astype(dtype)
        inits.append(nh.from_array(z, "w_zp") if np.dtype(dtype).name not in ("int4", "uint4") else
                     oh.make_tensor("w_zp", T.INT4 if np.dtype(dtype).name == "int4" else T.UINT4, z.shape,
                                    np.asarray(z).astype(np.int8).ravel().tolist()))  # fmt: skip
        dq_in.append("w_zp")
    nodes = [
        oh.make_node("DequantizeLinear", dq_in, ["w"], **attrs),
        oh.make_node("MatMul", ["x", "w"], ["y"]),
    ]
    g = oh.make_graph(
        nodes, "wonly", [oh.make_tensor_value_info("x", T.FLOAT, ["batch", k])],
        [oh.make_tensor_value_info("y", T.FLOAT, ["batch", n])], inits,
    )  # fmt: skip
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 21)])


@settings(max_examples=20, deadline=None)
@given(
    k=st.integers(1, 40), n=st.integers(1, 24), dtype=st.sampled_from(["int8", "uint8", "int4", "uint4"]),
    layout=st.sampled_from(["tensor", "column", "block"]), zp=st.booleans(), seed=st.integers(0, 2**16),
)  # fmt: skip
def test_weight_only_fused_equals_the_unfused_graph(k, n, dtype, layout, zp, seed) -> None:
    import ml_dtypes

    dt = {"int8": np.int8, "uint8": np.uint8, "int4": ml_dtypes.int4, "uint4": ml_dtypes.uint4}[dtype]
    m = _wonly_model(k, n, dtype=dt, layout=layout, zp=zp, seed=seed)
    fused, report = og.optimize(og.from_onnx(m), 2)
    assert _ops(fused) == ["DequantMatMul"] and report.matched("fuse_dequant_matmul") == 1
    basic, _ = og.optimize(og.from_onnx(m), 1)
    assert "DequantizeLinear" in _ops(basic)  # constant folding keeps the weight quantized
    x = np.random.default_rng(seed + 1).standard_normal((3, k)).astype(np.float32)
    want = _run(m, 0, x)
    got = og.run_graph(fused, {"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max())))


def test_weight_only_dq_read_elsewhere_is_folded_not_fused() -> None:
    m = _wonly_model(8, 4)
    m.graph.output.append(oh.make_tensor_value_info("w", T.FLOAT, None))  # the float weight is an output
    g, _ = og.optimize(og.from_onnx(m), 2)
    assert "DequantMatMul" not in _ops(g)


def _relu_quantize_model(zp: Any, scale: Any, *, relu_also_output: bool = False) -> Any:
    """x -> Relu -> QuantizeLinear(scale, zp) -> y (codes)."""
    inits = [nh.from_array(np.asarray(scale, np.float32), "s")]
    q_in = ["r", "s"]
    if zp is not None:
        inits.append(nh.from_array(np.asarray(zp), "zp"))
        q_in.append("zp")
    zdt = np.asarray(zp).dtype if zp is not None else np.dtype(np.uint8)
    outs = [oh.make_tensor_value_info("y", oh.np_dtype_to_tensor_dtype(zdt), None)]
    if relu_also_output:
        outs.append(oh.make_tensor_value_info("r", T.FLOAT, None))
    g = oh.make_graph(
        [oh.make_node("Relu", ["x"], ["r"], name="relu"), oh.make_node("QuantizeLinear", q_in, ["y"], name="q")],
        "relu_q", [oh.make_tensor_value_info("x", T.FLOAT, ["n", 4])], outs, inits,
    )  # fmt: skip
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])


_SPECIALS = np.array([[np.nan, -np.inf, np.inf, -0.0], [0.0, -1e-30, 1e30, -1e30]], np.float32)


@settings(max_examples=25, deadline=None)
@given(
    zp=st.sampled_from([np.uint8(0), np.int8(-128), None, np.zeros(1, np.uint8)]),
    scale=st.floats(0.0001220703125, 8.0, width=32), seed=st.integers(0, 2**16),
)  # fmt: skip
def test_relu_before_quantize_with_the_lowest_zero_point_is_dropped_with_equal_codes(zp, scale, seed) -> None:
    m = _relu_quantize_model(zp, scale)
    fused, report = og.optimize(og.from_onnx(m), 2)
    assert _ops(fused) == ["QuantizeLinear"] and report.matched("drop_relu_before_quantize") == 1
    x = np.random.default_rng(seed).standard_normal((6, 4)).astype(np.float32) * np.float32(scale * 300)
    x = np.concatenate([x, _SPECIALS])
    want = _run(m, 0, x)
    got = og.run_graph(fused, {"x": x})["y"]
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("zp", "scale", "also_output"),
    [
        (np.uint8(3), 0.1, False),  # a zero point above the lowest code: Relu's zeros are not saturation's
        (np.int8(0), 0.1, False),
        (np.uint8(0), -0.1, False),  # a negative scale flips the order
        (np.uint8(0), 0.1, True),  # the Relu's output is read elsewhere
    ],
)
def test_relu_before_quantize_stays_where_dropping_it_would_change_results(zp, scale, also_output) -> None:
    m = _relu_quantize_model(zp, scale, relu_also_output=also_output)
    fused, report = og.optimize(og.from_onnx(m), 2)
    assert _ops(fused) == ["Relu", "QuantizeLinear"] and report.matched("drop_relu_before_quantize") == 0


def _relu_pool_quantize_model(zp: Any, *, indices: bool = False, pool_also_output: bool = False) -> Any:
    """x (N, 2, 7, 7) -> Relu -> MaxPool(3x3, stride 2, pads 1) -> QuantizeLinear -> y (a CNN stem's tail)."""
    inits = [nh.from_array(np.asarray(0.05, np.float32), "s"), nh.from_array(np.asarray(zp), "zp")]
    pool_out = ["p", "i"] if indices else ["p"]
    nodes = [
        oh.make_node("Relu", ["x"], ["r"], name="relu"),
        oh.make_node(
            "MaxPool", ["r"], pool_out, name="pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]
        ),
        oh.make_node("QuantizeLinear", ["p", "s", "zp"], ["y"], name="q"),
    ]
    outs = [oh.make_tensor_value_info("y", oh.np_dtype_to_tensor_dtype(np.asarray(zp).dtype), None)]
    if indices:
        outs.append(oh.make_tensor_value_info("i", T.INT64, None))
    if pool_also_output:
        outs.append(oh.make_tensor_value_info("p", T.FLOAT, None))
    g = oh.make_graph(
        nodes, "relu_pool_q", [oh.make_tensor_value_info("x", T.FLOAT, ["n", 2, 7, 7])], outs, inits
    )
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])


@settings(max_examples=20, deadline=None)
@given(zp=st.sampled_from([np.uint8(0), np.int8(-128)]), seed=st.integers(0, 2**16))
def test_relu_before_maxpool_and_a_saturating_quantize_is_dropped_with_equal_codes(zp, seed) -> None:
    m = _relu_pool_quantize_model(zp)
    fused, report = og.optimize(og.from_onnx(m), 2)
    assert _ops(fused) == ["MaxPool", "QuantizeLinear"] and report.matched("drop_relu_before_quantize") == 1
    x = np.random.default_rng(seed).standard_normal((3, 2, 7, 7)).astype(np.float32) * 10
    x[0, 0, :3, :3] = -np.inf  # a window of -inf and padding only
    x[1, 1, 2, 2], x[1, 1, 4, 4], x[2, 0, 0, 0] = np.nan, -0.0, np.inf
    x[2, 1] = -np.abs(x[2, 1])  # a plane with no positive value
    want = _run(m, 0, x)
    np.testing.assert_array_equal(og.run_graph(fused, {"x": x})["y"], want)


@pytest.mark.parametrize(("zp", "indices", "also"), [(np.uint8(5), False, False), (np.uint8(0), True, False),
                                                     (np.uint8(0), False, True)])  # fmt: skip
def test_relu_before_maxpool_stays_where_dropping_it_would_change_results(zp, indices, also) -> None:
    """A zero point above the lowest code, a MaxPool with Indices, or the pooled floats read elsewhere."""
    fused, report = og.optimize(
        og.from_onnx(_relu_pool_quantize_model(zp, indices=indices, pool_also_output=also)), 2
    )
    assert "Relu" in _ops(fused) and report.matched("drop_relu_before_quantize") == 0
