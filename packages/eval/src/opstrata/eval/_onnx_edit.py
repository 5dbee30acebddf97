"""ONNX model edits for the layer diff: expose every node output as a graph output, cast a model's floats.

Both edits work on a copy of an ``onnx.ModelProto`` so the same edited file runs in opstrata and in
onnxruntime, and tensors keep their names (the diff aligns the two sides by name).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

import opstrata.graph as og

__all__ = ["FLOAT_TYPES", "cast_model", "expose_intermediates", "node_outputs"]

#: ONNX elem types a cast rewrites: FLOAT, FLOAT16, DOUBLE, BFLOAT16 (fp8 stays: it is quantized storage).
FLOAT_TYPES = frozenset({1, 10, 11, 16})

#: (op_type, input index) whose ONNX type must stay float32 whatever the model's compute dtype.
_KEEP_FLOAT32 = frozenset({("Resize", 2), ("Upsample", 1)})


def _onnx() -> Any:
    import onnx

    return onnx


def _copy(model: Any) -> Any:
    out = _onnx().ModelProto()
    out.CopyFrom(model)
    return out


def node_outputs(graph: Any) -> Iterator[tuple[Any, str]]:
    """(node, output name) for every non-empty output of the top-level graph, in node order."""
    for node in graph.node:
        for name in node.output:
            if name:
                yield node, name


def expose_intermediates(model: Any) -> Any:
    """A copy of ``model`` whose graph outputs also list every node output (untyped: runtimes infer it)."""
    onnx = _onnx()
    out = _copy(model)
    have = {o.name for o in out.graph.output}
    for _, name in node_outputs(out.graph):
        if name not in have:
            out.graph.output.append(onnx.ValueInfoProto(name=name))
            have.add(name)
    return out


def _tensor_to(tensor: Any, elem: int, np_dtype: np.dtype) -> Any:
    if tensor.data_type not in FLOAT_TYPES or tensor.data_type == elem:
        return tensor
    arr = og.array_from_tensor(tensor)  # bfloat16 as ml_dtypes on any onnx
    return og.tensor_from_array(arr.astype(np.float64).astype(np_dtype), tensor.name)


def _retype(value_info: Any, elem: int) -> None:
    t = value_info.type
    if t.HasField("tensor_type") and t.tensor_type.elem_type in FLOAT_TYPES:
        t.tensor_type.elem_type = elem


def _cast_graph(graph: Any, elem: int, np_dtype: np.dtype, keep: set[str]) -> None:
    onnx = _onnx()
    AP = onnx.AttributeProto
    for i, init in enumerate(graph.initializer):
        if init.name not in keep:
            graph.initializer[i].CopyFrom(_tensor_to(init, elem, np_dtype))
    for vi in (*graph.input, *graph.output, *graph.value_info):
        if vi.name not in keep:
            _retype(vi, elem)
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == AP.TENSOR and node.op_type in ("Constant", "ConstantOfShape"):
                attr.t.CopyFrom(_tensor_to(attr.t, elem, np_dtype))
            elif attr.type == AP.INT and attr.name in ("to", "dtype") and attr.i in FLOAT_TYPES:
                attr.i = elem  # Cast(to=float), RandomNormal(dtype=float), EyeLike(dtype=float), ...
            elif attr.type == AP.GRAPH:
                _cast_graph(attr.g, elem, np_dtype, keep)
            elif attr.type == AP.GRAPHS:
                for g in attr.graphs:
                    _cast_graph(g, elem, np_dtype, keep)
        if node.op_type == "Constant" and any(
            a.name in ("value_float", "value_floats") for a in node.attribute
        ):
            _constant_to_tensor(node, np_dtype)


def _constant_to_tensor(node: Any, np_dtype: np.dtype) -> None:
    """Constant(value_float[s]=...) always makes float32: rewrite it as value=<tensor of np_dtype>."""
    onnx = _onnx()
    for j, attr in enumerate(node.attribute):
        if attr.name in ("value_float", "value_floats"):
            arr = np.array(attr.f if attr.name == "value_float" else list(attr.floats), np.float64)
            tensor = og.tensor_from_array(arr.astype(np_dtype))
            del node.attribute[j]
            node.attribute.append(onnx.helper.make_attribute("value", tensor))
            return


def cast_model(model: Any, dtype: Any) -> Any:
    """A copy of ``model`` computing in ``dtype``: float initializers, constants, Cast targets and types.

    Inputs that ONNX requires to be float32 whatever the data type (Resize scales) keep float32.
    """
    np_dtype = np.dtype(dtype)
    elem = og.dtype_to_onnx(np_dtype)  # bfloat16 too on onnx < 1.19
    out = _copy(model)
    keep = {node.input[i] for node in out.graph.node for (op, i) in _KEEP_FLOAT32
            if node.op_type == op and len(node.input) > i and node.input[i]}  # fmt: skip
    _cast_graph(out.graph, elem, np_dtype, keep)
    return out
