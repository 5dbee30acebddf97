"""Native C kernels against the numpy kernels they replace and torch's CPU kernels, in one run.

Run: ``PYTHONPATH=packages/ops/src python packages/ops/benchmarks/bench_native.py [--quick]``.
One thread everywhere (set before numpy / torch load). Shapes are the BERT / GPT blocks' of the
runtime benchmark (batch 4 x seq 128 rows). Each cell is a median of interleaved rounds
(:func:`opstrata.ops.benchtools.compare`); ratios are against the numpy kernel of the same op.
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
from opstrata.ops.benchtools import compare, format_table  # noqa: E402
from opstrata.ops.kernels.activation import gelu_cpu  # noqa: E402
from opstrata.ops.kernels.fused import bias_act_cpu  # noqa: E402
from opstrata.ops.kernels.normalization import layer_norm_cpu  # noqa: E402
from opstrata.ops.kernels.softmax import softmax_cpu  # noqa: E402

try:
    import torch

    torch.set_num_threads(1)
    F: Any = torch.nn.functional
except ImportError:  # the torch column is optional
    torch = None  # type: ignore[assignment]


def cases(quick: bool) -> list[tuple[str, dict[str, Callable[[], object]]]]:
    """(label, {runtime: call}) per op; the numpy kernel is the first entry (the baseline)."""
    rng = np.random.default_rng(0)
    rows = 64 if quick else 512
    h = (rng.standard_normal((rows, 1024)) * 2).astype(np.float32)  # the FFN activation
    b = rng.standard_normal(1024).astype(np.float32)
    y = np.empty_like(h)
    x = rng.standard_normal((rows, 256)).astype(np.float32) * 3 + 1  # the hidden state
    w, beta = rng.standard_normal(256).astype(np.float32), rng.standard_normal(256).astype(np.float32)
    sc = rng.standard_normal((4, 4, rows // 4, 128)).astype(np.float32) * 4  # attention scores
    out: list[tuple[str, dict[str, Callable[[], object]]]] = [
        (
            f"bias + exact GELU {rows}x1024 (in place)",
            {
                "numpy": lambda: bias_act_cpu(h, b, act="gelu", out=y),
                "native": lambda: ops.call("bias_act", h, b, act="gelu", out=y),
            },
        ),
        (
            f"bias + tanh GELU {rows}x1024 (in place)",
            {
                "numpy": lambda: bias_act_cpu(h, b, act="gelu_tanh", out=y),
                "native": lambda: ops.call("bias_act", h, b, act="gelu_tanh", out=y),
            },
        ),
        (f"exact GELU {rows}x1024", {"numpy": lambda: gelu_cpu(h), "native": lambda: ops.gelu(h)}),
        (
            f"layer norm {rows}x256",
            {
                "numpy": lambda: layer_norm_cpu(x, w, beta),
                "native": lambda: ops.layer_norm(x, w, beta),
            },
        ),
        (f"softmax {sc.shape}", {"numpy": lambda: softmax_cpu(sc), "native": lambda: ops.softmax(sc)}),
    ]
    if torch is not None:
        th, tb, tx, tw, tbeta, tsc = (torch.from_numpy(a.copy()) for a in (h, b, x, w, beta, sc))
        out[0][1]["torch eager"] = lambda: F.gelu(th + tb)
        out[1][1]["torch eager"] = lambda: F.gelu(th + tb, approximate="tanh")
        out[2][1]["torch eager"] = lambda: F.gelu(th)
        out[3][1]["torch eager"] = lambda: F.layer_norm(tx, (256,), tw, tbeta, 1e-5)
        out[4][1]["torch eager"] = lambda: torch.softmax(tsc, -1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small shapes, few repeats (a smoke run)")
    args = ap.parse_args()
    status = ops.native_status()
    ops.gelu(np.zeros(4, np.float32))  # builds (or loads) the library before timing
    status = ops.native_status()
    if not status.available:
        raise SystemExit(f"native kernels unavailable: {status.reason or status.mode}")
    print(
        f"# native kernels vs numpy kernels vs torch eager ({platform.machine()}, 1 thread, {status.compiler})\n"
    )
    rows = []
    for label, cands in cases(args.quick):
        t = compare(cands, repeats=5 if args.quick else 41, warmup=2)
        base = t["numpy"].median
        for name, timing in t.items():
            rows.append([label, name, f"{timing.median * 1e3:.3f}", f"{base / timing.median:.2f}x"])
    print(format_table(["kernel", "runtime", "median ms", "speed-up vs numpy"], rows))


if __name__ == "__main__":
    main()
