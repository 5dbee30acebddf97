"""Convolution and pooling through the graph (ONNX import, shape rules, executor, plan, export) against
onnxruntime: Conv 1-D/2-D/3-D, ConvTranspose (output_padding, output_shape, groups, dilations, auto_pad),
MaxPool/AveragePool 1-D/3-D with dilations and ceil_mode, MaxPool Indices, LpPool, GlobalLpPool, MaxUnpool."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


from _onnx_check import F, check_against_ort, const, feed, node_model, rng  # noqa: E402

from opstrata.graph import from_onnx, run_graph  # noqa: E402
from opstrata.graph.testing import ort_run  # noqa: E402

_node_model = node_model


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize(
    "attrs",
    [{}, {"strides": 2, "pads": 1, "dilations": 2}, {"auto_pad": "SAME_UPPER", "strides": 2}, {"group": 2}],
)
def test_conv_any_rank(nd: int, attrs: dict[str, Any]) -> None:
    a = {
        k: ([v] * nd if k in ("strides", "dilations") else [v] * 2 * nd if k == "pads" else v)
        for k, v in attrs.items()
    }
    g = attrs.get("group", 1)
    check_against_ort("Conv", [feed(F(2, 4, *[7] * nd)), const(F(6, 4 // g, *[3] * nd)), const(F(6))], a)


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize(
    "attrs",
    [
        {},
        {"strides": 2, "output_padding": 1},
        {"strides": 2, "pads": 1, "dilations": 2, "group": 2},
        {"strides": 2, "output_shape": 10},
        {"strides": 2, "auto_pad": "SAME_UPPER"},
        {"strides": 3, "auto_pad": "SAME_LOWER"},
        {"auto_pad": "VALID", "strides": 2},
    ],
)
def test_conv_transpose(nd: int, attrs: dict[str, Any]) -> None:
    a = {
        k: ([v] * 2 * nd if k == "pads" else [v] * nd if isinstance(v, int) and k != "group" else v)
        for k, v in attrs.items()
    }
    g = attrs.get("group", 1)
    check_against_ort(
        "ConvTranspose", [feed(F(1, 4, *[4] * nd)), const(F(4, 6 // g, *[3] * nd)), const(F(6))], a
    )


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "LpPool"])
@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("ceil", [0, 1])
def test_pools_any_rank_with_dilations_and_ceil_mode(op: str, nd: int, ceil: int) -> None:
    attrs: dict[str, Any] = {
        "kernel_shape": [3] * nd,
        "strides": [2] * nd,
        "pads": [1] * 2 * nd,
        "ceil_mode": ceil,
    }
    attrs["dilations"] = [2] * nd
    if op == "AveragePool":
        attrs["count_include_pad"] = 1
    check_against_ort(op, [feed(F(1, 2, *[8] * nd))], attrs, opset=19)


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("storage_order", [0, 1])
def test_max_pool_indices(nd: int, storage_order: int) -> None:
    attrs = {"kernel_shape": [2] * nd, "strides": [2] * nd, "pads": [1] * 2 * nd}
    if nd == 2:
        attrs["storage_order"] = storage_order
    elif storage_order:
        return
    check_against_ort("MaxPool", [feed(F(2, 3, *[5] * nd))], attrs, n_out=2)


def test_average_pool_wide_pads_run_on_the_nd_kernel() -> None:
    attrs = {"kernel_shape": [3, 3], "pads": [2, 2, 2, 2]}
    check_against_ort("AveragePool", [feed(F(1, 2, 5, 5))], attrs)


@pytest.mark.parametrize("p", [1, 2, 3])
def test_global_lp_pool(p: int) -> None:
    check_against_ort("GlobalLpPool", [feed(F(2, 3, 4, 5))], {"p": p})


@pytest.mark.parametrize("with_shape", [False, True])
def test_max_unpool(with_shape: bool) -> None:
    x = F(1, 2, 4, 4)
    model, feeds = _node_model("MaxPool", [feed(x)], {"kernel_shape": [2, 2], "strides": [2, 2]}, 2, 17)
    pooled = ort_run(model, feeds)
    ins = [feed(pooled["out0"]), feed(pooled["out1"])]
    if with_shape:
        ins.append(const(np.array([1, 2, 5, 5], np.int64)))
    check_against_ort("MaxUnpool", ins, {"kernel_shape": [2, 2], "strides": [2, 2]})


def test_conv_channel_mismatch_names_the_node() -> None:
    model, feeds = _node_model("Conv", [feed(F(1, 3, 5)), const(F(2, 3, 3))], {}, 1, 17)
    model.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(F(2, 2, 3), "in1"))
    with pytest.raises(Exception, match=r"node 'node' \(Conv\).*3 channels"):
        run_graph(from_onnx(model), feeds)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("n_out", [1, 2])
def test_max_pool_of_ints_imports_as_max_pool_nd(dtype: Any, n_out: int) -> None:
    x = rng.integers(0, 100, size=(1, 2, 5, 5)).astype(dtype)
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [0, 0, 1, 1]}
    check_against_ort("MaxPool", [feed(x)], attrs, n_out=n_out)
    model, _ = _node_model("MaxPool", [feed(x)], attrs, n_out, 17)
    assert [n.qualified_type for n in from_onnx(model).nodes] == ["ai.opstrata::MaxPoolNd"]
