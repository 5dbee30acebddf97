"""Lossless IR serialisation for saved plans: graph structure as JSON, tensors as raw little-endian bytes.

Unlike ``to_onnx`` (which writes fused ops as functions for other runtimes), this keeps every
node as it is, so a loaded plan is the compiled graph, not a re-import of it.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import numpy as np

import opstrata.ops as ops

from ._ir import Graph, Node, Value

__all__ = ["decode_array", "encode_array", "graph_from_json", "graph_to_json"]


def array_bytes(a: np.ndarray) -> bytes:
    """The stored bytes of an array: raw little-endian data; STRING tensors (object arrays of str) as
    the UTF-8 JSON list of their strings."""
    if a.dtype.hasobject:
        return json.dumps([str(x) for x in np.asarray(a).reshape(-1)]).encode()
    return np.ascontiguousarray(a).tobytes()


def encode_array(a: np.ndarray) -> dict[str, Any]:
    """``{"dtype", "shape", "b64"}`` of an array."""
    a = np.ascontiguousarray(a)
    return {"dtype": a.dtype.name, "shape": list(a.shape), "b64": base64.b64encode(array_bytes(a)).decode()}


def decode_array(d: dict[str, Any], raw: bytes | None = None) -> np.ndarray:
    """The array ``encode_array`` (or a tensor entry plus its ``raw`` bytes) describes."""
    data = raw if raw is not None else base64.b64decode(d["b64"])
    shape = tuple(int(s) for s in d["shape"])
    if d["dtype"] == "object":  # STRING tensor (see array_bytes)
        return np.array(json.loads(data.decode()) or [], dtype=object).reshape(shape)
    dt = ops.as_dtype(d["dtype"])
    want = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if len(data) != want:
        raise ValueError(f"tensor of {d['dtype']}{list(shape)} needs {want} bytes, found {len(data)}")
    return np.frombuffer(data, dt).reshape(shape).copy()


def _enc(v: Any, put: Callable[[str, np.ndarray], str]) -> Any:
    if isinstance(v, np.ndarray):
        return {"__array__": encode_array(v)}
    if isinstance(v, np.dtype):
        return {"__dtype__": v.name}
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, Graph):  # a control-flow body (If/Loop/Scan), tensors stored like the graph's
        return {"__graph__": graph_to_json(v, put)}
    if isinstance(v, (list, tuple)):
        return [_enc(x, put) for x in v]
    if isinstance(v, dict):
        return {"__dict__": {k: _enc(x, put) for k, x in v.items()}}
    return v


def _dec(v: Any, get: Callable[[str], bytes]) -> Any:
    if isinstance(v, list):
        return [_dec(x, get) for x in v]
    if isinstance(v, dict):
        if "__array__" in v:
            return decode_array(v["__array__"])
        if "__dtype__" in v:
            return ops.as_dtype(v["__dtype__"])
        if "__graph__" in v:
            return graph_from_json(v["__graph__"], get)
        if "__dict__" in v:
            return {k: _dec(x, get) for k, x in v["__dict__"].items()}
        raise ValueError(f"unknown attribute encoding {sorted(v)}")
    return v


def graph_to_json(g: Graph, put_tensor: Callable[[str, np.ndarray], str]) -> dict[str, Any]:
    """JSON-ready dict of ``g``; ``put_tensor(name, array) -> entry`` stores each initializer."""
    return {
        "name": g.name,
        "doc_string": g.doc_string,
        "opset_imports": g.opset_imports,
        "inputs": g.inputs,
        "outputs": g.outputs,
        "values": [
            [v.name, None if v.dtype is None else v.dtype.name, None if v.shape is None else list(v.shape)]
            + ([v.kind] if v.kind != "tensor" else [])  # sequences/optionals (Value.kind)
            for v in g.values.values()
        ],
        "initializers": {
            name: {"dtype": a.dtype.name, "shape": list(a.shape), "entry": put_tensor(name, a)}
            for name, a in g.initializers.items()
        },
        "nodes": [
            {
                "op": n.op_type,
                "domain": n.domain,
                "name": n.name,
                "inputs": n.inputs,
                "outputs": n.outputs,
                "attrs": {k: _enc(x, put_tensor) for k, x in n.attrs.items()},
            }
            for n in g.nodes
        ],
        # the passes' provenance (aliases, fusions, folded constants); plans written before it lack it
        "provenance": {"aliases": g.aliases, "fused_into": g.fused_into, "folded": sorted(g.folded)},
    }


def graph_from_json(d: dict[str, Any], get_tensor: Callable[[str], bytes]) -> Graph:
    """The Graph ``graph_to_json`` wrote; ``get_tensor(entry) -> bytes`` reads initializers."""
    g = Graph(d["name"], opset_imports=d["opset_imports"])
    g.doc_string = d.get("doc_string", "")
    for name, dt, shape, *kind in d["values"]:
        g.values[name] = Value(
            name,
            None if dt is None else np.dtype(object) if dt == "object" else ops.as_dtype(dt),
            None if shape is None else tuple(shape),
            kind[0] if kind else "tensor",
        )
    for name, t in d["initializers"].items():
        g.initializers[name] = decode_array(t, get_tensor(t["entry"]))
    g.inputs, g.outputs = list(d["inputs"]), list(d["outputs"])
    g.nodes = [
        Node(
            n["op"],
            n["inputs"],
            n["outputs"],
            {k: _dec(x, get_tensor) for k, x in n["attrs"].items()},
            n["name"],
            n["domain"],
        )
        for n in d["nodes"]
    ]
    prov = d.get("provenance", {})
    g.aliases, g.fused_into = dict(prov.get("aliases", {})), dict(prov.get("fused_into", {}))
    g.folded = set(prov.get("folded", ()))
    return g
