"""Arena execution: one buffer per input shape, laid out by the graph's memory plan; no steady-state allocation."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import opstrata.runtime._allocator as _allocator_mod
import opstrata.runtime._arena as _arena_mod
import opstrata.runtime._bound as _bound_mod
import opstrata.runtime._executor as _executor_mod
import opstrata.runtime._session as _session_mod
from opstrata.graph.testing import random_feeds
from opstrata.runtime import InferenceSession, SessionOptions

_ALLOC_FUNCS = (
    "empty",
    "zeros",
    "ones",
    "full",
    "array",
    "copy",
    "ascontiguousarray",
    "empty_like",
    "zeros_like",
)


class _CountingNumpy:
    """Stands in for ``np`` inside the runtime modules and counts every call that allocates an array."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str):
        attr = getattr(np, name)
        if name in _ALLOC_FUNCS:

            def counted(*a, **k):
                self.calls.append(name)
                return attr(*a, **k)

            return counted
        return attr


@pytest.mark.parametrize("name", ["mlp", "cnn", "bert", "gpt"])
@pytest.mark.parametrize("level", [0, 3])
def test_steady_state_run_allocates_only_its_outputs(monkeypatch, models, name: str, level: int) -> None:
    model, dims = models[name]
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=level))
    feeds = random_feeds(model, dims)
    sess.run(None, feeds)  # first run at this shape: plans memory and allocates the arena
    arena = next(iter(sess.arenas.values()))
    counter = _CountingNumpy()
    for mod in (_session_mod, _executor_mod, _arena_mod, _allocator_mod, _bound_mod):
        monkeypatch.setattr(mod, "np", counter)
    dom = np.lib.tracemalloc_domain
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot().filter_traces([tracemalloc.DomainFilter(True, dom)])
        outs = sess.run(None, feeds)
        after = tracemalloc.take_snapshot().filter_traces([tracemalloc.DomainFilter(True, dom)])
    finally:
        tracemalloc.stop()
    # the runtime's own array allocations in the steady state: one copy per output, nothing else
    assert counter.calls == ["array"] * len(outs)
    # numpy memory still held after the run: exactly the outputs (no growth of arena, caches, blocks)
    grown = sum(d.size_diff for d in after.compare_to(before, "filename"))
    assert grown == sum(o.nbytes for o in outs)
    assert next(iter(sess.arenas.values())) is arena
    assert sess.allocator.stats()["num_alloc"] == 0


@pytest.mark.parametrize("name", ["mlp", "cnn", "bert", "gpt"])
def test_arena_bytes_equal_the_plan(models, name: str) -> None:
    model, dims = models[name]
    sess = InferenceSession(model)
    feeds = random_feeds(model, dims)
    sess.run(None, feeds)
    (key, arena), *_ = sess.arenas.items()
    mp = sess.plan.memory_for(dict(zip([i.name for i in sess.get_inputs()], key, strict=True)))
    assert arena.nbytes == mp.arena_bytes == arena.buffer.nbytes
    assert arena.plan is mp
    for v, view in arena.views.items():  # each view sits at its planned offset
        start = view.__array_interface__["data"][0] - arena.buffer.__array_interface__["data"][0]
        assert start == mp.offsets[v] and view.shape == mp.shapes[v]


def test_one_arena_per_shape_cached(models) -> None:
    model, _ = models["bert"]
    sess = InferenceSession(model)
    for dims in ({"batch": 2, "seq": 5}, {"batch": 1, "seq": 7}, {"batch": 2, "seq": 5}):
        feeds = random_feeds(model, dims)
        from opstrata.graph.testing import ort_run

        pytest.importorskip("onnxruntime")
        np.testing.assert_allclose(sess.run(None, feeds)[0], ort_run(model, feeds)["y"], rtol=1e-4, atol=1e-5)
    assert len(sess.arenas) == 2
    sizes = sorted(a.nbytes for a in sess.arenas.values())
    assert sizes[0] < sizes[1]


def test_outputs_do_not_alias_the_arena(models) -> None:
    model, dims = models["mlp"]
    sess = InferenceSession(model)
    feeds = random_feeds(model, dims)
    first = sess.run(None, feeds)[0]
    keep = first.copy()
    sess.run(None, random_feeds(model, dims, seed=1))  # overwrites the arena
    np.testing.assert_array_equal(first, keep)
    arena = next(iter(sess.arenas.values()))
    assert not np.shares_memory(first, arena.buffer)


def _reuse_model(shape_back: bool = True):
    """x -> Relu -> Reshape (view) ... Neg(x) may land in Relu's freed bytes while the view is live."""
    onnx = pytest.importorskip("onnx")
    h = onnx.helper
    nodes = [
        h.make_node("Relu", ["x"], ["r"], name="relu"),
        h.make_node("Reshape", ["r", "flat"], ["v"], name="view"),
        h.make_node("Neg", ["x2"], ["n"], name="neg"),
        h.make_node("Reshape", ["n", "flat"], ["nf"], name="nflat"),
        h.make_node("Add", ["v", "nf"], ["y"], name="add"),
    ]
    g = h.make_graph(
        nodes, "reuse",
        [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 8]),
         h.make_tensor_value_info("x2", onnx.TensorProto.FLOAT, [4, 8])],
        [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [32])],
        [onnx.numpy_helper.from_array(np.array([32], np.int64), "flat")],
    )  # fmt: skip
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def test_view_kept_only_when_its_bytes_are_not_reused() -> None:
    import opstrata.graph as og
    from opstrata.runtime._arena import view_aliases

    model = _reuse_model()
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=0))
    rng = np.random.default_rng(0)
    feeds = {
        "x": rng.standard_normal((4, 8), dtype=np.float32),
        "x2": rng.standard_normal((4, 8), dtype=np.float32),
    }
    (y,) = sess.run(None, feeds)
    np.testing.assert_array_equal(y, np.maximum(feeds["x"], 0).reshape(32) - feeds["x2"].reshape(32))
    mp = sess.plan.memory_for({"x": (4, 8), "x2": (4, 8)})
    aliases = view_aliases(sess.graph, mp)
    assert mp.offsets["v"] == mp.offsets["r"] and mp.inplace["v"] == "r"  # the plan puts views on their base
    r, n = (
        (mp.offsets["r"], mp.offsets["r"] + mp.sizes["r"]),
        (mp.offsets["n"], mp.offsets["n"] + mp.sizes["n"]),
    )
    assert not (r[0] < n[1] and n[0] < r[1])  # ...whose bytes stay live while the view is read
    assert {"v", "nf"} <= aliases  # the in-place Add at their last read does not cost them the view
    # a plan without view sharing: Neg may land in Relu's freed bytes, and then the view is copied
    mp0 = og.plan_memory(sess.graph, input_shapes={"x": (4, 8), "x2": (4, 8)}, inplace=False)
    r0, n0 = (
        (mp0.offsets["r"], mp0.offsets["r"] + mp0.sizes["r"]),
        (mp0.offsets["n"], mp0.offsets["n"] + mp0.sizes["n"]),
    )
    assert ("v" in view_aliases(sess.graph, mp0)) == (not (r0[0] < n0[1] and n0[0] < r0[1]))
    g = og.from_onnx(model)
    np.testing.assert_array_equal(y, og.run_graph(g, feeds)["y"])


def test_unplannable_shape_runs_on_the_allocator(monkeypatch, models) -> None:
    import opstrata.graph as og

    model, dims = models["gpt"]
    sess = InferenceSession(model)
    feeds = random_feeds(model, dims)
    want = InferenceSession(model).run(None, feeds)[0]

    def unplannable(shapes, **kwargs):
        raise og.GraphError("graph 'gpt_block': value 'x'", "needs a concrete shape")

    monkeypatch.setattr(sess.plan, "memory_for", unplannable)
    np.testing.assert_array_equal(sess.run(None, feeds)[0], want)
    assert list(sess.arenas.values()) == [None]
    st = sess.allocator.stats()
    assert st["num_alloc"] > 0 and st["allocated_bytes"] == 0


def test_session_memory_limit_raises_out_of_memory(models) -> None:
    from opstrata.runtime import OutOfMemoryError

    model, dims = models["bert"]
    sess = InferenceSession(model, SessionOptions(enable_mem_arena=False, memory_limit_bytes=4096))
    with pytest.raises(OutOfMemoryError, match=r"limit 4096 B.*tried to allocate .*empty_cache\(\)"):
        sess.run(None, random_feeds(model, dims))
    assert sess.allocator.stats()["allocated_bytes"] == 0  # blocks given back after the failure


def test_reshape_steps_on_arena_bytes_are_skipped_not_run(monkeypatch, models) -> None:
    """A reshape whose output the plan put on its input's bytes has nothing to do; one of a feed is a view
    of the program's staged copy, taken once."""
    from opstrata.graph import EXECUTOR_KERNELS as KERNELS

    model, dims = models["bert"]
    feeds = random_feeds(model, dims)
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=3, enable_profiling=True))
    want = InferenceSession(model, SessionOptions(enable_mem_arena=False)).run(None, feeds)[0]
    sess.run(None, feeds)
    arena = next(iter(sess.arenas.values()))
    skip = sess._schedule.view_steps(arena)
    by_name = {sess._schedule.steps[i].node.name: sess._schedule.steps[i].node for i in skip}
    assert sum(n.op_type == "Reshape" for n in by_name.values()) >= 4  # head split / merge after GEMMs
    for n in by_name.values():
        assert arena.is_view_of(n.outputs[0], n.inputs[0])
    sess2 = InferenceSession(model, SessionOptions(graph_optimization_level=3))
    np.testing.assert_array_equal(sess2.run(None, feeds)[0], want)
    (bound,) = sess2._bound.values()  # the steps bound to a call: the ones that run
    ran = [sess2._schedule.steps[i].node.name for i in bound.index]
    assert not set(ran) & set(by_name)  # skipped steps never call their kernel
    graph_inputs = set(sess.graph.inputs)
    feed_views = [
        n.name for n in sess.graph.nodes if n.op_type == "Unsqueeze" and n.inputs[0] in graph_inputs
    ]
    # a view of a feed is taken once, of the program's staged copy of the feed (runtime >= 0.5.21) ...
    assert feed_views and not set(feed_views) & set(ran)
    chained = [
        n.name for n in sess.graph.nodes if n.op_type == "Unsqueeze" and n.inputs[0] not in graph_inputs
    ]
    assert not set(chained) & set(ran)  # ...and so is a view of that view
    feeds2 = random_feeds(model, dims, seed=1)  # new feed values: the views read them
    want2 = InferenceSession(model, SessionOptions(enable_mem_arena=False)).run(None, feeds2)[0]
    np.testing.assert_array_equal(sess2.run(None, feeds2)[0], want2)
    names = {e.name for e in sess.profiler.events}
    assert set(by_name) <= names  # the profile still lists every node
    # an overridden Reshape kernel is called, not skipped
    calls = []
    stock = KERNELS[("", "Reshape")]
    monkeypatch.setitem(KERNELS, ("", "Reshape"), lambda n, x: calls.append(n.name) or stock(n, x))
    sess3 = InferenceSession(model, SessionOptions(graph_optimization_level=3))
    np.testing.assert_array_equal(sess3.run(None, feeds)[0], want)
    assert {n.name for n in by_name.values() if n.op_type == "Reshape"} <= set(calls)
