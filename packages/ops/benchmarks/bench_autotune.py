"""Autotuned vs default parameters of the tunable cpu kernels, on four shapes, in one run.

Run: ``PYTHONPATH=packages/ops/src python packages/ops/benchmarks/bench_autotune.py [--quick]``
(or ``nox -s bench``). Tunes into a fresh temporary cache (``--cache-dir`` to keep one), then times
the default and the tuned parameters interleaved (benchtools.compare) and prints both medians and
the ratio default / tuned (> 1: tuning helped). A tuned choice equal to the default shows ~1.00x.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np

import opstrata.ops as ops
from opstrata.ops.benchtools import compare, format_table

RNG = np.random.default_rng(0)


def _randn(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def cases(quick: bool) -> list[tuple[str, str, tuple[Any, ...], dict[str, Any]]]:
    """(op, shape text, args, attributes) of each benchmarked call.

    The first shape is one where the default heuristic is poor (its causal attention block spans
    every query, so no block above the diagonal is skipped); the others are ones where it is good.
    """
    n = 256 if quick else 512
    rows = 1024 if quick else 4096
    q, k, v = (_randn(1, 8, n, 64) for _ in range(3))
    q2, k2, v2 = (_randn(1, 4, 4 * n, 64) for _ in range(3))
    x, g, w = _randn(rows, 1024), _randn(rows, 1024), _randn(1024)
    idx, ge = RNG.integers(0, 30000, size=(64, rows // 8)), _randn(64, rows // 8, 256)
    return [
        ("attention", f"causal (1, 8, {n}, 64) fp32", (q, k, v), {"causal": True}),
        ("attention", f"non-causal (1, 4, {4 * n}, 64) fp32", (q2, k2, v2), {}),
        ("layer_norm_backward", f"({rows}, 1024) fp32", (x, w, g), {}),
        ("embedding_backward", f"30000 x 256, {8 * rows} indices", (idx, ge, 30000), {}),
    ]


def _fmt(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items())


def run(quick: bool, repeats: int) -> str:
    rows = []
    specs = {(t.op, t.device): t for t in ops.tunables()}
    for op, shape, args, kw in cases(quick):
        spec = specs[(op, "cpu")]
        res = ops.tune(op, *args, **kw)
        tuning_s = ops.autotune_stats().tuning_seconds
        ops.reset_autotune_stats()

        def thunk(
            params: dict[str, Any], op: str = op, args: tuple = args, kw: dict = kw
        ) -> Callable[[], object]:
            return lambda: ops.call(op, *args, device="cpu", **kw, **params)

        t = compare({"default": thunk(dict(spec.default)), "tuned": thunk(res.params)}, repeats=repeats)
        d, tu = t["default"].median, t["tuned"].median
        rows.append(
            (
                op,
                shape,
                _fmt(dict(spec.default)),
                _fmt(res.params),
                f"{d * 1e3:.2f}",
                f"{tu * 1e3:.2f}",
                f"{d / tu:.2f}x",
                f"{tuning_s:.1f}",
            )
        )
    headers = ["op", "shape", "default", "tuned", "default ms", "tuned ms", "default/tuned", "tuning s"]
    return format_table(headers, rows)


def write_pretuned_table() -> str:
    """Tune the full-size and quick shapes and write them as ``autotune_pretuned.json``."""
    from opstrata.ops.tune.autotune import shape_key
    from opstrata.ops.tune.pretuned import write_pretuned

    specs = {(t.op, t.device): t for t in ops.tunables()}
    entries = []
    for quick in (False, True):
        for op, _, args, kw in cases(quick):
            spec = specs[(op, "cpu")]
            entries.append((shape_key(spec, args, kw), ops.tune(op, *args, **kw).params))
    fp = ops.device_fingerprint()
    note = f"tuned by bench_autotune.py on {fp['cpu']}, {fp['cores']} cores, BLAS {fp['blas']['vendor']}"
    return str(write_pretuned(entries, note))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller shapes, fewer repeats")
    p.add_argument("--cache-dir", help="autotune cache root (default: a fresh temporary directory)")
    p.add_argument(
        "--write-pretuned",
        action="store_true",
        help="store the tuned choices (full shapes) as the package's pre-tuned table",
    )
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["OPSTRATA_CACHE_DIR"] = a.cache_dir or tmp
        os.environ.pop("OPSTRATA_AUTOTUNE", None)  # off: the comparisons pass their knobs explicitly
        fp = ops.device_fingerprint()
        print(
            f"# autotune: {platform.python_version()}, numpy {np.__version__}, {fp['cpu']}, "
            f"{fp['cores']} cores, BLAS {fp['blas']['vendor']} x{fp['blas']['threads']}"
        )
        print(run(a.quick, repeats=5 if a.quick else 15))
        if a.write_pretuned:
            print(f"wrote {write_pretuned_table()}")


if __name__ == "__main__":
    main()
