"""quant's weight-only GEMM (ops' ``dequant_matmul``: int4 weights in groups of 128, dequantized tile by
tile) against numpy fp32 matmul on the dequantized float weight, and onnxruntime's MatMulNBits beside it.

Run: ``python packages/quant/benchmarks/bench_dq_matmul.py [--quick] [--repeats N]``.
One thread everywhere. Shapes: the decode (M = 1) and prefill (M = 32, 128) products of a hidden-384
transformer block and of a 4096-wide layer (whose float weight no longer fits in cache). Medians of
interleaved rounds with rotating order; every result is checked against ops' reference first.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OPSTRATA_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import opstrata.ops as ops  # noqa: E402
import opstrata.quant as oq  # noqa: E402
from opstrata.ops.benchtools import compare, format_table  # noqa: E402

try:
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
except ImportError:
    ort = None  # type: ignore[assignment]

SHAPES = [(1, 384, 1536), (1, 1536, 384), (128, 384, 1536), (1, 4096, 4096), (32, 4096, 4096)]
BLOCK = 128


def _ort_nbits(w: np.ndarray, s: np.ndarray) -> Callable[[np.ndarray], Any] | None:
    """onnxruntime's MatMulNBits (com.microsoft) on the same int4 weight, or None where it is missing."""
    k, n = w.shape
    codes = (w.astype(np.int16) + 8).astype(np.uint8).T.reshape(n, k // BLOCK, BLOCK)  # (N, blocks, BLOCK)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    zp = np.full((n, (k // BLOCK + 1) // 2), 0x88, np.uint8)
    node = helper.make_node("MatMulNBits", ["x", "w", "s", "z"], ["y"], domain="com.microsoft", K=k, N=n,
                            bits=4, block_size=BLOCK)  # fmt: skip
    g = helper.make_graph([node], "nbits", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(packed, "w"), numpy_helper.from_array(s.T.copy(), "s"),
                           numpy_helper.from_array(zp, "z")])  # fmt: skip
    model = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    try:
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception:  # an onnxruntime without the contrib op: the column stays empty
        return None
    return lambda x: sess.run(None, {"x": x})[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=21)
    args = ap.parse_args()
    rounds = 3 if args.quick else args.repeats
    r = np.random.default_rng(0)
    rows = []
    for m, k, n in SHAPES[:2] if args.quick else SHAPES:
        w = r.integers(-8, 8, (k, n)).astype(ml_dtypes.int4)
        w.flags.writeable = False  # as a session's weights: packed once, trusted
        s = r.uniform(0.01, 0.05, (k // BLOCK, n)).astype(np.float32)
        x = r.standard_normal((m, k)).astype(np.float32)
        wf = ops.dequantize_linear(w, s, axis=0, block_size=BLOCK)
        want = x @ wf
        got = ops.dequant_matmul(x, w, s, axis=0, block_size=BLOCK)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
        cands: dict[str, Callable[[], object]] = {
            "int4": lambda x=x, w=w, s=s: ops.dequant_matmul(x, w, s, axis=0, block_size=BLOCK),
            "fp32": lambda x=x, wf=wf: x @ wf,
        }
        nbits = _ort_nbits(np.asarray(w, np.int8), s) if ort is not None else None
        if nbits is not None:
            np.testing.assert_allclose(nbits(x), want, rtol=1e-3, atol=1e-3 * float(np.abs(want).max()))
            cands["ort"] = lambda f=nbits, x=x: f(x)
        ms = {c: t.median * 1e3 for c, t in compare(cands, repeats=rounds).items()}
        row = [f"{m}x{k}x{n}", f"{ms['int4']:.3f}", f"{ms['fp32']:.3f}", f"{ms['fp32'] / ms['int4']:.2f}x",
               f"{wf.nbytes / 2**20:.1f} -> {w.size / 2 / 2**20 + s.nbytes / 2**20:.2f}"]  # fmt: skip
        row += [f"{ms['ort']:.3f}", f"{ms['int4'] / ms['ort']:.2f}x"] if "ort" in ms else ["", ""]
        rows.append(row)
    print(f"int4 weight-only GEMM (groups of {BLOCK}) vs numpy fp32, one thread, {rounds} interleaved rounds; "
          f"native paths {oq.native_status().paths}")  # fmt: skip
    print(format_table(["M x K x N", "int4 ms", "fp32 ms", "int4 speed-up", "weight MiB fp32 -> int4",
                        "ort MatMulNBits ms", "int4 / ort"], rows))  # fmt: skip


if __name__ == "__main__":
    main()
