"""opstrata.graph — IR, ONNX import/export, shape inference, optimisation passes, memory planning, tensor-parallel partitioning, execution plans."""

from __future__ import annotations

from opstrata.ops.compat import check_compatible as _check_compatible

__version__: str = _check_compatible("opstrata-graph")

# --- IR ---
# --- optimisation passes (levels 0-3) and the pass report ---
from . import _fused_ops as _fused_ops  # registers shape rules and exporters of the fused ops
from ._collective import Collectives as Collectives, use_collectives as use_collectives
from ._cse import eliminate_common_subexpressions as eliminate_common_subexpressions
from ._dce import eliminate_dead_code as eliminate_dead_code
from ._errors import GraphError as GraphError, UnsupportedOpError as UnsupportedOpError
from ._execute import HOST_OPS as HOST_OPS, KERNELS as EXECUTOR_KERNELS, run_graph as run_graph
from ._fold import fold_constants as fold_constants
from ._fold_shapes import fold_shapes as fold_shapes
from ._fuse_activation import fuse_bias_activation as fuse_bias_activation
from ._fuse_attention import fuse_attention as fuse_attention
from ._fuse_elementwise import fuse_elementwise as fuse_elementwise
from ._fuse_gelu import fuse_gelu as fuse_gelu
from ._fuse_linear import fuse_linear as fuse_linear
from ._fuse_norm import fuse_layer_norm as fuse_layer_norm, fuse_rms_norm as fuse_rms_norm
from ._fuse_skip_norm import fuse_skip_norm as fuse_skip_norm
from ._fused_codegen import fused_kernel as fused_kernel
from ._identity import remove_identities as remove_identities
from ._ir import OPSTRATA_DOMAIN as OPSTRATA_DOMAIN, Graph as Graph, Node as Node, Value as Value

# --- memory planning, execution plans ---
from ._memory import (
    ALIGNMENT as ALIGNMENT,
    MemoryPlan as MemoryPlan,
    MemoryPlanner as MemoryPlanner,
    plan_memory as plan_memory,
)
from ._onnx_export import (
    ExportContext as ExportContext,
    export_as_function as export_as_function,
    register_export as register_export,
    to_onnx as to_onnx,
)

# --- ONNX front end and back end (need the [onnx] extra at call time) ---
from ._onnx_import import from_onnx as from_onnx, supported_onnx_ops as supported_onnx_ops

# --- tensor-parallel partitioning (Megatron-LM): rank graphs, their collective, the simulator ---
from ._partition import partition as partition
from ._partition_sim import simulate_tensor_parallel as simulate_tensor_parallel
from ._pipeline import (
    LEVELS as LEVELS,
    PassReport as PassReport,
    PassResult as PassResult,
    optimize as optimize,
    passes_for_level as passes_for_level,
)
from ._plan import (
    FORMAT_VERSION as FORMAT_VERSION,
    KernelBinding as KernelBinding,
    Plan as Plan,
    compile as compile,
    kernels_of as kernels_of,
)

# --- shape inference, execution ---
from ._shape_infer import infer_shapes as infer_shapes, supported_ops as supported_ops
from ._symbolic import (
    Dim as Dim,
    Shape as Shape,
    broadcast_shapes as broadcast_shapes,
    is_static as is_static,
)
from ._transpose import fold_transposes as fold_transposes
from ._validate import find_cycle as find_cycle, validate as validate

__all__ = [
    "ALIGNMENT",
    "EXECUTOR_KERNELS",
    "FORMAT_VERSION",
    "HOST_OPS",
    "LEVELS",
    "OPSTRATA_DOMAIN",
    "Collectives",
    "Dim",
    "ExportContext",
    "Graph",
    "GraphError",
    "KernelBinding",
    "MemoryPlan",
    "MemoryPlanner",
    "Node",
    "PassReport",
    "PassResult",
    "Plan",
    "Shape",
    "UnsupportedOpError",
    "Value",
    "__version__",
    "broadcast_shapes",
    "compile",
    "eliminate_common_subexpressions",
    "eliminate_dead_code",
    "export_as_function",
    "find_cycle",
    "fold_constants",
    "fold_shapes",
    "fold_transposes",
    "from_onnx",
    "fuse_attention",
    "fuse_bias_activation",
    "fuse_elementwise",
    "fuse_gelu",
    "fuse_layer_norm",
    "fuse_linear",
    "fuse_rms_norm",
    "fuse_skip_norm",
    "fused_kernel",
    "infer_shapes",
    "is_static",
    "kernels_of",
    "optimize",
    "partition",
    "passes_for_level",
    "plan_memory",
    "register_export",
    "remove_identities",
    "run_graph",
    "simulate_tensor_parallel",
    "supported_onnx_ops",
    "supported_ops",
    "to_onnx",
    "use_collectives",
    "validate",
]
