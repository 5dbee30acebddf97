"""Arena runs as prebuilt per-shape calls (_bound): bit-identical to the allocator path, registry changes
after the session was built still apply, a failing kernel names its node, runs keep no feeds alive."""

from __future__ import annotations

import types

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import opstrata.ops as ops
from opstrata.graph.testing import random_feeds
from opstrata.runtime import ExecutionError, InferenceSession, InvalidArgument, SessionOptions
from opstrata.runtime.testing import DAG_KINDS, random_dag_model


def _allocator_outputs(model, feeds, level: int) -> list[np.ndarray]:
    opts = SessionOptions(graph_optimization_level=level, enable_mem_arena=False)
    return InferenceSession(model, opts).run(None, feeds)


@pytest.mark.parametrize("name", ["mlp", "cnn", "bert", "gpt"])
@pytest.mark.parametrize("level", [0, 2, 3])
def test_bound_arena_run_is_bit_identical_to_the_allocator_path(models, name: str, level: int) -> None:
    model, dims = models[name]
    feeds = random_feeds(model, dims)
    want = _allocator_outputs(model, feeds, level)
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=level))
    for _ in range(3):  # first run binds, later ones reuse the bound calls
        for w, g in zip(want, sess.run(None, feeds), strict=True):
            np.testing.assert_array_equal(g, w)
    (bound,) = sess._bound.values()
    assert bound.calls and len(bound.calls) == len(bound.index)
    # new feed values at the same shape: the bound calls read the new feeds, not the first ones
    feeds2 = random_feeds(model, dims, seed=1)
    for w, g in zip(_allocator_outputs(model, feeds2, level), sess.run(None, feeds2), strict=True):
        np.testing.assert_array_equal(g, w)


_choice = st.tuples(st.sampled_from(DAG_KINDS), st.integers(0, 1000), st.integers(0, 1000))


@given(choices=st.lists(_choice, min_size=1, max_size=24), seed=st.integers(0, 2**16))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_dag_bound_runs_bit_identical(choices, seed: int) -> None:
    model = random_dag_model(choices)
    rng = np.random.default_rng(seed)
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=0))
    for _ in range(2):  # feeds change between runs: steps reading feeds or view aliases re-read them
        feeds = {k: rng.standard_normal((8, 8), dtype=np.float32) for k in ("x", "z")}
        want = _allocator_outputs(model, feeds, 0)
        for w, g in zip(want, sess.run(None, feeds), strict=True):
            np.testing.assert_array_equal(g, w)
    assert len(sess._bound) == 1


def test_run_keeps_no_reference_to_feeds(models) -> None:
    model, dims = models["bert"]
    feeds = random_feeds(model, dims)
    sess = InferenceSession(model)
    sess.run(None, feeds)
    (bound,) = sess._bound.values()
    held = {id(v) for v in bound.vals}
    assert not any(id(f) in held for f in feeds.values())
    assert all(not isinstance(v, np.ndarray) or v.base is None or v.base is not f for v in bound.vals for f in feeds.values())  # fmt: skip


@pytest.fixture
def override():
    """Register a cpu kernel for an op (highest priority) for one test; unregistered afterwards."""
    added: list[tuple[str, object]] = []

    def add(op: str, fn) -> None:
        ops.register(op, device="cpu", priority=10_000)(fn)
        added.append((op, fn))

    yield add
    for op, fn in added:
        ops.unregister(op, device="cpu", kernel=fn)


def _stock(op: str):
    return next(e.fn for e in ops.kernels(op) if e.device == "cpu")


def test_kernel_registered_after_the_session_is_used(models, override) -> None:
    model, dims = models["mlp"]
    feeds = random_feeds(model, dims)
    sess = InferenceSession(model)
    want = sess.run(None, feeds)  # binds the calls
    stock, seen = _stock("softmax"), []

    def traced(x, *a, **k):
        seen.append(x.shape)
        return stock(x, *a, **k)

    override("softmax", traced)
    got = sess.run(None, feeds)
    assert seen, "the kernel registered after the build was not called"
    np.testing.assert_array_equal(got[0], want[0])
    ops.unregister("softmax", device="cpu", kernel=traced)
    seen.clear()
    sess.run(None, feeds)
    assert not seen  # unregistered: the stock kernel again


@pytest.mark.parametrize(("name", "op", "node_re"), [("mlp", "softmax", r"node 'softmax' \(Softmax\)"), ("bert", "add", r"node '[^']+' \(Add\)")])  # fmt: skip
def test_failing_kernel_raises_execution_error_naming_its_node(models, override, name, op, node_re) -> None:
    model, dims = models[name]
    feeds = random_feeds(model, dims)
    level = 0 if op == "add" else 3  # level 0 keeps a plain Add node (the out= binary path)
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=level))
    want = sess.run(None, feeds)

    def broken(*a, **k):
        raise ValueError("kernel exploded")

    override(op, broken)
    with pytest.raises(ExecutionError, match=node_re + r".*ValueError: kernel exploded"):
        sess.run(None, feeds)
    ops.unregister(op, device="cpu", kernel=broken)
    (bound,) = sess._bound.values()
    assert not any(v is f for v in bound.vals for f in feeds.values())  # released after the failure
    for w, g in zip(want, sess.run(None, feeds), strict=True):  # the session still runs
        np.testing.assert_array_equal(g, w)


def test_feed_checks_still_apply_after_a_shape_was_validated(models) -> None:
    model, dims = models["bert"]
    feeds = random_feeds(model, dims)
    sess = InferenceSession(model)
    sess.run(None, feeds)
    x = next(iter(feeds))
    with pytest.raises(InvalidArgument, match=rf"input '{x}': expected dtype"):
        sess.run(None, {**feeds, x: feeds[x].astype(np.float64)})
    with pytest.raises(InvalidArgument, match="missing input"):
        sess.run(None, {x: feeds[x]})
    bad = {k: (v[:1] if k == x else v) for k, v in feeds.items()}  # batch disagrees between inputs
    with pytest.raises(InvalidArgument, match="symbolic dim 'batch'"):
        sess.run(None, bad)
    proxy = types.MappingProxyType(feeds)  # not a dict: the full path, same outputs
    for w, g in zip(sess.run(None, feeds), sess.run(None, proxy), strict=True):
        np.testing.assert_array_equal(g, w)
    other = random_feeds(model, {**dims, "seq": dims["seq"] + 2})  # a new shape: validated, then run
    assert sess.run(None, other)[0].shape[1] == dims["seq"] + 2


def test_kernel_removed_after_build_takes_the_audited_fallback_then_rebinds(models) -> None:
    model, dims = models["bert"]
    feeds = random_feeds(model, dims)
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=0, fallback_policy="allow"))
    want = sess.run(None, feeds)
    stock = [e for e in ops.kernels("add") if e.device == "cpu"]
    add_cpu = stock[0].fn

    def resolved(s) -> set:
        (b,) = s._bound.values()
        return {getattr(c, "func", None) for c in b.calls}

    assert add_cpu in resolved(sess)  # the plain Adds call the native kernel directly
    ops.unregister("add", device="cpu")
    try:
        ops.reset_fallback_report()
        got = sess.run(None, feeds)  # rebound: no native kernel, so the public (audited) path
        audited = [r for r in ops.fallback_report().records if r.op == "add" and r.device == "cpu"]
        assert audited and audited[0].count > 0
        assert add_cpu not in resolved(sess)
        for w, g in zip(want, got, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    finally:
        for e in reversed(stock):
            ops.register("add", device="cpu", dtypes=e.dtypes, priority=e.priority, dtype_arg=e.dtype_arg)(
                e.fn
            )
    for w, g in zip(want, sess.run(None, feeds), strict=True):  # rebound to the native kernel again
        np.testing.assert_array_equal(g, w)
    assert add_cpu in resolved(sess)


def _shape_subgraph_model(big: bool = False):
    """x (B, S, 8) -> Reshape to (B, S*8) by a shape computed from x itself (Shape -> Gather -> Mul ->
    Concat), plus a mask (S, S) built from Shape -> Range -> comparisons, as exporters emit."""
    from onnx import TensorProto, helper, numpy_helper

    ints = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    nodes = [
        helper.make_node("Shape", ["x"], ["shp"]),
        helper.make_node("Gather", ["shp", "i0"], ["b"], axis=0),
        helper.make_node("Gather", ["shp", "i1"], ["s"], axis=0),
        helper.make_node("Mul", ["s", "eight"], ["s8"]),
        helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"]),
        helper.make_node("Unsqueeze", ["s8", "ax0"], ["s81"]),
        helper.make_node("Concat", ["b1", "s81"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("Range", ["zero", "s", "one"], ["pos"]),
        helper.make_node("Unsqueeze", ["pos", "ax0"], ["row"]),
        helper.make_node("Unsqueeze", ["pos", "ax1"], ["col"]),
        helper.make_node("GreaterOrEqual", ["col", "row"], ["keep"]),
        helper.make_node("Cast", ["keep"], ["keepf"], to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["x", "w"], ["xw"]),  # (B, S, S)
        helper.make_node("Mul", ["xw", "keepf"], ["y"]),
    ]
    s_dim = 600 if big else "S"
    g = helper.make_graph(
        nodes, "shape_subgraph",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", s_dim, 8])],
        [helper.make_tensor_value_info("flat", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [ints("i0", 0), ints("i1", 1), ints("eight", 8), ints("ax0", [0]), ints("ax1", [1]), ints("zero", 0),
         ints("one", 1), numpy_helper.from_array(np.ones((8, 600 if big else 5), np.float32), "w")],
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_shape_derived_steps_are_computed_once_per_shape() -> None:
    """Shape -> Gather -> Concat -> Reshape and the Range/compare mask are constants of an input shape:
    bound once per shape (left out of the per-run calls), the results those of the allocator path, for
    every shape seen and for new feed values at a known shape."""
    model = _shape_subgraph_model()
    sess = InferenceSession(model)
    rng = np.random.default_rng(0)
    for b, s in ((2, 5), (3, 5), (2, 5)):
        feeds = {"x": rng.standard_normal((b, s, 8)).astype(np.float32)}
        want = _allocator_outputs(model, feeds, 0)
        for w, g in zip(want, sess.run(None, feeds), strict=True):
            np.testing.assert_array_equal(g, w)
    assert len(sess._bound) == 2
    sch = sess._schedule
    for bound in sess._bound.values():
        ran = {sch.steps[i].node.op_type for i in bound.index}
        assert not ran & {"Shape", "Gather", "Concat", "Range", "GreaterOrEqual", "Cast", "Unsqueeze"}
        assert "MatMul" in ran
        folded = [v for v in bound.template if isinstance(v, np.ndarray) and not v.flags.writeable]
        assert folded, "the folded values are read-only arrays of their own"


def test_shape_derived_values_above_the_size_limit_are_recomputed() -> None:
    from opstrata.runtime import _bound

    model = _shape_subgraph_model(big=True)  # the (600, 600) float mask is 1.4 MB
    sess = InferenceSession(model)
    feeds = {"x": np.ones((1, 600, 8), np.float32)}
    want = _allocator_outputs(model, feeds, 0)
    for w, g in zip(want, sess.run(None, feeds), strict=True):
        np.testing.assert_array_equal(g, w)
    (bound,) = sess._bound.values()
    sch = sess._schedule
    ran = [sch.steps[i].node.op_type for i in bound.index]
    assert "Cast" in ran and "Shape" not in ran  # the large float mask stays a step; its small inputs fold
    assert _bound.FOLD_MAX_BYTES < 600 * 600 * 4


def test_random_ops_are_never_folded() -> None:
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["shp"]),
         helper.make_node("ConstantOfShape", ["shp"], ["zeros"]),  # shape-derived: would fold
         helper.make_node("RandomNormalLike", ["zeros"], ["r"], dtype=TensorProto.FLOAT),
         helper.make_node("Add", ["x", "r"], ["y"])],
        "rnd", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )  # fmt: skip
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=0))
    x = np.zeros(4, np.float32)
    a, b = sess.run(None, {"x": x})[0], sess.run(None, {"x": x})[0]
    assert not np.array_equal(a, b)


def _assert_only_matmul_and_relu_run(model, out_shape) -> None:
    """At three input shapes (one repeated) the session equals the allocator path, its output has
    ``out_shape(b, s)``, and each shape's bound program calls only the MatMul and the Relu."""
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=0))
    rng = np.random.default_rng(0)
    for b, s in ((2, 5), (3, 7), (2, 5)):
        feeds = {"x": rng.standard_normal((b, s, 8)).astype(np.float32)}
        (want,) = _allocator_outputs(model, feeds, 0)
        (got,) = sess.run(None, feeds)
        assert got.shape == out_shape(b, s)
        np.testing.assert_array_equal(got, want)
    sch = sess._schedule
    for bound in sess._bound.values():
        ran = [sch.steps[i].node.op_type for i in bound.index]
        assert ran == ["MatMul", "Relu"], ran


def test_reshape_to_a_shape_derived_target_is_a_view() -> None:
    """A Reshape whose target an exporter computes from shapes (Shape -> Gather -> Concat) is folded to a
    constant per input shape, so the Reshape of an arena value is its arena view: no call per run."""
    from onnx import TensorProto, helper, numpy_helper

    ints = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),  # (B, S, 4): an arena value
        helper.make_node("Shape", ["h"], ["shp"]),
        helper.make_node("Gather", ["shp", "i0"], ["b"], axis=0),
        helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"]),
        helper.make_node("Concat", ["b1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["h", "target"], ["flat"]),  # (B, S * 4)
        helper.make_node("Relu", ["flat"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "reshape_target",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [ints("i0", 0), ints("ax0", [0]), ints("minus1", [-1]),
         numpy_helper.from_array(np.random.default_rng(1).standard_normal((8, 4)).astype(np.float32), "w")],
    )  # fmt: skip
    _assert_only_matmul_and_relu_run(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), lambda b, s: (b, s * 4)
    )


def test_shape_of_a_view_alias_is_folded_too() -> None:
    """nn.TransformerEncoder's K path: Shape reads a view alias (a Reshape of an arena value), and the
    target it feeds makes a second Reshape; the alias has its planned shape, so the Shape chain folds and
    both Reshapes are views: no call per run but the MatMul and the Relu."""
    from onnx import TensorProto, helper, numpy_helper

    ints = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),  # (B, S, 4): an arena value
        helper.make_node("Reshape", ["h", "split"], ["h4"]),  # (B, S, 2, 2): a view alias
        helper.make_node("Shape", ["h4"], ["shp"], start=0, end=2),
        helper.make_node("Concat", ["shp", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["h4", "target"], ["flat"]),  # (B, S, 4) again
        helper.make_node("Relu", ["flat"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "alias_shape",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [ints("split", [0, 0, 2, 2]), ints("minus1", [-1]),
         numpy_helper.from_array(np.random.default_rng(1).standard_normal((8, 4)).astype(np.float32), "w")],
    )  # fmt: skip
    _assert_only_matmul_and_relu_run(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), lambda b, s: (b, s, 4)
    )


def test_bound_gemms_and_small_attention_match_onnxruntime() -> None:
    """Arena runs bind MatMul / Linear to their BLAS call and a small attention (GQA, causal, (B, S, H, D)
    layout after the graph passes) to one native call: results still match onnxruntime, run after run."""
    pytest.importorskip("onnxruntime")
    import opstrata.graph as og
    from opstrata.graph.testing import gpt_gqa_model, ort_run

    model = gpt_gqa_model(layers=2, heads=8, kv_heads=4)
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=3))
    for seed in range(3):
        feeds = random_feeds(model, {"batch": 2, "seq": 5}, seed=seed)
        (got,) = sess.run(None, feeds)
        np.testing.assert_allclose(got, ort_run(model, feeds)["y"], rtol=1e-4, atol=1e-5)
    (bound,) = sess._bound.values()
    kinds = {
        sess._schedule.steps[i].node.op_type: getattr(c, "name", None) or getattr(c, "__qualname__", type(c).__name__)
        for c, i in zip(bound.calls, bound.index, strict=True)
    }  # fmt: skip
    if hasattr(ops, "bind") and hasattr(og, "bind_fused") and ops.native_status().available:
        # one native call: a packed one (ops >= 0.4.20) or the binder's closure
        assert kinds["Attention"] in ("opstrata_attention_f32",) or kinds["Attention"].startswith(
            "bind_small_attention"
        ), kinds
        assert kinds["Linear"] in ("partial", "_bind_linear.<locals>.run", "BoundSteps", "batched_sgemm"), (
            kinds
        )


def _llama_block_model(seq: int = 6):
    """A Llama-style block as torch.onnx writes it: decomposed RMSNorm, one QKV MatMul + Split, head
    Reshape / Transpose, rotate-half RoPE (Slice, Neg, Concat, Mul, Add), additive causal mask, merge,
    residual, RMSNorm, SiLU-gated MLP, residual. x (batch, seq, 16), 4 heads of 4."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = []

    def c(name, arr):
        inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def w(name, *shape):
        return c(name, (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32))

    nodes = []

    def n(op, ins, out, **kw):
        nodes.append(
            helper.make_node(op, ins, [out] if isinstance(out, str) else out, name=f"{op}_{len(nodes)}", **kw)
        )
        return out

    def rms(x, wname, tag):
        ms = n(
            "ReduceMean", [n("Pow", [x, c(f"two_{tag}", np.float32(2))], f"{tag}_sq")], f"{tag}_ms", axes=[-1]
        )
        r = n("Sqrt", [n("Add", [ms, c(f"eps_{tag}", np.float32(1e-6))], f"{tag}_mse")], f"{tag}_rms")
        return n("Mul", [n("Div", [x, r], f"{tag}_n"), w(wname, 16)], f"{tag}_out")

    def rope(t, tag):
        ax, lo, mid, hi = c(f"{tag}_ax", [3]), c(f"{tag}_lo", [0]), c(f"{tag}_mid", [2]), c(f"{tag}_hi", [4])
        x1 = n("Slice", [t, lo, mid, ax], f"{tag}_x1")
        x2 = n("Slice", [t, mid, hi, ax], f"{tag}_x2")
        rot = n("Concat", [n("Neg", [x2], f"{tag}_neg"), x1], f"{tag}_rot", axis=-1)
        return n(
            "Add", [n("Mul", [t, "cos"], f"{tag}_xc"), n("Mul", [rot, "sin"], f"{tag}_rs")], f"{tag}_rope"
        )

    ang = rng.standard_normal((1, 1, seq, 4)).astype(np.float32)
    c("cos", np.cos(ang))
    c("sin", np.sin(ang))
    h = rms("x", "w1", "n1")
    qkv = n("MatMul", [h, w("wqkv", 16, 48)], "qkv")
    sizes = c("sizes", [16, 16, 16])
    n("Split", [qkv, sizes], ["q0", "k0", "v0"], axis=-1)
    heads = c("heads", [0, 0, 4, 4])
    q, k, v = (
        n("Transpose", [n("Reshape", [t, heads], f"{t}_h")], f"{t}_t", perm=[0, 2, 1, 3])
        for t in ("q0", "k0", "v0")
    )
    q, k = rope(q, "q"), rope(k, "k")
    s = n(
        "Mul",
        [n("MatMul", [q, n("Transpose", [k], "kT", perm=[0, 1, 3, 2])], "qk"), c("scale", np.float32(0.5))],
        "s",
    )
    mask = np.triu(np.full((seq, seq), -1e9, np.float32), 1)[None, None]
    p = n("Softmax", [n("Add", [s, c("mask", mask)], "sm")], "p", axis=-1)
    o = n("Transpose", [n("MatMul", [p, v], "pv")], "pvt", perm=[0, 2, 1, 3])
    attn = n("MatMul", [n("Reshape", [o, c("merge", [0, 0, 16])], "merged"), w("wo", 16, 16)], "attn")
    y1 = n("Add", ["x", attn], "y1")
    h2 = rms(y1, "w2", "n2")
    g = n("MatMul", [h2, w("wg", 16, 24)], "g")
    act = n(
        "Mul", [n("Mul", [g, n("Sigmoid", [g], "sg")], "silu"), n("MatMul", [h2, w("wu", 16, 24)], "u")], "gu"
    )
    n("Add", [y1, n("MatMul", [act, w("wd", 24, 16)], "down")], "y")
    graph = helper.make_graph(
        nodes, "llama_block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", seq, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("level", [2, 3])
def test_bound_llama_block_is_bit_identical_and_binds_its_kernels(level: int) -> None:
    """RMSNorm, SkipRMSNorm, Split, RotaryHalf, bshd Attention, FusedElementwise and MatMul steps are
    bound once (native / BLAS calls on fixed views) and give the allocator path's bits, run after run."""
    pytest.importorskip("onnxruntime")
    import opstrata.graph as og
    from opstrata.graph.testing import ort_run

    model = _llama_block_model()
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=level))
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).standard_normal((2, 6, 16)).astype(np.float32)}
        want = _allocator_outputs(model, feeds, level)
        got = sess.run(None, feeds)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_allclose(got[0], ort_run(model, feeds)["y"], rtol=1e-4, atol=1e-5)
    passes = {name for _, name, _ in og.passes_for_level(level)}
    if not {"fuse_rotary", "fold_attention_layout"} <= passes:
        return  # graph < 0.4.13 (a compat floor): the block runs unfused, the results above still hold
    (bound,) = sess._bound.values()
    sch = sess._schedule
    steps = [(sch.steps[i], c) for c, i in zip(bound.calls, bound.index, strict=True)]
    ran = {st.node.op_type for st, _ in steps}
    assert {"RotaryHalf", "Attention", "SkipRMSNorm", "RMSNorm", "Split"} <= ran, sorted(ran)
    assert "Slice" not in ran and "Transpose" not in ran
    if hasattr(ops, "bind") and hasattr(og, "bind_fused") and ops.native_status().available:
        bindable = {
            "RotaryHalf",
            "Attention",
            "SkipRMSNorm",
            "RMSNorm",
            "Split",
            "MatMul",
            "FusedElementwise",
        }
        generic = [
            st.node.op_type for st, c in steps
            if st.node.op_type in bindable and not set(st.ins) & set(sch.input_slots)  # a feed is per run
            and getattr(c, "__qualname__", "").startswith(("_generic", "_dyn"))
        ]  # fmt: skip
        assert generic == [], generic  # every step over arena values binds


def test_data_movement_steps_bind_to_copies_of_fixed_views() -> None:
    """Transpose / Slice / Expand of arena values bind to a copy of a view taken once, Gather to np.take,
    Concat to np.concatenate (all into the output views): the allocator path's bits, each run's values."""
    from onnx import TensorProto, helper, numpy_helper

    ints = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),  # (4, 6): an arena value
        helper.make_node("Transpose", ["h"], ["ht"], perm=[1, 0]),  # (6, 4)
        helper.make_node("Slice", ["ht", "s0", "s1", "ax0"], ["hs"]),  # (4, 4)
        helper.make_node("Gather", ["h", "idx"], ["hg"], axis=1),  # (4, 4)
        helper.make_node("Concat", ["hs", "hg"], ["hc"], axis=0),  # (8, 4)
        helper.make_node("Expand", ["hc", "shape3"], ["he"]),  # (2, 8, 4)
        helper.make_node("Relu", ["he"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "moves", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.random.default_rng(0).standard_normal((6, 6)).astype(np.float32), "w"),
         ints("s0", [1]), ints("s1", [5]), ints("ax0", [0]), ints("idx", [5, 0, -1, 2]), ints("shape3", [2, 8, 4])],
    )  # fmt: skip
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=0))
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).standard_normal((4, 6)).astype(np.float32)}
        (want,) = _allocator_outputs(model, feeds, 0)
        (got,) = sess.run(None, feeds)
        np.testing.assert_array_equal(got, want)
    (bound,) = sess._bound.values()
    kinds = {
        sess._schedule.steps[i].node.op_type: getattr(c, "name", None) or getattr(getattr(c, "func", c), "__name__", "") or type(c).__name__
        for c, i in zip(bound.calls, bound.index, strict=True)
    }  # fmt: skip
    if hasattr(ops, "bind"):  # numpy calls, or packed native ones (ops >= 0.4.20 with the native library)
        assert kinds["Transpose"] == kinds["Slice"] == kinds["Expand"], kinds
        assert kinds["Transpose"] in ("copyto", "strided_copy"), kinds
        assert kinds["Gather"] in ("take", "gather_rows"), kinds
        assert kinds["Concat"] in ("concatenate", "BoundSteps"), kinds  # numpy's, or a native copy per piece


def test_conv_net_bound_runs_are_bit_identical_and_bind_every_conv_step() -> None:
    """The mobile idioms (Conv epilogues, depthwise, SE, MaxPool, ReduceMean): bound calls, the allocator
    path's bits, and no step left on the per-run path (the first Conv reads the staged feed)."""
    import opstrata.graph.testing as gt

    build = getattr(gt, "mobile_cnn_model", None)
    if build is None:
        pytest.skip("graph < 0.4.14 has no mobile_cnn_model")
    model = build()
    for level in (0, 2, 3):
        sess = InferenceSession(model, SessionOptions(graph_optimization_level=level, intra_op_num_threads=1))
        for seed in range(2):
            feeds = random_feeds(model, {"batch": 2}, seed=seed)
            want = _allocator_outputs(model, feeds, level)
            for w, g in zip(want, sess.run(None, feeds), strict=True):
                np.testing.assert_array_equal(g, w)
        (bound,) = sess._bound.values()
        sch = sess._schedule
        per_run = [
            sch.steps[i].node.op_type for i, c in zip(bound.index, bound.calls, strict=True)
            if "_generic" in getattr(c, "__qualname__", "") or "_dyn" in getattr(c, "__qualname__", "")
        ]  # fmt: skip
        conv_like = {"Conv", "FusedConv", "MaxPool", "ReduceMean"}
        if ops.native_status().available and hasattr(
            ops, "merge_bound_calls"
        ):  # native binders: ops >= 0.4.20
            assert not conv_like & set(per_run), per_run


def test_feeds_are_staged_into_the_programs_own_buffers(models, monkeypatch) -> None:
    """A run copies each (small) feed into a buffer the bound steps read: changing the caller's array
    afterwards changes nothing; over the size limit the feed is read in place, with the same results."""
    from opstrata.runtime import _bound

    model, dims = models["cnn"]
    feeds = random_feeds(model, dims)
    want = _allocator_outputs(model, feeds, 3)
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=3))
    got = sess.run(None, feeds)
    (bound,) = sess._bound.values()
    assert [k for k, _ in bound.stage] == [0]
    buf = bound.stage[0][1]
    assert not np.may_share_memory(buf, feeds["x"])
    feeds["x"][...] = 0.0  # the caller reuses its array: the next run copies it afresh
    np.testing.assert_array_equal(got[0], want[0])
    zero = sess.run(None, feeds)[0]
    np.testing.assert_array_equal(zero, _allocator_outputs(model, feeds, 3)[0])
    monkeypatch.setattr(_bound, "STAGE_MAX_BYTES", 0)
    sess2 = InferenceSession(model, SessionOptions(graph_optimization_level=3))
    np.testing.assert_array_equal(sess2.run(None, feeds)[0], zero)
    (bound2,) = sess2._bound.values()
    assert bound2.stage == []


def test_native_steps_run_merged_and_a_failure_inside_names_its_node() -> None:
    """Consecutive bound native steps run as one batch call (ops >= 0.4.20); a call failing inside the
    batch raises ExecutionError naming its own node, and the session still runs afterwards."""
    import opstrata.graph.testing as gt

    build = getattr(gt, "mobile_cnn_model", None)
    if build is None or not hasattr(ops, "merge_bound_calls"):
        pytest.skip("needs graph >= 0.4.14 and ops >= 0.4.20")
    model = build()
    feeds = random_feeds(model, {"batch": 1})
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=3, intra_op_num_threads=1))
    want = sess.run(None, feeds)
    (bound,) = sess._bound.values()
    if not ops.native_status().available:
        pytest.skip("no native library")
    batches = [k for k, r in enumerate(bound.runner) if isinstance(r, ops.NativeBatch)]
    assert batches, "no native steps were merged"
    k = batches[0]
    batch = bound.runner[k]
    victim = batch.calls[-1]
    node = sess._schedule.steps[bound.owners[k][-1]].node
    code, victim.code = victim.code, 999  # the library answers an unknown id with an error code
    batch._cmds[2 * (len(batch.calls) - 1)] = 999
    with pytest.raises(ExecutionError, match=rf"node '{node.name}' \((\S+::)?{node.op_type}\).*code -1000"):
        sess.run(None, feeds)
    victim.code = code
    batch._cmds[2 * (len(batch.calls) - 1)] = code
    for w, g in zip(want, sess.run(None, feeds), strict=True):
        np.testing.assert_array_equal(g, w)


def test_a_reshape_of_a_staged_feed_is_a_fixed_view_and_its_reader_binds() -> None:
    """GPT-2's input_ids -> Reshape -> Gather: the Reshape of the program's copy of the feed is taken once
    (no step per run), the Gather binds to it, and each run still reads its own feed."""
    from opstrata.graph.testing import ModelBuilder

    b = ModelBuilder("ids", 17, seed=0)
    ids = b.input("ids", [2, 5], np.int64)
    flat = b.op("Reshape", [ids, b.ints([10])])
    emb = b.op("Gather", [b.weight([50, 8]), flat], axis=0)
    b.nodes.append(b.onnx.helper.make_node("Reshape", [emb, b.ints([2, 5, 8])], ["y"], name="out"))
    b.output("y")
    model = b.build()
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=1))
    rng = np.random.default_rng(0)
    for _ in range(3):
        feeds = {"ids": rng.integers(0, 50, (2, 5)).astype(np.int64)}
        want = _allocator_outputs(model, feeds, 1)
        got = sess.run(None, feeds)
        feeds["ids"][...] = 0  # the caller reuses its array after the run: nothing bound reads it
        np.testing.assert_array_equal(got[0], want[0])
    (bound,) = sess._bound.values()
    ran = [sess._schedule.steps[i].node for i in bound.index]
    assert any(n.op_type == "Gather" for n in ran)
    assert not any(n.op_type == "Reshape" and n.inputs[0] == "ids" for n in ran)  # a view taken once
    bad = {"ids": np.full((2, 5), 50, np.int64)}  # out of range: the bound gather names its node
    with pytest.raises(ExecutionError, match=r"Gather"):
        sess.run(None, bad)


@pytest.mark.parametrize(("n", "hw"), [(1, 7), (2, 4), (1, 1)])
def test_global_average_pool_is_bound_with_the_graph_kernels_bits(n: int, hw: int) -> None:
    """The TorchScript exporter's GlobalAveragePool (ReduceMean's place in the dynamo export) runs as the
    bound mean over the image, with the graph kernel's bits, and joins the native batch."""
    import opstrata.graph as og
    from opstrata.graph.testing import ModelBuilder

    b = ModelBuilder("gap", 17)
    x = b.input("x", ["batch", 8, hw, hw])
    y = b.op(
        "GlobalAveragePool", [b.op("Relu", [b.op("Conv", [x, b.weight([16, 8, 3, 3])], pads=[1, 1, 1, 1])])]
    )
    b.nodes.append(b.onnx.helper.make_node("Flatten", [y], ["out"], axis=1))
    b.output("out")
    model = b.build()
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=3, intra_op_num_threads=1))
    feeds = {"x": np.random.default_rng(n * 10 + hw).standard_normal((n, 8, hw, hw)).astype(np.float32)}
    (got,) = sess.run(None, feeds)
    np.testing.assert_array_equal(got, og.run_graph(sess.graph, feeds)["out"])
    (bound,) = sess._bound.values()
    gap = [c for c, i in zip(bound.calls, bound.index, strict=True)
           if sess._schedule.steps[i].node.op_type == "GlobalAveragePool"]  # fmt: skip
    assert len(gap) == 1
    if ops.native_status().available and hasattr(ops, "merge_bound_calls"):  # ops >= 0.4.20 binds the mean
        assert "partial" not in type(gap[0]).__name__ and "_generic" not in getattr(
            gap[0], "__qualname__", ""
        )


def test_unfused_attention_binds_its_matmuls_and_softmax_natively() -> None:
    """Scores and context as 4-D MatMuls around a Softmax (what the TorchScript export leaves when the
    attention fusion cannot see its shapes): one native batch, the graph kernels' bits."""
    import opstrata.graph as og
    from opstrata.graph.testing import ModelBuilder

    b = ModelBuilder("attn", 17)
    q = b.input("q", ["batch", 4, 8, 16])
    k = b.input("k", ["batch", 4, 16, 8])
    v = b.input("v", ["batch", 4, 8, 16])
    p = b.op("Softmax", [b.op("MatMul", [q, k])], axis=-1)
    b.nodes.append(b.onnx.helper.make_node("MatMul", [p, v], ["out"]))
    b.output("out")
    model = b.build()
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=0, intra_op_num_threads=1))
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in
             (("q", (2, 4, 8, 16)), ("k", (2, 4, 16, 8)), ("v", (2, 4, 8, 16)))}  # fmt: skip
    (got,) = sess.run(None, feeds)
    np.testing.assert_array_equal(got, og.run_graph(sess.graph, feeds)["out"])
    (bound,) = sess._bound.values()
    probe = np.zeros((1, 2), np.float32)
    bind = getattr(ops, "bind", None)  # ops >= 0.4.33 binds softmax, and stacked matmuls where numpy's sgemm
    stack = np.zeros((1, 1, 2, 2), np.float32)  # is reachable from C
    natively = (
        ops.native_status().available and bind is not None
        and bind("softmax", probe, out=np.empty_like(probe)) is not None
        and isinstance(bind("matmul", stack, stack, out=np.empty_like(stack)), getattr(ops, "NativeCall", ()))
    )  # fmt: skip
    if natively:
        kinds = {type(c).__name__ for c in bound.runner}
        assert "partial" not in kinds and "function" not in kinds, kinds


def test_a_float_relu_step_is_ops_native_loop_with_numpys_bits() -> None:
    """A lone float32 Relu (a quantized model's, where it cannot fold into a convolution) binds to ops'
    native loop when ops has one (>= 0.4.60): inside the run's native batch, the same bits as numpy's
    maximum (NaN kept, -0 to +0)."""
    from opstrata.graph.testing import ModelBuilder

    b = ModelBuilder("relu", 17)
    x = b.input("x", [4, 33])
    b.output(b.op("Relu", [b.op("Neg", [x])]))
    sess = InferenceSession(b.build(), SessionOptions(graph_optimization_level=0))
    v = np.random.default_rng(0).standard_normal((4, 33)).astype(np.float32)
    v[0, :4] = [np.nan, -0.0, 0.0, -np.inf]
    for _ in range(2):  # the second run takes the bound calls
        got = sess.run(None, {"x": v})[0]
        want = np.maximum(-v, np.float32(0))
        np.testing.assert_array_equal(got, want)
        assert np.array_equal(np.signbit(got), np.signbit(want))
    native = getattr(ops, "NativeCall", None)
    probe = np.ones(3, np.float32)
    if (
        native is None
        or not hasattr(ops, "bind")
        or not isinstance(ops.bind("relu", probe, out=probe), native)
    ):
        return  # an opstrata-ops without the native relu loop: the numpy kernel, per node
    (bound,) = sess._bound.values()
    steps = sess._schedule.steps
    relu = [c for c, i in zip(bound.calls, bound.index, strict=True) if steps[i].node.op_type == "Relu"]
    assert isinstance(relu[0], native) and relu[0].name == "relu_f32"


def _position_bias_model():
    """T5's relative position bias: buckets from Range(S) (outer difference, clipped), a Gather from a
    (buckets, heads) table, Transpose to (heads, S, S): a shape-derived constant the Transpose makes as a
    strided view; then Relu(scores + bias)."""
    from onnx import TensorProto, helper, numpy_helper

    ints = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    table = np.random.default_rng(3).standard_normal((4, 2)).astype(np.float32)
    nodes = [
        helper.make_node("Shape", ["x"], ["shp"]),
        helper.make_node("Gather", ["shp", "i2"], ["s"], axis=0),
        helper.make_node("Range", ["zero", "s", "one"], ["pos"]),
        helper.make_node("Unsqueeze", ["pos", "ax0"], ["row"]),
        helper.make_node("Unsqueeze", ["pos", "ax1"], ["col"]),
        helper.make_node("Sub", ["row", "col"], ["rel"]),
        helper.make_node("Abs", ["rel"], ["dist"]),
        helper.make_node("Min", ["dist", "three"], ["bucket"]),
        helper.make_node("Gather", ["table", "bucket"], ["per_pair"], axis=0),  # (S, S, H)
        helper.make_node("Transpose", ["per_pair"], ["heads"], perm=[2, 0, 1]),  # (H, S, S), a strided view
        helper.make_node("Unsqueeze", ["heads", "ax0"], ["bias"]),
        helper.make_node("Add", ["x", "bias"], ["scores"]),
        helper.make_node("Relu", ["scores"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "position_bias",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 2, "S", "S"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [ints("i2", 2), ints("zero", 0), ints("one", 1), ints("three", 3), ints("ax0", [0]), ints("ax1", [1]),
         numpy_helper.from_array(table, "table")],
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_folded_constants_are_c_order_so_their_readers_bind_once() -> None:
    """A shape-derived constant made as a strided view (a Transpose) is kept in C order: the generated
    kernel reading it binds to it once (one native call per run, no copy per run), the bits unchanged."""
    from opstrata.ops.native import library as _native

    model = _position_bias_model()
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=3))
    rng = np.random.default_rng(0)
    for b, s in ((1, 6), (2, 5), (1, 6)):
        feeds = {"x": rng.standard_normal((b, 2, s, s)).astype(np.float32)}
        (want,) = _allocator_outputs(model, feeds, 3)
        np.testing.assert_array_equal(sess.run(None, feeds)[0], want)
    sch = sess._schedule
    for bound in sess._bound.values():
        folded = [v for v in bound.template if isinstance(v, np.ndarray) and not v.flags.writeable]
        assert any(v.ndim == 4 for v in folded) and all(v.flags.c_contiguous for v in folded)
        assert [sch.steps[i].node.op_type for i in bound.index] == ["FusedElementwise"]
        if _native.library() is not None and hasattr(ops, "merge_bound_calls"):  # ops >= 0.4.20 (compat rows)
            assert len(bound.runner) == 1 and type(bound.runner[0]).__name__ in ("NativeCall", "NativeBatch")


@pytest.mark.parametrize("pads", [[0, 0, 0, 0], [1, 1, 1, 1]])
def test_average_pool_is_bound_where_its_windows_stay_inside(pads) -> None:
    """DenseNet's transition (2x2, stride 2, no padding) is one native call in the bound program; a
    padded AveragePool keeps the per-run path; both give the allocator path's bits."""
    from onnx import TensorProto, helper

    from opstrata.ops.native import library as _native

    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]),
         helper.make_node("AveragePool", ["r"], ["y"], kernel_shape=[2, 2], strides=[2, 2], pads=pads)],
        "avg", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 3, 8, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=0))
    for seed in (0, 1):
        feeds = {"x": np.random.default_rng(seed).standard_normal((2, 3, 8, 6)).astype(np.float32)}
        (want,) = _allocator_outputs(model, feeds, 0)
        np.testing.assert_array_equal(sess.run(None, feeds)[0], want)
    (bound,) = sess._bound.values()
    kernels = getattr(getattr(ops, "native", None), "kernels", None)
    if _native.library() is not None and hasattr(kernels, "avg_pool2d_native"):  # ops >= 0.4.84
        native = [type(c).__name__ in ("NativeCall", "NativeBatch") for c in bound.runner]
        assert native == ([True] if not any(pads) else [True, False])


def _position_ids_model():
    """RoBERTa's position ids from its input ids: mask = ids != pad; cumsum(mask) * mask + pad, then
    the ids as a float mask too (Cast bool -> float) and a Max with a floor."""
    from onnx import TensorProto, helper, numpy_helper

    ints = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    nodes = [
        helper.make_node("Equal", ["ids", "pad"], ["is_pad"]),
        helper.make_node("Not", ["is_pad"], ["keep"]),
        helper.make_node("Cast", ["keep"], ["keep32"], to=TensorProto.INT32),
        helper.make_node("Cast", ["keep32"], ["keep64"], to=TensorProto.INT64),
        helper.make_node("CumSum", ["keep64", "axis"], ["run"]),
        helper.make_node("Mul", ["run", "keep64"], ["masked"]),
        helper.make_node("Add", ["masked", "pad"], ["pos"]),
        helper.make_node("Max", ["pos", "floor"], ["pos_floor"]),
        helper.make_node("Cast", ["keep"], ["keepf"], to=TensorProto.FLOAT),
    ]
    g = helper.make_graph(
        nodes, "position_ids", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["B", "S"])],
        [helper.make_tensor_value_info("pos_floor", TensorProto.INT64, None),
         helper.make_tensor_value_info("keepf", TensorProto.FLOAT, None)],
        [ints("pad", 1), ints("axis", 1), ints("floor", 2)],
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("level", [0, 3])
def test_integer_elementwise_steps_are_one_numpy_call_each(level: int) -> None:
    """Position ids and masks (integer / boolean steps) bind as one numpy call each into the arena,
    giving the allocator path's values, also at int64's wrap-around."""
    from functools import partial

    model = _position_ids_model()
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=level))
    rng = np.random.default_rng(0)
    for ids in (rng.integers(0, 4, (2, 7)), rng.integers(0, 4, (3, 5)), np.full((1, 3), 2**62)):
        feeds = {"ids": ids.astype(np.int64)}
        for w, g in zip(_allocator_outputs(model, feeds, level), sess.run(None, feeds), strict=True):
            np.testing.assert_array_equal(g, w)
    sch = sess._schedule
    for bound in sess._bound.values():
        for call, i in zip(bound.calls, bound.index, strict=True):
            op = sch.steps[i].node.op_type
            assert isinstance(call, partial) and call.func in (np.copyto, np.cumsum, *_exact_ufuncs()), op


def _exact_ufuncs():
    from opstrata.runtime._bound import _EXACT_UFUNCS

    return tuple(_EXACT_UFUNCS.values())


def test_a_replaced_integer_kernel_is_still_called() -> None:
    """A graph kernel a user or test replaced keeps its per-run call (it is not bound to numpy's ufunc)."""
    from opstrata.graph import EXECUTOR_KERNELS

    model = _position_ids_model()
    stock = EXECUTOR_KERNELS[("", "Equal")]
    calls = []

    def counted(node, args):
        calls.append(node.name)
        return stock(node, args)

    EXECUTOR_KERNELS[("", "Equal")] = counted
    try:
        sess = InferenceSession(model, SessionOptions(graph_optimization_level=0))
        feeds = {"ids": np.arange(6, dtype=np.int64).reshape(2, 3)}
        for _ in range(3):
            sess.run(None, feeds)
    finally:
        EXECUTOR_KERNELS[("", "Equal")] = stock
    assert len(calls) == 3


def test_a_cumsum_axis_fed_at_run_time_is_read_each_run() -> None:
    """Only a constant axis is bound: an axis given as a graph input may change between runs of a shape."""
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("CumSum", ["x", "axis"], ["y"])], "cumsum_axis",
        [helper.make_tensor_value_info("x", TensorProto.INT32, [2, 3]),
         helper.make_tensor_value_info("axis", TensorProto.INT32, [])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
    )  # fmt: skip
    sess = InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    x = np.arange(1, 7, dtype=np.int32).reshape(2, 3)
    for axis in (0, 1, 0):
        (got,) = sess.run(None, {"x": x, "axis": np.array(axis, np.int32)})
        np.testing.assert_array_equal(got, np.cumsum(x, axis=axis))
