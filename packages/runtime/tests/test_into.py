"""GEMM nodes write their arena slot directly (out=): no copy-in, same numbers, errors still name the node."""

from __future__ import annotations

import numpy as np
import pytest

import opstrata.graph as og
import opstrata.ops as ops
from opstrata.graph import EXECUTOR_KERNELS as KERNELS, OPSTRATA_DOMAIN, Node
from opstrata.graph.testing import random_feeds
from opstrata.runtime import ExecutionError, InferenceSession, SessionOptions
from opstrata.runtime._executor import Schedule
from opstrata.runtime._into import into_kernel


def _stored_ops(monkeypatch, sess: InferenceSession, feeds: dict) -> list[str]:
    """Op types whose results the executor copied into the arena during one run."""
    seen: list[str] = []
    real = Schedule._store

    def spy(st, k, dst, r, arena):
        seen.append(st.node.op_type)
        return real(st, k, dst, r, arena)

    monkeypatch.setattr(Schedule, "_store", staticmethod(spy))
    sess.run(None, feeds)
    return seen


@pytest.mark.parametrize("name", ["gpt", "bert", "mlp"])
def test_gemm_and_skip_norm_results_are_not_copied_in(monkeypatch, models, name: str) -> None:
    model, dims = models[name]
    feeds = random_feeds(model, dims)
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=3))
    direct = {"Linear", "MatMul", "SkipLayerNorm"}
    assert direct & {n.op_type for n in sess.graph.nodes}
    stored = _stored_ops(monkeypatch, sess, feeds)
    assert not direct & set(stored), stored
    acts = {n.attrs.get("activation") for n in sess.graph.nodes if n.op_type == "Linear"}
    assert acts & {"relu", "gelu", "gelu_tanh"}  # epilogues run on the arena view too
    want = og.run_graph(sess.graph, feeds)
    for got, w in zip(sess.run(None, feeds), want.values(), strict=True):
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6)


def test_which_nodes_get_a_writer() -> None:
    lin = lambda **a: Node("Linear", ["x", "w"], ["y"], a, "n", og.OPSTRATA_DOMAIN)  # noqa: E731
    assert into_kernel(lin()) is not None and into_kernel(lin(activation="gelu")) is not None
    assert into_kernel(lin(activation="swish7")) is None  # the generic path raises the named error
    assert into_kernel(Node("MatMul", ["a", "b"], ["y"], {}, "m")) is not None
    assert into_kernel(Node("Relu", ["a"], ["y"], {}, "r")) is None


def test_an_overridden_kernel_is_respected(monkeypatch, models) -> None:
    calls = []
    real = KERNELS[("", "MatMul")]
    monkeypatch.setitem(KERNELS, ("", "MatMul"), lambda n, x: calls.append(n.name) or real(n, x))
    model, dims = models["gpt"]
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=3))
    sess.run(None, random_feeds(model, dims))
    assert calls, "a replaced MatMul kernel is called, not bypassed by the out= writer"


def test_a_failing_gemm_names_the_node(monkeypatch, models) -> None:
    model, dims = models["gpt"]
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=3))

    real = ops.call

    def broken(op, *args, **kwargs):
        if op == "matmul":
            raise FloatingPointError("simulated BLAS fault")
        return real(op, *args, **kwargs)

    real_bind = getattr(ops, "bind", None)

    def broken_bind(op, *args, **kwargs):  # arena runs bind the GEMM once: fail there too
        if op == "matmul":
            return lambda: broken(op)
        return real_bind(op, *args, **kwargs)

    monkeypatch.setattr(ops, "call", broken)
    if real_bind is not None:
        monkeypatch.setattr(ops, "bind", broken_bind)
    with pytest.raises(
        ExecutionError, match=r"node 'lm_head' \(MatMul\): kernel .* FloatingPointError: simulated BLAS fault"
    ):
        sess.run(None, random_feeds(model, dims))


@pytest.mark.parametrize(("name", "act"), [("mlp", "relu"), ("bert", "gelu"), ("gpt", "gelu_tanh")])
def test_epilogues_in_place_are_bit_identical_to_the_generic_path(models, name: str, act: str) -> None:
    """relu in place and bias + gelu through ops.bias_act(out=) give the allocator path's exact bits."""
    model, dims = models[name]
    feeds = random_feeds(model, dims)
    arena = InferenceSession(model, SessionOptions(graph_optimization_level=3))
    assert act in {n.attrs.get("activation") for n in arena.graph.nodes if n.op_type == "Linear"}
    generic = InferenceSession(model, SessionOptions(graph_optimization_level=3, enable_mem_arena=False))
    for got, want in zip(arena.run(None, feeds), generic.run(None, feeds), strict=True):
        np.testing.assert_array_equal(got, want)


def _dynamic_quant_mlp():
    """x (B, 16) -> DynamicQuantizeLinear -> MatMulInteger(int8 W) -> Cast -> Mul(scale) -> Add(bias): the
    chain graph fuses into one ai.opstrata::DynamicQMatMul."""
    from onnx import TensorProto, helper, numpy_helper

    r = np.random.default_rng(0)
    w = r.integers(-127, 128, (16, 8)).astype(np.int8)
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
        helper.make_node("MatMulInteger", ["xq", "w", "xz"], ["acc"]),
        helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["xs", "ws"], ["scale"]),
        helper.make_node("Mul", ["accf", "scale"], ["prod"]),
        helper.make_node("Add", ["prod", "bias"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "dq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 8])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.full(8, 0.01, np.float32), "ws"),
         numpy_helper.from_array(r.standard_normal(8).astype(np.float32), "bias")],
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _needs_dynamic_qmatmul_node() -> None:
    if (OPSTRATA_DOMAIN, "DynamicQMatMul") not in KERNELS:  # graph < 0.4.6 (compat runs) has no such node
        pytest.skip("ai.opstrata::DynamicQMatMul needs opstrata-graph >= 0.4.6")


@pytest.mark.filterwarnings("ignore::opstrata.runtime.SlowKernelWarning")  # the reference kernels on purpose
def test_dynamic_qmatmul_writes_its_arena_view_with_a_read_only_weight(monkeypatch) -> None:
    from opstrata.runtime._into import _kernels_take_out

    _needs_dynamic_qmatmul_node()
    if not _kernels_take_out("dynamic_qmatmul"):  # opstrata-ops < 0.4.8 (compat runs): the generic path
        pytest.skip("this opstrata-ops' dynamic_qmatmul kernels take no out= (added in 0.4.8)")
    model = _dynamic_quant_mlp()
    sess = InferenceSession(model)
    assert [n.op_type for n in sess.graph.nodes] == ["DynamicQMatMul"]
    (st,) = sess._schedule.steps
    assert st.into is not None
    weight = sess._schedule.template[st.ins[1]]
    assert weight.dtype == np.int8 and not weight.flags.writeable and weight.base is None
    x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    assert _stored_ops(monkeypatch, sess, {"x": x}) == []
    want = InferenceSession(model, SessionOptions(enable_mem_arena=False)).run(None, {"x": x})[0]
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], want)
    ref = ops.dynamic_qmatmul(x, weight, np.float32(0.01), None, sess._schedule.steps[0].node.attrs["bias"],
                              device="ref")  # fmt: skip
    np.testing.assert_allclose(want, ref, rtol=1e-6, atol=1e-6)


def test_dynamic_qmatmul_keeps_the_generic_path_when_a_kernel_takes_no_out(monkeypatch) -> None:
    _needs_dynamic_qmatmul_node()

    def no_out(x, b, b_scale, b_zero_point=None, bias=None):  # an older package's kernel
        return ops.dynamic_qmatmul(x, b, b_scale, b_zero_point, bias, device="ref")

    ops.register("dynamic_qmatmul", device="cpu", dtypes=(np.float32,), priority=5)(no_out)
    try:
        sess = InferenceSession(_dynamic_quant_mlp())
        assert sess._schedule.steps[0].into is None
        x = np.ones((2, 16), np.float32)
        np.testing.assert_array_equal(
            sess.run(None, {"x": x})[0],
            no_out(
                x,
                sess._schedule.template[sess._schedule.steps[0].ins[1]],
                np.float32(0.01),
                None,
                sess._schedule.steps[0].node.attrs["bias"],
            ),
        )
    finally:
        ops.unregister("dynamic_qmatmul", device="cpu", kernel=no_out)


@pytest.mark.filterwarnings("ignore::opstrata.runtime.SlowKernelWarning")  # the reference kernels on purpose
def test_qconv_writes_its_arena_view(monkeypatch) -> None:
    """A QDQ Conv fused to ai.opstrata::QConv writes its arena view through ops.qconv(..., out=); the
    result equals the allocator path and the unfused QDQ graph."""
    from onnx import TensorProto, helper, numpy_helper

    if "qconv" not in ops.list_ops() or (OPSTRATA_DOMAIN, "QConv") not in KERNELS:
        pytest.skip(
            "QConv needs opstrata-ops >= 0.4.9 and opstrata-graph >= 0.4.7 (compat runs use older ones)"
        )

    r = np.random.default_rng(2)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w", "ws"], ["wd"], axis=0),
        helper.make_node("Conv", ["xd", "wd", "b"], ["y"], pads=[1, 1, 1, 1]),
    ]
    g = helper.make_graph(
        nodes, "qconv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 6, 6])],
        [numpy_helper.from_array(np.array(0.05, np.float32), "xs"), numpy_helper.from_array(np.array(128, np.uint8), "xz"),
         numpy_helper.from_array(r.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8), "w"),
         numpy_helper.from_array(np.full(4, 0.01, np.float32), "ws"),
         numpy_helper.from_array(r.standard_normal(4).astype(np.float32), "b")],
    )  # fmt: skip
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = InferenceSession(model)
    (st,) = [s for s in sess._schedule.steps if s.node.op_type == "QConv"]
    assert st.into is not None
    x = r.standard_normal((2, 3, 6, 6)).astype(np.float32)
    assert "QConv" not in _stored_ops(monkeypatch, sess, {"x": x})
    want = InferenceSession(model, SessionOptions(enable_mem_arena=False)).run(None, {"x": x})[0]
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], want)
    unfused = InferenceSession(model, SessionOptions(graph_optimization_level=0)).run(None, {"x": x})[0]
    np.testing.assert_allclose(want, unfused, rtol=1e-5, atol=1e-5 * float(np.abs(unfused).max()))
