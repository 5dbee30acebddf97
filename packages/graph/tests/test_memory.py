"""Memory planning: valid offsets, arena within 5% of the lower bound on the test models, in-place, cache, errors."""

from __future__ import annotations

import numpy as np
import pytest

import opstrata.graph as og
from opstrata.graph._memory import _greedy_by_size
from opstrata.graph.testing import bert_block_model, cnn_model, gpt_block_model, mlp_model

pytest.importorskip("onnx")

MODELS = {
    "mlp": mlp_model,
    "cnn": cnn_model,
    "bert": bert_block_model,
    "gpt": lambda: gpt_block_model(opset=14),
}


def _assert_valid(mp: og.MemoryPlan) -> None:
    """No two values share bytes while both are live, unless one reuses the other's buffer in place."""
    chains: dict[str, str] = {}
    for v in mp.offsets:
        root = v
        while root in mp.inplace:
            root = mp.inplace[root]
        chains[v] = root
    names = list(mp.offsets)
    for i, a in enumerate(names):
        assert mp.offsets[a] % mp.alignment == 0 and mp.sizes[a] % mp.alignment == 0
        fa, la = mp.lifetimes[a]
        for b in names[i + 1 :]:
            if chains[a] == chains[b]:
                continue
            fb, lb = mp.lifetimes[b]
            if fa <= lb and fb <= la:
                overlap = (
                    mp.offsets[a] < mp.offsets[b] + mp.sizes[b]
                    and mp.offsets[b] < mp.offsets[a] + mp.sizes[a]
                )
                assert not overlap, (a, b)
        assert mp.offsets[a] + mp.sizes[a] <= mp.arena_bytes


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("level", [0, 2, 3])
@pytest.mark.parametrize("dims", [{"batch": 1, "seq": 4}, {"batch": 2, "seq": 5}, {"batch": 8, "seq": 16}])
def test_arena_within_5_percent_of_lower_bound(name, level, dims):
    g, _ = og.optimize(og.from_onnx(MODELS[name]()), level)
    mp = og.plan_memory(g, dims)
    _assert_valid(mp)
    assert mp.lower_bound_bytes <= mp.arena_bytes <= 1.05 * mp.lower_bound_bytes, mp.summary()
    assert mp.arena_bytes < mp.no_reuse_bytes


def test_inplace_reuse_for_dying_elementwise_inputs():
    g = og.Graph("chain")
    g.add_input("x", np.float32, ("n", 16))
    g.add_node("Exp", ["x"], ["a"])
    g.add_node("Neg", ["a"], ["b"])
    g.add_node("Relu", ["b"], ["c"])
    g.outputs.append("c")
    mp = og.plan_memory(g, {"n": 4})
    assert mp.inplace == {"b": "a", "c": "b"}
    assert mp.arena_bytes == mp.lower_bound_bytes == 256 and mp.no_reuse_bytes == 768
    assert og.plan_memory(g, {"n": 4}, inplace=False).arena_bytes == 512  # two buffers ping-pong


def test_no_inplace_when_input_lives_on():
    g = og.Graph("fork")
    g.add_input("x", np.float32, (4,))
    g.add_node("Exp", ["x"], ["a"])
    g.add_node("Neg", ["a"], ["b"])
    g.add_node("Add", ["a", "b"], ["c"])
    g.outputs.append("c")
    mp = og.plan_memory(g)
    assert "b" not in mp.inplace and mp.inplace == {"c": "a"}
    _assert_valid(mp)


def test_alignment_and_table():
    g = og.Graph("odd")
    g.add_input("x", np.float32, (3,))
    g.add_node("Exp", ["x"], ["a"])
    g.add_node("MatMul", ["a", "a"], ["y"])
    g.outputs.append("y")
    mp = og.plan_memory(g, alignment=128)
    assert mp.sizes == {"a": 128, "y": 128} and mp.arena_bytes == 256
    text = mp.table()
    assert "value" in text and "lower bound" in text and "a " in text
    with pytest.raises(og.GraphError, match="power of two"):
        og.plan_memory(g, alignment=48)


def test_greedy_by_size_reuses_gaps():
    # (size, first, last): 100 and 50 never live together, so they share offset 0
    offsets = _greedy_by_size([(100, 0, 1), (50, 2, 3), (30, 1, 2)])
    assert offsets == [0, 0, 100]


def test_symbolic_dims_planned_per_shape_and_cached():
    g = og.from_onnx(bert_block_model())
    planner = og.MemoryPlanner(g)
    a = planner.for_shapes({"x": (2, 5, 32), "mask": (2, 5)})
    b = planner.for_shapes({"x": (2, 5, 32), "mask": (2, 5)})
    c = planner.for_shapes({"x": (4, 7, 32), "mask": (4, 7)})
    assert a is b and a is not c and len(planner) == 2
    assert c.dims == {"batch": 4, "seq": 7} and c.arena_bytes > a.arena_bytes


def test_missing_dims_are_clear_errors():
    g = og.from_onnx(bert_block_model())
    with pytest.raises(og.GraphError, match="symbolic dim 'seq' has no value"):
        og.plan_memory(g, {"batch": 2})
    with pytest.raises(og.GraphError, match="unknown inputs"):
        og.plan_memory(g, input_shapes={"nope": (1,)})
    with pytest.raises(og.GraphError, match="dim 'seq' is 6 here but 5"):
        og.plan_memory(g, input_shapes={"x": (2, 5, 32), "mask": (2, 6)})
    with pytest.raises(og.GraphError, match="expected rank 3"):
        og.plan_memory(g, input_shapes={"x": (2, 5), "mask": (2, 5)})


def test_round_trip_dict():
    mp = og.plan_memory(og.from_onnx(mlp_model()), {"batch": 3})
    assert og.MemoryPlan.from_dict(mp.to_dict()) == mp


def test_no_inplace_into_a_broadcast_input():
    g = og.Graph("bcast")
    g.add_input("x", np.float32, (15,))
    g.add_input("z", np.float32, (16, 1))
    g.add_node("Exp", ["x"], ["a"])  # (15,): 60 bytes, 64 aligned like (16,) would be
    g.add_node("Add", ["a", "z"], ["y"])  # (16, 15): bigger than a, must not reuse it
    g.outputs.append("y")
    assert og.plan_memory(g).inplace == {}


hypothesis = pytest.importorskip("hypothesis")
from hypothesis import (  # noqa: E402
    given,
    settings,
    strategies as st,
)


@st.composite
def _random_graph(draw):
    """A random DAG of unary/binary float ops over (n, k) tensors with random widths."""
    g = og.Graph("rand")
    g.add_input("x", np.float32, ("n", 8))
    avail = ["x"]
    for i in range(draw(st.integers(1, 14))):
        op = draw(st.sampled_from(["Relu", "Exp", "Add", "Mul", "MatMul", "Reshape", "Identity"]))
        a = draw(st.sampled_from(avail))
        out = f"v{i}"
        if op == "Reshape":  # a view with the same shape, through the shape [-1, k]
            shape = f"s{i}"
            g.add_initializer(shape, np.array([-1, g.values[a].shape[1]], np.int64))
            g.add_node("Reshape", [a, shape], [out])
        elif op == "MatMul":
            w = f"w{i}"
            g.add_initializer(
                w, np.ones((g.values[a].shape[1], draw(st.sampled_from([4, 8, 16]))), np.float32)
            )
            g.add_node("MatMul", [a, w], [out])
        elif op in ("Add", "Mul"):
            b = draw(st.sampled_from([v for v in avail if g.values[v].shape[1] == g.values[a].shape[1]]))
            g.add_node(op, [a, b], [out])
        else:
            g.add_node(op, [a], [out])
        og.infer_shapes(g)
        avail.append(out)
    g.outputs.extend(draw(st.lists(st.sampled_from(avail[1:]), min_size=1, max_size=2, unique=True)))
    return g


def _assert_no_write_under_a_live_view(g: og.Graph, mp: og.MemoryPlan) -> None:
    """A non-view node writing a buffer in place: every earlier value on that buffer is dead by then."""
    views = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"}
    root = {}
    for v in mp.offsets:
        r = v
        while r in mp.inplace:
            r = mp.inplace[r]
        root[v] = r
    for o, src in mp.inplace.items():
        step = mp.lifetimes[o][0]
        if g.nodes[step].op_type in views:
            continue
        for v in mp.offsets:
            if v != o and root[v] == root[src] and mp.lifetimes[v][0] < step:
                assert mp.lifetimes[v][1] <= step, (o, v)  # v is still read after o overwrote it


@settings(max_examples=60, deadline=None)
@given(_random_graph(), st.integers(1, 5))
def test_random_graphs_plan_validly(g, n):
    mp = og.plan_memory(g, {"n": n})
    _assert_valid(mp)
    _assert_no_write_under_a_live_view(g, mp)
    assert mp.lower_bound_bytes <= mp.arena_bytes <= mp.no_reuse_bytes


def test_reshape_shares_its_input_bytes_and_blocks_in_place_writes_while_read():
    g = og.Graph("views")
    g.add_input("x", np.float32, (4, 8))
    g.add_initializer("flat", np.array([32], np.int64))
    g.add_node("Exp", ["x"], ["a"])
    g.add_node("Reshape", ["a", "flat"], ["v"])  # a view of a; a is still read below
    g.add_node("Neg", ["a"], ["b"])  # a dies here, but v is live: b must not overwrite a's bytes
    g.add_node("Reshape", ["b", "flat"], ["bf"])
    g.add_node("Add", ["v", "bf"], ["y"])  # v and bf die here: in place is fine
    g.outputs.append("y")
    mp = og.plan_memory(g)
    assert mp.inplace["v"] == "a" and mp.offsets["v"] == mp.offsets["a"]
    assert mp.inplace["bf"] == "b" and "b" not in mp.inplace
    assert mp.offsets["b"] != mp.offsets["a"]
    assert mp.inplace["y"] in ("v", "bf")
    _assert_valid(mp)
    _assert_no_write_under_a_live_view(g, mp)
    assert mp.arena_bytes == mp.lower_bound_bytes == 256  # two 128-byte buffers, views cost nothing
    assert "v" not in og.plan_memory(g, inplace=False).inplace


@given(
    st.lists(
        st.tuples(st.integers(0, 5000), st.integers(0, 30), st.integers(0, 30)).map(
            lambda t: (t[0], min(t[1], t[2]), max(t[1], t[2]))
        ),
        max_size=40,
    ),
    st.sampled_from([1, 64, 256]),
)
def test_pack_buffers_never_overlaps_buffers_live_together(bufs, alignment):
    offsets, total = og.pack_buffers(bufs, alignment=alignment)
    sizes = [-(-max(b[0], 1) // alignment) * alignment for b in bufs]
    assert all(off % alignment == 0 for off in offsets)
    assert total == max((o + s for o, s in zip(offsets, sizes, strict=True)), default=0)
    lower = max(
        (sum(s for s, b in zip(sizes, bufs, strict=True) if b[1] <= t <= b[2]) for t in range(31)), default=0
    )
    assert lower <= total <= sum(sizes)
    for i, (a, b) in enumerate(zip(offsets, bufs, strict=True)):
        for j in range(i):
            live_together = bufs[j][1] <= b[2] and b[1] <= bufs[j][2]
            if live_together:
                assert a + sizes[i] <= offsets[j] or offsets[j] + sizes[j] <= a, (i, j)


def test_pack_buffers_rejects_bad_input():
    with pytest.raises(og.GraphError, match="power of two"):
        og.pack_buffers([(8, 0, 0)], alignment=48)
    with pytest.raises(og.GraphError, match="buffer 1"):
        og.pack_buffers([(8, 0, 0), (8, 3, 2)])
    with pytest.raises(og.GraphError, match="buffer 0"):
        og.pack_buffers([(-1, 0, 0)])
