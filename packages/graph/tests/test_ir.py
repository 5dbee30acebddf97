"""The IR: building, mutation helpers, topological order, validation errors, text and DOT dumps."""

from __future__ import annotations

import numpy as np
import pytest

from opstrata.graph import Graph, GraphError, Node, find_cycle, infer_shapes


def _chain() -> Graph:
    g = Graph("chain")
    g.add_input("x", np.float32, ("batch", 4))
    g.add_initializer("w", np.ones((4, 3), np.float32))
    g.add_node("MatMul", ["x", "w"], ["h"])
    g.add_node("Relu", ["h"], ["y"])
    g.outputs.append("y")
    return g


def test_build_validate_and_maps() -> None:
    g = _chain()
    g.validate()
    assert [n.op_type for n in g.nodes] == ["MatMul", "Relu"]
    assert g.producers()["h"].op_type == "MatMul"
    assert [n.op_type for n in g.consumers()["h"]] == ["Relu"]
    assert g.producer("x") is None and g.producer("y") is g.nodes[1]
    assert g.node("Relu_0") is g.nodes[1]
    assert g.op_counts() == {"MatMul": 1, "Relu": 1}
    assert "3 initializers" not in repr(g) and "2 nodes" in repr(g)


def test_mutation_helpers() -> None:
    g = _chain()
    relu = g.nodes[1]
    t = g.fresh_name("h")
    assert t == "h_1"
    g.replace_node(relu, [Node("Sigmoid", ["h"], [t]), Node("Relu", [t], ["y"])])
    assert [n.op_type for n in g.nodes] == ["MatMul", "Sigmoid", "Relu"]
    assert all(n.name for n in g.nodes) and len({n.name for n in g.nodes}) == 3
    g.rename_value("h", "hidden")
    assert g.nodes[0].outputs == ["hidden"] and g.nodes[1].inputs == ["hidden"] and "h" not in g.values
    assert g.replace_uses("hidden", "x") == 1
    g.remove_node(g.nodes[0])
    assert "hidden" not in g.values
    g.remove_initializer("w")
    g.validate()
    infer_shapes(g)
    assert g.value("y").shape == ("batch", 4)
    with pytest.raises(GraphError, match="'x' exists"):
        g.rename_value("y", "x")


def test_copy_is_independent() -> None:
    g = _chain()
    c = g.copy()
    c.nodes[0].attrs["k"] = 1
    c.value("x").shape = (1, 4)
    c.outputs.append("h")
    assert "k" not in g.nodes[0].attrs and g.value("x").shape == ("batch", 4) and g.outputs == ["y"]


def test_toposort_is_stable_and_fixes_order() -> None:
    g = _chain()
    g.nodes.reverse()
    with pytest.raises(GraphError, match=r"not in schedule order.*Fix: call graph.toposort\(\)"):
        g.validate()
    g.toposort()
    assert [n.op_type for n in g.nodes] == ["MatMul", "Relu"]
    g.validate()


def test_dangling_input_names_node_value_and_suggestion() -> None:
    g = _chain()
    g.nodes[1].inputs = ["hh"]
    with pytest.raises(GraphError, match=r"node 'Relu_0' \(Relu\): input 'hh' is dangling.*did you mean 'h'"):
        g.validate()


def test_dangling_output() -> None:
    g = _chain()
    g.outputs.append("z")
    with pytest.raises(GraphError, match="graph output 'z' is dangling"):
        g.validate()


def test_cycle_is_named() -> None:
    g = Graph("loop")
    g.add_input("x", np.float32, (2,))
    g.add_node("Add", ["x", "b"], ["a"], name="first")
    g.add_node("Relu", ["a"], ["b"], name="second")
    g.outputs.append("b")
    assert {n.name for n in find_cycle(g) or []} == {"first", "second"}
    with pytest.raises(
        GraphError, match=r"cycle: 'first' \(Add\) -> 'second' \(Relu\) -> 'first'|cycle: 'second'"
    ):
        g.validate()
    with pytest.raises(GraphError, match="cycle"):
        g.toposort()


def test_duplicate_definitions() -> None:
    g = _chain()
    g.add_node("Relu", ["x"], ["h"])
    with pytest.raises(
        GraphError, match=r"value 'h' is defined twice: by node 'MatMul_0' \(MatMul\) and by node"
    ):
        g.validate()
    g = _chain()
    g.nodes[1].name = "MatMul_0"
    with pytest.raises(GraphError, match="two nodes are named 'MatMul_0'"):
        g.validate()
    g = _chain()
    g.add_initializer("x", np.zeros(1, np.float32))
    with pytest.raises(GraphError, match="'x' is defined twice: by a graph input and by an initializer"):
        g.validate()


def test_annotation_type_mismatch() -> None:
    g = _chain()
    g.value("w").dtype = np.dtype(np.float16)
    with pytest.raises(
        GraphError, match="initializer 'w': type mismatch: its Value says float16 but the array is float32"
    ):
        g.validate()
    g = _chain()
    g.value("w").shape = (3, 4)
    with pytest.raises(GraphError, match="shape mismatch"):
        g.validate()


def test_op_level_type_mismatch_in_inference() -> None:
    g = _chain()
    g.add_initializer("i", np.ones(3, np.int64))
    g.add_node("Add", ["y", "i"], ["z"])
    with pytest.raises(
        GraphError,
        match=r"node 'Add_0' \(Add\): type mismatch: input 'y' is float32 but input 'i' is int64.*Cast",
    ):
        infer_shapes(g)


def test_dump_and_dot() -> None:
    g = infer_shapes(_chain())
    text = str(g)
    assert "%h: float32[batch, 3] = MatMul(%x, %w)  # MatMul_0" in text
    assert "inputs: %x: float32[batch, 4]" in text and "outputs: %y: float32[batch, 3]" in text
    dot = g.to_dot()
    assert dot.startswith('digraph "chain"') and '"op:MatMul_0" -> "op:Relu_0"' in dot and dot.endswith("}")
