"""Shared by the op-family tests: one-node ONNX models and their check against onnxruntime.

A node's inputs are given as ``feed(arr)`` (a graph input), ``const(arr)`` (an initializer) or None
(omitted); :func:`check_against_ort` runs the model through ``from_onnx`` + ``run_graph``, a compiled
Plan and ``to_onnx`` back through onnxruntime, and compares every output with onnxruntime's.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper as oh

from opstrata.graph import compile, from_onnx, run_graph, to_onnx
from opstrata.graph.testing import ort_run

__all__ = [
    "F",
    "check_against_ort",
    "const",
    "feed",
    "needs_onnx_opset",
    "needs_ort_noop_reduce",
    "node_model",
    "rng",
]

rng = np.random.default_rng(0)


def F(*s: int) -> np.ndarray:
    """A float32 array of standard normal draws (the module's fixed-seed generator)."""
    return rng.standard_normal(s).astype(np.float32)


def feed(a: Any) -> tuple[str, np.ndarray]:
    """A node input fed at run time."""
    return ("feed", np.asarray(a))


def const(a: Any) -> tuple[str, np.ndarray]:
    """A node input stored as an initializer."""
    return ("const", np.asarray(a))


def needs_onnx_opset(opset: int) -> None:
    """Skip the calling test when the installed onnx does not know ``opset`` (its shape inference and
    schemas stop at ``onnx.defs.onnx_opset_version()``; the lowest session installs the oldest onnx)."""
    newest = onnx.defs.onnx_opset_version()
    if opset > newest:
        pytest.skip(
            f"installed onnx {onnx.__version__} knows opset <= {newest}; the test needs opset {opset}"
        )


@functools.cache
def _ort_noop_reduce(op: str, axes: str) -> str | None:
    """What onnxruntime does instead of the spec for ``op`` with noop_with_empty_axes=1 and no axes
    (opset 18: no reduction, the elementwise part stays: log for ReduceLogSum, square for
    ReduceSumSquare), or None when it follows the spec. ``axes``: "feed" (an empty graph input),
    "const" (an empty initializer) or "absent" (the optional input left out)."""
    x = np.array([[2.0, 3.0]], np.float32)
    want = {"ReduceLogSum": np.log(x), "ReduceSumSquare": x * x}.get(op, x)
    empty = np.zeros(0, np.int64)
    ins = [feed(x)] + {"feed": [feed(empty)], "const": [const(empty)], "absent": []}[axes]
    model, feeds = node_model(op, ins, {"noop_with_empty_axes": 1}, 1, 18, infer_types=False)
    try:  # a model onnxruntime cannot load at all fails (or skips, see conftest.py) as any other
        got = ort_run(model, feeds)["out0"]
    except Exception as exc:
        if "Non-zero status code returned while running" not in str(exc):
            raise
        return f"fails to run it ({str(exc).split('Status Message:')[-1].strip()[-160:]})"
    if got.shape == want.shape and np.allclose(got, want, rtol=1e-5):
        return None
    return f"returns {got.tolist()} for {x.tolist()} (the spec: {want.tolist()})"


def needs_ort_noop_reduce(op: str, *, axes: str) -> None:
    """Skip the calling test when the installed onnxruntime does not follow the spec for ``op`` with
    noop_with_empty_axes=1 and no axes, probed on a 2-element input. Older releases differ: 1.21 returns
    the input for ReduceLogSum and ReduceSumSquare and fails to run ReduceSum with the axes input left
    out; 1.16 reduces everything when axes is a graph input. Nothing to compare against then."""
    import onnxruntime

    wrong = _ort_noop_reduce(op, axes)
    if wrong is not None:
        pytest.skip(
            f"installed onnxruntime {onnxruntime.__version__} does not follow the spec for {op} with "
            f"noop_with_empty_axes=1 and no axes ({axes}): it {wrong}"
        )


def node_model(
    op: str, inputs: list[Any], attrs: dict[str, Any], n_out: int, opset: int, *, infer_types: bool = True
) -> tuple[Any, dict[str, np.ndarray]]:
    """A one-node model and its feeds; ``infer_types`` annotates the outputs with onnx's shape inference."""
    needs_onnx_opset(opset)
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
    elem = oh.np_dtype_to_tensor_dtype(next(iter(feeds.values())).dtype)  # function ops infer no type
    types: dict[str, Any] = {}
    if infer_types:
        inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
        types = {v.name: v for v in [*inferred.graph.value_info, *inferred.graph.output]}
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
    plan: bool = True,
    infer_types: bool = True,
    floor: float | None = None,
) -> dict[str, np.ndarray]:
    """from_onnx + run_graph (and a compiled Plan, and to_onnx back through onnxruntime) == onnxruntime.

    ``floor`` clamps both sides from below before comparing (onnxruntime writes -FLT_MAX where the spec
    has -inf); with ``infer_types`` the graph's inferred dtypes and static dims must equal the outputs'.
    Returns onnxruntime's outputs.
    """
    model, feeds = node_model(op, inputs, attrs or {}, n_out, opset, infer_types=infer_types)
    want = ort_run(model, feeds)
    graph = from_onnx(model)
    results = {"run_graph": run_graph(graph, feeds)}
    if plan:
        results["plan"] = compile(from_onnx(model)).run(feeds)
    if export:
        exported = to_onnx(graph)
        onnx.checker.check_model(exported, full_check=True)
        results["to_onnx+ort"] = ort_run(exported, feeds)
    for k, w in want.items():
        for name, got in results.items():
            r = np.asarray(got[k])
            assert r.dtype == w.dtype and r.shape == w.shape, (name, k, r.dtype, r.shape, w.dtype, w.shape)
            a, b = r.astype(np.float64), w.astype(np.float64)
            if floor is not None:
                a, b = np.maximum(a, floor), np.maximum(b, floor)
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"{name} {k}")
        if infer_types:
            v = graph.value(k)
            assert v.dtype == w.dtype and all(
                not isinstance(d, int) or d == s for d, s in zip(v.shape, w.shape, strict=True)
            )
    return want
