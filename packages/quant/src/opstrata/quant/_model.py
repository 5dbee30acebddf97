"""ONNX model plumbing shared by calibration and the schemes: loading, naming, constants, opsets, names."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import numpy as np
import onnx

from opstrata.graph import array_from_tensor

from ._errors import QuantError

__all__ = ["ModelInfo", "ensure_opset", "graph_input_names", "load_model", "unique_namer"]

#: Op types the schemes can quantize, and which input positions carry activations vs weights.
QUANTIZABLE = ("MatMul", "Gemm", "Conv")


def load_model(model: Any, where: str) -> onnx.ModelProto:
    """A private copy of ``model`` (path, bytes or ModelProto) with every main-graph node named and
    ``Constant`` tensors turned into initializers (so weights are found one way)."""
    if isinstance(model, onnx.ModelProto):
        m = onnx.ModelProto()
        m.CopyFrom(model)
    elif isinstance(model, (bytes, bytearray)):
        try:
            m = onnx.load_from_string(bytes(model))
        except Exception as exc:
            raise QuantError(
                where, f"the bytes are not an ONNX model ({exc})", "pass model.SerializeToString()"
            ) from exc
    elif isinstance(model, (str, os.PathLike)):
        if not os.path.isfile(model):
            raise QuantError(where, f"no such file '{model}'", "check the path")
        try:
            m = onnx.load(os.fspath(model))
        except Exception as exc:
            raise QuantError(
                where, f"'{model}' is not a readable ONNX model ({exc})", "check the file"
            ) from exc
    else:
        raise QuantError(
            where,
            f"expected a path, bytes or onnx.ModelProto, got {type(model).__name__}",
            "pass onnx.load(path)",
        )
    if not m.graph.node:
        raise QuantError(where, "the model has no nodes", "pass a model with MatMul/Gemm/Conv nodes")
    _name_nodes(m.graph)
    _constants_to_initializers(m.graph)
    return m


def _name_nodes(g: onnx.GraphProto) -> None:
    """Give unnamed nodes ``<OpType>_<index>`` (opstrata's own naming), keeping names unique."""
    seen = {n.name for n in g.node if n.name}
    for i, n in enumerate(g.node):
        if not n.name:
            name, j = f"{n.op_type}_{i}", 0
            while name in seen:
                j += 1
                name = f"{n.op_type}_{i}_{j}"
            n.name = name
            seen.add(name)


def _constants_to_initializers(g: onnx.GraphProto) -> None:
    keep = []
    for n in g.node:
        if (
            n.op_type == "Constant"
            and n.domain in ("", "ai.onnx")
            and len(n.attribute) == 1
            and (n.attribute[0].name == "value")
        ):
            t = onnx.TensorProto()
            t.CopyFrom(n.attribute[0].t)
            t.name = n.output[0]
            g.initializer.append(t)
        else:
            keep.append(n)
    if len(keep) != len(g.node):
        del g.node[:]
        g.node.extend(keep)


def graph_input_names(m: onnx.ModelProto) -> list[str]:
    """The inputs a caller must feed (graph inputs that are not initializers)."""
    inits = {t.name for t in m.graph.initializer}
    return [i.name for i in m.graph.input if i.name not in inits]


def opset(m: onnx.ModelProto) -> int:
    """The model's ai.onnx opset version."""
    for o in m.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return 1


def ensure_opset(m: onnx.ModelProto, needed: int, where: str) -> onnx.ModelProto:
    """``m`` at ai.onnx opset >= ``needed`` (converted with onnx.version_converter when older)."""
    have = opset(m)
    if have >= needed:
        return m
    try:
        from onnx import version_converter

        out = version_converter.convert_version(m, needed)
    except Exception as exc:
        raise QuantError(
            where, f"the model is at opset {have}; the quantized form needs opset {needed} and conversion failed "
            f"({exc})", f"export the model at opset >= {needed}",
        ) from exc  # fmt: skip
    ir_needed = {13: 7, 19: 9, 21: 10}.get(needed, 7)
    out.ir_version = max(out.ir_version, ir_needed)
    return out


def unique_namer(m: onnx.ModelProto) -> Any:
    """A function returning names unused by any value, initializer or node of ``m``."""
    used: set[str] = {t.name for t in m.graph.initializer} | {i.name for i in m.graph.input}
    used |= {o.name for o in m.graph.output} | {n.name for n in m.graph.node}
    for n in m.graph.node:
        used.update(n.input)
        used.update(n.output)

    def fresh(base: str) -> str:
        name, i = base, 0
        while name in used:
            i += 1
            name = f"{base}_{i}"
        used.add(name)
        return name

    return fresh


class ModelInfo:
    """Lookup tables of one (loaded) model: initializers as numpy arrays, consumers, known float dtypes."""

    def __init__(self, m: onnx.ModelProto) -> None:
        self.model = m
        self.inits: dict[str, onnx.TensorProto] = {t.name: t for t in m.graph.initializer}
        self.inputs = graph_input_names(m)
        self.nodes = {n.name: n for n in m.graph.node}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for n in m.graph.node:
            for x in n.input:
                if x:
                    self.consumers.setdefault(x, []).append(n)
        self.elem_types = _elem_types(m)

    def array(self, name: str) -> np.ndarray:
        """An initializer as a numpy array."""
        return array_from_tensor(self.inits[name])  # ml_dtypes int4/fp8 on any onnx

    def is_const(self, name: str) -> bool:
        """True for initializers (weights), False for activations and graph inputs."""
        return name in self.inits and name not in self.inputs

    def node_names(self) -> list[str]:
        """Every main-graph node name, in order."""
        return list(self.nodes)


def _elem_types(m: onnx.ModelProto) -> dict[str, int]:
    """ONNX element type of every value shape inference can tell (missing names: unknown)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(m, strict_mode=False)
    except Exception:
        inferred = m
    out: dict[str, int] = {}
    g = inferred.graph
    for vi in (*g.input, *g.output, *g.value_info):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            out[vi.name] = vi.type.tensor_type.elem_type
    for t in g.initializer:
        out[t.name] = t.data_type
    return out


def check_names(names: Iterable[str], known: list[str], what: str, where: str) -> None:
    """Every name in ``names`` must be a node of the model (a close match is suggested otherwise)."""
    import difflib

    for name in names:
        if name not in known:
            close = difflib.get_close_matches(str(name), known, n=3)
            raise QuantError(
                where, f"{what} names node {name!r}, which is not in the model",
                f"use a node name of the model (close: {', '.join(close)})" if close
                else f"use one of the model's node names (first few: {', '.join(known[:5])})",
            )  # fmt: skip
