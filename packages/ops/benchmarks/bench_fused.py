"""Fused kernels against the straightforward numpy they replace, side by side in one run.

Run: ``PYTHONPATH=packages/ops/src python packages/ops/benchmarks/bench_fused.py [--quick] [--sweep]``
(or ``nox -s bench``). Prints a markdown table of ratios = baseline median / fused median, interleaved
(:func:`opstrata.ops.benchtools.compare`). Targets are issue 4's. ``--sweep`` also times each fused
kernel at several block sizes (``opstrata.ops.kernels.chunking.BLOCK_ELEMS``), the measurement the default
block size was chosen by.
"""

from __future__ import annotations

import argparse
import math
import platform
from collections.abc import Callable

import numpy as np

import opstrata.ops as ops
from opstrata.ops.benchtools import compare, format_table
from opstrata.ops.kernels import chunking as _chunking

RNG = np.random.default_rng(0)
_K = math.sqrt(2.0 / math.pi)


def _randn(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape, dtype=np.float32)


def np_bias_gelu_tanh_residual(x: np.ndarray, b: np.ndarray, r: np.ndarray) -> np.ndarray:
    """The straightforward expression, cubed as ``h * h * h`` (not ``h ** 3``, numpy's slow pow)."""
    h = x + b
    return 0.5 * h * (1.0 + np.tanh(_K * (h + 0.044715 * (h * h * h)))) + r


def np_add_layer_norm(x: np.ndarray, r: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    h = x + r
    mu = h.mean(axis=-1, keepdims=True)
    var = ((h - mu) * (h - mu)).mean(axis=-1, keepdims=True)
    return (h - mu) / np.sqrt(var + 1e-5) * w + b


def np_add_rms_norm(x: np.ndarray, r: np.ndarray, w: np.ndarray) -> np.ndarray:
    h = x + r
    return h / np.sqrt((h * h).mean(axis=-1, keepdims=True) + 1e-6) * w


def np_scale_mask_softmax(x: np.ndarray, mask: np.ndarray, scale: float) -> np.ndarray:
    s = np.where(mask, x * scale, -np.inf)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


class TextbookAdamW:
    """The textbook numpy AdamW update (new arrays each step), state kept between calls."""

    def __init__(self, p: np.ndarray) -> None:
        self.p, self.m, self.v = p.copy(), np.zeros_like(p), np.zeros_like(p)

    def step(self, g: np.ndarray, t: int, lr: float = 1e-3, b1: float = 0.9, b2: float = 0.999) -> None:
        self.p = self.p - lr * 0.01 * self.p
        self.m = b1 * self.m + (1 - b1) * g
        self.v = b2 * self.v + (1 - b2) * (g * g)
        m_hat, v_hat = self.m / (1 - b1**t), self.v / (1 - b2**t)
        self.p = self.p - lr * m_hat / (np.sqrt(v_hat) + 1e-8)


Case = tuple[str, str, str, float, Callable[[], object], Callable[[], object]]


def cases(quick: bool) -> list[Case]:
    """(name, shape, baseline name, target, fused thunk, baseline thunk)."""
    n = 2048 if quick else 4096
    x, r, b, w = _randn(n, n), _randn(n, n), _randn(n), _randn(n)
    sm, mask = _randn(8, n // 4, n // 4), RNG.random((n // 4, n // 4)) > 0.1
    size = 2_000_000 if quick else 10_000_000
    p, g = _randn(size), _randn(size) * 1e-2
    m, v, book = np.zeros_like(p), np.zeros_like(p), TextbookAdamW(p)
    return [
        ("bias + gelu_tanh + residual", f"{x.shape}", "numpy expr", 3.0,
         lambda: ops.bias_act(x, b, r, act="gelu_tanh"), lambda: np_bias_gelu_tanh_residual(x, b, r)),
        ("residual + layer_norm", f"{x.shape}", "numpy", 1.8,
         lambda: ops.add_layer_norm(x, r, w, b), lambda: np_add_layer_norm(x, r, w, b)),
        ("residual + rms_norm", f"{x.shape}", "numpy", 0.0,
         lambda: ops.add_rms_norm(x, r, w), lambda: np_add_rms_norm(x, r, w)),
        ("scale + bool mask + softmax", f"{sm.shape}", "numpy", 0.0,
         lambda: ops.scale_mask_softmax(sm, mask, scale=0.125), lambda: np_scale_mask_softmax(sm, mask, 0.125)),
        ("AdamW step", f"{size:,} params", "textbook numpy", 2.0,
         lambda: ops.adamw_step(p, g, m, v, lr=1e-3, step=10), lambda: book.step(g, 10)),
    ]  # fmt: skip


def sweep(quick: bool, repeats: int) -> str:
    """Median ms of each fused kernel at several block sizes (elements per scratch buffer)."""
    sizes = (16 * 1024, 32 * 1024, 64 * 1024, 128 * 1024, 256 * 1024)
    default, rows = _chunking.BLOCK_ELEMS, []
    for name, _, _, _, fused, _ in cases(quick):

        def at(size: int, fn: Callable[[], object] = fused) -> Callable[[], object]:
            def run() -> object:
                _chunking.BLOCK_ELEMS = size
                return fn()

            return run

        t = compare({str(s): at(s) for s in sizes}, repeats=repeats)
        best = min(t, key=lambda k: t[k].median)
        rows.append([name, *(f"{t[str(s)].median * 1e3:.1f}" for s in sizes), best])
    _chunking.BLOCK_ELEMS = default
    return format_table(["kernel", *(f"{s // 1024} Ki" for s in sizes), "best"], rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller shapes, fewer repeats")
    parser.add_argument("--sweep", action="store_true", help="also time block sizes")
    args = parser.parse_args(argv)
    repeats = 3 if args.quick else 9
    rows = []
    for name, shape, base, target, fused, baseline in cases(args.quick):
        t = compare({"fused": fused, "baseline": baseline}, repeats=repeats)
        ratio = t["baseline"].median / t["fused"].median
        verdict = "" if not target else (f">= {target}x " + ("ok" if ratio >= target else "MISSED"))
        rows.append([name, shape, base, f"{t['baseline'].median * 1e3:.1f}", f"{t['fused'].median * 1e3:.1f}",
                     f"{ratio:.2f}x", verdict])  # fmt: skip
    print(
        f"machine: {platform.machine()}, numpy {np.__version__}, block {_chunking.BLOCK_ELEMS} elements, "
        f"repeats={repeats} (median, interleaved), fp32"
    )
    print(format_table(["fused op", "shape", "baseline", "baseline ms", "fused ms", "ratio", "target"], rows))
    if args.sweep:
        print("\nblock-size sweep (median ms per call):")
        print(sweep(args.quick, max(3, repeats // 3)))


if __name__ == "__main__":
    main()
