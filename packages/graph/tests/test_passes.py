"""Unit tests of each optimisation pass on small hand-built graphs: the rewrite happens, numerics hold."""

from __future__ import annotations

import math

import numpy as np
import pytest

import opstrata.graph as og
from opstrata.graph.testing import ModelBuilder, ort_run

pytest.importorskip("onnx")

RNG = np.random.default_rng(0)


def _check(model, pass_fn, feeds, *, expect_added=None, expect_removed=None):
    """Apply ``pass_fn``; run_graph and the onnxruntime export must agree with the original."""
    g = og.from_onnx(model)
    h = pass_fn(g)
    assert h is not g
    og.infer_shapes(h)
    h.validate()
    ref = ort_run(model, feeds)
    got = og.run_graph(h, feeds)
    exported = ort_run(og.to_onnx(h), feeds)
    for k in ref:
        np.testing.assert_allclose(got[k], ref[k], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(exported[k], ref[k], rtol=1e-4, atol=1e-5)
    counts = h.op_counts()
    for op, n in (expect_added or {}).items():
        assert counts.get(op, 0) == n, (op, counts)
    for op in expect_removed or ():
        assert op not in counts, (op, counts)
    return g, h


def _x(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# --------------------------------------------------------------------------- level 1


def test_fold_constants_computes_constant_subgraphs():
    b = ModelBuilder("fold")
    x = b.input("x", ["batch", 4])
    w = b.op("Transpose", [b.weight([4, 4])], perm=[1, 0])
    c = b.op("Add", [b.op("Neg", [b.weight([4])]), b.scalar(1.0)])
    b.nodes.append(b.onnx.helper.make_node("Add", [b.op("MatMul", [x, w]), c], ["y"]))
    b.output("y")
    _, h = _check(b.build(), og.fold_constants, {"x": _x(3, 4)}, expect_removed=["Transpose", "Neg"])
    assert h.op_counts() == {"MatMul": 1, "Add": 1}


def test_fold_error_names_the_node_and_keeps_the_kernels_own_fix_once():
    """A node that fails on its constants fails at fold time, with the ops kernel's specific fix."""
    g = og.Graph("bad_fold")
    g.add_initializer("q", np.array([1, 2], np.int64))  # DequantizeLinear takes no int64
    g.add_initializer("s", np.array(0.5, np.float32))
    g.add_node("DequantizeLinear", ["q", "s"], ["y"], name="dq")
    g.outputs.append("y")
    with pytest.raises(og.GraphError) as info:
        og.fold_constants(g)
    text = str(info.value)
    assert "node 'dq' (DequantizeLinear)" in text and "got int64" in text
    assert text.count("Fix:") == 1 and "cast 'x' first" in text


def test_fold_constants_keeps_blowups_symbolic():
    g = og.Graph("big")
    g.add_initializer("shape", np.array([4096, 4096], np.int64))
    g.add_node("ConstantOfShape", ["shape"], ["y"], {"value": np.ones(1, np.float32)})
    g.outputs.append("y")
    assert len(og.fold_constants(g)) == 1  # 64 MiB from 16 bytes: not folded


def test_fold_shapes_rewrites_symbolic_reshape_targets():
    b = ModelBuilder("heads")
    x = b.input("x", ["batch", "seq", 8])
    shape = b.op("Shape", [x])
    bs = b.op("Gather", [shape, b.ints([0, 1])], axis=0)
    t = b.op("Concat", [bs, b.ints([2, 4])], axis=0)
    b.nodes.append(b.onnx.helper.make_node("Reshape", [x, t], ["y"]))
    b.output("y")
    g = og.from_onnx(b.build())
    h = og.eliminate_dead_code(og.fold_shapes(g))
    assert h.op_counts() == {"Reshape": 1}
    assert h.initializers[h.nodes[0].inputs[1]].tolist() == [0, 0, 2, 4]
    _check(b.build(), lambda g: og.eliminate_dead_code(og.fold_shapes(g)), {"x": _x(2, 3, 8)})


def test_fold_shapes_makes_static_shapes_constants():
    b = ModelBuilder("static")
    x = b.input("x", [2, 6])
    b.nodes.append(
        b.onnx.helper.make_node("Reshape", [x, b.op("Shape", [b.op("Transpose", [x], perm=[1, 0])])], ["y"])
    )
    b.output("y")
    _, h = _check(b.build(), lambda g: og.eliminate_dead_code(og.fold_shapes(g)), {"x": _x(2, 6)})
    assert "Shape" not in h.op_counts()


def test_remove_identities_keeps_output_names():
    b = ModelBuilder("ident")
    x = b.input("x", [3])
    r = b.op("Relu", [b.op("Identity", [x])])
    b.nodes.append(b.onnx.helper.make_node("Identity", [r], ["y"]))
    b.output("y")
    _, h = _check(b.build(), og.remove_identities, {"x": _x(3)}, expect_removed=["Identity"])
    assert h.outputs == ["y"] and h.nodes[0].outputs == ["y"]


def test_cse_merges_duplicates_and_equal_constants():
    b = ModelBuilder("cse")
    x = b.input("x", ["batch", 4])
    a1 = b.op("Add", [b.op("Exp", [x]), b.scalar(1.0)])
    a2 = b.op("Add", [b.op("Exp", [x]), b.scalar(1.0)])  # a different but equal constant
    b.nodes.append(b.onnx.helper.make_node("Mul", [a1, a2], ["y"]))
    b.output("y")
    _, h = _check(b.build(), og.eliminate_common_subexpressions, {"x": _x(2, 4)})
    assert h.op_counts() == {"Exp": 1, "Add": 1, "Mul": 1}


def test_dce_drops_unused_nodes_and_initializers():
    b = ModelBuilder("dce")
    x = b.input("x", [4])
    b.op("Add", [b.op("Exp", [x]), b.weight([4])])  # dead
    b.nodes.append(b.onnx.helper.make_node("Relu", [x], ["y"]))
    b.output("y")
    _, h = _check(b.build(), og.eliminate_dead_code, {"x": _x(4)})
    assert h.op_counts() == {"Relu": 1} and not h.initializers


# --------------------------------------------------------------------------- level 2: norms, gelu


@pytest.mark.parametrize("square", ["pow", "mul"])
@pytest.mark.parametrize("divide", ["div", "reciprocal"])
@pytest.mark.parametrize("affine", [True, False])
def test_fuse_layer_norm_variants(square, divide, affine):
    b = ModelBuilder("ln")
    x = b.input("x", ["batch", "seq", 16])
    mu = b.reduce("ReduceMean", x, [-1])
    xc = b.op("Sub", [x, mu])
    sq = b.op("Pow", [xc, b.scalar(2.0)]) if square == "pow" else b.op("Mul", [xc, xc])
    sd = b.op("Sqrt", [b.op("Add", [b.reduce("ReduceMean", sq, [-1]), b.scalar(1e-5)])])
    y = b.op("Div", [xc, sd]) if divide == "div" else b.op("Mul", [xc, b.op("Reciprocal", [sd])])
    if affine:
        y = b.op("Add", [b.op("Mul", [y, b.weight([16], "g", 1.0)]), b.weight([16], "b", 0.1)])
    b.nodes.append(b.onnx.helper.make_node("Identity", [y], ["y"]))
    b.output("y")
    _, h = _check(b.build(), og.fuse_layer_norm, {"x": _x(2, 3, 16)}, expect_added={"LayerNormalization": 1})
    assert "ReduceMean" not in h.op_counts()


def test_fuse_layer_norm_leaves_shared_intermediates():
    b = ModelBuilder("ln_shared")
    x = b.input("x", [2, 8])
    mu = b.reduce("ReduceMean", x, [-1])
    xc = b.op("Sub", [x, mu])
    sd = b.op(
        "Sqrt",
        [b.op("Add", [b.reduce("ReduceMean", b.op("Pow", [xc, b.scalar(2.0)]), [-1]), b.scalar(1e-5)])],
    )
    b.nodes.append(b.onnx.helper.make_node("Div", [xc, sd], ["y"]))
    b.nodes.append(b.onnx.helper.make_node("Identity", [mu], ["mean"]))  # the mean is also an output
    b.output("y")
    b.output("mean")
    _check(b.build(), og.fuse_layer_norm, {"x": _x(2, 8)}, expect_added={"LayerNormalization": 0})


@pytest.mark.parametrize(("weight", "inverse"), [(True, "Reciprocal"), (False, "Reciprocal"), (True, "Div")])
def test_fuse_rms_norm(weight, inverse):
    """``x * Reciprocal(sqrt(.))``, and ``x * Div(1, sqrt(.))``: torch.rsqrt as the TorchScript exporter writes it."""
    b = ModelBuilder("rms")
    x = b.input("x", ["batch", 16])
    ms = b.reduce("ReduceMean", b.op("Pow", [x, b.scalar(2.0)]), [-1])
    sd = b.op("Sqrt", [b.op("Add", [ms, b.scalar(1e-6)])])
    inv = b.op("Reciprocal", [sd]) if inverse == "Reciprocal" else b.op("Div", [b.scalar(1.0), sd])
    y = b.op("Mul", [x, inv])
    if weight:
        y = b.op("Mul", [y, b.weight([16], "w", 1.0)])
    b.nodes.append(b.onnx.helper.make_node("Identity", [y], ["y"]))
    b.output("y")
    _, h = _check(b.build(), og.fuse_rms_norm, {"x": _x(3, 16)}, expect_added={"ai.opstrata::RMSNorm": 1})
    assert len(h) == 2  # RMSNorm + Identity


@pytest.mark.parametrize("form", ["x_a_half", "half_x_a", "a_half_x", "mul_inv_sqrt2"])
def test_fuse_gelu_erf_variants(form):
    b = ModelBuilder("gelu")
    x = b.input("x", ["batch", 8])
    arg = (
        b.op("Mul", [x, b.scalar(1 / math.sqrt(2))])
        if form == "mul_inv_sqrt2"
        else b.op("Div", [x, b.scalar(math.sqrt(2))])
    )
    a = b.op("Add", [b.op("Erf", [arg]), b.scalar(1.0)])
    if form in ("x_a_half", "mul_inv_sqrt2"):
        y = b.op("Mul", [b.op("Mul", [x, a]), b.scalar(0.5)])
    elif form == "half_x_a":
        y = b.op("Mul", [b.op("Mul", [x, b.scalar(0.5)]), a])
    else:
        y = b.op("Mul", [b.op("Mul", [a, b.scalar(0.5)]), x])
    b.nodes.append(b.onnx.helper.make_node("Identity", [y], ["y"]))
    b.output("y")
    _, h = _check(b.build(), og.fuse_gelu, {"x": _x(3, 8)}, expect_added={"Gelu": 1})
    assert h.op_counts() == {"Gelu": 1, "Identity": 1}


@pytest.mark.parametrize("cube", ["pow", "mul"])
def test_fuse_gelu_tanh(cube):
    b = ModelBuilder("gelu_tanh")
    x = b.input("x", ["batch", 8])
    if cube == "pow":
        b.nodes.append(b.onnx.helper.make_node("Identity", [b.gelu_tanh(x)], ["y"]))
    else:
        x3 = b.op("Mul", [b.op("Mul", [x, x]), x])
        inner = b.op("Add", [x, b.op("Mul", [x3, b.scalar(0.044715)])])
        t = b.op("Tanh", [b.op("Mul", [inner, b.scalar(math.sqrt(2 / math.pi))])])
        y = b.op("Mul", [b.op("Mul", [x, b.scalar(0.5)]), b.op("Add", [t, b.scalar(1.0)])])
        b.nodes.append(b.onnx.helper.make_node("Identity", [y], ["y"]))
    b.output("y")
    _, h = _check(b.build(), og.fuse_gelu, {"x": _x(3, 8)}, expect_added={"Gelu": 1})
    assert h.nodes[0].attrs["approximate"] == "tanh"


def test_fuse_gelu_rejects_wrong_constant():
    b = ModelBuilder("not_gelu")
    x = b.input("x", [4])
    e = b.op("Erf", [b.op("Div", [x, b.scalar(1.5)])])
    y = b.op("Mul", [b.op("Mul", [x, b.op("Add", [e, b.scalar(1.0)])]), b.scalar(0.5)])
    b.nodes.append(b.onnx.helper.make_node("Identity", [y], ["y"]))
    b.output("y")
    _check(b.build(), og.fuse_gelu, {"x": _x(4)}, expect_added={"Gelu": 0})


# --------------------------------------------------------------------------- level 2: attention


def _attention_model(mask: str, scale: str, opset: int = 17):
    b = ModelBuilder(f"attn_{mask}_{scale}", opset)
    q = b.input("q", ["batch", 2, "seq", 8])
    k = b.input("k", ["batch", 2, "seq", 8])
    v = b.input("v", ["batch", 2, "seq", 8])
    s = b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])])
    if scale == "div":
        s = b.op("Div", [s, b.scalar(math.sqrt(8))])
    elif scale == "mul":
        s = b.op("Mul", [s, b.scalar(0.25)])
    if mask == "additive":
        m = b.input("m", ["batch", 1, 1, "seq"])
        s = b.op("Add", [s, m])
    elif mask in ("trilu_equal", "trilu_upper"):
        seq = b.op("Gather", [b.op("Shape", [q]), b.const(np.array(2, np.int64))], axis=0)
        ss = b.op("Concat", [b.unsqueeze(seq, [0]), b.unsqueeze(seq, [0])], axis=0)
        ones = b.op(
            "ConstantOfShape",
            [ss],
            value=b.onnx.helper.make_tensor("one", b.onnx.TensorProto.FLOAT, [1], [1.0]),
        )
        if mask == "trilu_equal":
            cond = b.op("Equal", [b.op("Trilu", [ones], upper=0), b.scalar(0.0)])
            s = b.op("Where", [cond, b.scalar(-np.inf), s])
        else:
            keep = b.op(
                "Not", [b.op("Cast", [b.op("Trilu", [ones, b.const(np.array(1, np.int64))], upper=1)], to=9)]
            )
            s = b.op("Where", [keep, s, b.scalar(float(np.finfo(np.float32).min))])
    y = b.op("MatMul", [b.op("Softmax", [s], axis=-1), v])
    b.nodes.append(b.onnx.helper.make_node("Identity", [y], ["y"]))
    b.output("y")
    return b.build()


@pytest.mark.parametrize(
    "mask,scale", [("none", "none"), ("additive", "div"), ("trilu_equal", "mul"), ("trilu_upper", "div")]
)
def test_fuse_attention_variants(mask, scale):
    model = _attention_model(mask, scale)
    feeds = {n: _x(2, 2, 5, 8) for n in "qkv"}
    if mask == "additive":
        feeds["m"] = np.where(RNG.random((2, 1, 1, 5)) < 0.3, -1e4, 0).astype(np.float32)
    _, h = _check(model, og.fuse_attention, feeds, expect_added={"ai.opstrata::Attention": 1})
    node = next(n for n in h.nodes if n.op_type == "Attention")
    assert node.attrs["causal"] == (1 if mask.startswith("trilu") else 0)
    assert node.attrs["scale"] == pytest.approx({"none": 1.0, "div": 1 / math.sqrt(8), "mul": 0.25}[scale])
    assert "Softmax" not in h.op_counts()


def test_fuse_attention_skips_scaled_mask():
    b = ModelBuilder("attn_mask_then_scale")  # (s + m) * c: the mask is scaled, Attention cannot say that
    q, k, v = (b.input(n, [1, 2, 4, 8]) for n in "qkv")
    m = b.input("m", [1, 2, 4, 4])
    s = b.op("Add", [b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])]), m])
    y = b.op("MatMul", [b.op("Softmax", [b.op("Mul", [s, b.scalar(0.5)])], axis=-1), v])
    b.nodes.append(b.onnx.helper.make_node("Identity", [y], ["y"]))
    b.output("y")
    feeds = {n: _x(1, 2, 4, 8) for n in "qkv"} | {"m": _x(1, 2, 4, 4)}
    _, h = _check(b.build(), og.fuse_attention, feeds)
    node = next((n for n in h.nodes if n.op_type == "Attention"), None)
    assert node is None or node.attrs["scale"] == 1.0  # the scale stays outside when fused at all


# --------------------------------------------------------------------------- level 2: linear, transpose, skip norm, activation


def test_fuse_linear_matmul_add_and_gemm():
    b = ModelBuilder("lin")
    x = b.input("x", ["batch", 8])
    h = b.linear(x, 8, 16)
    g1 = b.op("Gemm", [h, b.weight([16, 4]), b.weight([4], "b")])  # transB=0: weight transposed at compile
    b.nodes.append(
        b.onnx.helper.make_node("Gemm", [g1, b.weight([3, 4]), b.weight([1, 3], "c")], ["y"], transB=1)
    )
    b.output("y")
    _, h2 = _check(b.build(), og.fuse_linear, {"x": _x(5, 8)}, expect_added={"ai.opstrata::Linear": 3})
    assert len(h2) == 3


def test_fold_transposes_into_linear_and_composition():
    b = ModelBuilder("tr")
    x = b.input("x", ["batch", 8])
    w = b.input("w", [4, 8])  # a run-time weight (out, in): MatMul(x, w^T) is Linear(x, w)
    y = b.op("MatMul", [x, b.op("Transpose", [w], perm=[1, 0])])
    t = b.op("Transpose", [b.op("Transpose", [y], perm=[1, 0])], perm=[1, 0])
    b.nodes.append(b.onnx.helper.make_node("Relu", [t], ["y"]))
    b.output("y")
    _, h = _check(b.build(), og.fold_transposes, {"x": _x(3, 8), "w": _x(4, 8)})
    assert og.eliminate_dead_code(h).op_counts() == {"ai.opstrata::Linear": 1, "Relu": 1}


@pytest.mark.parametrize("opset", [14, 17])
def test_fuse_skip_norm_with_and_without_sum_output(opset):
    b = ModelBuilder("skip", opset)
    x = b.input("x", ["batch", 4, 8])
    r = b.input("r", ["batch", 4, 8])
    s = b.op("Add", [x, r])
    y1 = b.layer_norm(s, 8, decomposed=opset < 17)
    b.nodes.append(b.onnx.helper.make_node("Add", [y1, s], ["y"]))  # the sum is read again
    b.output("y")
    pipeline = lambda g: og.fuse_skip_norm(og.fuse_layer_norm(g))  # noqa: E731
    _, h = _check(
        b.build(),
        pipeline,
        {"x": _x(2, 4, 8), "r": _x(2, 4, 8)},
        expect_added={"ai.opstrata::SkipLayerNorm": 1},
    )
    fused = next(n for n in h.nodes if n.op_type == "SkipLayerNorm")
    assert fused.outputs[1] == s


def test_fuse_bias_activation():
    b = ModelBuilder("act")
    x = b.input("x", ["batch", 8])
    y = b.op("Relu", [b.linear(x, 8, 8)])
    y = b.op("Sigmoid", [b.linear(y, 8, 8)])
    b.nodes.append(b.onnx.helper.make_node("Identity", [y], ["y"]))
    b.output("y")
    pipeline = lambda g: og.fuse_bias_activation(og.fuse_linear(g))  # noqa: E731
    _, h = _check(
        b.build(),
        pipeline,
        {"x": _x(3, 8)},
        expect_added={"ai.opstrata::Linear": 2},
        expect_removed=["Relu", "Sigmoid"],
    )
    assert [n.attrs.get("activation") for n in h.nodes if n.op_type == "Linear"] == ["relu", "sigmoid"]


def test_fuse_bias_activation_through_a_reshape():
    """GPT-2's Conv1D: GEMM on a 2-D view, reshaped back, then GELU: the GELU moves into the GEMM."""
    b = ModelBuilder("act_reshape", 20)
    x = b.input("x", [6, 8])
    h = b.op("Reshape", [b.linear(x, 8, 12), b.ints([2, 3, 12])])
    y = b.op("Gelu", [h], approximate="tanh")
    b.nodes.append(b.onnx.helper.make_node("Identity", [y], ["y"]))
    b.output("y")
    pipeline = lambda g: og.fuse_bias_activation(og.fuse_linear(g))  # noqa: E731
    _, g = _check(b.build(), pipeline, {"x": _x(6, 8)}, expect_removed=["Gelu"])
    assert [n.attrs.get("activation") for n in g.nodes if n.op_type == "Linear"] == ["gelu_tanh"]
    assert g.op_counts().get("Reshape") == 1


@pytest.mark.parametrize("act", ["Relu", "Gelu"])
def test_a_bias_free_matmul_by_a_constant_takes_its_activation(act: str) -> None:
    """T5's and Llama's projections have no bias: MatMul(x, W) -> activation becomes one Linear with the
    activation as its epilogue (W stored transposed); onnxruntime agrees on the original."""
    b = ModelBuilder("mm_act", 20)
    x = b.input("x", ["batch", 5, 8])
    y = b.op(
        act, [b.op("MatMul", [x, b.weight([8, 12])])], **({"approximate": "tanh"} if act == "Gelu" else {})
    )
    b.nodes.append(b.onnx.helper.make_node("Identity", [y], ["y"]))
    b.output("y")
    _, g = _check(b.build(), og.fuse_bias_activation, {"x": _x(2, 5, 8)}, expect_removed=["MatMul", act])
    (lin,) = [n for n in g.nodes if n.op_type == "Linear"]
    assert lin.attrs["activation"] == ("gelu_tanh" if act == "Gelu" else "relu")
    assert g.initializers[lin.inputs[1]].shape == (12, 8)


def test_a_matmul_keeps_its_activation_when_it_cannot_carry_it() -> None:
    """A MatMul of two inputs (attention's scores), or whose result is read twice, stays as it is."""
    b = ModelBuilder("mm_keep", 17)
    x = b.input("x", ["batch", 4, 8])
    k = b.input("k", ["batch", 8, 4])
    scores = b.op("Relu", [b.op("MatMul", [x, k])])
    h = b.op("MatMul", [x, b.weight([8, 8])])
    both = b.op("Add", [b.op("Sigmoid", [h]), h])
    b.nodes.append(b.onnx.helper.make_node("Identity", [scores], ["s"]))
    b.nodes.append(b.onnx.helper.make_node("Identity", [both], ["y"]))
    b.output("s")
    b.output("y")
    _, g = _check(b.build(), og.fuse_bias_activation, {"x": _x(2, 4, 8), "k": _x(2, 8, 4)})
    assert g.op_counts().get("MatMul") == 2 and "ai.opstrata::Linear" not in g.op_counts()


# --------------------------------------------------------------------------- level 3: elementwise


def test_fuse_elementwise_chain_expression():
    b = ModelBuilder("ew")
    x = b.input("x", ["batch", 8])
    z = b.input("z", [8])
    e = b.op("Exp", [b.op("Neg", [x])])
    t = b.op("Mul", [b.op("Add", [e, z]), b.op("Sqrt", [b.op("Abs", [z])])])
    b.nodes.append(b.onnx.helper.make_node("Tanh", [t], ["y"]))
    b.output("y")
    _, h = _check(
        b.build(),
        og.fuse_elementwise,
        {"x": _x(3, 8), "z": _x(8)},
        expect_added={"ai.opstrata::FusedElementwise": 1},
    )
    assert len(h) == 1
    node = h.nodes[0]
    assert node.inputs == ["x", "z"] and node.attrs["expr"][-1][0] == "Tanh"


@pytest.mark.parametrize(("hw", "split"), [(8, True), (4, True), (2, False)])
def test_fuse_elementwise_keeps_a_broadcast_gate_out_of_the_bigger_kernel(hw: int, split: bool):
    """Squeeze-excitation: Sigmoid(s) on (1, C, 1, 1) times x on (1, C, H, W). Fused, the sigmoid would run
    once per pixel; from 8 repeats it stays a node of its own (4 x 4), below that it joins the Mul (2 x 2)."""
    b = ModelBuilder("se")
    x = b.input("x", [1, 4, hw, hw])
    s = b.input("s", [1, 4, 1, 1])
    g = b.op("Sigmoid", [b.op("Add", [s, b.scalar(1.0)])])
    b.nodes.append(b.onnx.helper.make_node("Mul", [b.op("Relu", [x]), g], ["y"]))
    b.output("y")

    def shaped_fuse(g: og.Graph) -> og.Graph:  # the pipeline infers shapes before fusing
        og.infer_shapes(g)
        return og.fuse_elementwise(g)

    _, h = _check(b.build(), shaped_fuse, {"x": _x(1, 4, hw, hw), "s": _x(1, 4, 1, 1)})
    fused = [n for n in h.nodes if n.op_type == "FusedElementwise"]
    together = any({"Sigmoid", "Mul"} <= {op for op, _ in n.attrs["expr"]} for n in fused)
    assert together != split
    if split:  # the gate's chain is a kernel over (1, 4, 1, 1); the product's over the image
        assert len(fused) == 2 and {tuple(h.values[n.outputs[0]].shape) for n in fused} == {
            (1, 4, 1, 1),
            (1, 4, hw, hw),
        }


def test_fuse_elementwise_stops_at_shared_values():
    b = ModelBuilder("ew_shared")
    x = b.input("x", [4])
    e = b.op("Exp", [x])
    b.nodes.append(b.onnx.helper.make_node("Neg", [b.op("Abs", [e])], ["y1"]))
    b.nodes.append(b.onnx.helper.make_node("Relu", [e], ["y2"]))
    b.output("y1")
    b.output("y2")
    _, h = _check(b.build(), og.fuse_elementwise, {"x": _x(4)})
    assert h.op_counts() == {"Exp": 1, "ai.opstrata::FusedElementwise": 1, "Relu": 1}


def test_fused_elementwise_bad_expression_is_clear():
    g = og.Graph("bad")
    g.add_input("x", np.float32, (3,))
    g.add_node("FusedElementwise", ["x"], ["y"], {"expr": [["Add", ["x0", "t5"]]]}, domain=og.OPSTRATA_DOMAIN)
    g.outputs.append("y")
    with pytest.raises(og.GraphError, match="step 0 refers to 't5'"):
        og.infer_shapes(g)


# --------------------------------------------------------------------------- pipeline and report


def test_optimize_levels_and_report():
    from opstrata.graph.testing import bert_block_model

    g = og.from_onnx(bert_block_model())
    h0, r0 = og.optimize(g, 0)
    assert len(h0) == len(g) and r0.results == []
    h, rep = og.optimize(g, 2)
    assert len(h) < len(g) and len(g) == 65  # the input is untouched
    text = str(rep)
    assert "fuse_attention" in text and "ai.opstrata::Attention x1" in text and "level 2:" in text
    assert rep.matched("fuse_layer_norm") == 2 and rep.nodes_before == 65 and rep.nodes_after == len(h)
    assert og.PassReport.from_dict(rep.to_dict()).table() == rep.table()


@pytest.mark.parametrize("level", [-1, 4, "2", None])
def test_optimize_rejects_bad_level(level):
    with pytest.raises(og.GraphError, match="level must be one of"):
        og.optimize(og.Graph("g"), level)


def _sdpa_model(causal: bool, bool_mask: bool):
    """What torch.onnx exports for ``F.scaled_dot_product_attention`` (opset 14 symbolic)."""
    b = ModelBuilder("sdpa", 17)
    q, k, v = (b.input(n, ["batch", 2, "seq", 8]) for n in "qkv")
    d = b.op("Cast", [b.op("Slice", [b.op("Shape", [q]), b.ints([-1]), b.ints([2**62])])], to=1)
    scale = b.op("Div", [b.const(np.array([1.0], np.float32)), b.op("Sqrt", [d])])
    kt = b.op("Transpose", [k], perm=[0, 1, 3, 2])
    s = b.op("MatMul", [b.op("Mul", [q, b.op("Sqrt", [scale])]), b.op("Mul", [kt, b.op("Sqrt", [scale])])])
    zero, neg = b.const(np.array([0.0], np.float32)), b.const(np.array([-np.inf], np.float32))
    if bool_mask:
        m = b.input("m", ["batch", 1, "seq", "seq"], np.bool_)
        s = b.op("Add", [s, b.op("Where", [m, zero, neg])])
    if causal:
        tl = b.op("Slice", [b.op("Shape", [q]), b.ints([-2]), b.ints([-1])])
        sl = b.op("Slice", [b.op("Shape", [k]), b.ints([-2]), b.ints([-1])])
        ones = b.op("Expand", [b.const(np.array([1.0], np.float32)), b.op("Concat", [tl, sl], axis=0)])
        tri = b.op("Trilu", [ones], upper=0)
        s = b.op("Add", [s, b.op("Where", [b.op("Equal", [tri, zero]), neg, zero])])
    y = b.op("MatMul", [b.op("Softmax", [s], axis=-1), v])
    b.nodes.append(b.onnx.helper.make_node("Identity", [y], ["y"]))
    b.output("y")
    return b.build()


@pytest.mark.parametrize("causal,bool_mask", [(True, False), (False, True), (False, False)])
def test_fuse_attention_torch_sdpa_export(causal, bool_mask):
    model = _sdpa_model(causal, bool_mask)
    feeds = {n: _x(2, 2, 5, 8) for n in "qkv"}
    if bool_mask:
        feeds["m"] = RNG.random((2, 1, 5, 5)) < 0.8
        feeds["m"][..., 0] = True  # no fully masked rows (onnxruntime gives NaN there, ops.attention 0)
    _, h = _check(model, lambda g: og.optimize(g, 2)[0], feeds, expect_added={"ai.opstrata::Attention": 1})
    node = next(n for n in h.nodes if n.op_type == "Attention")
    assert node.attrs["causal"] == int(causal) and node.attrs["scale"] == pytest.approx(1 / math.sqrt(8))
    assert len(node.inputs) == (4 if bool_mask else 3)
    assert set(h.op_counts()) <= {"ai.opstrata::Attention", "Transpose", "Identity"}


def test_fuse_skip_rms_norm():
    b = ModelBuilder("skip_rms")
    x = b.input("x", ["batch", 8])
    r = b.input("r", ["batch", 8])
    s = b.op("Add", [x, r])
    ms = b.reduce("ReduceMean", b.op("Mul", [s, s]), [-1])
    y = b.op("Div", [s, b.op("Sqrt", [b.op("Add", [ms, b.scalar(1e-6)])])])
    b.nodes.append(b.onnx.helper.make_node("Mul", [y, b.weight([8], "w", 1.0)], ["y"]))
    b.output("y")
    _, h = _check(
        b.build(), lambda g: og.optimize(g, 2)[0], {"x": _x(3, 8), "r": _x(3, 8)},
        expect_added={"ai.opstrata::SkipRMSNorm": 1},
    )  # fmt: skip
    assert len(h) == 1 and h.nodes[0].outputs == ["y"]  # the sum is read by nothing else: one output
