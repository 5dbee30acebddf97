"""``assert_close``: torch.testing.assert_close for numpy arrays, with its default tolerances and message.

Closeness is ``|actual - expected| <= atol + rtol * |expected|`` elementwise, checked in exact
float64 math (torch checks in the tensors' dtype, so a pair within one rounding of the bound may
be judged differently); integers and bools must be equal. Defaults per dtype: ``_tolerances``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ._compare import as_array, check_tolerances, close_mask
from ._tolerances import dtype_class

__all__ = ["assert_close"]


def _fmt(x: Any) -> str:
    return (
        str(int(x))
        if isinstance(x, (int, np.integer))
        else str(float(np.abs(x)) if np.iscomplexobj(x) else float(x))
    )


def _diff_line(kind: str, diff: float | int, idx: tuple[int, ...] | None, tol: float, equality: bool) -> str:
    line = (
        f"{kind.title()} difference: {_fmt(diff)}"
        if idx is None
        else f"Greatest {kind} difference: {_fmt(diff)} at index {idx}"
    )
    return line if equality else f"{line} (up to {tol} allowed)"


def _scalar(x: np.ndarray) -> Any:
    v = x.item()
    return float(v) if dtype_class(x.dtype) == "float" else v


def _exact(x: np.ndarray, integral: bool, complex_: bool) -> np.ndarray:
    """Values for the message: Python ints (no overflow) for integers, else float64/complex128."""
    if integral:
        return (x if x.dtype.kind in "iub" else x.astype(np.int64)).astype(object)
    return x.astype(np.complex128 if complex_ else np.float64)


def _message(a: np.ndarray, b: np.ndarray, ok: np.ndarray, rtol: float, atol: float) -> str:
    """The failure text, shaped like torch.testing's (header, mismatch count, greatest differences)."""
    equality = rtol == 0 and atol == 0
    kinds = {dtype_class(a.dtype), dtype_class(b.dtype)}
    integral = kinds <= {"int", "bool"}
    A, B = (_exact(x, integral, "complex" in kinds) for x in (a, b))
    if a.ndim == 0:
        with np.errstate(invalid="ignore", over="ignore"):
            d, expected = abs(A.item() - B.item()), B.item()
        r = float("inf") if expected == 0 else float(d) / abs(expected)
        return "\n".join([
            f"Scalars are not {'equal' if equality else 'close'}!", "",
            f"Expected {_scalar(b)} but got {_scalar(a)}.",
            _diff_line("absolute", d, None, atol, equality), _diff_line("relative", r, None, rtol, equality),
        ])  # fmt: skip
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        diff = np.where(ok, 0, np.abs(A - B))
        rel = np.where(ok, 0.0, diff.astype(np.float64) / np.abs(B).astype(np.float64))
    i_abs = int(np.argmax(diff.ravel()))  # NaN (a NaN facing a number) wins, as in torch
    i_rel = int(np.argmax(rel.ravel()))
    bad = int(ok.size - np.count_nonzero(ok))

    def where(i: int) -> tuple[int, ...]:
        return tuple(int(j) for j in np.unravel_index(i, ok.shape))

    return "\n".join([
        f"Tensor-likes are not {'equal' if equality else 'close'}!", "",
        f"Mismatched elements: {bad} / {ok.size} ({bad / ok.size:.1%})",
        _diff_line("absolute", diff.ravel()[i_abs], where(i_abs), atol, equality),
        _diff_line("relative", float(rel.ravel()[i_rel]), where(i_rel), rtol, equality),
    ])  # fmt: skip


def assert_close(
    actual: Any, expected: Any, *, rtol: float | None = None, atol: float | None = None,
    equal_nan: bool = False, msg: str | Callable[[str], str] | None = None,
) -> None:  # fmt: skip
    """Raise AssertionError unless ``actual`` and ``expected`` have the same shape, dtype and close values.

    ``rtol``/``atol`` default to torch.testing's per-dtype values (both or neither); ``msg`` replaces
    the failure text, or (a callable) rewrites it.
    """
    a = as_array(actual, "actual")
    b = as_array(expected, "expected")
    rtol_, atol_ = check_tolerances(rtol, atol, a.dtype, b.dtype)

    def fail(text: str) -> None:
        raise AssertionError(msg(text) if callable(msg) else (msg if msg is not None else text))

    if a.shape != b.shape:
        fail(
            f"The values for attribute 'shape' do not match: {a.shape} != {b.shape}.\n"
            "actual and expected must have the same shape; reshape or slice one side, or compare the "
            "arrays you meant to"
        )
    if a.dtype != b.dtype:
        fail(
            f"The values for attribute 'dtype' do not match: {a.dtype} != {b.dtype}.\n"
            f"cast one side first (e.g. actual.astype(np.{b.dtype.name}) - then the defaults are "
            f"{b.dtype.name}'s), or use opstrata.eval.compare, which accepts mixed dtypes"
        )
    ok = close_mask(a, b, rtol_, atol_, equal_nan)
    if bool(np.all(ok)):
        return
    fail(_message(a, b, ok, rtol_, atol_))
