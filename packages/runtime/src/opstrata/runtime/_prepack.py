"""Weights re-laid out once per session for the BLAS call their kernel makes (onnxruntime's prepacking).

``Linear`` computes ``x @ w.T`` with ``w`` stored ``(out, in)``. For a C-ordered ``w`` that is a
transposed-B GEMM, which OpenBLAS runs 3-15% slower than the plain one at transformer sizes; the
same values in Fortran order make ``w.T`` C-contiguous, so the kernel's GEMM needs no transpose. The
packed copy lives in the schedule's value template and replaces the plan graph's own array (same
values, shape and dtype; read-only), so a session holds such a weight once in this layout -- plus the
strip-tile panels ops packs from it for small batches -- not twice (ConvNeXt-T: 369 -> 240 MiB), and
a second session of the same plan reuses it. The plain right operand
of a MatMul (or a Gemm without transB) that a folded Transpose left Fortran-ordered (GPT-2's tied LM
head) gets a C-ordered copy the same way: numpy runs it as a transposed GEMM, 1.5x slower at 32x64x1000.

int8/uint8/int4/uint4 initializers (the weights of integer GEMMs and convolutions, and their zero points)
get a read-only copy of their own: an int8 kernel that caches its packed form per weight (opstrata.quant's)
then trusts it not to change, instead of fingerprinting its bytes on every call, and binds a convolution
whose weight zero points cannot change as one native call. A kernel writing into one fails loudly.

Float convolution weights (read only as a Conv / FusedConv weight) are made read-only the same way -- in
place when the array owns its memory, else as a copy -- so that ops' conv binders pack them once per
bound call (``opstrata.ops.native.kernels.immutable``) instead of on every run. The float transposed GEMM
weights above are read-only too: ops' linear binder then packs one copy per weight for its strip tiles
where they beat the BLAS (``opstrata.ops.native.kernels.LINEAR_PACKED_MAX_ROWS``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from opstrata.graph import OPSTRATA_DOMAIN, Graph

__all__ = ["prepack_weights"]

#: integer weight dtypes by name (int4/uint4 are ml_dtypes' types)
_INT_WEIGHTS = ("int8", "uint8", "int4", "uint4")


def _only_read_as(graph: Graph, use: Callable[[Any, int], bool]) -> set[str]:
    """Initializers that every node reading them reads as ``use(node, input index)``."""
    uses: dict[str, set[bool]] = {}
    for n in graph.nodes:
        for i, x in enumerate(n.inputs):
            if x in graph.initializers:
                uses.setdefault(x, set()).add(bool(use(n, i)))
    return {x for x, u in uses.items() if u == {True}}


def _transposed_b(n: Any, i: int) -> bool:
    """The transposed right operand of a GEMM: Linear's weight, or Gemm's B with transB."""
    linear_w = n.domain == OPSTRATA_DOMAIN and n.op_type == "Linear" and i == 1
    return linear_w or (
        n.domain in ("", "ai.onnx") and n.op_type == "Gemm" and i == 1 and bool(n.attrs.get("transB", 0))
    )


def _plain_b(n: Any, i: int) -> bool:
    """The plain right operand of a GEMM: MatMul's B, or Gemm's B without transB."""
    if n.domain not in ("", "ai.onnx") or i != 1:
        return False
    return n.op_type == "MatMul" or (n.op_type == "Gemm" and not n.attrs.get("transB", 0))


def _conv_weight(n: Any, i: int) -> bool:
    """The weight of a Conv or of a FusedConv (Conv + its epilogue)."""
    conv = n.domain in ("", "ai.onnx") and n.op_type == "Conv"
    return i == 1 and (conv or (n.domain == OPSTRATA_DOMAIN and n.op_type == "FusedConv"))


def _frozen(w: np.ndarray) -> np.ndarray:
    """``w`` read-only: itself when it owns its memory, else a read-only copy."""
    if w.base is None:
        w.flags.writeable = False
        return w
    own = np.array(w, copy=True)
    own.flags.writeable = False
    return own


def prepack_weights(graph: Graph, template: list[Any], slot: dict[str, int]) -> int:
    """Put read-only Fortran-ordered copies of the float transposed GEMM weights, C-ordered copies of the
    plain ones, read-only copies of int8 weights and read-only float convolution weights into
    ``template``; returns how many."""
    count = 0
    for name, w in graph.initializers.items():
        if w.dtype.name in _INT_WEIGHTS:
            frozen = np.array(w, order="C", copy=True)
            frozen.flags.writeable = False
            template[slot[name]] = frozen
            count += 1
    for name in sorted(_only_read_as(graph, _conv_weight)):
        w = template[slot[name]]
        if isinstance(w, np.ndarray) and w.dtype.kind == "f" and w.ndim >= 3 and w.flags.writeable:
            template[slot[name]] = _frozen(w)
            count += 1
    for name in sorted(_only_read_as(graph, _transposed_b)):
        w = graph.initializers[name]
        if w.ndim == 2 and w.size > 1 and w.dtype.kind == "f":
            packed = np.asfortranarray(w) if not w.flags.f_contiguous else _frozen(w)
            packed.flags.writeable = False
            template[slot[name]] = graph.initializers[name] = packed  # the C-ordered array is not kept
            count += 1
    for name in sorted(
        _only_read_as(graph, _plain_b)
    ):  # a folded Transpose leaves GPT-2's tied LM head F-ordered
        w = graph.initializers[name]
        if w.ndim == 2 and w.size > 1 and not w.flags.c_contiguous:
            template[slot[name]] = np.ascontiguousarray(w)
            count += 1
    return count
