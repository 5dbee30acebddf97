"""ONNX <-> numpy conversions shared by the importer and exporter (dtypes, shapes, attributes)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._errors import GraphError
from .._symbolic import Dim, Shape

__all__ = [
    "array_from_tensor",
    "dtype_from_onnx",
    "dtype_to_onnx",
    "kind_from_type",
    "require_onnx",
    "shape_from_type",
    "tensor_from_array",
    "tensor_type_of",
]


def require_onnx() -> Any:
    """The ``onnx`` module, or an ImportError with the install command."""
    try:
        import onnx
    except ImportError as exc:  # pragma: no cover - onnx is installed in the test env
        raise ImportError(
            "opstrata.graph's ONNX front end needs the 'onnx' package. Fix: pip install 'opstrata-graph[onnx]'"
        ) from exc
    return onnx


# ONNX elem types computed with ml_dtypes. onnx < 1.19 maps these to its storage types instead (BFLOAT16
# and FLOAT8* to float32, INT4/UINT4 to int8/uint8), which would silently compute a bfloat16 model in
# float32; onnx >= 1.19 returns the ml_dtypes types. This table gives the same answer on both.
_ML_DTYPES = {
    16: "bfloat16",
    17: "float8_e4m3fn",
    18: "float8_e4m3fnuz",
    19: "float8_e5m2",
    20: "float8_e5m2fnuz",
    21: "uint4",
    22: "int4",
    23: "float4_e2m1fn",
    24: "float8_e8m0fnu",
}
_ML_DTYPE_ELEM = {name: elem for elem, name in _ML_DTYPES.items()}


def _ml_dtype(elem_type: int) -> np.dtype | None:
    """The ml_dtypes dtype of an ONNX elem type in ``_ML_DTYPES``, None for others (or an older ml_dtypes)."""
    name = _ML_DTYPES.get(elem_type)
    if name is None:
        return None
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, name)) if hasattr(ml_dtypes, name) else None


def dtype_from_onnx(elem_type: int, where: str) -> np.dtype:
    """numpy dtype (ml_dtypes for bfloat16/float8) of an ONNX TensorProto elem type; STRING is numpy's
    object dtype (arrays of Python ``str``, as onnx.numpy_helper gives them)."""
    onnx = require_onnx()
    if elem_type == onnx.TensorProto.STRING:
        return np.dtype(object)
    if elem_type in (onnx.TensorProto.UNDEFINED, onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128):
        name = (
            onnx.TensorProto.DataType.Name(elem_type)
            if elem_type in onnx.TensorProto.DataType.values()
            else elem_type
        )
        raise GraphError(
            where, f"tensor element type {name} is not supported", "use a numeric, bool or string tensor type"
        )
    ml = _ml_dtype(elem_type)
    if ml is not None:
        return ml
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, ValueError, TypeError):
        raise GraphError(
            where, f"unknown tensor element type {elem_type}", "the model may be corrupt"
        ) from None


def dtype_to_onnx(dtype: Any) -> int:
    """ONNX TensorProto elem type of a numpy dtype."""
    onnx = require_onnx()
    dtype = np.dtype(dtype)
    if dtype.name in _ML_DTYPE_ELEM and _ml_dtype(_ML_DTYPE_ELEM[dtype.name]) == dtype:
        return _ML_DTYPE_ELEM[dtype.name]  # onnx < 1.19 does not know the ml_dtypes types
    return int(onnx.helper.np_dtype_to_tensor_dtype(dtype))


def tensor_from_array(arr: np.ndarray, name: str | None = None) -> Any:
    """``onnx.numpy_helper.from_array``, also for the ml_dtypes arrays (bfloat16, float8) onnx < 1.19
    cannot convert: those are written as raw little-endian bytes of their elem type."""
    onnx = require_onnx()
    from onnx import numpy_helper  # a submodule `import onnx` does not load

    arr = np.asarray(arr)
    elem = _ML_DTYPE_ELEM.get(arr.dtype.name)
    if elem is None:
        return numpy_helper.from_array(arr, name)
    try:
        return numpy_helper.from_array(arr, name)
    except (KeyError, ValueError, TypeError, RuntimeError):  # onnx < 1.19: "data type not understood"
        if elem == 23:  # float4: packed two per byte, and no numpy view to write it from
            raise
        if elem in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):  # make_tensor packs two per byte
            wide = np.int8 if elem == onnx.TensorProto.INT4 else np.uint8
            return onnx.helper.make_tensor(name or "", elem, arr.shape, arr.astype(wide).ravel().tolist())
        raw = np.ascontiguousarray(arr).view(f"<u{arr.dtype.itemsize}").tobytes()
        return onnx.helper.make_tensor(name or "", elem, arr.shape, raw, raw=True)


def array_from_tensor(tensor: Any) -> np.ndarray:
    """``onnx.numpy_helper.to_array`` in the dtype ``dtype_from_onnx`` gives: onnx < 1.19 decodes
    BFLOAT16/FLOAT8 to float32 (exactly) and INT4/UINT4 to int8/uint8, cast back here."""
    onnx = require_onnx()
    from onnx import numpy_helper  # a submodule `import onnx` does not load

    ml = _ml_dtype(tensor.data_type)
    packed = (onnx.TensorProto.INT4, onnx.TensorProto.UINT4, 23)
    if ml is not None and tensor.data_type not in packed and not tensor.external_data:
        dims = tuple(tensor.dims)
        if tensor.HasField("raw_data"):
            # one or two bytes per value, little-endian: decode them directly (onnx 1.16's to_array rejects
            # float8 bytes >= 0x80, i.e. every negative float8 value)
            return np.frombuffer(tensor.raw_data, dtype=ml.newbyteorder("<")).reshape(dims).astype(ml)
        if 0 in dims:  # an empty tensor may carry no data field at all; old onnx cannot type it
            return np.zeros(dims, ml)
    arr = numpy_helper.to_array(tensor)
    return arr.astype(ml) if ml is not None and arr.dtype != ml else arr


def kind_from_type(tp: Any, where: str) -> str:
    """The IR value kind (``Value.kind``) of an ONNX TypeProto: tensor, sequence or optional of either."""
    which = tp.WhichOneof("value")
    if which in (None, "tensor_type"):
        return "tensor"
    if which == "sequence_type":
        inner = tp.sequence_type.elem_type.WhichOneof("value")
        if inner not in (None, "tensor_type"):
            raise GraphError(
                where, f"is a sequence of {inner.removesuffix('_type')}s; only sequences of tensors are supported",
                "use a sequence of tensors",
            )  # fmt: skip
        return "sequence"
    if which == "optional_type":
        inner = kind_from_type(tp.optional_type.elem_type, where)
        if inner not in ("tensor", "sequence"):
            raise GraphError(where, "is an optional of an optional", "use an optional tensor or sequence")
        return f"optional_{inner}"
    raise GraphError(
        where, f"has type '{which}'; only tensors, sequences and optionals are supported",
        "export the model with tensor, sequence or optional I/O",
    )  # fmt: skip


def _tensor_type(tp: Any) -> Any:
    """The TensorTypeProto inside a TypeProto (through sequence/optional), None when it has none."""
    while tp is not None:
        which = tp.WhichOneof("value")
        if which == "tensor_type":
            return tp.tensor_type
        tp = (
            tp.sequence_type.elem_type
            if which == "sequence_type"
            else tp.optional_type.elem_type
            if which == "optional_type"
            else None
        )
    return None


def shape_from_type(tp: Any, where: str) -> tuple[np.dtype | None, Shape | None]:
    """(dtype, shape) of an ONNX TypeProto; symbolic dims become their ``dim_param`` names. A sequence
    or optional gives its element dtype and shape None (:func:`kind_from_type` says which it is)."""
    if tp.WhichOneof("value") is None:
        return None, None
    kind = kind_from_type(tp, where)
    tt = _tensor_type(tp)
    dtype = dtype_from_onnx(tt.elem_type, where) if tt is not None and tt.elem_type else None
    if kind != "tensor" or not tt.HasField("shape"):
        return dtype, None
    dims: list[Dim] = []
    for d in tt.shape.dim:
        kind = d.WhichOneof("value")
        dims.append(int(d.dim_value) if kind == "dim_value" else d.dim_param if kind == "dim_param" else None)
    return dtype, tuple(dims)


def tensor_type_of(name: str, dtype: np.dtype | None, shape: Shape | None, kind: str = "tensor") -> Any:
    """An ONNX ValueInfoProto for a value (unknown dims left blank; sequences/optionals by ``kind``)."""
    onnx = require_onnx()
    elem = dtype_to_onnx(dtype) if dtype is not None else onnx.TensorProto.UNDEFINED
    if kind == "tensor":
        dims = None if shape is None else [d if isinstance(d, (int, str)) else None for d in shape]
        return onnx.helper.make_tensor_value_info(name, elem, dims)
    tp = onnx.helper.make_tensor_type_proto(elem, None)
    if kind.endswith("sequence"):
        tp = onnx.helper.make_sequence_type_proto(tp)
    if kind.startswith("optional"):
        tp = onnx.helper.make_optional_type_proto(tp)
    return onnx.helper.make_value_info(name, tp)
