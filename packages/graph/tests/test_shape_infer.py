"""Shape and dtype inference: symbolic broadcasting/matmul/conv/reshape rules, checked against execution."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from opstrata.graph import Graph, GraphError, broadcast_shapes, infer_shapes, run_graph, supported_ops
from opstrata.graph._execute import KERNELS
from opstrata.graph._symbolic import dim_div, dim_mul, dim_prod
from opstrata.graph.opdefs.registry import RULES

dims = st.integers(1, 4)
shapes = st.lists(dims, min_size=0, max_size=4).map(tuple)


def _graph(*inputs: tuple[str, tuple]) -> Graph:
    g = Graph("t")
    for name, shape in inputs:
        g.add_input(name, np.float32, shape)
    return g


def test_every_ir_op_has_an_executor_kernel() -> None:
    assert set(RULES) <= set(KERNELS), set(RULES) - set(KERNELS)
    assert "MatMul" in supported_ops() and "ai.opstrata::Attention" in supported_ops()


@st.composite
def broadcastable(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    out = draw(st.lists(dims, min_size=0, max_size=4))
    a = [d if draw(st.booleans()) else 1 for d in out][draw(st.integers(0, len(out))) :]
    b = [d if draw(st.booleans()) else 1 for d in out][draw(st.integers(0, len(out))) :]
    return tuple(a), tuple(b)


@settings(max_examples=60, deadline=None)
@given(broadcastable())
def test_broadcast_matches_numpy_and_execution(ab: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    a, b = ab
    g = _graph(("a", a), ("b", b))
    g.add_node("Add", ["a", "b"], ["y"])
    g.outputs.append("y")
    infer_shapes(g)
    assert g.value("y").shape == np.broadcast_shapes(a, b)
    out = run_graph(g, {"a": np.ones(a, np.float32), "b": np.ones(b, np.float32)})["y"]
    assert out.shape == g.value("y").shape


@settings(max_examples=60, deadline=None)
@given(broadcastable(), st.data())
def test_broadcast_with_symbols_is_sound(
    ab: tuple[tuple[int, ...], tuple[int, ...]], data: st.DataObject
) -> None:
    """Replacing some dims by names never contradicts the static answer: a dim is exact or None."""
    a, b = ab
    names = {d: f"s{d}" for d in range(1, 5)}
    sym_a = tuple(names[d] if d > 1 and data.draw(st.booleans()) else d for d in a)
    sym_b = tuple(names[d] if d > 1 and data.draw(st.booleans()) else d for d in b)
    static = np.broadcast_shapes(a, b)
    for got, want in zip(broadcast_shapes(sym_a, sym_b), static, strict=True):
        assert got is None or got == want or got == names.get(want)


def test_broadcast_symbolic_rules() -> None:
    assert broadcast_shapes(("batch", 1, 4), (3, 1)) == ("batch", 3, 4)
    assert broadcast_shapes(("batch", "seq"), ("batch", 1)) == ("batch", "seq")
    assert broadcast_shapes(("a",), ("b",)) == (None,)
    with pytest.raises(ValueError, match="cannot broadcast"):
        broadcast_shapes((2, 3), (4, 3))


def test_symbolic_products() -> None:
    assert dim_prod(["batch", 3, 4]) == "12*batch"
    assert dim_div("12*batch*seq", dim_mul("batch", 4)) == "3*seq"
    assert dim_div("batch", 2) is None and dim_mul(None, 0) == 0


@st.composite
def matmul_pair(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    m, k, n = draw(dims), draw(dims), draw(dims)
    batch_a, batch_b = draw(broadcastable())
    a = (*batch_a, m, k) if draw(st.integers(0, 4)) else (k,)
    b = (*batch_b, k, n) if draw(st.integers(0, 4)) else (k,)
    return a, b


@settings(max_examples=60, deadline=None)
@given(matmul_pair())
def test_matmul_matches_numpy(ab: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    a, b = ab
    g = _graph(("a", a), ("b", b))
    g.add_node("MatMul", ["a", "b"], ["y"])
    g.outputs.append("y")
    infer_shapes(g)
    want = np.matmul(np.ones(a), np.ones(b)).shape
    assert g.value("y").shape == want
    assert run_graph(g, {"a": np.ones(a, np.float32), "b": np.ones(b, np.float32)})["y"].shape == want


def test_matmul_inner_dim_mismatch() -> None:
    g = _graph(("a", ("batch", 2, 3)), ("b", (4, 5)))
    g.add_node("MatMul", ["a", "b"], ["y"])
    with pytest.raises(GraphError, match=r"MatMul_0.*inconsistent shapes: inner dims must match.*\(3 != 4\)"):
        infer_shapes(g)


@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(3, 9), k=st.integers(1, 3), stride=st.integers(1, 3), pad=st.integers(0, 2),
    dil=st.integers(1, 2), auto=st.sampled_from(["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]),
)  # fmt: skip
def test_conv_output_size_matches_kernel(
    size: int, k: int, stride: int, pad: int, dil: int, auto: str
) -> None:
    if auto in ("NOTSET", "VALID") and (k - 1) * dil + 1 > size + 2 * (0 if auto == "VALID" else pad):
        with pytest.raises(GraphError, match="smaller than the window"):  # a clear error, not a bad shape
            _conv_graph(size, k, stride, pad, dil, auto)
        return
    g = _conv_graph(size, k, stride, pad, dil, auto)
    out = run_graph(g, {"x": np.ones((2, 2, size, size + 1), np.float32)})["y"]
    assert g.value("y").shape == ("batch", *out.shape[1:])


def _conv_graph(size: int, k: int, stride: int, pad: int, dil: int, auto: str) -> Graph:
    g = _graph(("x", ("batch", 2, size, size + 1)))
    g.add_initializer("w", np.ones((3, 2, k, k), np.float32))
    attrs = {"kernel_shape": [k, k], "strides": [stride, stride], "dilations": [dil, dil], "auto_pad": auto}
    if auto == "NOTSET":
        attrs["pads"] = [pad, pad, pad, pad]
    g.add_node("Conv", ["x", "w"], ["y"], attrs)
    g.outputs.append("y")
    return infer_shapes(g)


@pytest.mark.parametrize(
    ("in_shape", "target", "want"),
    [
        (("batch", 3, 4), [0, -1], ("batch", 12)),
        (("batch", "seq", 64), [0, 0, 4, 16], ("batch", "seq", 4, 16)),
        (("batch", "seq", 64), [-1, 64], ("batch*seq", 64)),
        ((2, 3, 4), [4, -1], (4, 6)),
    ],
)
def test_reshape_zero_and_minus_one(in_shape: tuple, target: list[int], want: tuple) -> None:
    g = _graph(("x", in_shape))
    g.add_initializer("s", np.array(target, np.int64))
    g.add_node("Reshape", ["x", "s"], ["y"])
    assert infer_shapes(g).value("y").shape == want


def test_reshape_element_count_mismatch() -> None:
    g = _graph(("x", (2, 3)))
    g.add_initializer("s", np.array([4, 2], np.int64))
    g.add_node("Reshape", ["x", "s"], ["y"])
    with pytest.raises(
        GraphError, match=r"cannot reshape \(2, 3\) \(6 elements\) to \(4, 2\) \(8 elements\)"
    ):
        infer_shapes(g)


def test_shape_subgraph_contents_propagate_and_shape_of_static_value_runs() -> None:
    g = _graph(("x", ("batch", "seq", 8)))
    g.add_node("Shape", ["x"], ["s"])
    g.add_initializer("i", np.array([0, 1], np.int64))
    g.add_node("Gather", ["s", "i"], ["bs"], {"axis": 0})
    g.add_initializer("tail", np.array([2, 4], np.int64))
    g.add_node("Concat", ["bs", "tail"], ["t"], {"axis": 0})
    g.add_node("Reshape", ["x", "t"], ["y"])
    g.add_initializer("w", np.ones((3, 5), np.float32))
    g.add_node("Shape", ["w"], ["ws"])
    g.outputs += ["y", "ws"]
    infer_shapes(g)
    assert g.value("y").shape == ("batch", "seq", 2, 4)
    out = run_graph(g, {"x": np.zeros((2, 3, 8), np.float32)})
    assert out["y"].shape == (2, 3, 2, 4) and out["ws"].tolist() == [3, 5]


@pytest.mark.parametrize(("h", "fmod", "want"), [(13, 0, 16), (16, 0, 16), (5, 1, 8), ("h", 0, None)])
def test_mod_of_a_shape_value_propagates(h, fmod: int, want) -> None:
    """Swin's window padding: pad = (w - H % w) % w on a shape value, then Pad: known once H is."""
    g = _graph(("x", (1, h, 4)))
    g.add_node("Shape", ["x"], ["s"])
    g.add_initializer("one", np.array([1], np.int64))
    g.add_node("Gather", ["s", "one"], ["len"], {"axis": 0})
    g.add_initializer("w", np.array([8], np.int64))
    g.add_node("Mod", ["len", "w"], ["r"], {"fmod": fmod})
    g.add_node("Sub", ["w", "r"], ["short"])
    g.add_node("Mod", ["short", "w"], ["pad"], {"fmod": fmod})
    g.add_initializer("z4", np.array([0, 0, 0, 0], np.int64))
    g.add_initializer("z1", np.array([0], np.int64))
    g.add_node("Concat", ["z4", "pad", "z1"], ["p"], {"axis": 0})  # the end of axis 1 (begins, then ends)
    g.add_node("Pad", ["x", "p"], ["y"], {"mode": "constant"})
    g.outputs.append("y")
    infer_shapes(g)
    assert g.value("y").shape[1] == want
    if want is not None:
        assert g.value("y").shape == (1, want, 4)
    if want is not None:
        assert run_graph(g, {"x": np.zeros((1, h, 4), np.float32)})["y"].shape == (1, want, 4)


@pytest.mark.parametrize("h", [13, 16, "h"])
def test_torchscript_pad_idiom_propagates_through_a_2d_shape_value(h) -> None:
    """TorchScript's F.pad: the pads as (pairs, 2) rows, the rows reversed by a step -1 Slice, transposed
    and flattened back; the contents follow through the 2-D steps, so Pad gets its output shape."""
    g = _graph(("x", (1, h, 4)))
    g.add_node("Shape", ["x"], ["s"])
    g.add_initializer("one", np.array([1], np.int64))
    g.add_node("Gather", ["s", "one"], ["len"], {"axis": 0})
    g.add_initializer("w", np.array([8], np.int64))
    g.add_node("Mod", ["len", "w"], ["r"])
    g.add_node("Sub", ["w", "r"], ["short"])
    g.add_node("Mod", ["short", "w"], ["pad"])
    g.add_initializer("z", np.array([0], np.int64))
    # F.pad's (last-axis first) pairs for axes 2, 1, 0: (0, 0), (0, pad), (0, 0)
    g.add_node("Concat", ["z", "z", "z", "pad", "z", "z"], ["pairs"], {"axis": 0})
    g.add_initializer("rows", np.array([-1, 2], np.int64))
    g.add_node("Reshape", ["pairs", "rows"], ["grid"])  # (3, 2)
    g.add_initializer("m1", np.array([-1], np.int64))
    g.add_initializer("lo", np.array([-(2**63) + 1], np.int64))
    g.add_initializer("ax0", np.array([0], np.int64))
    g.add_node("Slice", ["grid", "m1", "lo", "ax0", "m1"], ["rev"])  # rows reversed: axis 0 first
    g.add_node("Transpose", ["rev"], ["cols"], {"perm": [1, 0]})  # begins, then ends
    g.add_node("Reshape", ["cols", "m1"], ["p"])
    g.add_node("Pad", ["x", "p"], ["y"], {"mode": "constant"})
    g.outputs.append("y")
    infer_shapes(g)
    want = None if h == "h" else 16
    assert g.value("y").shape[1] == want
    if want is not None:
        assert g.value("y").shape == (1, 16, 4)
        assert run_graph(g, {"x": np.zeros((1, h, 4), np.float32)})["y"].shape == (1, 16, 4)


def test_a_2d_shape_value_is_not_read_as_flat_by_1d_rules() -> None:
    """Gather along axis 0 of a tracked (2, 2) value picks rows: the 1-D rule would pick elements, so
    the contents are not propagated (the shape stays unknown, never wrong)."""
    g = _graph(("x", (2, 3, 5, 7)))
    g.add_node("Shape", ["x"], ["s"])
    g.add_initializer("rows", np.array([2, 2], np.int64))
    g.add_node("Reshape", ["s", "rows"], ["grid"])  # [[2, 3], [5, 7]]
    g.add_initializer("i1", np.array([1], np.int64))
    g.add_node("Gather", ["grid", "i1"], ["row"], {"axis": 0})  # [[5, 7]]: (1, 2)
    g.add_initializer("m1", np.array([-1], np.int64))
    g.add_node("Reshape", ["row", "m1"], ["target"])  # [5, 7]
    g.add_initializer("x35", np.zeros((35,), np.float32))
    g.add_node("Reshape", ["x35", "target"], ["y"])
    g.outputs.append("y")
    infer_shapes(g)
    assert g.value("y").shape in ((5, 7), (None, None))
    assert run_graph(g, {"x": np.zeros((2, 3, 5, 7), np.float32)})["y"].shape == (5, 7)


@pytest.mark.parametrize(("seq", "want"), [(6, 4), (3, 3), ("seq", None)])
def test_min_of_a_shape_value_propagates(seq, want) -> None:
    """GPT-Neo's causal mask (dynamo export): a (1, 1, 128, 128) buffer sliced to ``min(128, seq)``
    rows; with a concrete seq the Slice's end is known, so the slice (and all after it) gets a shape."""
    g = _graph(("x", (2, seq, 8)))
    g.add_node("Shape", ["x"], ["s"])
    g.add_initializer("one", np.array([1], np.int64))
    g.add_node("Gather", ["s", "one"], ["len"], {"axis": 0})
    g.add_initializer("cap", np.array([4], np.int64))
    g.add_node("Min", ["len", "cap"], ["end"])
    g.add_initializer("zero", np.array([0], np.int64))
    g.add_node("Slice", ["x", "zero", "end", "one"], ["y"])
    g.outputs.append("y")
    infer_shapes(g)
    assert g.value("y").shape == (2, want, 8)
    if want is not None:
        assert run_graph(g, {"x": np.zeros((2, seq, 8), np.float32)})["y"].shape == (2, want, 8)


@pytest.mark.parametrize(("seq", "folded"), [(5, False), ("seq", False), (5, True)])
def test_torchscripts_expand_minus_one_idiom_gives_the_expand_its_shape(seq, folded: bool) -> None:
    """torch.onnx (TorchScript) writes ``t.expand(batch, seq)`` as Expand(t, Where(Equal(s, -1),
    ConstantOfShape([2]) of ones, s)) with s = Reshape(Concat(batch, seq)): Equal, Where,
    ConstantOfShape and a 1-D Reshape carry the shape's contents, so the Expand has a planned shape."""
    g = _graph(("ids", (2, seq)))
    g.add_node("Shape", ["ids"], ["s"])
    g.add_initializer("i0", np.array([0], np.int64))
    g.add_initializer("i1", np.array([1], np.int64))
    g.add_node("Gather", ["s", "i0"], ["b"], {"axis": 0})
    g.add_node("Gather", ["s", "i1"], ["n"], {"axis": 0})
    g.add_node("Concat", ["b", "n"], ["bn"], {"axis": 0})
    g.add_initializer("flat", np.array([-1], np.int64))
    g.add_node("Reshape", ["bn", "flat"], ["shape"])
    g.add_initializer("two", np.array([2], np.int64))
    g.add_node("ConstantOfShape", ["two"], ["ones"], {"value": np.array([1], np.int64)})
    g.add_initializer("minus", np.array([-1, -1], np.int64))
    g.add_node("Equal", ["shape", "minus"], ["is_minus"])
    if folded:  # constant folding left the comparison a bool initializer
        g.add_initializer("never", np.array([False, False]))
    g.add_node("Where", ["never" if folded else "is_minus", "ones", "shape"], ["target"])
    g.add_initializer("row", np.zeros((1, 1), np.int64))
    g.add_node("Expand", ["row", "target"], ["y"])
    g.outputs.append("y")
    infer_shapes(g)
    assert g.value("y").shape == (2, seq)
    n = 7 if seq == "seq" else 5
    assert run_graph(g, {"ids": np.zeros((2, n), np.float32)})["y"].shape == (2, n)


@pytest.mark.parametrize(
    ("op", "attrs", "in_shape", "want"),
    [
        ("ReduceMean", {"axes": [-1], "keepdims": 1}, ("b", 3, 4), ("b", 3, 1)),
        ("ReduceSum", {"axes": None, "keepdims": 0}, ("b", 3), ()),
        ("ArgMax", {"axis": 1, "keepdims": 0}, ("b", 3, 4), ("b", 4)),
        ("Transpose", {"perm": [0, 2, 1]}, ("b", 3, 4), ("b", 4, 3)),
        ("Flatten", {"axis": 1}, ("b", 3, 4), ("b", 12)),
        ("Unsqueeze", {"axes": [0, -1]}, ("b", 3), (1, "b", 3, 1)),
        ("Squeeze", {"axes": [1]}, ("b", 1, 3), ("b", 3)),
        ("Softmax", {"axis": -1}, ("b", 3), ("b", 3)),
    ],
)
def test_unary_shape_rules(op: str, attrs: dict, in_shape: tuple, want: tuple) -> None:
    g = _graph(("x", in_shape))
    g.add_node(op, ["x"], ["y"], attrs)
    infer_shapes(g)
    assert g.value("y").shape == want
    if op == "ArgMax":
        assert g.value("y").dtype == np.int64


def test_concat_split_slice_gather() -> None:
    g = _graph(("a", ("b", 2, 4)), ("c", ("b", 3, 4)))
    g.add_node("Concat", ["a", "c"], ["cat"], {"axis": 1})
    g.add_node("Split", ["cat"], ["p", "q"], {"axis": 2, "split": [1, 3]})
    for name, vals in {"st": [1], "en": [2**62], "ax": [1]}.items():
        g.add_initializer(name, np.array(vals, np.int64))
    g.add_node("Slice", ["cat", "st", "en", "ax"], ["sl"])
    g.add_initializer("idx", np.array([[0, 1]], np.int64))
    g.add_node("Gather", ["cat", "idx"], ["ga"], {"axis": 2})
    infer_shapes(g)
    assert g.value("cat").shape == ("b", 5, 4)
    assert [g.value(x).shape for x in ("p", "q")] == [("b", 5, 1), ("b", 5, 3)]
    assert g.value("sl").shape == ("b", 4, 4)
    assert g.value("ga").shape == ("b", 5, 1, 2)
    g = _graph(("a", ("b", 2, 4)), ("c", ("b", 3, 5)))
    g.add_node("Concat", ["a", "c"], ["cat"], {"axis": 1})
    with pytest.raises(GraphError, match=r"Concat input 'c'.*differs.*in dim 2"):
        infer_shapes(g)


def test_annotation_contradiction_is_an_error() -> None:
    g = _graph(("x", ("b", 3)))
    g.add_node("Relu", ["x"], ["y"])
    g.value("y").shape = ("b", 4)
    with pytest.raises(GraphError, match=r"Relu_0.*inconsistent shapes: output 'y' is annotated \('b', 4\)"):
        infer_shapes(g)
    assert infer_shapes(g, reset=True).value("y").shape == ("b", 3)


def test_unknown_op_has_no_rule() -> None:
    g = _graph(("x", (2,)))
    g.add_node("Frobnicate", ["x"], ["y"])
    with pytest.raises(
        GraphError, match=r"Frobnicate_0.*not in the IR vocabulary.*Fix: use a supported op \(Abs"
    ):
        infer_shapes(g)
