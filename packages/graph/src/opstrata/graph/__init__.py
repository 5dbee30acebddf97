"""opstrata.graph — IR, ONNX import/export, shape inference, optimisation passes, memory planning, tensor-parallel partitioning, execution plans."""

from __future__ import annotations

from opstrata.ops.compat import check_compatible as _check_compatible

__version__: str = _check_compatible("opstrata-graph")

# --- IR ---
# --- optimisation passes (levels 0-3) and the pass report ---
from ._errors import GraphError as GraphError, UnsupportedOpError as UnsupportedOpError
from ._execute import HOST_OPS as HOST_OPS, KERNELS as EXECUTOR_KERNELS, run_graph as run_graph
from ._ir import OPSTRATA_DOMAIN as OPSTRATA_DOMAIN, Graph as Graph, Node as Node, Value as Value

# --- memory planning, execution plans ---
from ._memory import (
    ALIGNMENT as ALIGNMENT,
    MemoryPlan as MemoryPlan,
    MemoryPlanner as MemoryPlanner,
    pack_buffers as pack_buffers,
    plan_memory as plan_memory,
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
from ._validate import find_cycle as find_cycle, validate as validate
from .onnx.export import (
    ExportContext as ExportContext,
    export_as_function as export_as_function,
    register_export as register_export,
    to_onnx as to_onnx,
)

# --- ONNX front end and back end (need the [onnx] extra at call time) ---
from .onnx.importer import from_onnx as from_onnx, supported_onnx_ops as supported_onnx_ops
from .onnx.types import (
    array_from_tensor as array_from_tensor,
    dtype_from_onnx as dtype_from_onnx,
    dtype_to_onnx as dtype_to_onnx,
    tensor_from_array as tensor_from_array,
)
from .opdefs import fused as _fused_ops  # noqa: F401  (registers shape rules and exporters of the fused ops)
from .opdefs.fused_codegen import (
    bind_fused as bind_fused,
    fused_kernel as fused_kernel,
    run_fused as run_fused,
)
from .opdefs.registry import (
    OpDef as OpDef,
    define as define_op,
    lookup as lookup_op,
    op_defs as op_defs,
    undefine as undefine_op,
)

# --- the op vocabulary: one OpDef per op (import, shape rule, kernel, classes); plugins add their own ---
from .opdefs.sequence import (  # how sequence / optional values are held at run time (runtime feeds)
    absent as absent,
    is_absent as is_absent,
    sequence_items as sequence_items,
    to_sequence as to_sequence,
)
from .partition.collective import Collectives as Collectives, use_collectives as use_collectives

# --- tensor-parallel partitioning (Megatron-LM): rank graphs, their collective, the simulator ---
from .partition.partition import partition as partition
from .partition.simulate import simulate_tensor_parallel as simulate_tensor_parallel
from .passes.cse import eliminate_common_subexpressions as eliminate_common_subexpressions
from .passes.dce import eliminate_dead_code as eliminate_dead_code
from .passes.fold import fold_constants as fold_constants
from .passes.fold_conv_bn import (
    batchnorm_to_affine as batchnorm_to_affine,
    fold_conv_batchnorm as fold_conv_batchnorm,
)
from .passes.fold_shapes import fold_shapes as fold_shapes
from .passes.fuse_activation import fuse_bias_activation as fuse_bias_activation
from .passes.fuse_attention import fuse_attention as fuse_attention
from .passes.fuse_conv_epilogue import fuse_conv_epilogue as fuse_conv_epilogue
from .passes.fuse_elementwise import fuse_elementwise as fuse_elementwise
from .passes.fuse_gelu import fuse_gelu as fuse_gelu
from .passes.fuse_linear import fuse_linear as fuse_linear
from .passes.fuse_norm import fuse_layer_norm as fuse_layer_norm, fuse_rms_norm as fuse_rms_norm
from .passes.fuse_skip_norm import fuse_skip_norm as fuse_skip_norm
from .passes.identity import remove_identities as remove_identities
from .passes.pipeline import (
    LEVELS as LEVELS,
    PassReport as PassReport,
    PassResult as PassResult,
    optimize as optimize,
    passes_for_level as passes_for_level,
)
from .passes.transpose import fold_transposes as fold_transposes

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
    "OpDef",
    "PassReport",
    "PassResult",
    "Plan",
    "Shape",
    "UnsupportedOpError",
    "Value",
    "__version__",
    "absent",
    "array_from_tensor",
    "batchnorm_to_affine",
    "bind_fused",
    "broadcast_shapes",
    "compile",
    "define_op",
    "dtype_from_onnx",
    "dtype_to_onnx",
    "eliminate_common_subexpressions",
    "eliminate_dead_code",
    "export_as_function",
    "find_cycle",
    "fold_constants",
    "fold_conv_batchnorm",
    "fold_shapes",
    "fold_transposes",
    "from_onnx",
    "fuse_attention",
    "fuse_bias_activation",
    "fuse_conv_epilogue",
    "fuse_elementwise",
    "fuse_gelu",
    "fuse_layer_norm",
    "fuse_linear",
    "fuse_rms_norm",
    "fuse_skip_norm",
    "fused_kernel",
    "infer_shapes",
    "is_absent",
    "is_static",
    "kernels_of",
    "lookup_op",
    "op_defs",
    "optimize",
    "pack_buffers",
    "partition",
    "passes_for_level",
    "plan_memory",
    "register_export",
    "remove_identities",
    "run_fused",
    "run_graph",
    "sequence_items",
    "simulate_tensor_parallel",
    "supported_onnx_ops",
    "supported_ops",
    "tensor_from_array",
    "to_onnx",
    "to_sequence",
    "undefine_op",
    "use_collectives",
    "validate",
]
