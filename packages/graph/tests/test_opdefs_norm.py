"""Normalisations through the graph (ONNX import, shape rules, executor, plan, export) against onnxruntime:
InstanceNormalization, GroupNormalization (opset 18 per-group and 21 per-channel forms), LRN, LpNormalization,
MeanVarianceNormalization, LayerNormalization with its Mean / InvStdDev outputs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from _onnx_check import F, check_against_ort, const, feed, node_model  # noqa: E402

from opstrata.graph import from_onnx, run_graph  # noqa: E402

_node_model = node_model


@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (1, 2, 3, 2, 2)])
def test_instance_normalization(shape: tuple[int, ...]) -> None:
    c = shape[1]
    check_against_ort("InstanceNormalization", [feed(F(*shape)), const(F(c)), const(F(c))], {"epsilon": 1e-3})


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_group_normalization_opset_21_per_channel(groups: int) -> None:
    ins = [feed(F(2, 4, 3, 3)), const(F(4)), const(F(4))]
    check_against_ort("GroupNormalization", ins, {"num_groups": groups}, opset=21)


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_group_normalization_opset_18_per_group(groups: int) -> None:
    ins = [feed(F(2, 4, 3, 3)), const(F(groups)), const(F(groups))]
    check_against_ort(
        "GroupNormalization", ins, {"num_groups": groups, "epsilon": 1e-3}, opset=18, rtol=1e-3, atol=1e-4
    )


@pytest.mark.parametrize("size", [1, 3, 5])  # onnxruntime takes odd sizes only
def test_lrn(size: int) -> None:
    check_against_ort("LRN", [feed(F(2, 5, 3, 3))], {"size": size, "alpha": 0.01, "beta": 0.6, "bias": 1.5})


@pytest.mark.parametrize(("p", "axis"), [(1, -1), (2, 0), (2, 1)])
def test_lp_normalization(p: int, axis: int) -> None:
    check_against_ort("LpNormalization", [feed(F(3, 4, 5))], {"p": p, "axis": axis})


@pytest.mark.parametrize("axes", [[0, 2, 3], [1], [0, 1, 2, 3]])
def test_mean_variance_normalization(axes: list[int]) -> None:
    check_against_ort(
        "MeanVarianceNormalization", [feed(F(2, 3, 4, 4))], {"axes": axes}, rtol=1e-3, atol=1e-4
    )


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_layer_normalization_mean_and_inv_std_dev(axis: int, dtype: Any) -> None:
    x = F(2, 3, 4).astype(dtype)
    norm = x.shape[axis % 3 :]
    ins = [feed(x), const(F(*norm).astype(dtype)), const(F(*norm).astype(dtype))]
    tol = 1e-4 if dtype == np.float32 else 3e-3
    check_against_ort("LayerNormalization", ins, {"axis": axis}, n_out=3, rtol=tol, atol=tol)


def test_layer_normalization_stats_with_other_stash_type_are_refused() -> None:
    model, _ = _node_model("LayerNormalization", [feed(F(2, 3)), const(F(3))], {"stash_type": 1}, 3, 17)
    model.graph.node[0].attribute[0].i = 0
    with pytest.raises(Exception, match=r"Mean / InvStdDev outputs with stash_type=0 are not supported"):
        from_onnx(model)


def test_group_norm_groups_must_divide_channels() -> None:
    model, feeds = _node_model(
        "GroupNormalization", [feed(F(1, 4, 2)), const(F(4)), const(F(4))], {"num_groups": 2}, 1, 21
    )
    model.graph.node[0].attribute[0].i = 3
    with pytest.raises(Exception, match="num_groups=3 does not divide the 4 channels"):
        run_graph(from_onnx(model), feeds)
