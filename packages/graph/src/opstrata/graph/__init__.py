"""opstrata.graph — IR, ONNX import/export, shape inference, optimisation passes, memory planning, tensor-parallel partitioning, execution plans."""

from __future__ import annotations

from opstrata.ops.compat import check_compatible as _check_compatible

__version__: str = _check_compatible("opstrata-graph")

# --- IR ---
from ._collective import Collectives as Collectives, use_collectives as use_collectives
from ._errors import GraphError as GraphError, UnsupportedOpError as UnsupportedOpError
from ._execute import HOST_OPS as HOST_OPS, run_graph as run_graph
from ._ir import OPSTRATA_DOMAIN as OPSTRATA_DOMAIN, Graph as Graph, Node as Node, Value as Value
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

# --- shape inference, execution ---
from ._shape_infer import infer_shapes as infer_shapes, supported_ops as supported_ops
from ._symbolic import (
    Dim as Dim,
    Shape as Shape,
    broadcast_shapes as broadcast_shapes,
    is_static as is_static,
)
from ._validate import find_cycle as find_cycle, validate as validate

__all__ = [
    "HOST_OPS",
    "OPSTRATA_DOMAIN",
    "Collectives",
    "Dim",
    "ExportContext",
    "Graph",
    "GraphError",
    "Node",
    "Shape",
    "UnsupportedOpError",
    "Value",
    "__version__",
    "broadcast_shapes",
    "export_as_function",
    "find_cycle",
    "from_onnx",
    "infer_shapes",
    "is_static",
    "partition",
    "register_export",
    "run_graph",
    "simulate_tensor_parallel",
    "supported_onnx_ops",
    "supported_ops",
    "to_onnx",
    "use_collectives",
    "validate",
]
