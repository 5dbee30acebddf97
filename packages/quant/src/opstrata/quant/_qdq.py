"""QDQ graph rewriting: QuantizeLinear/DequantizeLinear pairs on activations, DequantizeLinear on stored
integer weights, node replacement, and the final rebuild (topological order, unused weights dropped)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper

from opstrata.graph import dtype_to_onnx, tensor_from_array

from ._model import ModelInfo, unique_namer
from ._packing import pack_int4
from ._qparams import QuantParams

__all__ = ["Rewriter"]


def _qdq_attrs(p: QuantParams) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    if p.axis is not None and np.asarray(p.scale).ndim > 0:
        attrs["axis"] = int(p.axis)
    if p.block_size:
        attrs["block_size"] = int(p.block_size)
    return attrs


class Rewriter:
    """Collects new nodes and initializers for one model and rebuilds its graph once at the end."""

    def __init__(self, m: onnx.ModelProto, info: ModelInfo | None = None) -> None:
        self.m = m
        self.info = info if info is not None else ModelInfo(m)
        self.fresh = unique_namer(m)
        self._before: dict[str, list[onnx.NodeProto]] = {}
        self._replace: dict[str, list[onnx.NodeProto]] = {}
        self._inits: list[onnx.TensorProto] = []
        self._cache: dict[Any, Any] = {}
        self._replaced: set[str] = set()  # float weights now stored quantized: dropped when unused
        self.max_opset = 13

    # ------------------------------------------------------------------ building blocks

    def init(self, base: str, value: np.ndarray) -> str:
        """A new initializer named after ``base``; returns its name."""
        name = self.fresh(base)
        arr = np.asarray(value)
        if arr.dtype.name in ("int4", "uint4"):  # packed raw_data on any onnx (< 1.19 would write int32_data)
            raw = pack_int4(arr).tobytes()
            self._inits.append(helper.make_tensor(name, dtype_to_onnx(arr.dtype), arr.shape, raw, raw=True))
        else:
            self._inits.append(tensor_from_array(arr, name))  # fp8 on any onnx
        return name

    def insert(self, before: str, node: onnx.NodeProto) -> None:
        """Place ``node`` just before node ``before`` (or its replacement)."""
        self._before.setdefault(before, []).append(node)

    def replace(self, name: str, nodes: list[onnx.NodeProto]) -> None:
        """Replace node ``name`` with ``nodes`` (in order)."""
        self._replace[name] = nodes

    def node(
        self, op: str, inputs: list[str], outputs: list[str], before: str, base: str, **attrs: Any
    ) -> None:
        """A new ai.onnx node named after ``base``, inserted before ``before``."""
        self.insert(before, helper.make_node(op, inputs, outputs, name=self.fresh(base), **attrs))

    def _params(self, base: str, p: QuantParams) -> tuple[str, str]:
        self.max_opset = max(self.max_opset, p.qtype.min_opset, 21 if p.block_size else 13)
        s = self.init(f"{base}_scale", np.asarray(p.scale, np.float32))
        z = self.init(f"{base}_zero_point", np.asarray(p.zero_point).astype(p.dtype))
        return s, z

    def qdq(self, tensor: str, p: QuantParams, before: str, key: Any = None) -> str:
        """``tensor`` through QuantizeLinear -> DequantizeLinear (one pair per tensor and key); the DQ output."""
        ck = ("qdq", tensor, key)
        if ck not in self._cache:
            s, z = self._params(tensor, p)
            q, dq = self.fresh(f"{tensor}_quantized"), self.fresh(f"{tensor}_dequantized")
            self.node(
                "QuantizeLinear", [tensor, s, z], [q], before, f"{tensor}_QuantizeLinear", **_qdq_attrs(p)
            )
            self.node(
                "DequantizeLinear", [q, s, z], [dq], before, f"{tensor}_DequantizeLinear", **_qdq_attrs(p)
            )
            self._cache[ck] = dq
        return self._cache[ck]

    def weight(self, name: str, make: Any, before: str, key: Any = None) -> str:
        """Weight ``name`` quantized by ``make() -> (q, params)`` (once per key), stored as an integer
        initializer behind a DequantizeLinear; returns the DQ output."""
        ck = ("w", name, key)
        if ck not in self._cache:
            q, p = make()
            s, z = self._params(name, p)
            qi = self.init(f"{name}_quantized", q)
            dq = self.fresh(f"{name}_dequantized")
            self._replaced.add(name)
            self.node(
                "DequantizeLinear", [qi, s, z], [dq], before, f"{name}_DequantizeLinear", **_qdq_attrs(p)
            )
            self._cache[ck] = dq
        return self._cache[ck]

    def replaced(self, name: str) -> None:
        """Mark float weight ``name`` as superseded (dropped at the end unless still read)."""
        self._replaced.add(name)

    def cached(self, key: Any, make: Any) -> Any:
        """``make()`` once per ``key`` (shared sub-results such as a DynamicQuantizeLinear)."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    # ------------------------------------------------------------------ result

    def finish(self) -> onnx.ModelProto:
        """The rewritten model: inserted nodes in place, new initializers added, superseded float weights
        dropped where nothing reads them any more."""
        g = self.m.graph
        nodes: list[onnx.NodeProto] = []
        for n in g.node:
            nodes.extend(self._before.get(n.name, []))
            nodes.extend(self._replace.get(n.name, [n]))
        del g.node[:]
        g.node.extend(nodes)
        g.initializer.extend(self._inits)
        used = {x for n in g.node for x in n.input} | {o.name for o in g.output}
        used |= _subgraph_inputs(g)
        keep = [t for t in g.initializer if t.name in used or t.name not in self._replaced]
        dropped = {t.name for t in g.initializer} - {t.name for t in keep}
        del g.initializer[:]
        g.initializer.extend(keep)
        kept_inputs = [i for i in g.input if i.name not in dropped]
        del g.input[:]
        g.input.extend(kept_inputs)
        return self.m


def _subgraph_inputs(g: onnx.GraphProto) -> set[str]:
    """Names read inside subgraphs (If/Loop/Scan bodies): outer initializers they use must stay."""
    out: set[str] = set()
    for n in g.node:
        for a in n.attribute:
            subs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
            for sg in subs:
                out |= {x for sn in sg.node for x in sn.input}
                out |= _subgraph_inputs(sg)
    return out
