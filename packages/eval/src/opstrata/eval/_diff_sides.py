"""The two sides of a layer diff: which model each runs, on what, and running it with every value exposed.

``--against`` picks the expected side: onnxruntime (same model), ``ref`` (opstrata's reference device),
``float64`` (the model cast to float64), ``bfloat16``/``float16`` (the model cast down is then the
actual side and the model as written the expected one), or another ONNX file (the actual side).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

import opstrata.graph as og
import opstrata.runtime as rt

from ._diff_inputs import DiffError, input_specs, load_model, model_label
from ._onnx_edit import cast_model, expose_intermediates

__all__ = ["AGAINST", "CAST_DTYPES", "Side", "build_sides", "initializers", "run_fused", "run_side"]

#: The named peers of ``--against`` (anything else must be an .onnx file).
AGAINST = ("onnxruntime", "ref", "float64", "bfloat16", "float16")
CAST_DTYPES: dict[str, np.dtype] = {
    "float64": np.dtype(np.float64),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
}
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


@dataclass(frozen=True)
class Side:
    """One side of the diff: the model it runs (before exposing values), its feeds, engine and label."""

    label: str
    proto: Any
    feeds: dict[str, np.ndarray]
    engine: str  # "opstrata" | "onnxruntime"
    device: str = "cpu"


def _cast_feeds(feeds: Mapping[str, np.ndarray], dtype: np.dtype) -> dict[str, np.ndarray]:
    return {k: (v.astype(dtype) if v.dtype in _FLOATS else v) for k, v in feeds.items()}


def _other_feeds(
    proto: Any, other: Any, feeds: Mapping[str, np.ndarray], label: str
) -> dict[str, np.ndarray]:
    """The feeds for ``other``: same input names required; floats cast where its input dtype differs."""
    mine = {s.name: s for s in input_specs(proto)}
    theirs = {s.name: s for s in input_specs(other)}
    if set(mine) != set(theirs):
        only_a = sorted(set(mine) - set(theirs))
        only_b = sorted(set(theirs) - set(mine))
        raise DiffError(
            f"the models have different inputs: only in the model {only_a or 'none'}, only in {label} "
            f"{only_b or 'none'}; diff models with the same input names (rename the graph inputs)"
        )
    out = {}
    for name, arr in feeds.items():
        want = theirs[name].dtype
        if arr.dtype == want:
            out[name] = arr
        elif arr.dtype in _FLOATS and want in _FLOATS:
            out[name] = arr.astype(want)
        else:
            raise DiffError(
                f"input '{name}' is {arr.dtype} in the model but {want} in {label}; "
                "diff models whose inputs have the same dtypes"
            )
    return out


def build_sides(
    proto: Any, label: str, against: Any, feeds: dict[str, np.ndarray], *, device: str = "cpu",
    level: int = 3,
) -> tuple[Side, Side]:  # fmt: skip
    """(actual, expected) for ``against``: a name in AGAINST, an .onnx path, or an onnx.ModelProto."""
    here = f"opstrata {device}, level {level}"
    if isinstance(against, str) and against in AGAINST:
        if against == "onnxruntime":
            ort_version = _ort().__version__
            return (Side(f"{here} ({label})", proto, feeds, "opstrata", device),
                    Side(f"onnxruntime {ort_version} CPU ({label})", proto, feeds, "onnxruntime"))  # fmt: skip
        if against == "ref":
            if "ref" not in _devices():
                raise DiffError("--against ref: opstrata has no 'ref' device registered here")
            return (Side(f"{here} ({label})", proto, feeds, "opstrata", device),
                    Side(f"opstrata ref, level {level} ({label})", proto, feeds, "opstrata", "ref"))  # fmt: skip
        dt = CAST_DTYPES[against]
        cast = Side(f"{here} ({label} cast to {against})", cast_model(proto, dt), _cast_feeds(feeds, dt),
                    "opstrata", device)  # fmt: skip
        plain = Side(f"{here} ({label})", proto, feeds, "opstrata", device)
        return (plain, cast) if against == "float64" else (cast, plain)
    is_path = isinstance(against, (str, os.PathLike))
    if is_path and not str(against).endswith(".onnx") and not Path(against).is_file():
        raise DiffError(
            f"--against: unknown peer {str(against)!r}; expected one of {', '.join(AGAINST)} "
            "or the path of an .onnx model file"
        )
    other = load_model(against, "--against")
    other_label = model_label(against, other)
    return (Side(f"{here} ({other_label})", other, _other_feeds(proto, other, feeds, other_label), "opstrata",
                 device),
            Side(f"{here} ({label})", proto, feeds, "opstrata", device))  # fmt: skip


def _devices() -> list[str]:
    import opstrata.ops as ops

    return list(ops.list_devices())


def _ort() -> Any:
    try:
        import onnxruntime
    except ImportError:
        raise DiffError(
            "--against onnxruntime: onnxruntime is not installed; pip install 'opstrata-eval[peers]', "
            "or diff against ref or float64"
        ) from None
    return onnxruntime


def initializers(proto: Any) -> dict[str, np.ndarray]:
    """The top-level initializers of ``proto`` as arrays."""
    return {t.name: og.array_from_tensor(t) for t in proto.graph.initializer}


def run_side(side: Side, *, level: int = 3, fallback: str | None = "allow") -> dict[str, Any]:
    """Every graph output and node output of ``side``'s model, by name, for its feeds."""
    exposed = expose_intermediates(side.proto)
    if side.engine == "onnxruntime":
        ort = _ort()
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        # every node as written: the reference side of a layer diff must not fuse or fold nodes away
        # (onnxruntime 1.23 also loses exposed outputs of constant-folded nodes at its default level)
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            sess = ort.InferenceSession(exposed.SerializeToString(), opts, providers=["CPUExecutionProvider"])
            names = [o.name for o in sess.get_outputs()]
            values = sess.run(names, dict(side.feeds))
        except Exception as exc:  # onnxruntime's own refusal: name it, it is not our answer
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            raise DiffError(
                f"onnxruntime cannot run the model with every value exposed: {first}; "
                "diff against ref or float64 instead"
            ) from None
        return dict(zip(names, values, strict=True))
    opts = rt.SessionOptions(graph_optimization_level=level, fallback_policy=fallback)
    with rt.InferenceSession(exposed, opts, device=side.device) as sess:
        names = [o.name for o in sess.get_outputs()]
        values = sess.run(None, dict(side.feeds))
    return dict(zip(names, values, strict=True))


def run_fused(
    side: Side, *, level: int = 3, fallback: str | None = "allow"
) -> tuple[dict[str, Any], dict[str, str], Any]:
    """Every value the optimised graph still computes, the op type of the node that computed it, and
    the optimised graph (its provenance says where the other values went).

    Exposing values in the ONNX file stops the passes from fusing them away; here the model is
    compiled as a session would compile it, then every surviving value of the optimised graph is
    made an output and that graph runs as is (level 0), so fused kernels are what is measured.
    """
    opts = rt.SessionOptions(graph_optimization_level=level, fallback_policy=fallback)
    with rt.InferenceSession(side.proto, opts, device=side.device) as compiled:
        graph = copy.deepcopy(compiled.plan.graph)
    producers: dict[str, str] = {}
    have = set(graph.outputs)
    for node in graph.nodes:
        for out in node.outputs:
            if out:
                producers[out] = node.op_type
                if out not in have:
                    graph.outputs.append(out)
                    have.add(out)
    plain = rt.SessionOptions(graph_optimization_level=0, fallback_policy=fallback)
    with rt.InferenceSession(graph, plain, device=side.device) as sess:
        names = [o.name for o in sess.get_outputs()]
        values = sess.run(None, dict(side.feeds))
    return dict(zip(names, values, strict=True)), producers, graph
