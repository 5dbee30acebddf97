"""STRING tensors (object arrays of str) and the string ops of opdefs/strings.py: import, shape inference,
run_graph against onnxruntime (or the spec where onnxruntime differs), export, and the error paths."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import onnx.helper as oh  # noqa: E402
from hypothesis import (  # noqa: E402
    given,
    settings,
    strategies as st,
)

from opstrata.graph import GraphError, UnsupportedOpError, from_onnx, plan_memory, run_graph, to_onnx  # noqa: E402

T = onnx.TensorProto
OBJ = np.dtype(object)


def model(nodes: list[Any], inputs: list[Any], outputs: list[Any], opset: int = 20, inits: Any = ()) -> Any:
    g = oh.make_graph(nodes, "g", inputs, outputs, list(inits))
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", opset)])


def s_in(name: str, shape: Any) -> Any:
    return oh.make_tensor_value_info(name, T.STRING, shape)


def ort_run(m: Any, feeds: dict[str, Any]) -> list[Any]:
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def strs(*xs: str) -> np.ndarray:
    return np.array(list(xs), dtype=object)


def check(m: Any, feeds: dict[str, Any], *, versus_ort: bool = True) -> list[Any]:
    """run_graph agrees with onnxruntime (exactly) and the exported model runs the same in onnxruntime."""
    g = from_onnx(m)
    got = run_graph(g, feeds)
    res = [got[o] for o in g.outputs]
    if versus_ort:
        want = ort_run(m, feeds)
        for r, w in zip(res, want, strict=True):
            w = np.asarray(w)
            assert r.shape == w.shape and r.dtype == w.dtype, (r, w)
            assert r.tolist() == w.tolist()
    exported = to_onnx(g)
    onnx.checker.check_model(exported, full_check=True)
    back = ort_run(exported, feeds)
    for r, b in zip(res, back, strict=True):
        assert np.asarray(b).tolist() == r.tolist()
    return res


def test_string_input_imports_as_object_dtype_and_plans_outside_the_arena() -> None:
    m = model(
        [oh.make_node("StringConcat", ["x", "y"], ["z"])], [s_in("x", [2]), s_in("y", [2])], [s_in("z", [2])]
    )
    g = from_onnx(m)
    assert g.value("x").dtype == OBJ and g.value("z").dtype == OBJ and g.value("z").shape == (2,)
    plan = plan_memory(g, input_shapes={"x": (2,), "y": (2,)}, dynamic=True)
    assert "z" in plan.dynamic and "z" not in plan.offsets
    with pytest.raises(GraphError, match="not arena values"):
        plan_memory(g, input_shapes={"x": (2,), "y": (2,)})


def test_string_initializer_and_constant() -> None:
    init = onnx.numpy_helper.from_array(strs("-x", "-y"), "suffix")
    m = model(
        [oh.make_node("StringConcat", ["x", "suffix"], ["z"])],
        [s_in("x", [2])],
        [s_in("z", [2])],
        inits=[init],
    )
    g = from_onnx(m)
    assert g.initializers["suffix"].dtype == OBJ
    (z,) = check(m, {"x": strs("a", "b")})
    assert z.tolist() == ["a-x", "b-y"]


@pytest.mark.parametrize(
    ("x", "y"),
    [
        (strs("abc", "é"), strs("def", "ü")),
        (np.array([["a"], ["b"]], dtype=object), strs("1", "2", "3")),
        (np.array("x", dtype=object), np.array("", dtype=object)),
    ],
)
def test_string_concat_matches_ort(x: np.ndarray, y: np.ndarray) -> None:
    m = model(
        [oh.make_node("StringConcat", ["x", "y"], ["z"])],
        [s_in("x", list(x.shape)), s_in("y", list(y.shape))],
        [s_in("z", list(np.broadcast_shapes(x.shape, y.shape)))],
    )
    check(m, {"x": x, "y": y})


@pytest.mark.parametrize(
    ("attrs", "x", "want"),
    [
        ({}, strs("a b", "c  d", ""), [[["a", "b"], ["c", "d"], ["", ""]], [2, 2, 0]]),
        ({"delimiter": "-"}, strs("a-b-c", "d--e"), [[["a", "b", "c"], ["d", "", "e"]], [3, 3]]),
        ({"delimiter": "-", "maxsplit": 1}, strs("a-b-c", "d"), [[["a", "b-c"], ["d", ""]], [2, 1]]),
    ],
)
def test_string_split(attrs: dict[str, Any], x: np.ndarray, want: list[Any]) -> None:
    m = model(
        [oh.make_node("StringSplit", ["x"], ["y", "n"], **attrs)],
        [s_in("x", [len(x)])],
        [s_in("y", None), oh.make_tensor_value_info("n", T.INT64, None)],
    )
    y, n = check(m, {"x": x})
    assert [y.tolist(), n.tolist()] == want
    assert n.dtype == np.int64


def test_regex_full_match() -> None:
    m = model(
        [oh.make_node("RegexFullMatch", ["x"], ["y"], pattern=r"[a-z]+@(\w+)\.com")],
        [s_in("x", [3])],
        [oh.make_tensor_value_info("y", T.BOOL, [3])],
    )
    (y,) = check(m, {"x": strs("ab@cd.com", "ab@cd.org", "AB@cd.com")})
    assert y.tolist() == [True, False, False]


def test_regex_bad_pattern_is_refused_at_import() -> None:
    m = model(
        [oh.make_node("RegexFullMatch", ["x"], ["y"], pattern="(")],
        [s_in("x", [3])],
        [oh.make_tensor_value_info("y", T.BOOL, [3])],
    )
    with pytest.raises(UnsupportedOpError, match="not a valid regex"):
        from_onnx(m)


@pytest.mark.parametrize(
    ("attrs", "x", "want"),
    [
        ({"case_change_action": "LOWER"}, strs("MonDay", "tuesday"), ["monday", "tuesday"]),
        ({"case_change_action": "UPPER", "stopwords": ["monday"]}, strs("MonDay", "x"), ["X"]),
        ({"is_case_sensitive": 1, "stopwords": ["monday"]}, strs("MonDay", "monday"), ["MonDay"]),
        ({"stopwords": ["a", "b"]}, strs("a", "B"), [""]),
        ({"case_change_action": "UPPER"}, np.array([["a", "b"]], dtype=object), [["A", "B"]]),
    ],
)
def test_string_normalizer(attrs: dict[str, Any], x: np.ndarray, want: list[Any]) -> None:
    m = model(
        [oh.make_node("StringNormalizer", ["x"], ["y"], **attrs)],
        [s_in("x", list(x.shape))],
        [s_in("y", None)],
    )
    g = from_onnx(m)
    (y,) = run_graph(g, {"x": x}).values()
    assert y.dtype == OBJ and y.tolist() == want


def test_string_normalizer_bad_action_is_refused() -> None:
    m = model(
        [oh.make_node("StringNormalizer", ["x"], ["y"], case_change_action="TITLE")],
        [s_in("x", [2])],
        [s_in("y", None)],
    )
    with pytest.raises(UnsupportedOpError, match="case_change_action='TITLE'"):
        from_onnx(m)


def test_equal_on_strings_and_broadcast() -> None:
    m = model(
        [oh.make_node("Equal", ["x", "y"], ["z"])],
        [s_in("x", [2, 2]), s_in("y", [2])],
        [oh.make_tensor_value_info("z", T.BOOL, [2, 2])],
        opset=19,
    )
    g = from_onnx(m)
    assert g.nodes[0].qualified_type == "ai.opstrata::StringEqual"
    (z,) = check(m, {"x": np.array([["a", "b"], ["b", "a"]], dtype=object), "y": strs("a", "a")})
    assert z.tolist() == [[True, False], [False, True]]


def test_equal_on_numbers_still_imports_as_equal() -> None:
    f = oh.make_tensor_value_info
    m = model(
        [oh.make_node("Equal", ["x", "y"], ["z"])],
        [f("x", T.FLOAT, [2]), f("y", T.FLOAT, [2])],
        [f("z", T.BOOL, [2])],
    )
    assert from_onnx(m).nodes[0].op_type == "Equal"


@pytest.mark.parametrize(
    ("elem", "dtype"),
    [(T.FLOAT, np.float32), (T.DOUBLE, np.float64), (T.INT32, np.int32), (T.BOOL, np.bool_)],
)
def test_cast_to_string_and_back_matches_ort(elem: int, dtype: Any) -> None:
    f = oh.make_tensor_value_info
    m = model(
        [oh.make_node("Cast", ["x"], ["s"], to=T.STRING), oh.make_node("Cast", ["s"], ["y"], to=elem)],
        [f("x", elem, [6])],
        [s_in("s", [6]), f("y", elem, [6])],
    )
    if dtype in (np.float32, np.float64):
        x = np.array([0.1, -3.5, np.nan, np.inf, 1e20, 123456.789], dtype)
    else:
        x = np.array([1, 0, 1, 5, 7, 100]).astype(dtype)
    g = from_onnx(m)
    got = run_graph(g, {"x": x})
    want = ort_run(m, {"x": x})
    assert got["s"].tolist() == list(want[0])
    np.testing.assert_array_equal(got["y"], want[1])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=1, max_size=8))
def test_cast_float_to_string_property(xs: list[float]) -> None:
    x = np.array(xs, np.float32)
    m = model(
        [oh.make_node("Cast", ["x"], ["s"], to=T.STRING)],
        [oh.make_tensor_value_info("x", T.FLOAT, [len(xs)])],
        [s_in("s", [len(xs)])],
    )
    assert run_graph(from_onnx(m), {"x": x})["s"].tolist() == list(ort_run(m, {"x": x})[0])


def test_string_from_string_parses_special_values() -> None:
    m = model(
        [oh.make_node("Cast", ["s"], ["y"], to=T.FLOAT)],
        [s_in("s", [5])],
        [oh.make_tensor_value_info("y", T.FLOAT, [5])],
    )
    y = run_graph(from_onnx(m), {"s": strs("1e-5", "+INF", "-inf", "nan", " 3.5")})["y"]
    assert y[0] == np.float32(1e-5) and y[1] == np.inf and y[2] == -np.inf and np.isnan(y[3]) and y[4] == 3.5


def test_string_kernel_rejects_numbers() -> None:
    m = model(
        [oh.make_node("StringConcat", ["x", "y"], ["z"])], [s_in("x", [1]), s_in("y", [1])], [s_in("z", [1])]
    )
    g = from_onnx(m)
    with pytest.raises(GraphError, match="expected dtype object"):
        run_graph(g, {"x": np.array([1.0]), "y": strs("a")})


def test_constant_value_string_and_strings() -> None:
    m = model(
        [
            oh.make_node("Constant", [], ["c"], value_strings=["a", "b"]),
            oh.make_node("Constant", [], ["d"], value_string="z"),
            oh.make_node("StringConcat", ["x", "c"], ["y"]),
            oh.make_node("StringConcat", ["y", "d"], ["w"]),
        ],
        [s_in("x", [2])],
        [s_in("w", [2])],
    )
    g = from_onnx(m)
    assert g.initializers["c"].dtype == OBJ and g.initializers["d"].shape == ()
    (w,) = check(m, {"x": strs("1", "2")})
    assert w.tolist() == ["1az", "2bz"]


# --------------------------------------------------------------------------- data movement on strings

_X = np.array([["a", "bb", "c"], ["d", "", "f"]], dtype=object)


def _i64(name: str, values: list[int]) -> Any:
    return oh.make_tensor(name, T.INT64, [len(values)], values)


def _movement_cases() -> dict[str, tuple[Any, dict[str, Any]]]:
    """op -> (model, feeds): every data-movement op whose ONNX type constraint includes tensor(string)."""

    def i_in(n: str, shape: Any = None) -> Any:
        return oh.make_tensor_value_info(n, T.INT64, shape)

    def b_in(n: str, shape: Any = None) -> Any:
        return oh.make_tensor_value_info(n, T.BOOL, shape)

    y = [s_in("y", None)]
    x = [s_in("x", [2, 3])]
    node = oh.make_node
    return {
        "Reshape": (model([node("Reshape", ["x", "s"], ["y"])], x, y, inits=[_i64("s", [3, 2])]), {}),
        "Flatten": (model([node("Flatten", ["x"], ["y"], axis=0)], x, y), {}),
        "Unsqueeze+Squeeze": (
            model([node("Unsqueeze", ["x", "a"], ["t"]), node("Squeeze", ["t", "a"], ["y"])], x, y, inits=[_i64("a", [1])]),
            {},
        ),
        "Transpose": (model([node("Transpose", ["x"], ["y"], perm=[1, 0])], x, y), {}),
        "Concat": (model([node("Concat", ["x", "x"], ["y"], axis=1)], x, y), {}),
        "Split": (model([node("Split", ["x"], ["y", "z"], axis=1, num_outputs=2)], x, [*y, s_in("z", None)]), {}),
        "Slice": (model([node("Slice", ["x", "b", "e"], ["y"])], x, y, inits=[_i64("b", [1]), _i64("e", [2])]), {}),
        "Expand": (model([node("Expand", ["x", "s"], ["y"])], x, y, inits=[_i64("s", [2, 2, 3])]), {}),
        "Tile": (model([node("Tile", ["x", "r"], ["y"])], x, y, inits=[_i64("r", [2, 1])]), {}),
        "Gather": (model([node("Gather", ["x", "i"], ["y"], axis=1)], [*x, i_in("i", [3])], y), {"i": np.array([2, 0, -1])}),
        "GatherElements": (
            model([node("GatherElements", ["x", "i"], ["y"], axis=1)], [*x, i_in("i", [2, 2])], y),
            {"i": np.array([[2, 0], [1, 1]])},
        ),
        "GatherND": (model([node("GatherND", ["x", "i"], ["y"])], [*x, i_in("i", [2, 2])], y), {"i": np.array([[1, 2], [0, 0]])}),
        "ScatterElements": (
            model([node("ScatterElements", ["x", "i", "u"], ["y"], axis=1)], [*x, i_in("i", [2, 1]), s_in("u", [2, 1])], y),
            {"i": np.array([[0], [2]]), "u": strs("p", "q").reshape(2, 1)},
        ),
        "ScatterND": (
            model([node("ScatterND", ["x", "i", "u"], ["y"])], [*x, i_in("i", [1, 2]), s_in("u", [1])], y),
            {"i": np.array([[1, 2]]), "u": strs("zz")},
        ),
        "Where": (
            model([node("Where", ["c", "x", "w"], ["y"])], [b_in("c", [2, 3]), *x, s_in("w", [2, 3])], y),
            {"c": np.array([[True, False, True], [False, True, False]]), "w": _X[::-1].copy()},
        ),
        "Compress": (
            model([node("Compress", ["x", "c"], ["y"], axis=1)], [*x, b_in("c", [3])], y),
            {"c": np.array([True, False, True])},
        ),
        "ReverseSequence": (
            model([node("ReverseSequence", ["x", "l"], ["y"], batch_axis=1, time_axis=0)], [*x, i_in("l", [3])], y),
            {"l": np.array([2, 1, 2])},
        ),
        "OneHot": (
            model([node("OneHot", ["i", "d", "v"], ["y"])], [i_in("i", [3]), i_in("d", []), s_in("v", [2])], y),
            {"i": np.array([0, 2, 1]), "d": np.array(3), "v": strs("off", "on")},
        ),
        "Unique": (
            model([node("Unique", ["x"], ["y", "i", "inv", "n"], sorted=1)], [s_in("x", [6])],
                  [*y, i_in("i"), i_in("inv"), i_in("n")]),
            {"x": strs("b", "a", "b", "c", "a", "a")},
        ),
        "Shape+Size": (
            model([node("Shape", ["x"], ["y"]), node("Size", ["x"], ["z"])], x, [i_in("y"), i_in("z")]),
            {},
        ),
    }  # fmt: skip


@pytest.mark.parametrize("op", sorted(_movement_cases()))
def test_data_movement_on_strings_matches_ort(op: str) -> None:
    m, feeds = _movement_cases()[op]
    feeds = {"x": _X, **feeds}
    check(m, {k: v for k, v in feeds.items() if k in {i.name for i in m.graph.input}})


def test_pad_trilu_nonzero_on_strings_follow_the_spec() -> None:
    """onnxruntime's CPU provider has no string kernel for these three; the spec fills with ''."""
    node = oh.make_node
    pad = model(
        [node("Pad", ["x", "p"], ["y"])],
        [s_in("x", [2, 3])],
        [s_in("y", None)],
        inits=[_i64("p", [0, 1, 0, 0])],
    )
    got = run_graph(from_onnx(pad), {"x": _X})["y"]
    assert got.tolist() == [["", "a", "bb", "c"], ["", "d", "", "f"]]
    trilu = model([node("Trilu", ["x"], ["y"], upper=1)], [s_in("x", [2, 3])], [s_in("y", None)])
    got = run_graph(from_onnx(trilu), {"x": _X})["y"]
    assert got.tolist() == [["a", "bb", "c"], ["", "", "f"]]
    nz = model(
        [node("NonZero", ["x"], ["y"])], [s_in("x", [2, 3])], [oh.make_tensor_value_info("y", T.INT64, None)]
    )
    got = run_graph(from_onnx(nz), {"x": _X})["y"]
    assert got.tolist() == [[0, 0, 0, 1, 1], [0, 1, 2, 0, 2]]  # the empty string is the zero


def test_pad_of_strings_with_a_number_is_refused() -> None:
    from opstrata.ops import OpError, pad

    assert pad(_X, [0, 0, 0, 1], value="-").tolist() == [["a", "bb", "c", "-"], ["d", "", "f", "-"]]
    with pytest.raises(OpError, match=r"pad: argument 'value' expected a str to pad a string tensor.*got 7"):
        pad(_X, [0, 0, 0, 1], value=7)


@settings(max_examples=25, deadline=None)
@given(
    shape=st.lists(st.integers(0, 3), min_size=1, max_size=4),
    words=st.lists(st.text(max_size=3), min_size=1, max_size=5),
    data=st.data(),
)
def test_transpose_reshape_gather_of_strings_property(shape: list[int], words: list[str], data: Any) -> None:
    """Random string tensors through Transpose -> Reshape(-1) -> Gather equal numpy on the object array."""
    size = int(np.prod(shape))
    x = np.array([words[i % len(words)] for i in range(size)], dtype=object).reshape(shape)
    perm = data.draw(st.permutations(range(len(shape))))
    idx = np.array(
        data.draw(st.lists(st.integers(0, max(size - 1, 0)), max_size=4)) if size else [], np.int64
    )
    node = oh.make_node
    m = model(
        [node("Transpose", ["x"], ["t"], perm=list(perm)), node("Reshape", ["t", "s"], ["f"]), node("Gather", ["f", "i"], ["y"])],
        [s_in("x", shape), oh.make_tensor_value_info("i", T.INT64, [len(idx)])],
        [s_in("y", None)],
        inits=[_i64("s", [-1])],
    )  # fmt: skip
    got = run_graph(from_onnx(m), {"x": x, "i": idx})["y"]
    assert got.dtype == OBJ and got.tolist() == np.transpose(x, perm).reshape(-1)[idx].tolist()
