"""Text and Graphviz views of a Graph: one node per line with the types of what it makes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ._ir import Graph, Node

__all__ = ["dump", "format_attr", "to_dot"]


def format_attr(v: Any) -> str:
    """Short text for an attribute value (arrays summarised past 8 entries)."""
    if isinstance(v, np.ndarray):
        if v.size <= 8:
            return f"{v.dtype}{list(v.shape)}{v.ravel().tolist()}"
        return f"{v.dtype}{list(v.shape)}"
    if isinstance(v, np.dtype):
        return str(v)
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(format_attr(x) for x in v) + "]"
    return repr(v) if isinstance(v, str) else str(v)


def _type(graph: Graph, name: str) -> str:
    v = graph.values.get(name)
    return v.type_str() if v is not None else "?"


def node_line(graph: Graph, n: Node) -> str:
    """``%y: float32[b, 8] = Gemm[transB=1](%x, %w, %b)  # gemm_0``."""
    outs = ", ".join(f"%{o}: {_type(graph, o)}" if o else "_" for o in n.outputs)
    attrs = ", ".join(f"{k}={format_attr(v)}" for k, v in n.attrs.items() if v is not None)
    ins = ", ".join(f"%{i}" if i else "_" for i in n.inputs)
    return f"{outs} = {n.qualified_type}{f'[{attrs}]' if attrs else ''}({ins})  # {n.name}"


def dump(graph: Graph) -> str:
    """The whole graph as text, in schedule order."""
    opsets = ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in graph.opset_imports.items())
    lines = [f"graph {graph.name} ({opsets})"]
    lines.append("  inputs: " + ", ".join(f"%{x}: {_type(graph, x)}" for x in graph.inputs))
    for name, arr in graph.initializers.items():
        preview = f" = [{', '.join(format_attr(v) for v in arr.ravel().tolist())}]" if arr.size <= 4 else ""
        lines.append(f"  init %{name}: {_type(graph, name)}{preview}")
    lines.extend("  " + node_line(graph, n) for n in graph.nodes)
    lines.append("  outputs: " + ", ".join(f"%{x}: {_type(graph, x)}" for x in graph.outputs))
    return "\n".join(lines)


def _q(s: str) -> str:
    return '"' + s.replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(graph: Graph) -> str:
    """Graphviz DOT: ops as boxes, graph inputs/outputs as ellipses, edges labelled with types."""
    lines = [f"digraph {_q(graph.name)} {{", "  rankdir=TB;", '  node [fontname="Helvetica", fontsize=10];']
    producer: dict[str, str] = {}
    for x in graph.inputs:
        producer[x] = f"in:{x}"
        lines.append(f"  {_q('in:' + x)} [label={_q(x + chr(10) + _type(graph, x))}, shape=ellipse];")
    for n in graph.nodes:
        lines.append(f"  {_q('op:' + n.name)} [label={_q(n.qualified_type + chr(10) + n.name)}, shape=box];")
        for o in n.outputs:
            producer[o] = "op:" + n.name
    for n in graph.nodes:
        for i in n.inputs:
            if i in producer:
                lines.append(f"  {_q(producer[i])} -> {_q('op:' + n.name)} [label={_q(_type(graph, i))}];")
    for x in graph.outputs:
        lines.append(f"  {_q('out:' + x)} [label={_q(x)}, shape=ellipse, style=bold];")
        if x in producer:
            lines.append(f"  {_q(producer[x])} -> {_q('out:' + x)} [label={_q(_type(graph, x))}];")
    lines.append("}")
    return "\n".join(lines)
