"""Generated fused elementwise kernels against unfused numpy (and numexpr on one thread, when installed).

Run: ``PYTHONPATH=packages/ops/src python packages/ops/benchmarks/bench_codegen.py [--quick]``
(or ``nox -s bench``). Ratios = baseline median / generated-kernel median, interleaved runs
(:func:`opstrata.ops.benchtools.compare`). Compile time is reported separately (first call of
``compile_expr``); the timed calls hit the structural cache like a graph executor would.
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from opstrata.ops import codegen as cg
from opstrata.ops.benchtools import compare, format_table
from opstrata.ops.kernels import chunking as _chunking

try:  # optional peer: numexpr's own blocked virtual machine
    import numexpr
except ImportError:  # pragma: no cover - depends on the environment
    numexpr = None

RNG = np.random.default_rng(0)


def arith_expr() -> cg.Expr:
    """10 cheap ops (sub, mul, mul, mul, mul, add, abs, sub, minimum, add): memory-bound in numpy."""
    x, b = cg.var("x"), cg.var("b")
    y = (x - b) * 0.5
    return y * y * 0.25 + y * 1.5 - abs(x) + cg.minimum(x, 1.0)


def arith_numpy(x: np.ndarray, b: np.ndarray) -> np.ndarray:
    y = (x - b) * 0.5
    return y * y * 0.25 + y * 1.5 - np.abs(x) + np.minimum(x, 1.0)


ARITH_NUMEXPR = (
    "((x - b) * 0.5) * ((x - b) * 0.5) * 0.25 + ((x - b) * 0.5) * 1.5 - abs(x) + where(x < 1, x, 1)"
)


def chain_expr() -> cg.Expr:
    """11 elementwise ops: sub, mul, tanh, mul, abs, neg, exp, mul, add, maximum, sub."""
    x, b = cg.var("x"), cg.var("b")
    e = (x - b) * 0.5
    return cg.tanh(e) * e + cg.exp(-abs(x)) * 0.25 - cg.maximum(x, 0.0)


def chain_numpy(x: np.ndarray, b: np.ndarray) -> np.ndarray:
    e = (x - b) * 0.5
    return np.tanh(e) * e + np.exp(-np.abs(x)) * 0.25 - np.maximum(x, 0.0)


CHAIN_NUMEXPR = "tanh((x - b) * 0.5) * ((x - b) * 0.5) + exp(-abs(x)) * 0.25 - where(x > 0, x, 0)"


def poly_expr() -> cg.Expr:
    """A polynomial with integer powers (the pow pitfall the simplifier removes): 7 ops after rewriting."""
    x = cg.var("x")
    return 0.5 * x**3 - 1.5 * x**2 + x / 3.0 + 2.0


def poly_numpy(x: np.ndarray) -> np.ndarray:
    return 0.5 * x**3 - 1.5 * x**2 + x / 3.0 + 2.0


def rowsum_expr() -> cg.Expr:
    """A chain ending in a reduction: sum over the last axis of silu(x) * y."""
    return cg.reduce_sum(cg.silu(cg.var("x")) * cg.var("y"), axis=-1)


def rowsum_numpy(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return (x / (1.0 + np.exp(-x)) * y).sum(axis=-1)


def cases(
    quick: bool,
) -> list[tuple[str, str, cg.Expr, dict[str, np.ndarray], Callable[[], Any], str | None]]:
    n = 2048 if quick else 4096
    x, b, y = (RNG.standard_normal(s, dtype=np.float32) for s in ((n, n), (n,), (n, n)))
    return [
        ("arithmetic chain (10 ops)", f"{x.shape}+{b.shape}", arith_expr(), {"x": x, "b": b},
         lambda: arith_numpy(x, b), ARITH_NUMEXPR),
        ("exp/tanh chain (11 ops)", f"{x.shape}+{b.shape}", chain_expr(), {"x": x, "b": b},
         lambda: chain_numpy(x, b), CHAIN_NUMEXPR),
        ("polynomial x**3, x**2", f"{x.shape}", poly_expr(), {"x": x}, lambda: poly_numpy(x),
         "0.5 * x**3 - 1.5 * x**2 + x / 3.0 + 2.0"),
        ("silu(x) * y, row sum", f"{x.shape}", rowsum_expr(), {"x": x, "y": y}, lambda: rowsum_numpy(x, y),
         None),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller shapes, fewer repeats")
    parser.add_argument("--show-source", action="store_true", help="print the generated chain kernel")
    args = parser.parse_args(argv)
    repeats = 3 if args.quick else 9
    if numexpr is not None:
        numexpr.set_num_threads(1)
    rows = []
    for name, shape, expr, feeds, baseline, ne_src in cases(args.quick):
        start = time.perf_counter()
        kernel = cg.compile_expr(expr, "float32")
        compile_ms = (time.perf_counter() - start) * 1e3
        cands: dict[str, Callable[[], Any]] = {
            "generated": lambda k=kernel, f=feeds: k(**f),
            "numpy": baseline,
        }
        if numexpr is not None and ne_src is not None:
            try:  # check numexpr agrees before timing it
                ok = np.allclose(numexpr.evaluate(ne_src, local_dict=feeds), baseline(), rtol=1e-4, atol=1e-4)
            except Exception as exc:  # an unsupported expression in this numexpr version
                print(f"numexpr skipped for {name}: {type(exc).__name__}: {exc}")
                ok = False
            if ok:
                cands["numexpr"] = lambda s=ne_src, f=feeds: numexpr.evaluate(s, local_dict=f)
        t = compare(cands, repeats=repeats)
        gen = t["generated"].median
        vs_ne = f"{t['numexpr'].median / gen:.2f}x" if "numexpr" in t else "n/a (numexpr not installed)"
        if numexpr is not None and "numexpr" not in t:
            vs_ne = "n/a (no numexpr form)" if ne_src is None else "n/a (numexpr failed or disagreed)"
        rows.append([name, shape, f"{compile_ms:.1f}", f"{t['numpy'].median * 1e3:.1f}", f"{gen * 1e3:.1f}",
                     f"{t['numpy'].median / gen:.2f}x", vs_ne])  # fmt: skip
    print(
        f"machine: {platform.machine()}, numpy {np.__version__}, numexpr "
        f"{getattr(numexpr, '__version__', 'absent')}, block {_chunking.BLOCK_ELEMS} elements, "
        f"repeats={repeats} (median, interleaved), fp32; target: a 6+ op chain >= 2.5x vs numpy"
    )
    headers = [
        "chain",
        "shape",
        "compile ms",
        "numpy ms",
        "generated ms",
        "vs numpy",
        "vs numexpr (1 thread)",
    ]
    print(format_table(headers, rows))
    if args.show_source:
        print(cg.compile_expr(chain_expr(), "float32").source)


if __name__ == "__main__":
    main()
