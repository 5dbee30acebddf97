"""What the cuda kernel tests share, on the CPU (numpy stand-in) and on a GPU: inputs, tolerances, the check."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import opstrata.ops as ops

#: (rtol, atol) per result dtype: one rounding of a float32 computation, and the summation order of a GEMM.
TOL = {
    "float32": (2e-5, 2e-6),
    "float64": (1e-12, 1e-13),
    "float16": (2e-3, 2e-3),
    "bfloat16": (1.6e-2, 1.6e-2),
}
DTYPES = [np.dtype(np.float32), np.dtype(np.float16), np.dtype(ops.bfloat16)]


def rand(shape: Any, dtype: Any, seed: int = 0, lo: float = -2.0, hi: float = 2.0) -> np.ndarray:
    """Uniform values in [lo, hi) of ``dtype``, fixed by ``seed``."""
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(dtype)


def moved(x: Any, to_device: Callable[[np.ndarray], Any]) -> Any:
    """``x`` with its numpy arrays (also inside lists and tuples) passed through ``to_device``."""
    if isinstance(x, np.ndarray):
        return to_device(x)
    if isinstance(x, (list, tuple)):
        return type(x)(moved(v, to_device) for v in x)
    return x


def check_against_ref(
    op: str,
    device: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    to_device: Callable[[np.ndarray], Any] = lambda a: a,
    to_host: Callable[[Any], np.ndarray] = lambda a: a,
    array_type: type = np.ndarray,
    rtol: float | None = None,
) -> Any:
    """``op`` on ``device`` (inputs moved there) equals ``ref`` within the result dtype's tolerance."""
    got = ops.call(
        op, *moved(args, to_device), device=device, **{k: moved(v, to_device) for k, v in kwargs.items()}
    )
    want = ops.call(op, *args, device="ref", **kwargs)
    for g, w in zip(*((x,) if not isinstance(x, tuple) else x for x in (got, want)), strict=True):
        assert isinstance(g, array_type), (
            f"{op}: expected a {array_type.__name__} from {device}, got {type(g)}"
        )
        h = to_host(g)
        assert h.dtype == w.dtype and h.shape == w.shape, (op, h.dtype, w.dtype, h.shape, w.shape)
        r, a = TOL.get(w.dtype.name, (0, 0))
        np.testing.assert_allclose(
            h.astype(np.float64), w.astype(np.float64), rtol=rtol or r, atol=a, err_msg=op
        )
    return got
