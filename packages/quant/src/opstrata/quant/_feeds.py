"""Feed dicts checked against a model's declared inputs before any work: names, dtypes and shapes (fixed
dims, and symbolic dims that must agree across the inputs of one batch). Errors name the batch, the input,
the expected and the actual, and the fix."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from opstrata.graph import dtype_from_onnx

from ._calibrate import check_feeds
from ._errors import CalibrationError

__all__ = ["InputSpec", "input_specs", "materialize"]


@dataclass(frozen=True)
class InputSpec:
    """One graph input a caller feeds: element dtype (None: not declared) and dims (int, str or None)."""

    name: str
    dtype: np.dtype | None
    dims: tuple[int | str | None, ...] | None

    def describe(self) -> str:
        """``float32[batch, 64]``-style text."""
        dt = self.dtype.name if self.dtype is not None else "?"
        if self.dims is None:
            return f"{dt}[...]"
        return f"{dt}[{', '.join('?' if d is None else str(d) for d in self.dims)}]"


def input_specs(m: onnx.ModelProto) -> list[InputSpec]:
    """The declared type of every input the caller must feed (graph inputs that are not initializers)."""
    inits = {t.name for t in m.graph.initializer}
    out = []
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        dtype = dims = None
        if vi.type.HasField("tensor_type"):
            tt = vi.type.tensor_type
            if tt.elem_type:
                try:
                    dtype = np.dtype(dtype_from_onnx(tt.elem_type, f"model input {vi.name!r}"))
                except Exception:  # an element type opstrata cannot map: left to the runtime to refuse
                    dtype = None
                if dtype is not None and dtype.hasobject:  # strings: numpy str arrays are fed as well
                    dtype = None
            if tt.HasField("shape"):
                dims = tuple(
                    d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim
                )
        out.append(InputSpec(vi.name, dtype, dims))
    return out


def _check_batch(batch: Any, specs: list[InputSpec], index: int, where: str) -> dict[str, np.ndarray]:
    feeds = check_feeds(batch, [s.name for s in specs], index, where)
    bound: dict[str, tuple[int, str]] = {}
    for s in specs:
        x = feeds[s.name]
        at = f"{where}: batch {index} input {s.name!r}"
        if s.dtype is not None and x.dtype != s.dtype:
            raise CalibrationError(
                at, f"expected dtype {s.dtype.name} (the model declares {s.describe()}), got {x.dtype.name} "
                f"of shape {list(x.shape)}", f"cast it: x.astype(np.{s.dtype.name})",
            )  # fmt: skip
        if s.dims is None:
            continue
        if x.ndim != len(s.dims):
            raise CalibrationError(
                at, f"expected rank {len(s.dims)} (the model declares {s.describe()}), got shape "
                f"{list(x.shape)}", f"feed arrays shaped like {s.describe()} (one batch per feed dict)",
            )  # fmt: skip
        for axis, (d, got) in enumerate(zip(s.dims, x.shape, strict=True)):
            if isinstance(d, int) and d > 0 and d != got:
                raise CalibrationError(
                    at, f"dim {axis} must be {d} (the model declares {s.describe()}), got shape {list(x.shape)}",
                    f"feed arrays of shape {s.describe()}",
                )  # fmt: skip
            if isinstance(d, str):
                prev = bound.setdefault(d, (got, s.name))
                if prev[0] != got:
                    raise CalibrationError(
                        at, f"symbolic dim {d!r} is {got} here but {prev[0]} in input {prev[1]!r}",
                        f"feed inputs that agree on {d!r} within each batch",
                    )  # fmt: skip
    return feeds


def materialize(data: Any, m: onnx.ModelProto, where: str) -> list[dict[str, np.ndarray]]:
    """``data`` (one feed dict or an iterable of them, read once) as a checked list of feed dicts.

    Raises :class:`CalibrationError` for a non-iterable, an empty set, or a batch that does not fit the
    model's inputs (names, dtypes, ranks, fixed dims, symbolic dims across inputs).
    """
    if isinstance(data, Mapping):
        data = [data]
    if isinstance(data, (str, bytes)) or not isinstance(data, Iterable):
        raise CalibrationError(
            where, f"expected an iterable of feed dicts {{input name: array}}, got {type(data).__name__}",
            "pass e.g. [{'x': batch0}, {'x': batch1}] or a generator of such dicts",
        )  # fmt: skip
    specs = input_specs(m)
    out = [_check_batch(b, specs, i, where) for i, b in enumerate(data)]
    if not out:
        raise CalibrationError(
            where, "the data set is empty (no feed dict)",
            "pass at least one feed dict (a few dozen batches is typical for calibration)",
        )  # fmt: skip
    return out
