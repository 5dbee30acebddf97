"""A warning when a quantized model's fused int8 nodes would run on opstrata-ops' numpy reference kernels.

The graph passes fuse QDQ patterns into ``ai.opstrata`` integer nodes (QConv, QMatMul, ...) whose cpu
kernels in opstrata-ops are numpy references; the native ones come from a package above the runtime
(opstrata-quant registers them when imported). A session that would run such nodes on the references --
tens of times slower -- says so once, with the fix, instead of being silently slow.
"""

from __future__ import annotations

import warnings
from collections import Counter

import numpy as np

import opstrata.ops as ops
from opstrata.graph import OPSTRATA_DOMAIN, Graph

__all__ = ["SlowKernelWarning", "warn_reference_int8_kernels"]

#: fused integer node -> (the ops ops its kernel may call, newest first; the primary argument's dtype)
INT8_NODES: dict[str, tuple[tuple[str, ...], type]] = {
    "QConv": (("qconv",), np.uint8),
    "QConvQuantize": (("qconv_quantize",), np.uint8),
    "QMatMul": (("qmatmul", "matmul_integer"), np.uint8),
    "DynamicQMatMul": (("dynamic_qmatmul",), np.float32),
    "DequantMatMul": (("dequant_matmul",), np.float32),
}


class SlowKernelWarning(UserWarning):
    """A session's nodes run on reference kernels where a native package would run them far faster."""


def _reference(op: str, dtype: type, device: str) -> bool:
    """The kernel ``op`` dispatches to on ``device`` is opstrata-ops' own (a numpy reference) or none."""
    fn = ops.resolve_kernel(op, dtype, device)
    return fn is None or str(getattr(fn, "__module__", "")).startswith("opstrata.ops")


def warn_reference_int8_kernels(graph: Graph, device: str) -> list[str]:
    """Warn (:class:`SlowKernelWarning`) when the graph's fused int8 nodes would run on ops' numpy kernels
    on the cpu; returns the ``"<op> x<count>"`` entries it named (empty: nothing to say)."""
    if device != "cpu":
        return []
    counts = Counter(
        n.op_type for n in graph.nodes if n.domain == OPSTRATA_DOMAIN and n.op_type in INT8_NODES
    )
    have = set(ops.list_ops())
    slow = []
    for op_type, k in sorted(counts.items()):
        names, dtype = INT8_NODES[op_type]
        op = next((name for name in names if name in have), None)
        if op is not None and _reference(op, dtype, device):
            slow.append(f"{op_type} x{k}")
    if slow:
        warnings.warn(
            f"InferenceSession: this model's int8 nodes ({', '.join(slow)}) run on opstrata-ops' numpy "
            "reference kernels, many times slower than native int8 kernels. Fix: `import opstrata.quant` "
            "(pip install opstrata-quant) before creating the session: it registers native ones",
            SlowKernelWarning,
            stacklevel=3,
        )
    return slow
