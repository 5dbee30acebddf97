"""Conv fusions: fold_conv_batchnorm, fuse_conv_epilogue (Conv + its elementwise reader -> FusedConv); attribute activations join
FusedElementwise chains as the steps their kernels compute."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import opstrata.graph as og
from opstrata.graph import GraphError, Node
from opstrata.graph.passes.fuse_elementwise import activation_steps
from opstrata.graph.passes.pattern import Matcher
from opstrata.graph.testing import ModelBuilder, mobile_cnn_model, ort_run, random_feeds

pytest.importorskip("onnxruntime")

ACTS = ["Relu", "Sigmoid", "Tanh", "HardSwish", "HardSigmoid", "Clip", "LeakyRelu", "SiLU", "AddRelu", "Add"]


def _conv_act_model(act: str, *, c_in: int, c_out: int, k: int, stride: int, groups: int, bias: bool):
    b = ModelBuilder("conv_act", 17, seed=c_in * 7 + k)
    x = b.input("x", ["batch", c_in, 9, 8])
    ins = [x, b.weight([c_out, c_in // groups, k, k])] + ([b.weight([c_out], "b", 0.1)] if bias else [])
    c = b.op("Conv", ins, kernel_shape=[k, k], strides=[stride] * 2, pads=[k // 2] * 4, group=groups)
    if act == "Clip":
        y = b.op("Clip", [c, b.scalar(-0.5), b.scalar(0.75)])
    elif act == "HardSigmoid":
        y = b.op("HardSigmoid", [c], alpha=0.3, beta=0.4)
    elif act == "LeakyRelu":
        y = b.op("LeakyRelu", [c], alpha=0.2)
    elif act == "SiLU":
        y = b.op("Mul", [c, b.op("Sigmoid", [c])])
    elif act in ("AddRelu", "Add"):
        res = b.input("res", ["batch", c_out, 1, 1])  # broadcasts to the convolution's shape
        y = b.op("Add", [res, c])
        y = b.op("Relu", [y]) if act == "AddRelu" else y
    else:
        y = b.op(act, [c])
    b.nodes.append(b.onnx.helper.make_node("Identity", [y], ["y"], name="out"))
    b.output("y")
    return b.build()


@given(
    act=st.sampled_from(ACTS),
    k=st.sampled_from([1, 3]),
    stride=st.sampled_from([1, 2]),
    depthwise=st.booleans(),
    bias=st.booleans(),
    seed=st.integers(0, 1000),
)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_fused_conv_matches_the_unfused_graph_and_onnxruntime(act, k, stride, depthwise, bias, seed) -> None:
    c_in, c_out = (4, 4) if depthwise else (3, 5)
    model = _conv_act_model(act, c_in=c_in, c_out=c_out, k=k, stride=stride, groups=c_in if depthwise else 1,
                            bias=bias)  # fmt: skip
    g3, report = og.optimize(og.from_onnx(model), 3)
    assert g3.op_counts() == {"ai.opstrata::FusedConv": 1, "Identity": 1} or g3.op_counts() == {
        "ai.opstrata::FusedConv": 1
    }, g3.op_counts()
    assert report.matched("fuse_conv_epilogue") == 1
    feeds = random_feeds(model, {"batch": 2}, seed=seed)
    want = ort_run(model, feeds)["y"]
    for device in ("cpu", "ref"):  # ref: the epilogue step by step on that device's kernels
        got = og.run_graph(g3, feeds, device=device)["y"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"{act} on {device}")
    exported = og.to_onnx(g3)
    np.testing.assert_allclose(ort_run(exported, feeds)["y"], want, rtol=1e-5, atol=1e-6)


def test_mobile_cnn_convs_take_their_epilogues() -> None:
    g3, _ = og.optimize(og.from_onnx(mobile_cnn_model()), 3)
    counts = g3.op_counts()
    # every Conv takes its epilogue, the SE gate's too: its HardSigmoid, on (N, C, 1, 1), is not fused into
    # the Mul broadcasting it over the image (it would be recomputed per pixel), so it is the gate's own
    assert counts["ai.opstrata::FusedConv"] == 7
    assert "Conv" not in counts and counts["Mul"] == 1
    for op in ("HardSwish", "Clip", "LeakyRelu", "Relu", "HardSigmoid", "Add"):
        assert op not in counts
    fused = [n for n in g3.nodes if n.op_type == "FusedConv"]
    residual = [n for n in fused if len(n.inputs) > n.attrs["conv_inputs"]]
    assert len(residual) == 1 and residual[0].attrs["expr"] == [["Add", ["x0", "x1"]]]
    bias_free = [n for n in fused if n.attrs["conv_inputs"] == 2]
    assert len(bias_free) == 1
    assert og.kernels_of(fused[0], "cpu")[-1] == "codegen"


def _two_readers_model():
    b = ModelBuilder("two_readers", 17)
    x = b.input("x", [1, 2, 5, 5])
    c = b.op("Conv", [x, b.weight([3, 2, 3, 3])], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    b.nodes.append(b.onnx.helper.make_node("Relu", [c], ["y"], name="relu"))
    b.nodes.append(b.onnx.helper.make_node("Sigmoid", [c], ["z"], name="sig"))
    b.output("y")
    b.output("z")
    return b.build()


def test_a_conv_read_twice_or_a_graph_output_is_not_fused() -> None:
    g3, _ = og.optimize(og.from_onnx(_two_readers_model()), 3)
    assert "ai.opstrata::FusedConv" not in g3.op_counts()
    b = ModelBuilder("conv_out", 17)
    x = b.input("x", [1, 2, 5, 5])
    b.nodes.append(b.onnx.helper.make_node("Conv", [x, b.weight([3, 2, 1, 1])], ["c"], name="conv"))
    b.nodes.append(b.onnx.helper.make_node("Relu", ["c"], ["y"], name="relu"))
    b.output("c")
    b.output("y")
    g3, _ = og.optimize(og.from_onnx(b.build()), 3)
    assert "ai.opstrata::FusedConv" not in g3.op_counts()


def test_activation_steps_only_for_forms_they_compute_exactly() -> None:
    b = ModelBuilder("acts", 17)
    x = b.input("x", [4])
    lo = b.input("lo", [])  # a run-time bound
    b.op("Clip", [x, lo])
    b.op("LeakyRelu", [x], alpha=1.5)  # max(x, 1.5 x) is not LeakyRelu
    b.op("Clip", [x, "", b.scalar(2.0)])  # only a max bound
    g = og.from_onnx(b.build(check=False))
    m = Matcher(g)
    clip_rt, leaky, clip_hi = g.nodes
    assert activation_steps(m, clip_rt) is None
    assert activation_steps(m, leaky) is None
    assert activation_steps(m, clip_hi) == [("Min", ["x", 2.0])]


def test_bad_fused_conv_nodes_are_named_errors() -> None:
    g, _ = og.optimize(og.from_onnx(mobile_cnn_model()), 3)
    node = next(n for n in g.nodes if n.op_type == "FusedConv")
    bad = g.copy()
    n = next(x for x in bad.nodes if x.name == node.name)
    n.attrs["conv_inputs"] = 5
    with pytest.raises(GraphError, match=rf"'{node.name}'.*conv_inputs must be 2 or 3"):
        og.infer_shapes(bad)
    bad = g.copy()
    n = next(x for x in bad.nodes if x.name == node.name)
    n.attrs["expr"] = [["Relu", ["x7"]]]
    with pytest.raises(GraphError, match=rf"'{node.name}'.*refers to 'x7'"):
        og.infer_shapes(bad)
    assert isinstance(node, Node)


def _conv_bn_model(*, bias: bool, stats_as_input: bool = False, second_reader: bool = False):
    b = ModelBuilder("conv_bn", 17, seed=3)
    x = b.input("x", ["batch", 3, 8, 8])
    ins = [x, b.weight([6, 3, 3, 3])] + ([b.weight([6], "b", 0.1)] if bias else [])
    c = b.op("Conv", ins, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    mean = b.input("mean", [6]) if stats_as_input else b.weight([6], "mean", 0.2)
    var = b.const((0.5 + b.rng.random(6)).astype(np.float32), "var")
    stats = [b.const((1 + 0.3 * b.rng.standard_normal(6)).astype(np.float32), "gamma"), b.weight([6], "beta", 0.1),
             mean, var]  # fmt: skip
    y = b.op("BatchNormalization", [c, *stats], epsilon=1e-3)
    b.nodes.append(b.onnx.helper.make_node("Relu", [y], ["y"], name="relu"))
    b.output("y")
    if second_reader:
        b.nodes.append(b.onnx.helper.make_node("Identity", [c], ["c"], name="tap"))
        b.output("c")
    return b.build()


@pytest.mark.parametrize("bias", [True, False])
def test_batchnorm_folds_into_the_conv_before_it(bias: bool) -> None:
    model = _conv_bn_model(bias=bias)
    g2, report = og.optimize(og.from_onnx(model), 2)
    assert report.matched("fold_conv_batchnorm") == 1
    assert "BatchNormalization" not in g2.op_counts() and g2.op_counts()["Conv"] == 1
    feeds = random_feeds(model, {"batch": 2})
    want = ort_run(model, feeds)["y"]
    np.testing.assert_allclose(og.run_graph(g2, feeds)["y"], want, rtol=1e-5, atol=1e-5)
    g3, _ = og.optimize(og.from_onnx(model), 3)  # then the Relu joins the folded Conv
    assert g3.op_counts() == {"ai.opstrata::FusedConv": 1}
    np.testing.assert_allclose(og.run_graph(g3, feeds)["y"], want, rtol=1e-5, atol=1e-5)


def test_batchnorm_stays_when_its_statistics_are_not_constants() -> None:
    model = _conv_bn_model(bias=True, stats_as_input=True)
    g2, report = og.optimize(og.from_onnx(model), 2)
    assert report.matched("fold_conv_batchnorm") == 0 and report.matched("batchnorm_to_affine") == 0
    assert g2.op_counts()["BatchNormalization"] == 1


@pytest.mark.parametrize("level", [2, 3])
def test_batchnorm_without_its_own_conv_becomes_a_per_channel_affine(level: int) -> None:
    """The Conv's output is read twice (DenseNet's pre-activation BN of a Concat is the same case): the
    BatchNormalization becomes Mul + Add by per-channel constants, and at level 3 one generated kernel
    with the Relu after it; the outputs match onnxruntime's BatchNormalization."""
    model = _conv_bn_model(bias=True, second_reader=True)
    g, report = og.optimize(og.from_onnx(model), level)
    (affine,) = [r for r in report.results if r.name == "batchnorm_to_affine"]
    assert report.matched("fold_conv_batchnorm") == 0
    assert affine.removed == {"BatchNormalization": 1} and affine.added == {"Mul": 1, "Add": 1}
    counts = g.op_counts()
    assert "BatchNormalization" not in counts
    if level == 2:
        assert counts["Mul"] == 1 and counts["Add"] == 1
        scale = next(
            g.initializers[x] for n in g.nodes if n.op_type == "Mul" for x in n.inputs if x in g.initializers
        )
        assert scale.shape == (6, 1, 1) and scale.dtype == np.float32
    else:
        assert "Mul" not in counts and "Relu" not in counts and "ai.opstrata::FusedElementwise" in counts
    feeds = random_feeds(model, {"batch": 2})
    want = ort_run(model, feeds)
    got = og.run_graph(g, feeds)
    for k in ("y", "c"):
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rank", [2, 3, 5])
def test_batchnorm_to_affine_broadcasts_over_any_rank(rank: int) -> None:
    """BatchNorm1d on (N, C) and (N, C, L), BatchNorm3d on (N, C, D, H, W): constants shaped (C, 1, ...)."""
    b = ModelBuilder("bn_rank", 17, seed=4)
    x = b.input("x", ["batch", 5, *[3] * (rank - 2)])
    stats = [b.weight([5], "gamma"), b.weight([5], "beta", 0.1), b.weight([5], "mean", 0.2),
             b.const((0.5 + b.rng.random(5)).astype(np.float32), "var")]  # fmt: skip
    y = b.op("BatchNormalization", [x, *stats], epsilon=1e-4)
    b.nodes.append(b.onnx.helper.make_node("Identity", [y], ["y"], name="out"))
    b.output("y")
    model = b.build()
    g = og.batchnorm_to_affine(og.from_onnx(model))
    og.infer_shapes(g)
    assert "BatchNormalization" not in g.op_counts()
    feeds = random_feeds(model, {"batch": 2})
    np.testing.assert_allclose(og.run_graph(g, feeds)["y"], ort_run(model, feeds)["y"], rtol=1e-5, atol=1e-5)


def test_training_mode_batchnorm_is_left_alone() -> None:
    b = ModelBuilder("bn_train", 15, seed=4)
    x = b.input("x", [4, 3, 2, 2])
    stats = [b.weight([3], "gamma"), b.weight([3], "beta"), b.weight([3], "mean"), b.weight([3], "var", 1.0)]
    y, *_ = b.op("BatchNormalization", [x, *stats], n_out=3, training_mode=1)
    b.nodes.append(b.onnx.helper.make_node("Identity", [y], ["y"], name="out"))
    b.output("y")
    g = og.from_onnx(b.build(check=False))
    assert og.batchnorm_to_affine(g).op_counts().get("BatchNormalization") == 1


@pytest.mark.parametrize("act", ["HardSwish", "HardSigmoid", "LeakyRelu", "Clip"])
def test_a_lone_attribute_activation_becomes_one_generated_kernel(act: str) -> None:
    """MobileNetV3's classifier: Gemm -> HardSwish; the activation alone is one FusedElementwise (its
    expansion is several steps), matching onnxruntime."""
    b = ModelBuilder("lone", 17, seed=5)
    x = b.input("x", ["batch", 12])
    h = b.op("Gemm", [x, b.weight([12, 6]), b.weight([6], "b", 0.1)])
    extra = [b.scalar(-0.25), b.scalar(0.5)] if act == "Clip" else []
    b.nodes.append(b.onnx.helper.make_node(act, [h, *extra], ["y"], name="act"))
    b.output("y")
    model = b.build()
    g3, _ = og.optimize(og.from_onnx(model), 3)
    assert g3.op_counts().get("ai.opstrata::FusedElementwise") == 1 and act not in g3.op_counts()
    feeds = random_feeds(model, {"batch": 3})
    np.testing.assert_allclose(og.run_graph(g3, feeds)["y"], ort_run(model, feeds)["y"], rtol=1e-5, atol=1e-6)
