"""Dense convolution as the runtime runs it (a bound ``ops.conv2d`` call into a preallocated output: the
library's AVX-512 tiles with the bias folded in -- direct, gathered strips or rows in lanes, no im2col
buffer -- on read-only weights packed once, as a session's) against numpy's im2col + sgemm
(the cpu kernel), onnxruntime's Conv and torch's conv2d, on the zoo models' shapes, one thread everywhere.

Run: ``PYTHONPATH=packages/ops/src python packages/ops/benchmarks/bench_conv.py [--quick] [--threads N]``.
Each cell is a median of interleaved rounds (:func:`opstrata.ops.benchtools.compare`, rotating which
candidate goes first); ratios are opstrata's time over each baseline's (below 1: faster). "GFLOP/s" is
opstrata's multiply-add rate (2 m n k per image). onnxruntime runs a one-node model (its per-run Python
cost, a few us, is in its column; io binding beside torch in one process crashed torch 2.14.1).
"""

from __future__ import annotations

import os
import sys

_THREADS = next((int(a.split("=", 1)[1]) for a in sys.argv if a.startswith("--threads=")), 1)
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OPSTRATA_NUM_THREADS"):
    os.environ[_var] = str(_THREADS)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # torch's idle OpenMP threads must not spin

import argparse  # noqa: E402
import platform  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

import opstrata.ops as ops  # noqa: E402
from opstrata.ops.benchtools import compare, conv_peers, format_table  # noqa: E402
from opstrata.ops.kernels.conv import conv2d_cpu  # noqa: E402

#: (name, c_in, c_out, spatial, kernel, stride, pad): dense convolutions of the zoo's models at 64x64 input
SHAPES = [
    ("ResNet-18 stem 7x7/2", 3, 64, 64, 7, 2, 3),
    ("ResNet-18 layer1 3x3", 64, 64, 16, 3, 1, 1),
    ("ResNet-18 layer2 3x3/2", 64, 128, 16, 3, 2, 1),
    ("ResNet-18 layer3 3x3", 256, 256, 4, 3, 1, 1),
    ("ResNet-18 layer4 3x3", 512, 512, 2, 3, 1, 1),
    ("SqueezeNet conv1 3x3/2", 3, 64, 64, 3, 2, 0),
    ("SqueezeNet fire2 expand 3x3", 16, 64, 15, 3, 1, 1),
    ("SqueezeNet fire2 expand 1x1", 16, 64, 15, 1, 1, 0),
    ("SqueezeNet fire4 expand 3x3", 32, 128, 7, 3, 1, 1),
    ("SqueezeNet fire8 expand 3x3", 64, 256, 3, 3, 1, 1),
    ("EfficientNet stem 3x3/2", 3, 32, 64, 3, 2, 1),
    ("EfficientNet expand 1x1", 24, 144, 16, 1, 1, 0),
    ("MobileNetV3 project 1x1", 96, 40, 4, 1, 1, 0),
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="four shapes, few rounds")
    parser.add_argument("--threads", type=int, default=1, help="threads on every side (pass as --threads=N)")
    args = parser.parse_args(argv)
    if not ops.native_status(build=True).available:
        raise SystemExit(f"the native library is off: {ops.native_status().reason}")
    rows: list[list[Any]] = []
    with ops.intra_op_threads(_THREADS):
        for name, ci, co, hw, k, s, pad in SHAPES[:4] if args.quick else SHAPES:
            rng = np.random.default_rng(0)
            x = rng.standard_normal((1, ci, hw, hw)).astype(np.float32)
            w = (rng.standard_normal((co, ci, k, k)) / np.sqrt(ci * k * k)).astype(np.float32)
            w.flags.writeable = False  # as a session's weights: the bound call packs them once
            b = rng.standard_normal(co).astype(np.float32)
            kw = {"stride": s, "padding": pad}
            want = conv2d_cpu(x, w, b, **kw)
            out = np.empty_like(want)
            bound = ops.bind("conv2d", x, w, b, out=out, **kw)
            if bound is None:
                raise SystemExit(f"{name}: ops.bind('conv2d') declined these arguments")
            bound()
            np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
            cands: dict[str, Callable[[], object]] = {
                "opstrata": bound,
                "numpy": lambda x=x, w=w, b=b, kw=kw: conv2d_cpu(x, w, b, **kw),
            }
            cands.update(conv_peers(x, w, b, stride=s, pad=pad, groups=1, threads=_THREADS))
            t = compare(cands, repeats=5 if args.quick else 31, warmup=3)
            mine = t["opstrata"].median
            ho = want.shape[2] * want.shape[3]
            gflops = 2.0 * co * ci * k * k * ho / mine / 1e9
            cells = [f"{name} ({ci}->{co}, {hw}x{hw})", f"{mine * 1e6:.1f}", f"{gflops:.1f}"]
            cells += [
                f"{mine / t[o].median:.2f}" if o in t else "-" for o in ("numpy", "onnxruntime", "torch")
            ]
            rows.append(cells)
    print(
        f"machine: {platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores, numpy {np.__version__}, "
        f"threads {_THREADS}"
    )
    print(format_table(["shape", "opstrata us", "GFLOP/s", "/ numpy", "/ onnxruntime", "/ torch"], rows))


if __name__ == "__main__":
    main()
