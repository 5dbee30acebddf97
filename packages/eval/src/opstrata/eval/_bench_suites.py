"""Benchmark suites: named zero-argument callables over fixed, seeded inputs (one job each)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

import opstrata.ops as ops

__all__ = ["SUITES", "ops_suite"]


def ops_suite() -> dict[str, Callable[[], object]]:
    """opstrata.ops kernels on the cpu device at sizes where the kernel, not the call, dominates."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((256, 256)).astype(np.float32)
    x = rng.standard_normal((64, 1024)).astype(np.float32)
    w, b = np.ones(1024, np.float32), np.zeros(1024, np.float32)

    def on_cpu(fn: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            with ops.device("cpu"):
                return fn()

        return run

    return {
        "matmul_256": on_cpu(lambda: ops.matmul(a, a)),
        "softmax_64x1024": on_cpu(lambda: ops.softmax(x, axis=-1)),
        "layer_norm_64x1024": on_cpu(lambda: ops.layer_norm(x, w, b)),
        "add_64x1024": on_cpu(lambda: ops.add(x, x)),
        "gelu_64x1024": on_cpu(lambda: ops.gelu(x)),
    }


#: Suite name -> builder of its benchmarks.
SUITES: dict[str, Callable[[], dict[str, Callable[[], object]]]] = {"ops": ops_suite}
