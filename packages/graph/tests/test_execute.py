"""The reference executor: feed validation, intermediate outputs, devices, host ops."""

from __future__ import annotations

import numpy as np
import pytest

import opstrata.ops as ops
from opstrata.graph import HOST_OPS, Graph, GraphError, infer_shapes, run_graph


def _graph() -> Graph:
    g = Graph("exe")
    g.add_input("a", np.float32, ("batch", 3))
    g.add_input("b", np.float32, ("batch", 1))
    g.add_node("Add", ["a", "b"], ["s"])
    g.add_node("Relu", ["s"], ["y"])
    g.outputs.append("y")
    return infer_shapes(g)


def _feeds(n: int = 2) -> dict[str, np.ndarray]:
    return {"a": np.arange(3 * n, dtype=np.float32).reshape(n, 3) - 2, "b": np.ones((n, 1), np.float32)}


def test_runs_and_returns_intermediates() -> None:
    out = run_graph(_graph(), _feeds(), outputs=["s", "y"])
    np.testing.assert_array_equal(out["y"], np.maximum(_feeds()["a"] + 1, 0))
    assert set(out) == {"s", "y"}


def test_device_is_passed_to_ops() -> None:
    assert "ref" in ops.list_devices()
    np.testing.assert_array_equal(
        run_graph(_graph(), _feeds(), device="ref")["y"], run_graph(_graph(), _feeds())["y"]
    )


@pytest.mark.parametrize(
    ("feeds", "match"),
    [
        ({"a": np.zeros((2, 3), np.float32)}, r"miss inputs \['b'\].*Fix: feed exactly the graph inputs"),
        ({**_feeds(), "c": np.zeros(1)}, r"name unknown inputs \['c'\]"),
        (
            {**_feeds(), "a": np.zeros((2, 3))},
            r"input 'a': expected dtype float32, got float64.*astype\(np.float32\)",
        ),
        ({**_feeds(), "a": np.zeros((2, 4), np.float32)}, r"input 'a': dim 1 must be 3"),
        ({**_feeds(), "a": np.zeros(3, np.float32)}, r"input 'a': expected rank 2"),
        (
            {**_feeds(), "b": np.ones((3, 1), np.float32)},
            r"symbolic dim 'batch' is 3 here but 2 in input 'a'",
        ),
    ],
)
def test_bad_feeds(feeds: dict[str, np.ndarray], match: str) -> None:
    with pytest.raises(GraphError, match=match):
        run_graph(_graph(), feeds)


def test_unknown_output_and_unknown_op() -> None:
    with pytest.raises(GraphError, match=r"values \['nope'\] were not computed"):
        run_graph(_graph(), _feeds(), outputs=["nope"])
    g = _graph()
    g.add_node("Frobnicate", ["y"], ["z"])
    with pytest.raises(GraphError, match=r"Frobnicate_0.*no implementation.*supported: Abs"):
        run_graph(g, _feeds())


def test_host_ops_are_listed() -> None:
    assert {"Shape", "Range", "ConstantOfShape", "Trilu"} <= HOST_OPS
