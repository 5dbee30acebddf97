"""W8A8 static quantization of CNNs end to end: torchvision ResNet-18 and MobileNet-V3-small with random
weights (the zoo's configurations: 100 classes, 64x64 images), exported by torch.onnx, quantized by
opstrata.quant (``quantize(m, calib, "w8a8")``) and by onnxruntime's ``quantize_static`` (QDQ, per-channel
int8 weights, uint8 activations, minmax calibration), each run in its own runtime, one thread (or
``--threads N`` on both sides; above one, in settled and warmed turns).

Printed per model: top-1 agreement with the fp32 model on held-out synthetic images and the output
cosine, for both quantized models; latency of opstrata fp32, opstrata's quantized model in opstrata,
onnxruntime fp32 and onnxruntime's quantized model in onnxruntime (medians of interleaved rounds, the
order rotating, ops.benchtools.compare). Calibration and evaluation images are N(0, 1) noise, different seeds.

``--unfused`` also times our quantized model compiled without graph's ``fuse_qconv_quantize`` (QConv ->
activation -> QuantizeLinear as one native call; the pass patched out for that session), in the same
interleaved rounds.

    python packages/eval/benchmarks/bench_quant_static.py [--quick] [--rounds N] [--models resnet18] [--threads N]
        [--unfused]
"""

# bench-needs: torch torchvision transformers

from __future__ import annotations

import os
import sys

#: threads on both sides (--threads N, read before numpy / onnxruntime load; default 1)
THREADS = int(sys.argv[sys.argv.index("--threads") + 1]) if "--threads" in sys.argv[:-1] else 1
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OPSTRATA_NUM_THREADS"):
    os.environ[_var] = str(THREADS)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import tempfile  # noqa: E402
from functools import partial  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

import opstrata.quant as oq  # noqa: E402
import opstrata.runtime as rt  # noqa: E402
from opstrata.ops.benchtools import compare, format_table  # noqa: E402


def _images(n: int, batch: int, side: int, seed: int) -> list[np.ndarray]:
    r = np.random.default_rng(seed)
    return [r.standard_normal((batch, 3, side, side)).astype(np.float32) for _ in range(n)]


def _ort_session(path: Path) -> Any:
    import onnxruntime as ort

    o = ort.SessionOptions()
    o.intra_op_num_threads, o.inter_op_num_threads = THREADS, 1
    return ort.InferenceSession(str(path), o, providers=["CPUExecutionProvider"])


def _ort_quantize_static(src: Path, dst: Path, name: str, calib: list[np.ndarray]) -> None:
    from onnxruntime import quantization as q

    class Reader(q.CalibrationDataReader):
        def __init__(self) -> None:
            self._it = iter([{name: x} for x in calib])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._it, None)

    q.quantize_static(str(src), str(dst), Reader(), quant_format=q.QuantFormat.QDQ, per_channel=True,
                      activation_type=q.QuantType.QUInt8, weight_type=q.QuantType.QInt8)  # fmt: skip


def _session_without_qconv_quantize(path: Path) -> Any:
    """Our session on ``path`` compiled without graph's fuse_qconv_quantize (an A/B of that fusion)."""
    from opstrata.graph.passes import fuse_qdq

    keep = fuse_qdq.fuse_qconv_quantize
    fuse_qdq.fuse_qconv_quantize = lambda g: g.copy()  # the pipeline looks the pass up when it runs
    try:
        return rt.InferenceSession(str(path))
    finally:
        fuse_qdq.fuse_qconv_quantize = keep


def _agreement(ref: list[np.ndarray], got: list[np.ndarray]) -> tuple[float, float]:
    """Top-1 agreement and the cosine of all logits, against the fp32 outputs."""
    a, b = np.concatenate(ref), np.concatenate(got)
    top1 = float(np.mean(a.argmax(-1) == b.argmax(-1)))
    cos = float(np.dot(a.ravel(), b.ravel()) / (np.linalg.norm(a) * np.linalg.norm(b)))
    return top1, cos


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer images and rounds (a smoke run)")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--models", default="resnet18,mobilenet_v3_small")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads on both sides (default 1)")
    ap.add_argument("--unfused", action="store_true", help="also time ours without fuse_qconv_quantize")
    args = ap.parse_args()
    from opstrata.eval.zoo import export_model

    rounds = args.rounds or (3 if args.quick else 15)
    n_calib, n_eval = (2, 2) if args.quick else (16, 32)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            path = export_model(name, "dynamo", Path(tmp) / name)
            fp = rt.InferenceSession(str(path))
            inp = fp.get_inputs()[0].name
            calib = _images(n_calib, args.batch, 64, seed=1)
            held = _images(n_eval, args.batch, 64, seed=2)
            ours_q = oq.quantize(str(path), [{inp: x} for x in calib], "w8a8")
            qpath = Path(tmp) / f"{name}.w8a8.onnx"
            ours_q.save(qpath)
            ort_qpath = Path(tmp) / f"{name}.ortq.onnx"
            _ort_quantize_static(path, ort_qpath, inp, calib)
            oq_sess, ort_fp, ort_q = (
                rt.InferenceSession(str(qpath)),
                _ort_session(path),
                _ort_session(ort_qpath),
            )
            ref = [fp.run(None, {inp: x})[0] for x in held]
            t1_ours, cos_ours = _agreement(ref, [oq_sess.run(None, {inp: x})[0] for x in held])
            t1_ort, cos_ort = _agreement(ref, [ort_q.run(None, {inp: x})[0] for x in held])
            feeds = {inp: held[0]}
            sessions = {"ours fp32": fp, "ours q": oq_sess, "ort fp32": ort_fp, "ort q": ort_q}
            if args.unfused:
                sessions["ours q unfused"] = _session_without_qconv_quantize(qpath)
            # above one thread, settled and warmed turns: onnxruntime's idle workers spin ~25 ms after a run
            turns = {"settle_s": 0.05, "warm_s": 0.03} if THREADS > 1 else {}
            timed = compare(
                {k: partial(s.run, None, feeds) for k, s in sessions.items()}, repeats=rounds, **turns
            )
            ms = {k: t.median * 1e3 for k, t in timed.items()}
            rows.append([
                name, f"{t1_ours:.1%}", f"{cos_ours:.5f}", f"{t1_ort:.1%}", f"{cos_ort:.5f}",
                f"{ms['ours fp32']:.2f}", f"{ms['ours q']:.2f}", f"{ms['ort fp32']:.2f}", f"{ms['ort q']:.2f}",
                f"{ms['ours q'] / ms['ort q']:.2f}x",
            ] + ([f"{ms['ours q unfused']:.2f}"] if args.unfused else []))  # fmt: skip
    print(f"W8A8 static, batch {args.batch}, 64x64, {THREADS} thread(s) on both sides, {rounds} interleaved rounds, "
          f"{n_calib} calibration / {n_eval} held-out batches")  # fmt: skip
    print(format_table(
        ["model", "top-1 ours", "cos ours", "top-1 ort", "cos ort", "ours fp32 ms", "ours q ms", "ort fp32 ms",
         "ort q ms", "ours q / ort q"] + (["ours q unfused ms"] if args.unfused else []), rows,
    ))  # fmt: skip


if __name__ == "__main__":
    main()
