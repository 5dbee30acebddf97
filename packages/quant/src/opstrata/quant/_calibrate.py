"""Calibration: run the float model through opstrata's runtime once over the data and feed every
quantizable tensor's values to its observers.

The runtime has no option to fetch intermediate values, so the run uses a copy of the model with those
tensors added as graph outputs (graph inputs are read straight from the feeds).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import onnx

from ._errors import CalibrationError, QuantError
from ._model import QUANTIZABLE, ModelInfo, load_model
from ._observers import Observer, make_observer
from ._qparams import QuantParams
from ._select import select_targets

__all__ = ["calibrate", "check_feeds", "collect"]


def check_feeds(batch: Any, inputs: list[str], index: int, where: str) -> dict[str, np.ndarray]:
    """One feed dict, checked against the model's inputs: names missing or unknown raise naming them."""
    if not isinstance(batch, Mapping):
        raise CalibrationError(
            where, f"batch {index} is a {type(batch).__name__}, not a dict of input name -> array",
            f"yield dicts like {{{inputs[0]!r}: array}}" if inputs else "yield dicts of input arrays",
        )  # fmt: skip
    missing = [n for n in inputs if n not in batch]
    if missing:
        raise CalibrationError(
            where, f"batch {index} has no value for model input(s) {missing} (it has {sorted(batch)})",
            f"add {', '.join(repr(m) for m in missing)} to every feed dict (the model's inputs are {inputs})",
        )  # fmt: skip
    unknown = [n for n in batch if n not in inputs]
    if unknown:
        raise CalibrationError(
            where, f"batch {index} feeds {unknown}, which are not inputs of the model (inputs: {inputs})",
            "rename the keys to the model's input names or drop them",
        )  # fmt: skip
    return {n: np.asarray(batch[n]) for n in inputs}


def _iterate(data: Any, progress: bool | None, desc: str) -> Iterable[Any]:
    if isinstance(data, Mapping):
        data = [data]
    if isinstance(data, (str, bytes)) or not isinstance(data, Iterable):
        raise CalibrationError(
            desc, f"calibration data must be an iterable of feed dicts, got {type(data).__name__}",
            "pass e.g. [{'x': batch0}, {'x': batch1}] or a generator of such dicts",
        )  # fmt: skip
    show = progress if progress is not None else sys.stderr.isatty()
    if show:
        try:
            from tqdm.auto import tqdm
        except ImportError:
            return data
        total = len(data) if hasattr(data, "__len__") else None
        return tqdm(data, desc=desc, total=total, unit="batch")
    return data


def _with_outputs(m: onnx.ModelProto, names: list[str], info: ModelInfo) -> onnx.ModelProto:
    """A copy of ``m`` whose graph also outputs ``names``."""
    out = onnx.ModelProto()
    out.CopyFrom(m)
    have = {o.name for o in out.graph.output}
    for n in names:
        if n not in have:
            elem = info.elem_types.get(n, onnx.TensorProto.FLOAT)
            out.graph.output.append(onnx.helper.make_tensor_value_info(n, elem, None))
    return out


def collect(
    m: onnx.ModelProto,
    data: Any,
    observers: Mapping[str, list[Observer]],
    *,
    progress: bool | None,
    where: str,
) -> int:
    """Run ``m`` over ``data`` once, feeding each tensor's value to its observers; returns the batch count."""
    from opstrata.runtime import InferenceSession

    info = ModelInfo(m)
    fetch = [t for t in observers if t not in info.inputs]
    sess = InferenceSession(_with_outputs(m, fetch, info)) if fetch else None
    count = 0
    for i, batch in enumerate(_iterate(data, progress, where)):
        feeds = check_feeds(batch, info.inputs, i, where)
        values = dict(zip(fetch, sess.run(fetch, feeds), strict=True)) if sess is not None else {}
        values.update({k: v for k, v in feeds.items() if k in observers})
        for t, obs in observers.items():
            for o in obs:
                o.observe(values[t])
        count += 1
    if count == 0:
        raise CalibrationError(where, "the calibration data is empty (no batch)",
                               "pass at least one feed dict (a few hundred samples is typical)")  # fmt: skip
    return count


def activation_tensors(info: ModelInfo, op_types: Iterable[str]) -> list[str]:
    """Every non-constant input of the quantizable nodes of ``op_types``, in graph order, once."""
    targets = select_targets(info, op_types=op_types, exclude=(), overrides=None, defaults={"_": None},
                             where="calibrate")  # fmt: skip
    out: list[str] = []
    for t in targets:
        for pos in t.activations:
            if t.node.input[pos] not in out:
                out.append(t.node.input[pos])
    return out


def calibrate(
    model: Any,
    data: Any,
    *,
    observer: Any = "minmax",
    dtype: Any = "uint8",
    symmetric: bool | None = None,
    op_types: Iterable[str] = QUANTIZABLE,
    tensors: Iterable[str] | None = None,
    progress: bool | None = None,
    **observer_kwargs: Any,
) -> dict[str, QuantParams]:
    """Per-tensor QuantParams of every activation input of MatMul/Gemm/Conv (or of ``tensors``), from one
    pass of the float model over ``data`` (an iterable of feed dicts) in opstrata's runtime.

    ``progress``: a tqdm bar (None: only on a terminal, when tqdm is installed).
    """
    m = load_model(model, "calibrate(model)")
    info = ModelInfo(m)
    if tensors is None:
        names = activation_tensors(info, op_types)
    else:
        names = [tensors] if isinstance(tensors, str) else list(tensors)
        known = set(info.consumers) | {o.name for o in m.graph.output}
        for t in names:
            if t not in known:
                raise QuantError("calibrate(tensors)", f"tensor {t!r} is not a value of the model",
                                 "name a node input or output of the main graph")  # fmt: skip
    observers = {t: [make_observer(observer, dtype, symmetric=symmetric, **observer_kwargs)] for t in names}
    collect(m, data, observers, progress=progress, where="calibrate")
    return {t: obs[0].compute() for t, obs in observers.items()}
