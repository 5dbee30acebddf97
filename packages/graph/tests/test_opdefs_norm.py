"""Normalisations through the graph (ONNX import, shape rules, executor, plan, export) against onnxruntime:
InstanceNormalization, GroupNormalization (opset 18 per-group and 21 per-channel forms), LRN, LpNormalization,
MeanVarianceNormalization, LayerNormalization with its Mean / InvStdDev outputs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import helper as oh  # noqa: E402

from opstrata.graph import compile, from_onnx, run_graph, to_onnx  # noqa: E402
from opstrata.graph.testing import ort_run  # noqa: E402

rng = np.random.default_rng(0)


def F(*s: int) -> np.ndarray:
    return rng.standard_normal(s).astype(np.float32)


def feed(a: Any) -> tuple[str, np.ndarray]:
    return ("feed", np.asarray(a))


def const(a: Any) -> tuple[str, np.ndarray]:
    return ("const", np.asarray(a))


def _node_model(
    op: str, inputs: list[Any], attrs: dict[str, Any], n_out: int, opset: int
) -> tuple[Any, dict[str, np.ndarray]]:
    """A one-node model: ``("feed", arr)`` inputs are graph inputs, ``("const", arr)`` initializers."""
    ins, inits, names, feeds = [], [], [], {}
    for k, item in enumerate(inputs):
        if item is None:
            names.append("")
            continue
        kind, arr = item
        names.append(f"in{k}")
        if kind == "feed":
            ins.append(oh.make_tensor_value_info(f"in{k}", oh.np_dtype_to_tensor_dtype(arr.dtype), arr.shape))
            feeds[f"in{k}"] = arr
        else:
            inits.append(onnx.numpy_helper.from_array(arr, f"in{k}"))
    outs = [f"out{i}" for i in range(n_out)]
    node = oh.make_node(op, names, outs, name="node", **attrs)
    m = oh.make_model(oh.make_graph([node], "g", ins, [], inits), opset_imports=[oh.make_opsetid("", opset)])
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    types = {v.name: v for v in [*inferred.graph.value_info, *inferred.graph.output]}
    elem = oh.np_dtype_to_tensor_dtype(next(iter(feeds.values())).dtype)  # function ops infer no type
    m.graph.output.extend(types.get(o) or oh.make_tensor_value_info(o, elem, None) for o in outs)
    return m, feeds


def check_against_ort(
    op: str,
    inputs: list[Any],
    attrs: dict[str, Any] | None = None,
    *,
    n_out: int = 1,
    opset: int = 17,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    export: bool = True,
) -> None:
    """from_onnx + run_graph (and a compiled Plan, and to_onnx back through onnxruntime) == onnxruntime."""
    model, feeds = _node_model(op, inputs, attrs or {}, n_out, opset)
    want = ort_run(model, feeds)
    graph = from_onnx(model)
    results = {"run_graph": run_graph(graph, feeds), "plan": compile(from_onnx(model)).run(feeds)}
    if export:
        exported = to_onnx(graph)
        onnx.checker.check_model(exported, full_check=True)
        results["to_onnx+ort"] = ort_run(exported, feeds)
    for k, w in want.items():
        for name, got in results.items():
            r = np.asarray(got[k])
            assert r.dtype == w.dtype and r.shape == w.shape, (name, k, r.dtype, r.shape, w.dtype, w.shape)
            np.testing.assert_allclose(
                r.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol, err_msg=f"{name} {k}"
            )
        v = graph.value(k)
        assert v.dtype == w.dtype and all(
            not isinstance(d, int) or d == s for d, s in zip(v.shape, w.shape, strict=True)
        )


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
