"""An InferenceSession runs a fused elementwise chain through the ops code generator (graph's codegen kernel)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from opstrata.graph.opdefs import fused as _fused, fused_codegen as _codegen
from opstrata.graph.testing import ModelBuilder, ort_run, random_feeds
from opstrata.runtime import InferenceSession, SessionOptions

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


def _chain_model():
    """``h = x @ W + b``; y = tanh(h) * sigmoid(h) + h * h * h * 0.044715 (matches no level-2 pattern)."""
    b = ModelBuilder("chain", 17)
    x = b.input("x", ["batch", 16])
    h = b.op("Add", [b.op("MatMul", [x, b.weight([16, 32])]), b.weight([32], "b", 0.1)])
    ts = b.op("Mul", [b.op("Tanh", [h]), b.op("Sigmoid", [h])])
    cube = b.op("Mul", [b.op("Mul", [b.op("Mul", [h, h]), h]), b.scalar(0.044715)])
    y = b.op("Add", [ts, b.op("Mul", [cube, b.scalar(1 / math.sqrt(2))])])
    b.nodes.append(b.onnx.helper.make_node("Identity", [y], ["y"], name="out"))
    b.output("y")
    return b.build()


@pytest.mark.parametrize("arena", [True, False])
def test_session_runs_the_generated_kernel_and_matches_onnxruntime(monkeypatch, arena: bool) -> None:
    model = _chain_model()
    calls: list[str] = []
    real = _codegen.fused_kernel  # the generated kernel, whether the step writes its view or returns
    monkeypatch.setattr(_codegen, "fused_kernel", lambda n, dt: calls.append(n.name) or real(n, dt))
    sess = InferenceSession(
        model, SessionOptions(graph_optimization_level=3, enable_profiling=True, enable_mem_arena=arena)
    )
    fused = [b for b in sess.plan.bindings if b.op_type == "ai.opstrata::FusedElementwise"]
    assert [(b.kernel, b.path) for b in fused] == [("codegen", "codegen")] and sess.plan.fallbacks == []
    node = next(n for n in sess.graph.nodes if n.op_type == "FusedElementwise")
    assert len(node.attrs["expr"]) >= 8 and node.attrs["consts"]  # the whole chain, constants folded
    feeds = random_feeds(model, {"batch": 6})
    want = ort_run(model, feeds)["y"]
    (got,) = sess.run(None, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert calls == [node.name]
    events = [e for e in sess.profiler.events if e.op_type == "FusedElementwise"]
    assert [(e.kernels, e.fallback) for e in events] == [(("codegen",), False)]


def test_ref_session_steps_through_the_chain(monkeypatch) -> None:
    model = _chain_model()
    calls: list[str] = []
    monkeypatch.setattr(_fused, "run_fused", lambda n, x: calls.append(n.name))
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=3), device="ref")
    kernels = {b.kernel for b in sess.plan.bindings if b.op_type == "ai.opstrata::FusedElementwise"}
    assert "codegen" not in kernels and {"tanh", "sigmoid", "mul", "add"} <= kernels
    feeds = random_feeds(model, {"batch": 3})
    np.testing.assert_allclose(sess.run(None, feeds)[0], ort_run(model, feeds)["y"], rtol=1e-4, atol=1e-5)
    assert calls == []


def _feed_chain_model():
    """A FusedElementwise reading a graph input directly (a per-run value) and one reading arena values."""
    b = ModelBuilder("feed_chain", 17)
    x = b.input("x", ["batch", 16])
    t = b.op("Mul", [b.op("Tanh", [x]), b.op("Sigmoid", [x])])  # reads the feed
    h = b.op("MatMul", [t, b.weight([16, 24])])
    y = b.op("Add", [b.op("Mul", [h, b.op("Sigmoid", [h])]), b.weight([24], "b", 0.1)])  # reads the arena
    b.nodes.append(b.onnx.helper.make_node("Identity", [y], ["y"], name="out"))
    b.output("y")
    return b.build()


def test_bound_runs_bind_fused_nodes_once_and_read_each_runs_values() -> None:
    """Arena runs bind a FusedElementwise over fixed views to one native call (pointers resolved once);
    every run still sees its own feeds: a node reading a feed reads the program's copy of it."""
    import opstrata.graph as og
    from opstrata.ops import native_status

    model = _feed_chain_model()
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=3))
    assert sum(n.op_type == "FusedElementwise" for n in sess.graph.nodes) == 2
    for seed in range(3):
        feeds = random_feeds(model, {"batch": 5}, seed=seed)
        (got,) = sess.run(None, feeds)
        np.testing.assert_allclose(got, ort_run(model, feeds)["y"], rtol=1e-4, atol=1e-5)
    (bound,) = sess._bound.values()
    names = [sess._schedule.steps[i].node.op_type for i in bound.index]
    kinds = [
        getattr(c, "name", None) or getattr(c, "__qualname__", "")
        for c, n in zip(bound.calls, names, strict=True)
        if n == "FusedElementwise"
    ]
    if native_status().available and hasattr(og, "bind_fused"):  # graph >= 0.4.13 binds the native call
        native = [k for k in kinds if "vm_bind" in k or k == "opstrata_ew_run_f32"]  # closure or packed call
        assert len(native) == 2, kinds  # the feed reader too: feeds are staged
