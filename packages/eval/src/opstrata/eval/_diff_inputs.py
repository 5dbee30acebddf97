"""The layer diff's inputs: load the model, read its input specs, check given feeds, make random ones.

Every problem is a DiffError naming the file or input, the expected and the actual, and the fix.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from opstrata.graph.testing import random_feeds

__all__ = ["DiffError", "InputSpec", "input_specs", "load_model", "make_feeds", "model_label"]


class DiffError(ValueError):
    """Bad input to the layer diff (model file, --against, feeds): one line, exit code 2 in the CLI."""


@dataclass(frozen=True)
class InputSpec:
    """One graph input: name, numpy dtype and shape (symbolic dims as str, unknown as None)."""

    name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...]

    def __str__(self) -> str:
        return f"{self.name}: {self.dtype.name}[{', '.join(str(d) for d in self.shape)}]"


def load_model(model: Any, what: str = "model") -> Any:
    """An ``onnx.ModelProto`` from a path, bytes or ModelProto; DiffError naming the problem otherwise."""
    import onnx

    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray)):
        try:
            return onnx.load_from_string(bytes(model))
        except Exception as exc:  # protobuf's DecodeError and friends
            raise DiffError(f"{what}: the bytes are not an ONNX model ({exc})") from None
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.is_file():
            raise DiffError(f"{what}: no such file '{path}'; pass the path of an .onnx model file")
        try:
            return onnx.load(str(path))
        except Exception as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise DiffError(
                f"{what}: '{path}' cannot be read as an ONNX model ({reason}); "
                "check it with python -c \"import onnx; onnx.checker.check_model('PATH')\""
            ) from None
    raise DiffError(f"{what}: expected a path, bytes or onnx.ModelProto, got {type(model).__name__}")


def model_label(model: Any, proto: Any) -> str:
    """How the report names a model: its path, else its graph name."""
    if isinstance(model, (str, os.PathLike)):
        return str(model)
    return f"<model '{proto.graph.name or 'unnamed'}'>"


def _input_dtype(elem: int, name: str) -> np.dtype:
    """The numpy dtype of an input's ONNX elem type: ml_dtypes for bfloat16/float8/int4 on any onnx
    (onnx < 1.19's ``tensor_dtype_to_np_dtype`` says float32 for them)."""
    import onnx

    from opstrata.graph import GraphError, dtype_from_onnx

    try:
        return dtype_from_onnx(elem, f"input '{name}'")
    except GraphError:  # complex: opstrata's importer refuses the model later, with its own fix
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem))


def input_specs(proto: Any) -> list[InputSpec]:
    """The graph inputs that are not initializers, in order."""
    inits = {t.name for t in proto.graph.initializer}
    specs = []
    for vi in proto.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dtype = _input_dtype(tt.elem_type, vi.name) if tt.elem_type else np.dtype("float32")
        dims: list[int | str | None] = []
        for d in tt.shape.dim:
            dims.append(d.dim_value if d.HasField("dim_value") else (d.dim_param or None))
        specs.append(InputSpec(vi.name, dtype, tuple(dims)))
    return specs


def _check_feed(spec: InputSpec, arr: np.ndarray, source: str) -> None:
    if arr.dtype != spec.dtype:
        raise DiffError(
            f"input '{spec.name}' (from {source}): expected dtype {spec.dtype.name}, got {arr.dtype}; "
            f"save it as x.astype('{spec.dtype.name}')"
        )
    if arr.ndim != len(spec.shape) or any(
        isinstance(d, int) and d != s for d, s in zip(spec.shape, arr.shape, strict=False)
    ):
        raise DiffError(f"input '{spec.name}' (from {source}): expected shape {spec}, got {list(arr.shape)}")


def make_feeds(
    proto: Any, feeds: Mapping[str, Any] | None, *, dims: Mapping[str, int] | None = None,
    seed: int = 0, source: str = "feeds",
) -> tuple[dict[str, np.ndarray], list[str]]:  # fmt: skip
    """Feeds for every input: the given ones checked, the rest seeded random; plus notes on what was made.

    Symbolic dims of random inputs come from ``dims``, else from the given feeds, else 1.
    """
    specs = input_specs(proto)
    by_name = {s.name: s for s in specs}
    given = {k: np.asarray(v) for k, v in (feeds or {}).items()}
    unknown = [k for k in given if k not in by_name]
    if unknown:
        described = ", ".join(str(s) for s in specs) or "none"
        raise DiffError(
            f"{source} hold(s) {', '.join(repr(k) for k in unknown)}, which the model has no input for; "
            f"the model's inputs are {described}; name each array after an input (np.savez(path, NAME=array))"
        )
    bound: dict[str, int] = {}
    for name, arr in given.items():
        _check_feed(by_name[name], arr, source)
        for d, s in zip(by_name[name].shape, arr.shape, strict=False):
            if isinstance(d, str):
                bound.setdefault(d, int(s))
    missing = [s for s in specs if s.name not in given]
    notes: list[str] = []
    if missing:
        symbols = {d for s in missing for d in s.shape if isinstance(d, str)}
        values = {**{d: 1 for d in symbols}, **bound, **dict(dims or {})}
        rand = random_feeds(proto, values, seed=seed)
        used = ", ".join(f"{d}={values[d]}" for d in sorted(symbols))
        for s in missing:
            given[s.name] = rand[s.name]
            notes.append(
                f"{s.name}: random {rand[s.name].dtype.name}{list(rand[s.name].shape)} (seed {seed}"
                + (f"; {used}" if used else "") + ")"
            )  # fmt: skip
    for name in given:
        if name not in {s.name for s in missing}:
            notes.append(f"{name}: {given[name].dtype.name}{list(given[name].shape)} from {source}")
    return {s.name: given[s.name] for s in specs}, notes
