"""Control flow (opdefs/control.py): If, Loop and Scan models built with onnx.helper, run by run_graph and
compared with onnxruntime; outer-scope capture, nesting, passes, export, plan save/load and the errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import opstrata.graph as og  # noqa: E402
from opstrata.graph import GraphError, from_onnx, run_graph, to_onnx  # noqa: E402
from opstrata.graph.testing import ort_run  # noqa: E402

oh = onnx.helper
TP = onnx.TensorProto
F, I64, B = TP.FLOAT, TP.INT64, TP.BOOL
rng = np.random.default_rng(0)


def vi(name: str, elem: int, shape: Any) -> Any:
    return oh.make_tensor_value_info(name, elem, shape)


def model(
    nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: list[Any] = (), opset: int = 17
) -> Any:  # type: ignore[assignment]
    g = oh.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", opset)])
    onnx.checker.check_model(m, full_check=True)
    return m


def check(m: Any, feeds: dict[str, np.ndarray], *, levels: tuple[int, ...] = (0, 1, 2, 3)) -> og.Graph:
    """run_graph, the optimised plans and the re-exported model all agree with onnxruntime."""
    want = ort_run(m, feeds)
    g = from_onnx(m)
    got = run_graph(g, feeds)
    exported = to_onnx(g)
    onnx.checker.check_model(exported, full_check=True)
    back = ort_run(exported, feeds)
    results = [("run_graph", got), ("to_onnx+ort", back)]
    for level in levels:  # Plan.run plans memory without per-run values, so run the optimised graph
        results.append((f"level {level}", run_graph(og.optimize(g, level)[0], feeds)))
    for k, w in want.items():
        for name, res in results:
            assert res[k].dtype == w.dtype and res[k].shape == w.shape, (name, k, res[k].dtype, res[k].shape)
            np.testing.assert_allclose(res[k], w, rtol=1e-5, atol=1e-6, err_msg=f"{name} {k}")
    return g


# --------------------------------------------------------------------------- If


def if_model(*, outer_const: bool = False) -> Any:
    then_g = oh.make_graph(
        [oh.make_node("Add", ["x", "w"], ["t_out"], name="add")], "then", [], [vi("t_out", F, [2, 3])]
    )
    else_g = oh.make_graph(
        [oh.make_node("Mul", ["x", "x"], ["e_out"], name="mul")], "else", [], [vi("e_out", F, [2, 3])]
    )
    nodes = [
        oh.make_node("Relu", ["x0"], ["x"], name="relu"),
        oh.make_node("If", ["cond"], ["y"], name="if", then_branch=then_g, else_branch=else_g),
    ]
    inits = [onnx.numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")]
    return model(nodes, [vi("cond", B, []), vi("x0", F, [2, 3])], [vi("y", F, [2, 3])], inits)


@pytest.mark.parametrize("cond", [True, False])
def test_if_reads_outer_values(cond: bool) -> None:
    g = check(if_model(), {"cond": np.array(cond), "x0": rng.standard_normal((2, 3)).astype(np.float32)})
    node = g.node("if")
    assert node.inputs == ["cond", "x", "w"] and node.attrs["captures"] == ["x", "w"]
    assert g.value("y").type_str() == "float32[2, 3]"
    assert g.node("if").attrs["then_branch"].nodes[0].name == "if/then_branch/add"


def test_if_branches_of_different_shapes_merge_to_unknown_dims() -> None:
    then_g = oh.make_graph([oh.make_node("Identity", ["x"], ["a"])], "t", [], [vi("a", F, [2, 3])])
    else_g = oh.make_graph([oh.make_node("Concat", ["x", "x"], ["b"], axis=0)], "e", [], [vi("b", F, [4, 3])])
    m = model(
        [oh.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
        [vi("c", B, []), vi("x", F, [2, 3])],
        [vi("y", F, [None, 3])],
    )
    g = check(m, {"c": np.array(False), "x": np.ones((2, 3), np.float32)})
    assert g.value("y").shape == (None, 3)
    check(m, {"c": np.array(True), "x": np.ones((2, 3), np.float32)}, levels=())


def test_if_with_constant_cond_folds() -> None:
    m = if_model()
    g = from_onnx(m)
    g.initializers["cond"] = np.array(False)
    g.inputs.remove("cond")
    g.initializers["x"] = np.ones((2, 3), np.float32)  # make every If input constant
    g.nodes = [n for n in g.nodes if n.op_type != "Relu"]
    g.inputs.remove("x0")
    folded = og.fold_constants(g)
    assert not folded.nodes and folded.initializers["y"].tolist() == [[1.0] * 3] * 2


# --------------------------------------------------------------------------- Loop


def loop_body(*, capture: bool = True) -> Any:
    """iteration i: v <- v + x[i] * s (s captured); cond <- v.sum() < limit; scan out v."""
    nodes = [
        oh.make_node("Unsqueeze", ["i", "ax0"], ["i1"], name="unsq"),
        oh.make_node("Gather", ["xs", "i"], ["xi"], axis=0, name="gather"),
        oh.make_node("Mul", ["xi", "s" if capture else "xi"], ["xs_i"], name="mul"),
        oh.make_node("Add", ["v_in", "xs_i"], ["v_out"], name="add"),
        oh.make_node("ReduceSum", ["v_out"], ["total"], keepdims=0, name="sum"),
        oh.make_node("Less", ["total", "limit"], ["cond_out"], name="less"),
        oh.make_node("Identity", ["v_out"], ["scan_v"], name="copy"),
    ]
    inits = [onnx.numpy_helper.from_array(np.array([0], np.int64), "ax0")]
    return oh.make_graph(
        nodes, "body", [vi("i", I64, []), vi("c", B, []), vi("v_in", F, [3])],
        [vi("cond_out", B, []), vi("v_out", F, [3]), vi("scan_v", F, [3])], inits,
    )  # fmt: skip


def loop_model(trip: bool = True, cond: bool = True) -> Any:
    node = oh.make_node(
        "Loop",
        ["M" if trip else "", "cond" if cond else "", "v0"],
        ["v", "vs"],
        name="loop",
        body=loop_body(),
    )
    inputs = [vi("xs", F, [6, 3]), vi("s", F, []), vi("limit", F, []), vi("v0", F, [3])]
    if trip:
        inputs.append(vi("M", I64, []))
    if cond:
        inputs.append(vi("cond", B, []))
    return model([node], inputs, [vi("v", F, [3]), vi("vs", F, [None, 3])])


def loop_feeds(m: int | None = 4, cond: bool | None = True, limit: float = 100.0) -> dict[str, np.ndarray]:
    f = {
        "xs": rng.uniform(0, 1, (6, 3)).astype(np.float32),
        "s": np.array(2.0, np.float32),
        "limit": np.array(limit, np.float32),
        "v0": np.zeros(3, np.float32),
    }
    if m is not None:
        f["M"] = np.array(m, np.int64)
    if cond is not None:
        f["cond"] = np.array(cond)
    return f


@pytest.mark.parametrize(
    ("trip", "cond", "m", "c", "limit"),
    [
        (True, True, 4, True, 100.0),  # runs M times
        (True, True, 6, True, 3.0),  # cond stops it early
        (True, True, 0, True, 100.0),  # empty trip count: no iterations, empty scan output
        (True, True, 4, False, 100.0),  # cond false on entry
        (False, True, None, True, 4.0),  # cond-only (while) loop
        (True, False, 3, None, 100.0),  # for loop: no cond input, M bounds it
        (True, False, 5, None, 2.0),  # ... and the body's cond still stops it (as onnxruntime does)
    ],
)
def test_loop(trip: bool, cond: bool, m: int | None, c: bool | None, limit: float) -> None:
    g = check(loop_model(trip, cond), loop_feeds(m, c, limit))
    assert g.node("loop").attrs["captures"] == ["xs", "s", "limit"]
    assert g.value("vs").shape == (None, 3)  # depends on the trip count: planned per run


def test_loop_scan_output_is_dynamic_in_the_memory_plan() -> None:
    g = from_onnx(loop_model())
    plan = og.plan_memory(
        g, input_shapes={"xs": (6, 3), "s": (), "limit": (), "v0": (3,), "M": (), "cond": ()}, dynamic=True
    )
    assert plan.dynamic == ["vs"]


def test_nested_loop_if_captures_two_levels_out() -> None:
    """A Loop whose body holds an If that reads a value of the outermost graph."""
    then_g = oh.make_graph(
        [oh.make_node("Add", ["v_in", "bias"], ["a"], name="add")], "t", [], [vi("a", F, [3])]
    )
    else_g = oh.make_graph(
        [oh.make_node("Sub", ["v_in", "bias"], ["b"], name="sub")], "e", [], [vi("b", F, [3])]
    )
    body = oh.make_graph(
        [
            oh.make_node("Mod", ["i", "two"], ["r"], name="mod"),
            oh.make_node("Equal", ["r", "zero"], ["even"], name="eq"),
            oh.make_node("If", ["even"], ["v_out"], name="branch", then_branch=then_g, else_branch=else_g),
            oh.make_node("Identity", ["c"], ["c_out"], name="keep"),
        ],
        "body", [vi("i", I64, []), vi("c", B, []), vi("v_in", F, [3])], [vi("c_out", B, []), vi("v_out", F, [3])],
        [onnx.numpy_helper.from_array(np.array(2, np.int64), "two"),
         onnx.numpy_helper.from_array(np.array(0, np.int64), "zero")],
    )  # fmt: skip
    m = model(
        [
            oh.make_node("Mul", ["b0", "b0"], ["bias"], name="sq"),
            oh.make_node("Loop", ["M", "", "v0"], ["v"], name="loop", body=body),
        ],
        [vi("M", I64, []), vi("v0", F, [3]), vi("b0", F, [3])],
        [vi("v", F, [3])],
    )
    feeds = {"M": np.array(5, np.int64), "v0": np.ones(3, np.float32), "b0": np.array([1, 2, 3], np.float32)}
    g = check(m, feeds)
    inner = g.node("loop").attrs["body"].node("loop/body/branch")
    assert inner.attrs["captures"] == ["v_in", "bias"]
    assert g.node("loop").attrs["captures"] == ["bias"]
    assert inner.attrs["then_branch"].nodes[0].name == "loop/body/branch/then_branch/add"


# --------------------------------------------------------------------------- Scan


def scan_model(in_axis: int = 0, in_dir: int = 0, out_axis: int = 0, out_dir: int = 0) -> Any:
    body = oh.make_graph(
        [
            oh.make_node("Add", ["acc", "x_t"], ["acc_out"], name="add"),
            oh.make_node("Mul", ["acc_out", "scale"], ["y_t"], name="mul"),
        ],
        "body", [vi("acc", F, [4]), vi("x_t", F, [4])], [vi("acc_out", F, [4]), vi("y_t", F, [4])],
    )  # fmt: skip
    node = oh.make_node(
        "Scan", ["init", "x"], ["final", "ys"], name="scan", body=body, num_scan_inputs=1,
        scan_input_axes=[in_axis], scan_input_directions=[in_dir], scan_output_axes=[out_axis],
        scan_output_directions=[out_dir],
    )  # fmt: skip
    x_shape = [5, 4] if in_axis in (0, -2) else [4, 5]
    return model(
        [node],
        [vi("init", F, [4]), vi("x", F, x_shape), vi("scale", F, [])],
        [vi("final", F, [4]), vi("ys", F, [None, None])],
    )


@pytest.mark.parametrize(
    ("in_axis", "in_dir", "out_axis", "out_dir"),
    [(0, 0, 0, 0), (1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0), (0, 0, 0, 1), (-1, 1, -1, 1), (-2, 0, -2, 0)],
)
def test_scan_axes_and_directions(in_axis: int, in_dir: int, out_axis: int, out_dir: int) -> None:
    x = rng.standard_normal((5, 4) if in_axis in (0, -2) else (4, 5)).astype(np.float32)
    feeds = {"init": np.zeros(4, np.float32), "x": x, "scale": np.array(0.5, np.float32)}
    g = check(scan_model(in_axis, in_dir, out_axis, out_dir), feeds)
    assert g.value("ys").shape == ((5, 4) if out_axis in (0, -2) else (4, 5))


# --------------------------------------------------------------------------- passes, plans, errors


def test_cse_keeps_control_nodes_with_different_bodies() -> None:
    def branch(op: str) -> Any:
        return oh.make_graph([oh.make_node(op, ["x", "x"], ["o"])], op, [], [vi("o", F, [2])])

    m = model(
        [
            oh.make_node(
                "If", ["c"], ["a"], name="if_a", then_branch=branch("Add"), else_branch=branch("Mul")
            ),
            oh.make_node(
                "If", ["c"], ["b"], name="if_b", then_branch=branch("Sub"), else_branch=branch("Mul")
            ),
            oh.make_node("Add", ["a", "b"], ["y"]),
        ],
        [vi("c", B, []), vi("x", F, [2])],
        [vi("y", F, [2])],
    )
    g = og.eliminate_common_subexpressions(from_onnx(m))
    assert g.op_counts()["If"] == 2
    check(m, {"c": np.array(True), "x": np.array([1.0, 2.0], np.float32)})


def test_dce_keeps_values_only_a_body_reads() -> None:
    g = og.eliminate_dead_code(from_onnx(if_model()))
    assert "relu" in [n.name for n in g.nodes] and "w" in g.initializers


def test_plan_save_load_roundtrip(tmp_path: Any) -> None:
    m = loop_model()
    feeds = loop_feeds(5, True, 100.0)
    plan = og.compile(from_onnx(m), level=2)
    path = plan.save(tmp_path / "loop.plan")
    loaded = og.Plan.load(path)
    assert isinstance(loaded.graph.node("loop").attrs["body"], og.Graph)
    for k, w in ort_run(m, feeds).items():
        np.testing.assert_allclose(run_graph(loaded.graph, feeds)[k], w, rtol=1e-6)


def test_branch_output_count_mismatch_names_the_node() -> None:
    then_g = oh.make_graph([oh.make_node("Identity", ["x"], ["a"])], "t", [], [vi("a", F, [2])])
    else_g = oh.make_graph(
        [oh.make_node("Identity", ["x"], ["b"]), oh.make_node("Identity", ["x"], ["b2"])], "e", [],
        [vi("b", F, [2]), vi("b2", F, [2])],
    )  # fmt: skip
    g = oh.make_graph(
        [oh.make_node("If", ["c"], ["y"], name="pick", then_branch=then_g, else_branch=else_g)],
        "g", [vi("c", B, []), vi("x", F, [2])], [vi("y", F, [2])],
    )  # fmt: skip
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    with pytest.raises(GraphError, match=r"node 'pick' \(If\).*else_branch has 2 outputs but the node has 1"):
        from_onnx(m)


def test_body_reading_an_unknown_value_names_the_inner_node() -> None:
    body = oh.make_graph(
        [oh.make_node("Add", ["v_in", "nowhere"], ["v_out"], name="add"), oh.make_node("Identity", ["c"], ["c_out"])],
        "body", [vi("i", I64, []), vi("c", B, []), vi("v_in", F, [2])], [vi("c_out", B, []), vi("v_out", F, [2])],
    )  # fmt: skip
    g = oh.make_graph(
        [oh.make_node("Loop", ["M", "", "v0"], ["v"], name="loop", body=body)],
        "g", [vi("M", I64, []), vi("v0", F, [2])], [vi("v", F, [2])],
    )  # fmt: skip
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    with pytest.raises(
        GraphError, match=r"node 'loop/body/add' \(Add\).*'nowhere' is not defined in its subgraph"
    ):
        from_onnx(m)


def test_loop_body_input_count_mismatch() -> None:
    body = oh.make_graph(
        [oh.make_node("Identity", ["c"], ["c_out"])],
        "body",
        [vi("i", I64, []), vi("c", B, [])],
        [vi("c_out", B, [])],
    )
    g = oh.make_graph(
        [oh.make_node("Loop", ["M", "", "v0"], ["v"], name="lp", body=body)],
        "g", [vi("M", I64, []), vi("v0", F, [2])], [vi("v", F, [2])],
    )  # fmt: skip
    with pytest.raises(GraphError, match=r"node 'lp' \(Loop\).*body has 2 inputs; it needs 2 \+ 1"):
        from_onnx(oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)]))


def test_validate_refuses_a_subgraph_read_the_node_does_not_capture() -> None:
    g = from_onnx(if_model())
    node = g.node("if")
    node.attrs["captures"] = ["x"]
    node.inputs = ["cond", "x"]
    with pytest.raises(GraphError, match=r"node 'if/then_branch/add' \(Add\).*'w' is not defined"):
        g.validate()


def test_scan_sequence_length_mismatch_is_an_error() -> None:
    body = oh.make_graph(
        [oh.make_node("Add", ["a", "b"], ["o"])],
        "body",
        [vi("a", F, [2]), vi("b", F, [2])],
        [vi("o", F, [2])],
    )
    m = model(
        [oh.make_node("Scan", ["x", "y"], ["ys"], name="sc", body=body, num_scan_inputs=2)],
        [vi("x", F, [3, 2]), vi("y", F, [None, 2])],
        [vi("ys", F, [3, 2])],
    )
    g = from_onnx(m)
    with pytest.raises(GraphError, match=r"node 'sc' \(Scan\).*different sequence lengths \[3, 4\]"):
        run_graph(g, {"x": np.ones((3, 2), np.float32), "y": np.ones((4, 2), np.float32)})


@pytest.mark.parametrize("direction", [0, 1])
def test_scan8_with_a_batch_axis(direction: int) -> None:
    """Scan-8 (batch axis first, no sequence_lens) imports as a Loop over the batch of Scan-9 rows."""
    body = oh.make_graph(
        [oh.make_node("Add", ["acc", "x_t"], ["acc_out"]), oh.make_node("Neg", ["acc_out"], ["y_t"])],
        "body", [vi("acc", F, [2]), vi("x_t", F, [2])], [vi("acc_out", F, [2]), vi("y_t", F, [2])],
    )  # fmt: skip
    node = oh.make_node(
        "Scan",
        ["", "init", "x"],
        ["final", "ys"],
        name="scan",
        body=body,
        num_scan_inputs=1,
        directions=[direction],
    )
    m = model(
        [node],
        [vi("init", F, [3, 2]), vi("x", F, [3, 4, 2])],
        [vi("final", F, [3, 2]), vi("ys", F, [3, 4, 2])],
        opset=8,
    )
    feeds = {
        "init": rng.standard_normal((3, 2)).astype(np.float32),
        "x": rng.standard_normal((3, 4, 2)).astype(np.float32),
    }
    want = ort_run(m, feeds)
    got = run_graph(from_onnx(m), feeds)
    for k, w in want.items():
        np.testing.assert_allclose(got[k], w, rtol=1e-6, err_msg=k)


def test_scan8_with_sequence_lens_is_refused() -> None:
    body = oh.make_graph(
        [oh.make_node("Add", ["acc", "x_t"], ["acc_out"])], "body", [vi("acc", F, [2]), vi("x_t", F, [2])],
        [vi("acc_out", F, [2])],
    )  # fmt: skip
    node = oh.make_node("Scan", ["lens", "init", "x"], ["final"], name="s8", body=body, num_scan_inputs=1)
    m = model(
        [node],
        [vi("lens", I64, [3]), vi("init", F, [3, 2]), vi("x", F, [3, 4, 2])],
        [vi("final", F, [3, 2])],
        opset=8,
    )
    with pytest.raises(GraphError, match=r"cannot convert opset 8 to 13 at node 's8' \(Scan\)"):
        from_onnx(m)


def test_if_branch_outputs_an_outer_value_and_a_constant() -> None:
    then_g = oh.make_graph([], "then", [], [vi("x", F, [3])])  # the outer value itself
    else_g = oh.make_graph(
        [oh.make_node("Constant", [], ["k"], value=onnx.numpy_helper.from_array(np.full(3, 7, np.float32)))],
        "else", [], [vi("k", F, [3])],
    )  # fmt: skip
    g = oh.make_graph(
        [oh.make_node("If", ["c"], ["y"], name="if", then_branch=then_g, else_branch=else_g)],
        "g", [vi("c", B, []), vi("x", F, [3])], [vi("y", F, [3])],
    )  # fmt: skip
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])  # onnx.checker wants node outputs only
    x = np.array([1, 2, 3], np.float32)
    imported = from_onnx(m)
    exported = to_onnx(imported)
    onnx.checker.check_model(exported, full_check=True)  # the export copies them through Identity
    for c, want in ((True, x), (False, np.full(3, 7, np.float32))):
        feeds = {"c": np.array(c), "x": x}
        np.testing.assert_array_equal(run_graph(imported, feeds)["y"], want)
        np.testing.assert_array_equal(ort_run(exported, feeds)["y"], want)
        np.testing.assert_array_equal(run_graph(og.optimize(imported, 3)[0], feeds)["y"], want)


def test_loop_carried_value_that_grows_has_unknown_dims() -> None:
    """v <- Concat(v, x) each iteration: its final length depends on the trip count."""
    body = oh.make_graph(
        [
            oh.make_node("Concat", ["v_in", "x"], ["v_out"], axis=0),
            oh.make_node("Identity", ["c"], ["c_out"]),
        ],
        "body",
        [
            oh.make_tensor_value_info("i", I64, []),
            oh.make_tensor_value_info("c", B, []),
            vi("v_in", F, [None]),
        ],
        [vi("c_out", B, []), vi("v_out", F, [None])],
    )
    m = model(
        [oh.make_node("Loop", ["M", "", "v0"], ["v"], name="loop", body=body)],
        [vi("M", I64, []), vi("v0", F, [2]), vi("x", F, [2])],
        [vi("v", F, [None])],
    )
    for trip in (0, 1, 4):
        feeds = {
            "M": np.array(trip, np.int64),
            "v0": np.ones(2, np.float32),
            "x": np.arange(2, dtype=np.float32),
        }
        g = check(m, feeds)
    assert g.value("v").shape == (None,)


def test_removing_an_identity_rewires_a_capture_by_position() -> None:
    """remove_identities makes the If read 'x0' for 'x'; the branches keep reading 'x' (bound by position)."""
    then_g = oh.make_graph([oh.make_node("Add", ["x", "x"], ["t"])], "t", [], [vi("t", F, [2])])
    else_g = oh.make_graph([oh.make_node("Neg", ["x"], ["e"])], "e", [], [vi("e", F, [2])])
    m = model(
        [
            oh.make_node("Identity", ["x0"], ["x"]),
            oh.make_node("If", ["c"], ["y"], name="if", then_branch=then_g, else_branch=else_g),
        ],
        [vi("c", B, []), vi("x0", F, [2])],
        [vi("y", F, [2])],
    )
    g, _ = og.optimize(from_onnx(m), 1)
    assert g.node("if").inputs == ["c", "x0"] and g.node("if").attrs["captures"] == ["x"]
    for c in (True, False):
        check(m, {"c": np.array(c), "x0": np.array([1.0, -2.0], np.float32)})


@settings(max_examples=25, deadline=None)
@given(
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    data=st.data(),
)
def test_scan_matches_a_numpy_reference(shape: list[int], data: Any) -> None:
    """Scan with any input/output axis and direction: running sum state, per-step output 2 * x_t."""
    rank = len(shape)
    in_axis = data.draw(st.integers(-rank, rank - 1), "in_axis")
    out_axis = data.draw(st.integers(-rank, rank - 1), "out_axis")
    in_dir, out_dir = data.draw(st.integers(0, 1), "in_dir"), data.draw(st.integers(0, 1), "out_dir")
    step = shape[: in_axis % rank] + shape[in_axis % rank + 1 :]
    body = oh.make_graph(
        [oh.make_node("Add", ["acc", "x_t"], ["acc_out"]), oh.make_node("Add", ["x_t", "x_t"], ["y_t"])],
        "body", [vi("acc", F, step), vi("x_t", F, step)], [vi("acc_out", F, step), vi("y_t", F, step)],
    )  # fmt: skip
    node = oh.make_node(
        "Scan", ["init", "x"], ["final", "ys"], body=body, num_scan_inputs=1, scan_input_axes=[in_axis],
        scan_input_directions=[in_dir], scan_output_axes=[out_axis], scan_output_directions=[out_dir],
    )  # fmt: skip
    m = model(
        [node], [vi("init", F, step), vi("x", F, shape)], [vi("final", F, step), vi("ys", F, [None] * rank)]
    )
    x = rng.standard_normal(shape).astype(np.float32)
    got = run_graph(from_onnx(m), {"init": np.zeros(step, np.float32), "x": x})
    steps = np.moveaxis(x, in_axis, 0)
    np.testing.assert_allclose(got["final"], steps.sum(axis=0), rtol=1e-5, atol=1e-6)
    ys = 2 * (steps[::-1] if in_dir else steps)
    want = np.moveaxis(ys[::-1] if out_dir else ys, 0, out_axis)
    np.testing.assert_array_equal(got["ys"], want)
