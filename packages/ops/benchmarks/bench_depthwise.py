"""Depthwise convolution: the native C loop against the im2col + GEMM kernel it replaces, onnxruntime's
Conv and torch's conv2d, on MobileNet / EfficientNet / ConvNeXt shapes, one thread everywhere.

Run: ``PYTHONPATH=packages/ops/src python packages/ops/benchmarks/bench_depthwise.py [--quick]``.
Each cell is a median of interleaved rounds (:func:`opstrata.ops.benchtools.compare`, rotating which
candidate goes first); ratios are opstrata's native time over each baseline's (below 1: faster).
onnxruntime and torch columns appear when they are importable.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OPSTRATA_NUM_THREADS"):
    os.environ[_var] = "1"
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # torch's idle OpenMP threads must not spin

import argparse  # noqa: E402
import platform  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

import opstrata.ops as ops  # noqa: E402
from opstrata.ops.benchtools import compare, conv_peers, format_table  # noqa: E402
from opstrata.ops.kernels.conv import conv2d_cpu  # noqa: E402

#: (name, channels, spatial, kernel, stride): the depthwise layers of the networks people export
SHAPES = [
    ("MobileNetV2 block 2", 96, 112, 3, 2),
    ("MobileNetV2 block 4", 144, 56, 3, 1),
    ("MobileNetV2 block 6", 192, 28, 3, 1),
    ("EfficientNet-B0 5x5", 672, 14, 5, 1),
    ("ConvNeXt-T 7x7", 96, 56, 7, 1),
    ("MobileNetV3 first", 16, 112, 3, 2),
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="three shapes, few rounds")
    args = parser.parse_args(argv)
    if not ops.native_status(build=True).available:
        raise SystemExit(f"the native library is off: {ops.native_status().reason}")
    rows: list[list[Any]] = []
    for name, c, hw, k, s in SHAPES[:3] if args.quick else SHAPES:
        rng = np.random.default_rng(0)
        x = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
        w = rng.standard_normal((c, 1, k, k)).astype(np.float32)
        b = rng.standard_normal(c).astype(np.float32)
        pad = k // 2
        kw = {"stride": s, "padding": pad, "groups": c}
        cands: dict[str, Callable[[], object]] = {
            "native": lambda x=x, w=w, b=b, kw=kw: ops.conv2d(x, w, b, **kw),
            "im2col": lambda x=x, w=w, b=b, kw=kw: conv2d_cpu(x, w, b, **kw),
        }
        cands.update(conv_peers(x, w, b, stride=s, pad=pad, groups=c, threads=1))
        t = compare(cands, repeats=5 if args.quick else 21, warmup=2)
        nat = t["native"].median
        cells = [f"{name} ({c}x{hw}x{hw}, {k}x{k}/{s})", f"{nat * 1e3:.3f}"]
        cells += [f"{nat / t[o].median:.2f}" if o in t else "-" for o in ("im2col", "onnxruntime", "torch")]
        rows.append(cells)
    print(
        f"machine: {platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores, numpy {np.__version__}"
    )
    print(format_table(["shape", "native ms", "/ im2col", "/ onnxruntime", "/ torch"], rows))


if __name__ == "__main__":
    main()
