"""Pieces the schemes share: weight quantization with node-named errors, float32 checks, finishing a model."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from ._dtypes import qdtype
from ._errors import QuantError
from ._model import ModelInfo
from ._observers import make_observer
from ._qparams import QuantParams, quantize_array

__all__ = ["finish_model", "quantize_weight", "require_float32"]


def quantize_weight(
    w: np.ndarray,
    *,
    dtype: Any,
    symmetric: bool,
    axis: int | None,
    group_size: int = 0,
    observer: Any = "minmax",
    node: str,
    tensor: str,
) -> tuple[np.ndarray, QuantParams]:
    """A weight's integer values and parameters; errors name the node and tensor."""
    if group_size and axis is not None and w.shape[axis] % group_size:
        raise QuantError(
            f"node {node!r} weight {tensor!r}", f"group_size {group_size} does not divide its input-channel "
            f"dimension {axis} of size {w.shape[axis]} (shape {w.shape})",
            f"use a group size dividing {w.shape[axis]}, exclude the node, or override it with "
            f"overrides={{{node!r}: {{'group_size': None}}}}",
        )  # fmt: skip
    kw: dict[str, Any] = {}
    if observer in ("percentile", "entropy", "mse"):  # a weight is one batch: no more bins than values
        per_row = group_size or (w.size // w.shape[axis] if axis is not None else w.size)
        kw["bins"] = int(min(2048, max(256, 2 ** int(np.ceil(np.log2(max(per_row, 2)))))))
    obs = make_observer(observer, dtype, symmetric=symmetric, axis=axis, group_size=group_size or 0, **kw)
    obs.observe(w)
    p = obs.compute()
    return quantize_array(w, p), p


def require_float32(info: ModelInfo, tensor: str, node: str, where: str) -> None:
    """Quantized tensors must be float32 (scales are float32 in the QDQ form written here)."""
    t = info.elem_types.get(tensor)
    if t is not None and t != onnx.TensorProto.FLOAT:
        name = onnx.TensorProto.DataType.Name(t)
        raise QuantError(
            where, f"node {node!r} input {tensor!r} is {name}; this quantizer writes float32 QDQ graphs",
            "convert the model to float32 first, or exclude the node",
        )  # fmt: skip


def needed_opset(settings: list[dict[str, Any]], keys: tuple[str, ...], blocked: bool) -> int:
    """The lowest ai.onnx opset the QDQ form needs: 13 (per-axis), 19 (float8), 21 (int4, blocks)."""
    need = 21 if blocked else 13
    for s in settings:
        for k in keys:
            if s.get(k) is not None:
                need = max(need, qdtype(s[k]).min_opset)
    return need


def finish_model(m: onnx.ModelProto, scheme: str, where: str) -> onnx.ModelProto:
    """Tag the scheme in metadata and check the model with onnx.checker (errors name the scheme)."""
    meta = {p.key: p for p in m.metadata_props}
    if "opstrata.quant.scheme" in meta:
        meta["opstrata.quant.scheme"].value = scheme
    else:
        onnx.helper.set_model_props(
            m, {**{k: v.value for k, v in meta.items()}, "opstrata.quant.scheme": scheme}
        )
    if m.ByteSize() < 2**31 - 1:
        try:
            onnx.checker.check_model(m)
        except onnx.checker.ValidationError as exc:  # pragma: no cover - a bug here, not the user's
            raise QuantError(where, f"the quantized model fails onnx.checker: {exc}",
                             "report this with the model; exclude the node it names meanwhile") from exc  # fmt: skip
    return m
