"""quant's native int8 GEMM against numpy fp32 matmul, ops' own matmul_integer kernel and onnxruntime's
MatMulInteger, side by side in one run.

Run: ``python packages/quant/benchmarks/bench_qgemm.py [--quick] [--repeats N]``.
One thread everywhere (set before numpy / onnxruntime load). Each shape: the weight (K, N) int8 is
constant (prepacked once for quant, an initializer for onnxruntime), the activation (M, K) uint8.
Every int8 result is checked bit-for-bit against onnxruntime / an int64 reference before timing.
The slow candidates (the portable path, ops' own kernel) are timed in rounds of their own with both
baselines again (ratios against those).
Each cell is a median of interleaved rounds with alternating order
(:func:`opstrata.ops.benchtools.compare`); ratios are the figures, absolute times on a shared machine
are noise.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OPSTRATA_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

import opstrata.ops as ops  # noqa: E402
import opstrata.quant as oq  # noqa: E402
from opstrata.ops.benchtools import compare, format_table  # noqa: E402
from opstrata.quant import _kernels  # noqa: E402

try:
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
except ImportError:  # the onnxruntime column is optional
    ort = None  # type: ignore[assignment]

SHAPES = [(512, 1024, 1024), (128, 768, 768), (1, 768, 3072)]
QUICK_SHAPES = [(64, 256, 256), (1, 256, 512)]


def ort_matmul_integer(m: int, k: int, n: int, b: np.ndarray) -> Any:
    """A one-node MatMulInteger model (b an initializer) in an onnxruntime session on one thread."""
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b"], ["y"])],
        "mmi",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [m, n])],
        [numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def candidates(
    m: int, k: int, n: int, paths: list[str]
) -> tuple[dict[str, Callable[[], object]], np.ndarray]:
    """{name: call} for one shape (numpy fp32 first: the baseline) and the int64 reference result."""
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (m, k)).astype(np.uint8)
    b = rng.integers(-128, 128, (k, n)).astype(np.int8)
    b.flags.writeable = False  # a model constant: the registered kernel packs it once
    af, bf = a.astype(np.float32), b.astype(np.float32)
    want = (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32)
    w = oq.prepack_weight(b)
    numpy_kernel = _kernels._displaced["matmul_integer"]  # the cpu kernel quant's displaced
    out: dict[str, Callable[[], object]] = {"numpy fp32 matmul": lambda: af @ bf}
    out["ops matmul_integer (its numpy cpu kernel)"] = lambda: numpy_kernel(a, b)
    if ort is not None:
        sess = ort_matmul_integer(m, k, n, b)
        np.testing.assert_array_equal(sess.run(None, {"a": a})[0], want)
        out["onnxruntime MatMulInteger"] = lambda: sess.run(None, {"a": a})
    for p in paths:
        np.testing.assert_array_equal(oq.qgemm(a, w, path=p), want)
        out[f"quant qgemm {p}"] = lambda p=p: oq.qgemm(a, w, path=p)
    np.testing.assert_array_equal(ops.matmul_integer(a, b), want)
    out["ops.matmul_integer -> quant (registry)"] = lambda: ops.matmul_integer(a, b)
    b_rw = b.copy()  # writeable: its packing is re-verified by content fingerprint on every call
    out["same, writeable weight (fingerprinted)"] = lambda: ops.matmul_integer(a, b_rw)
    return out, want


def _calls_per_sample(fn: Callable[[], object], target_s: float = 0.004) -> int:
    """Calls per timed sample so a sample lasts ~``target_s`` (short ops: fewer timer / scheduler artefacts)."""
    fn()
    start = time.perf_counter()
    fn()
    return max(1, round(target_s / max(time.perf_counter() - start, 1e-7)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small shapes, 3 rounds (a smoke run)")
    ap.add_argument("--repeats", type=int, default=15, help="interleaved rounds per shape (default 15)")
    args = ap.parse_args()
    status = oq.native_status(build=True)
    if not status.available:
        raise SystemExit(f"the int8 library is unavailable: {status.reason}")
    repeats = 3 if args.quick else args.repeats
    print(
        f"machine: {platform.machine()}, {platform.processor() or 'cpu'}, {os.cpu_count()} cpus; "
        f"numpy {np.__version__}, onnxruntime {ort.__version__ if ort else 'not installed'}; "
        f"int8 paths {', '.join(status.paths)} (auto: {status.best_path}); 1 thread; "
        f"median of {repeats} interleaved rounds"
    )
    rows: list[list[object]] = []
    slow = ("ops matmul_integer (its numpy cpu kernel)", "quant qgemm portable")
    shared = ("numpy fp32 matmul", "onnxruntime MatMulInteger")
    for m, k, n in QUICK_SHAPES if args.quick else SHAPES:
        cands, _ = candidates(m, k, n, status.paths[::-1])
        # the slow candidates (~10x) get rounds of their own, with the baselines again: the fast ones'
        # rounds stay short, and none follows a 30 ms float64 product that churned the allocator
        groups = [
            ({n_: f for n_, f in cands.items() if n_ not in slow}, repeats),
            ({n_: f for n_, f in cands.items() if n_ in slow or n_ in shared}, max(3, repeats // 3)),
        ]
        for group, reps in groups:
            timed = compare(
                group, repeats=reps, number=_calls_per_sample(group["numpy fp32 matmul"]), warmup=2
            )
            base = timed["numpy fp32 matmul"].median
            ort_t = timed.get("onnxruntime MatMulInteger")
            for name, t in timed.items():
                if reps != repeats and name in shared:
                    continue
                rows.append(
                    [
                        f"{m}x{k}x{n}",
                        name,
                        f"{t.median * 1e3:.3f}",
                        f"{base / t.median:.2f}x",
                        f"{t.median / ort_t.median:.2f}" if ort_t else "n/a",
                    ]
                )
    print(
        format_table(
            ["M x K x N", "candidate", "median ms", "speed-up vs numpy fp32", "time / onnxruntime int8"], rows
        )
    )


if __name__ == "__main__":
    main()
