"""int4 weight-only quantization of transformers LMs: round-to-nearest against GPTQ, sizes and accuracy.

GPT-2 and Llama with random weights (hidden 384, 4 layers; ``--quick``: hidden 128, 2 layers), exported
by torch.onnx, quantized by ``opstrata.quant.quantize`` with ``w4-g128`` (RTN) and ``w4-g128-gptq`` on
the same calibration token batches. Printed per model and scheme: the bytes of the quantized weights
(int4 values + scales, against their float32 bytes), the logits' cosine to fp32 on held-out tokens,
and per layer the local SQNR (each node's quantized form fed float inputs) of GPTQ against RTN.
This is an accuracy benchmark: no timings.

    python packages/eval/benchmarks/bench_quant_weights.py [--quick] [--models gpt2,llama]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

import opstrata.quant as oq
from opstrata.ops.benchtools import format_table

sys.path.insert(0, str(Path(__file__).parent))
from bench_quant_models import SIZES, _export


def _quantized_weight_bytes(src: onnx.ModelProto, q: onnx.ModelProto) -> tuple[int, int]:
    """(float32 bytes of the weights that were quantized, bytes of their quantized values + scales + zps)."""
    floats = {t.name: t for t in src.graph.initializer}
    inits = {t.name: t for t in q.graph.initializer}
    before = after = 0
    for n in q.graph.node:
        if n.op_type != "DequantizeLinear" or n.input[0] not in inits:
            continue
        name = n.input[0].removesuffix("_quantized")
        if name not in floats:
            continue
        before += numpy_helper.to_array(floats[name]).nbytes
        for x in n.input:
            if x in inits:
                t = inits[x]
                after += len(t.raw_data) if t.raw_data else numpy_helper.to_array(t).nbytes
    return before, after


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", default="gpt2,llama")
    ap.add_argument(
        "--symmetric",
        action="store_true",
        help="int4 in [-7, 7] without zero points (default: asymmetric, 16 levels)",
    )
    args = ap.parse_args()
    size = "quick" if args.quick else "full"
    hidden, layers, heads, inter = SIZES[size]
    group = 128 if hidden % 128 == 0 else 64
    seq, batches = (32, 4) if args.quick else (64, 16)
    rng = np.random.default_rng(0)
    calib = [{"input_ids": rng.integers(0, 1000, (2, seq)).astype(np.int64)} for _ in range(batches)]
    held_out = [{"input_ids": rng.integers(0, 1000, (2, seq)).astype(np.int64)} for _ in range(4)]
    rows, layer_rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            path = _export(name, size, Path(tmp))
            src = onnx.load(path)
            reports = {}
            for scheme in (f"w4-g{group}", f"w4-g{group}-gptq"):
                opts = {"symmetric": args.symmetric}
                qm = oq.quantize(src, calib, scheme, eval_data=held_out, **opts)
                local = oq.quantize(
                    src, calib, scheme, **opts
                )  # measured on the calibration data: GPTQ's objective
                before, after = _quantized_weight_bytes(src, qm.model)
                rep = qm.report
                reports[scheme] = {n.node: n.local_sqnr_db for n in local.report.nodes}
                rows.append([name, scheme, f"{before / 2**20:.2f}", f"{after / 2**20:.2f}", f"{before / after:.2f}x",
                             f"{rep.min_cosine:.5f}", len(rep.quantized)])  # fmt: skip
            rtn, gptq = reports[f"w4-g{group}"], reports[f"w4-g{group}-gptq"]
            common = [k for k in rtn if k in gptq and np.isfinite(rtn[k]) and np.isfinite(gptq[k])]
            gains = [gptq[k] - rtn[k] for k in common]
            layer_rows.append([name, len(common), sum(g > 0 for g in gains), f"{statistics.median(gains):+.2f}",
                               f"{min(gains):+.2f}", f"{max(gains):+.2f}"])  # fmt: skip
    kind = "symmetric" if args.symmetric else "asymmetric (zero points)"
    print(f"int4 weight-only, {kind}, groups of {group}; models hidden {hidden}, {layers} layers, {heads} heads, ffn {inter}; "
          f"calibration {batches} x (2, {seq}) token batches, held-out 4")  # fmt: skip
    print(format_table(["model", "scheme", "float MiB", "int4 MiB", "smaller", "logits cosine (held-out)",
                        "nodes"], rows))  # fmt: skip
    print()
    print("per-layer local SQNR on the calibration data, GPTQ minus RTN (dB):")
    print(format_table(["model", "layers", "GPTQ better", "median", "min", "max"], layer_rows))


if __name__ == "__main__":
    main()
