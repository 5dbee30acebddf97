"""Per-op time of the ``cpu`` device against raw numpy and the ``ref`` device, on fixed shapes.

Run: ``PYTHONPATH=packages/ops/src python packages/ops/benchmarks/bench_ops.py``
(or ``nox -s bench``). Prints a markdown table of speedups (baseline median / cpu median).
"""

from __future__ import annotations

import argparse
import math
import platform

import numpy as np

import opstrata.ops as ops
from opstrata.ops.benchtools import compare, format_table

RNG = np.random.default_rng(0)


def _randn(*shape: int, dtype=np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def _np_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _np_layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) * (x - mu)).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * w + b


def _np_gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x))))


def _np_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    n, m = q.shape[-2], k.shape[-2]
    s = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    s = np.where(np.tril(np.ones((n, m), dtype=bool)), s, -np.inf)
    return _np_softmax(s) @ v


def cases(quick: bool) -> list[tuple[str, str, dict]]:
    """(op, shape text, {candidate name: thunk}) for each benchmarked op."""
    s = 2 if quick else 1
    x = _randn(1 << (20 - s))
    y = _randn(1 << (20 - s))
    sm = _randn(256 // s, 4096)
    ln = _randn(1024 // s, 1024)
    w, b = _randn(1024), _randn(1024)
    a, bm = _randn(512 // s, 512), _randn(512, 512)
    n3 = 512 if quick else 1024
    a3, b3 = _randn(n3, n3), _randn(n3, n3)
    xl, wl, bl = _randn(256 // s, 1024), _randn(1024, 1024), _randn(1024)
    img, ker = _randn(2, 16, 28 // s, 28 // s), _randn(32, 16, 3, 3)
    q, k, v = (_randn(1, 4, 256 // s, 64) for _ in range(3))
    return [
        (
            "add",
            f"{x.shape}",
            {
                "cpu": lambda: ops.add(x, y),
                "numpy": lambda: np.add(x, y),
                "ref": lambda: ops.add(x, y, device="ref"),
            },
        ),
        (
            "gelu(tanh)",
            f"{x.shape}",
            {
                "cpu": lambda: ops.gelu(x, approximate="tanh"),
                "numpy": lambda: _np_gelu_tanh(x),
                "ref": lambda: ops.gelu(x, approximate="tanh", device="ref"),
            },
        ),
        (
            "softmax",
            f"{sm.shape}",
            {
                "cpu": lambda: ops.softmax(sm),
                "numpy": lambda: _np_softmax(sm),
                "ref": lambda: ops.softmax(sm, device="ref"),
            },
        ),
        (
            "layer_norm",
            f"{ln.shape}",
            {
                "cpu": lambda: ops.layer_norm(ln, w, b),
                "numpy": lambda: _np_layer_norm(ln, w, b),
                "ref": lambda: ops.layer_norm(ln, w, b, device="ref"),
            },
        ),
        (
            "matmul",
            f"{a.shape}@{bm.shape}",
            {
                "cpu": lambda: ops.matmul(a, bm),
                "numpy": lambda: a @ bm,
                "ref": lambda: ops.matmul(a, bm, device="ref"),
            },
        ),
        (
            "matmul",
            f"{a3.shape}@{b3.shape}",
            {"cpu": lambda: ops.matmul(a3, b3), "numpy": lambda: a3 @ b3},
        ),
        (
            "linear",
            f"{xl.shape}x{wl.shape}",
            {
                "cpu": lambda: ops.linear(xl, wl, bl),
                "numpy": lambda: xl @ wl.T + bl,
                "ref": lambda: ops.linear(xl, wl, bl, device="ref"),
            },
        ),
        (
            "conv2d 3x3",
            f"{img.shape}*{ker.shape}",
            {
                "cpu": lambda: ops.conv2d(img, ker, padding=1),
                "ref": lambda: ops.conv2d(img, ker, padding=1, device="ref"),
            },
        ),
        (
            "attention causal",
            f"{q.shape}",
            {
                "cpu": lambda: ops.attention(q, k, v, causal=True),
                "numpy": lambda: _np_attention(q, k, v),
                "ref": lambda: ops.attention(q, k, v, causal=True, device="ref"),
            },
        ),
    ]


def main(argv: list[str] | None = None) -> None:
    """Print the cpu-vs-numpy and cpu-vs-ref table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller shapes, fewer repeats")
    args = parser.parse_args(argv)
    repeats = 3 if args.quick else 9
    rows = []
    for op, shape, cands in cases(args.quick):
        t = compare(cands, repeats=repeats)
        cpu = t["cpu"].median
        vs_np = f"{t['numpy'].median / cpu:.2f}x" if "numpy" in t else "n/a (no numpy op)"
        vs_ref = f"{t['ref'].median / cpu:.2f}x" if "ref" in t else "n/a (ref too slow at this size)"
        rows.append([op, shape, f"{cpu * 1e3:.3f}", vs_np, vs_ref])
    print(
        f"machine: {platform.machine()}, {platform.processor() or 'cpu'}, numpy {np.__version__}, "
        f"repeats={repeats} (median, interleaved)"
    )
    print(format_table(["op", "shape (fp32)", "cpu ms", "speedup vs numpy", "speedup vs ref"], rows))


if __name__ == "__main__":
    main()
