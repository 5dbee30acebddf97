"""The exporters' head Transposes folded into the attention node.

Exported transformers split heads as ``Reshape(B, S, H, D) -> Transpose(0, 2, 1, 3)`` for each of
q / k / v and merge them back as ``Transpose(0, 2, 1, 3) -> Reshape(B, S, H*D)``: four full copies per
layer. ``ai.opstrata::Attention`` reads any of q / k / v as (B, S, H, D) strided views (``bshd``) and
hands its result out as (B, S, H, D) (``bshd_out``), so those Transposes go, and the Reshapes around
them become views of contiguous bytes. A rotate-half RoPE between the Transpose and the attention
(Llama) is moved to the (B, S, H, D) side first: it acts on the last axis, so it commutes with the
transpose once its cos / sin are transposed alike (shape-derived values the runtime computes once per
input shape; one Transpose per distinct cos / sin).
"""

from __future__ import annotations

from .._ir import OPSTRATA_DOMAIN, Graph, Node, Value
from .pattern import Matcher

__all__ = ["fold_attention_layout"]

_SWAP = [0, 2, 1, 3]


def _head_transpose(m: Matcher, name: str) -> Node | None:
    """The single-use ``Transpose(perm=[0, 2, 1, 3])`` producing ``name``."""
    t = m.producer(name, "Transpose")
    if t is None or list(t.attrs.get("perm") or []) != _SWAP or m.only_use(name) is None:
        return None
    return t


def _is_attention(n: Node | None) -> bool:
    return n is not None and n.domain == OPSTRATA_DOMAIN and n.op_type == "Attention"


def _sink_through_rotary(g: Graph, m: Matcher, transposed: dict[str, str]) -> bool:
    """``RotaryHalf(T(x), cos, sin)`` read only by attention q / k -> ``T(RotaryHalf(x, T(cos), T(sin)))``."""
    for rot in list(g.nodes):
        if rot.domain != OPSTRATA_DOMAIN or rot.op_type != "RotaryHalf":
            continue
        t = _head_transpose(m, rot.inputs[0])
        user = m.only_use(rot.outputs[0])
        if t is None or not _is_attention(user) or rot.outputs[0] not in user.inputs[:2]:  # type: ignore[union-attr]
            continue
        if any(m.shape(c) is None or len(m.shape(c)) != 4 for c in rot.inputs[1:3]):  # type: ignore[arg-type]
            continue
        new_nodes: list[Node] = []
        cs = []
        for which, c in zip(("cos", "sin"), rot.inputs[1:3], strict=True):
            if c not in transposed:
                name = g.fresh_name(f"{c}_bshd")
                shape = m.shape(c)
                g.values[name] = Value(name, m.dtype(c), tuple(shape[i] for i in _SWAP))  # type: ignore[index]
                new_nodes.append(
                    Node("Transpose", [c], [name], {"perm": _SWAP}, g.fresh_node_name(f"Transpose_{which}"))
                )
                transposed[c] = name
            cs.append(transposed[c])
        x, y = t.inputs[0], rot.outputs[0]
        mid = g.fresh_name(f"{y}_bshd")
        g.values[mid] = Value(mid, m.dtype(y), m.shape(x))
        fused = Node("RotaryHalf", [x, *cs], [mid], {}, rot.name, OPSTRATA_DOMAIN)
        back = Node("Transpose", [mid], [y], {"perm": _SWAP}, g.fresh_node_name(f"Transpose_{rot.name}"))
        g.nodes.remove(t)
        g.values.pop(t.outputs[0], None)
        g.replace_node(rot, [*new_nodes, fused, back])
        g.record_fusion([t], [fused])
        return True
    return False


def fold_attention_layout(graph: Graph) -> Graph:
    """Fold head Transposes into ``ai.opstrata::Attention`` (``bshd`` / ``bshd_out``)."""
    g = graph.copy()
    transposed: dict[str, str] = {}
    while _sink_through_rotary(g, Matcher(g), transposed):
        pass
    m = Matcher(g)
    for node in list(g.nodes):
        if not _is_attention(node) or node.attrs.get("bshd") or node.attrs.get("bshd_out"):
            continue
        into = []
        for i in range(3):
            t = _head_transpose(m, node.inputs[i])
            if t is not None and node.inputs.count(node.inputs[i]) == 1:
                g.nodes.remove(t)
                g.values.pop(t.outputs[0], None)
                g.record_fusion([t], [node])
                node.inputs[i] = t.inputs[0]
                into.append(i)
        out = m.only_use(node.outputs[0])
        if (
            out is not None
            and out.op_type == "Transpose"
            and out.domain in ("", "ai.onnx")
            and list(out.attrs.get("perm") or []) == _SWAP
        ):
            g.nodes.remove(out)
            g.values.pop(node.outputs[0], None)
            g.fused_into[node.outputs[0]] = out.outputs[0]
            node.outputs[0] = out.outputs[0]
            node.attrs["bshd_out"] = 1
        if into:
            node.attrs["bshd"] = into
        m = Matcher(g)
    return g
