"""Prepacked GEMM weights: Fortran-ordered copies in the schedule (the plan holds the same one), same results."""

from __future__ import annotations

import numpy as np
import pytest

import opstrata.graph as og
import opstrata.ops as ops
from opstrata.graph.testing import ModelBuilder, random_feeds
from opstrata.runtime import InferenceSession, SessionOptions
from opstrata.runtime._prepack import prepack_weights


@pytest.mark.parametrize("name", ["mlp", "bert", "gpt"])
def test_linear_weights_are_fortran_ordered_and_results_unchanged(models, name: str) -> None:
    model, dims = models[name]
    feeds = random_feeds(model, dims)
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=3))
    sch = sess._schedule
    lin = [n for n in sess.graph.nodes if n.domain == og.OPSTRATA_DOMAIN and n.op_type == "Linear"]
    assert lin, "the level-3 plan fuses linears"
    fresh, _ = og.optimize(og.from_onnx(model), 3)  # the same passes: the weights as compiled, C-ordered
    for n in lin:
        packed = sch.template[sch.slot[n.inputs[1]]]
        orig = sess.graph.initializers[n.inputs[1]]
        assert packed.flags.f_contiguous and packed.T.flags.c_contiguous
        assert not packed.flags.writeable  # ops' linear binder may pack it once (kernels.immutable)
        kernels = getattr(getattr(ops, "native", None), "kernels", None)
        if hasattr(kernels, "immutable"):  # ops >= 0.4.44 (the compat job runs older ones too)
            assert kernels.immutable(packed)
        assert orig is packed  # one copy: the plan's array is the packed one, not kept beside it
        assert fresh.initializers[n.inputs[1]].flags.c_contiguous
        np.testing.assert_array_equal(packed, fresh.initializers[n.inputs[1]])
    want = og.run_graph(sess.graph, feeds)  # the unpacked reference executor on the same plan
    for got, w in zip(sess.run(None, feeds), want.values(), strict=True):
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6)


def test_a_weight_also_read_elsewhere_is_left_alone() -> None:
    pytest.importorskip("onnx")
    b = ModelBuilder("shared", 17)
    x = b.input("x", ["n", 4])
    w = b.weight([3, 4])
    y = b.op("Gemm", [x, w], transB=1)
    b.output(b.op("Add", [b.op("ReduceSum", [y], keepdims=0), b.op("ReduceSum", [w], keepdims=0)]))
    g = og.from_onnx(b.build())
    names = list(g.inputs) + list(g.initializers)
    slot = {k: i for i, k in enumerate(names)}
    template = [g.initializers.get(k) for k in names]
    assert prepack_weights(g, template, slot) == 0  # ReduceSum reads it too: its layout stays
    only_gemm = og.from_onnx(_gemm_only())
    names = list(only_gemm.inputs) + list(only_gemm.initializers)
    slot = {k: i for i, k in enumerate(names)}
    template = [only_gemm.initializers.get(k) for k in names]
    assert prepack_weights(only_gemm, template, slot) == 1
    (w_name,) = [k for k, v in only_gemm.initializers.items() if v.ndim == 2]
    assert template[slot[w_name]].flags.f_contiguous


def _gemm_only():
    b = ModelBuilder("gemm", 17)
    x = b.input("x", ["n", 4])
    b.output(b.op("Gemm", [x, b.weight([3, 4]), b.weight([3], "b")], transB=1))
    return b.build()


def _matmul_graph(also_reduce: bool):
    b = ModelBuilder("matmul", 17)
    x = b.input("x", ["n", 4])
    w = b.weight([4, 5])
    y = b.op("MatMul", [x, w])
    if also_reduce:
        y = b.op("Add", [b.op("ReduceSum", [y], keepdims=0), b.op("ReduceSum", [w], keepdims=0)])
    b.output(y)
    g = og.from_onnx(b.build())
    (w_name,) = [k for k, v in g.initializers.items() if v.ndim == 2]
    g.initializers[w_name] = np.asfortranarray(g.initializers[w_name])  # as a folded Transpose leaves it
    names = list(g.inputs) + list(g.initializers)
    slot = {k: i for i, k in enumerate(names)}
    return g, w_name, slot, [g.initializers.get(k) for k in names]


def test_a_fortran_ordered_matmul_weight_gets_a_c_ordered_copy() -> None:
    pytest.importorskip("onnx")
    g, w_name, slot, template = _matmul_graph(also_reduce=False)
    assert prepack_weights(g, template, slot) == 1
    packed = template[slot[w_name]]
    assert packed.flags.c_contiguous and g.initializers[w_name].flags.f_contiguous
    np.testing.assert_array_equal(packed, g.initializers[w_name])
    g2, w2, slot2, template2 = _matmul_graph(also_reduce=True)
    assert prepack_weights(g2, template2, slot2) == 0  # ReduceSum reads it too: its layout stays
    assert template2[slot2[w2]].flags.f_contiguous


def test_a_session_on_a_fortran_ordered_matmul_weight() -> None:
    """The session runs the C-ordered copy (the plan keeps its array) and equals x @ w."""
    pytest.importorskip("onnx")
    g, w_name, _, _ = _matmul_graph(also_reduce=False)
    want_w = np.array(g.initializers[w_name])
    sess = InferenceSession(g, SessionOptions(graph_optimization_level=1))
    (mm,) = [n for n in sess.graph.nodes if n.op_type == "MatMul"]
    sch = sess._schedule
    assert sch.template[sch.slot[mm.inputs[1]]].flags.c_contiguous
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], x @ want_w, rtol=1e-5, atol=1e-6)


def _conv_model(weight_as_input: bool):
    b = ModelBuilder("conv", 17)
    x = b.input("x", [1, 5, "h", "h"])
    w = b.input("w", [7, 5, 3, 3]) if weight_as_input else b.weight([7, 5, 3, 3])
    b.output(b.op("Relu", [b.op("Conv", [x, w], kernel_shape=[3, 3], pads=[1, 1, 1, 1])]))
    return b.build()


def test_conv_weights_are_made_read_only_and_packed_once() -> None:
    """A Conv weight held by the graph is read-only in the session (ops' conv binders then pack it once);
    results equal the ref kernel's at every image size (direct, gathered and lanes paths)."""
    pytest.importorskip("onnx")
    model = _conv_model(weight_as_input=False)
    g = og.from_onnx(model)
    names = list(g.inputs) + list(g.initializers)
    slot = {k: i for i, k in enumerate(names)}
    template = [g.initializers.get(k) for k in names]
    assert prepack_weights(g, template, slot) == 1
    (w_name,) = [k for k, v in g.initializers.items() if v.ndim == 4]
    assert not template[slot[w_name]].flags.writeable
    sess = InferenceSession(model)
    w = og.from_onnx(model).initializers[w_name]
    for hw in (3, 9, 20):
        x = np.random.default_rng(hw).standard_normal((1, 5, hw, hw)).astype(np.float32)
        want = np.maximum(ops.conv2d(x, w, padding=1, device="ref"), 0)
        for _ in range(2):  # the second run takes the bound calls
            np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4)


def test_a_conv_weight_fed_as_an_input_may_change_between_runs() -> None:
    """A weight that is a graph input is copied into the program every run: the bound conv packs it again,
    so a second run with other weights gives their result (as onnx's backend test cases feed them)."""
    pytest.importorskip("onnx")
    sess = InferenceSession(_conv_model(weight_as_input=True))
    rng = np.random.default_rng(1)
    for hw in (3, 9):
        x = rng.standard_normal((1, 5, hw, hw)).astype(np.float32)
        for _ in range(3):
            w = rng.standard_normal((7, 5, 3, 3)).astype(np.float32)
            want = np.maximum(ops.conv2d(x, w, padding=1, device="ref"), 0)
            np.testing.assert_allclose(sess.run(None, {"x": x, "w": w})[0], want, rtol=1e-4, atol=1e-4)


def test_integer_initializers_of_every_rank_are_read_only_copies() -> None:
    """int8 weights and their zero points -- per channel (1-D) and per tensor (scalars) -- get read-only
    copies of their own, so an int8 kernel may bind them once (opstrata.quant's convolution as one C call);
    float vectors are left as they are."""
    g = og.Graph()
    inits = {
        "w": np.arange(24, dtype=np.int8).reshape(4, 6),
        "w_zp": np.zeros(4, np.int8),
        "x_zp": np.array(3, np.uint8),
        "scale": np.ones(4, np.float32),
    }
    for k, v in inits.items():
        g.initializers[k] = v
    names = list(inits)
    slot = {k: i for i, k in enumerate(names)}
    template = [inits[k] for k in names]
    assert prepack_weights(g, template, slot) == 3
    for k in ("w", "w_zp", "x_zp"):
        got = template[slot[k]]
        assert not got.flags.writeable and got.base is None and got is not inits[k]
        np.testing.assert_array_equal(got, inits[k])
        assert inits[k].flags.writeable  # the graph's own array is untouched
    assert template[slot["scale"]] is inits["scale"]
