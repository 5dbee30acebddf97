"""ONNX <-> numpy conversions shared by the importer and exporter (dtypes, shapes, attributes)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._errors import GraphError
from .._symbolic import Dim, Shape

__all__ = ["dtype_from_onnx", "dtype_to_onnx", "require_onnx", "shape_from_type", "tensor_type_of"]


def require_onnx() -> Any:
    """The ``onnx`` module, or an ImportError with the install command."""
    try:
        import onnx
    except ImportError as exc:  # pragma: no cover - onnx is installed in the test env
        raise ImportError(
            "opstrata.graph's ONNX front end needs the 'onnx' package. Fix: pip install 'opstrata-graph[onnx]'"
        ) from exc
    return onnx


def dtype_from_onnx(elem_type: int, where: str) -> np.dtype:
    """numpy dtype (ml_dtypes for bfloat16/float8) of an ONNX TensorProto elem type."""
    onnx = require_onnx()
    if elem_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED) or elem_type in (
        onnx.TensorProto.COMPLEX64,
        onnx.TensorProto.COMPLEX128,
    ):
        name = (
            onnx.TensorProto.DataType.Name(elem_type)
            if elem_type in onnx.TensorProto.DataType.values()
            else elem_type
        )
        raise GraphError(
            where, f"tensor element type {name} is not supported", "use a numeric or bool tensor type"
        )
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, ValueError, TypeError):
        raise GraphError(
            where, f"unknown tensor element type {elem_type}", "the model may be corrupt"
        ) from None


def dtype_to_onnx(dtype: Any) -> int:
    """ONNX TensorProto elem type of a numpy dtype."""
    onnx = require_onnx()
    return int(onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))


def shape_from_type(tp: Any, where: str) -> tuple[np.dtype | None, Shape | None]:
    """(dtype, shape) of an ONNX TypeProto; symbolic dims become their ``dim_param`` names."""
    which = tp.WhichOneof("value")
    if which is None:
        return None, None
    if which != "tensor_type":
        raise GraphError(
            where, f"has type '{which}'; only tensors are supported", "export the model with tensor I/O"
        )
    tt = tp.tensor_type
    dtype = dtype_from_onnx(tt.elem_type, where) if tt.elem_type else None
    if not tt.HasField("shape"):
        return dtype, None
    dims: list[Dim] = []
    for d in tt.shape.dim:
        kind = d.WhichOneof("value")
        dims.append(int(d.dim_value) if kind == "dim_value" else d.dim_param if kind == "dim_param" else None)
    return dtype, tuple(dims)


def tensor_type_of(name: str, dtype: np.dtype | None, shape: Shape | None) -> Any:
    """An ONNX ValueInfoProto for a value (unknown dims left blank)."""
    onnx = require_onnx()
    elem = dtype_to_onnx(dtype) if dtype is not None else onnx.TensorProto.UNDEFINED
    dims = None if shape is None else [d if isinstance(d, (int, str)) else None for d in shape]
    return onnx.helper.make_tensor_value_info(name, elem, dims)
