"""cpu backward kernels against the straightforward numpy formula, measured side by side.

Run: ``PYTHONPATH=packages/ops/src python packages/ops/benchmarks/bench_backward.py [--quick]``
(or ``nox -s bench``). Prints numpy and cpu medians (interleaved) and the speedup numpy / cpu.
"""

from __future__ import annotations

import argparse
import math
import platform
from collections.abc import Callable

import numpy as np

import opstrata.ops as ops
from opstrata.ops.benchtools import compare, format_table

RNG = np.random.default_rng(0)
C0, C1 = math.sqrt(2 / math.pi), 0.044715


def _randn(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def cases(quick: bool) -> list[tuple[str, str, Callable[[], object], Callable[[], object]]]:
    """(op, shape text, numpy formula, cpu kernel) per case."""
    n = 1024 if quick else 2048
    x, g, w = _randn(n, n), _randn(n, n), _randn(n)
    y, ly = ops.softmax(x), ops.log_softmax(x)
    t = RNG.integers(0, n, size=n)
    a, b, gm = _randn(8, n // 8, 512), _randn(512, 512), _randn(8, n // 8, 512)
    idx, ge = RNG.integers(0, 30000, size=(64, n // 4)), _randn(64, n // 4, 256)

    def np_layer_norm() -> object:
        mu = x.mean(-1, keepdims=True)
        rs = 1 / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
        xh, gw = (x - mu) * rs, g * w
        return rs * (gw - gw.mean(-1, keepdims=True) - xh * (gw * xh).mean(-1, keepdims=True)), (g * xh).sum(
            0
        )

    def np_gelu_tanh() -> object:
        th = np.tanh(C0 * (x + C1 * x * x * x))
        return g * (0.5 * (1 + th) + 0.5 * x * (1 - th * th) * C0 * (1 + 3 * C1 * x * x))

    def np_silu() -> object:
        s = 1 / (1 + np.exp(-x))
        return g * s * (1 + x * (1 - s))

    def np_cross_entropy() -> object:
        e = np.exp(x - x.max(1, keepdims=True))
        p = e / e.sum(1, keepdims=True)
        p[np.arange(n), t] -= 1
        return p / n

    def np_embedding() -> object:
        out = np.zeros((30000, 256), np.float32)
        np.add.at(out, idx.ravel(), ge.reshape(-1, 256))
        return out

    sq = f"({n}, {n}) fp32"
    return [
        (
            "softmax_backward",
            sq,
            lambda: y * (g - (g * y).sum(-1, keepdims=True)),
            lambda: ops.softmax_backward(y, g),
        ),
        (
            "log_softmax_backward",
            sq,
            lambda: g - np.exp(ly) * g.sum(-1, keepdims=True),
            lambda: ops.log_softmax_backward(ly, g),
        ),
        ("cross_entropy_backward", sq, np_cross_entropy, lambda: ops.cross_entropy_backward(x, t)),
        ("layer_norm_backward", sq, np_layer_norm, lambda: ops.layer_norm_backward(x, w, g)),
        ("gelu_backward tanh", sq, np_gelu_tanh, lambda: ops.gelu_backward(x, g, approximate="tanh")),
        ("silu_backward", sq, np_silu, lambda: ops.silu_backward(x, g)),
        (
            "matmul_backward",
            f"(8, {n // 8}, 512) @ (512, 512)",
            lambda: (gm @ b.T, (np.swapaxes(a, -1, -2) @ gm).sum(0)),
            lambda: ops.matmul_backward(a, b, gm),
        ),
        (
            "embedding_backward",
            f"30000 x 256, {64 * n // 4} indices",
            np_embedding,
            lambda: ops.embedding_backward(idx, ge, 30000),
        ),
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller shapes, fewer repeats")
    a = p.parse_args()
    print(f"# backward: {platform.python_version()}, numpy {np.__version__}, {platform.machine()}")
    rows = []
    for op, shape, base, cpu in cases(a.quick):
        t = compare({"numpy": base, "cpu": cpu}, repeats=5 if a.quick else 9)
        nm, cm = t["numpy"].median, t["cpu"].median
        rows.append((op, shape, f"{nm * 1e3:.2f}", f"{cm * 1e3:.2f}", f"{nm / cm:.2f}x"))
    print(format_table(["op", "shape", "numpy ms", "cpu ms", "numpy/cpu"], rows))


if __name__ == "__main__":
    main()
