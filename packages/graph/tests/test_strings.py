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
