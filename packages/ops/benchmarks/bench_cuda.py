"""The cuda device against torch on the same GPU: GEMM, memory-bound row kernels, causal attention.

Each row times our call through the registry (``ops.call(..., device="cuda")``) and torch's in
interleaved rounds (alternating which goes first), with CUDA events, and reports medians and the
ratio. The memory-bound kernels are also given as a fraction of the measured device-to-device copy
bandwidth (bytes read + written). Needs CuPy, torch and a GPU; run by ``tools/gpu_check.sh``::

    python packages/ops/benchmarks/bench_cuda.py [--json out.json] [--rounds 7] [--quick]
"""

# bench-needs: cupy torch

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

import opstrata.ops as ops


def _events_ms(cp: Any, fn: Callable[[], Any], reps: int) -> float:
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) / reps


def interleaved(
    cp: Any, ours: Callable[[], Any], theirs: Callable[[], Any], rounds: int, reps: int
) -> tuple[float, float]:
    """Median ms of each side over ``rounds``, alternating which runs first; warmed up once."""
    for fn in (ours, theirs):
        fn()
    cp.cuda.Device().synchronize()
    a, b = [], []
    for r in range(rounds):
        if r % 2 == 0:
            a.append(_events_ms(cp, ours, reps))
            b.append(_events_ms(cp, theirs, reps))
        else:
            b.append(_events_ms(cp, theirs, reps))
            a.append(_events_ms(cp, ours, reps))
    return statistics.median(a), statistics.median(b)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="also write the rows as JSON here")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="smaller shapes (a smoke run)")
    args = p.parse_args(argv)
    import cupy as cp
    import torch
    import torch.nn.functional as F

    st = ops.device_status()
    cuda = {s.name: s for s in st}.get("cuda")
    if cuda is None or not cuda.available:
        print(f"bench_cuda: no cuda device ({cuda.reason if cuda else 'not registered'})", file=sys.stderr)
        return 2
    ops.set_fallback_policy("error")  # a fallback would time the CPU: refuse it
    dev = torch.device("cuda")
    n = 1024 if args.quick else 4096
    rows: list[dict[str, Any]] = []
    bf16 = np.dtype(ops.bfloat16)

    def add(name: str, ours_ms: float, torch_ms: float, nbytes: float = 0.0, flops: float = 0.0) -> None:
        row = {"case": name, "ours_ms": ours_ms, "torch_ms": torch_ms, "ratio": ours_ms / torch_ms}
        if nbytes:
            row["ours_gbs"] = nbytes / ours_ms / 1e6
            row["torch_gbs"] = nbytes / torch_ms / 1e6
        if flops:
            row["ours_tflops"] = flops / ours_ms / 1e9
            row["torch_tflops"] = flops / torch_ms / 1e9
        rows.append(row)

    def pair(shape: tuple[int, ...], dtype: Any, seed: int) -> tuple[Any, Any]:
        host = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
        t = torch.from_numpy(host).to(dev, torch.bfloat16 if dtype == bf16 else torch.float32)
        return cp.asarray(host.astype(dtype)), t

    # device-to-device copy: the bandwidth roof of the memory-bound rows
    src, tsrc = pair((n, n), bf16, 0)
    dst, tdst = cp.empty_like(src), torch.empty_like(tsrc)
    ours, theirs = interleaved(cp, lambda: cp.copyto(dst, src), lambda: tdst.copy_(tsrc), args.rounds, 20)
    copy_gbs = 2 * src.nbytes / min(ours, theirs) / 1e6
    add("d2d copy bf16 (cupy vs torch)", ours, theirs, 2 * src.nbytes)

    for dtype, tag in ((bf16, "bf16"), (np.dtype(np.float32), "fp32")):
        a, ta = pair((n, n), dtype, 1)
        b, tb = pair((n, n), dtype, 2)
        o, t = interleaved(
            cp,
            lambda a=a, b=b: ops.call("matmul", a, b, device="cuda"),
            lambda ta=ta, tb=tb: ta @ tb,
            args.rounds,
            10,
        )
        add(f"matmul {n}^3 {tag}", o, t, flops=2.0 * n**3)

    x, tx = pair((n, n), bf16, 3)
    bias, tbias = pair((n,), bf16, 4)
    res, tres = pair((n, n), bf16, 5)
    w, tw = pair((n,), bf16, 6)
    o, t = interleaved(
        cp, lambda: ops.call("softmax", x, device="cuda"), lambda: torch.softmax(tx, -1), args.rounds, 20
    )
    add(f"softmax {n}x{n} bf16", o, t, 2 * x.nbytes)
    o, t = interleaved(
        cp,
        lambda: ops.call("layer_norm", x, w, bias, device="cuda"),
        lambda: F.layer_norm(tx, (n,), tw, tbias),
        args.rounds,
        20,
    )
    add(f"layer_norm {n}x{n} bf16", o, t, 2 * x.nbytes)
    o, t = interleaved(
        cp,
        lambda: ops.call("bias_act", x, bias, res, act="gelu", device="cuda"),
        lambda: F.gelu(tx + tbias) + tres,
        args.rounds,
        20,
    )
    add(f"bias+gelu+residual {n}x{n} bf16", o, t, 3 * x.nbytes)

    bsz, heads, seq, hd = (4, 16, 1024 if args.quick else 4096, 64)
    q, tq = pair((bsz, heads, seq, hd), bf16, 7)
    k, tk = pair((bsz, heads, seq, hd), bf16, 8)
    v, tv = pair((bsz, heads, seq, hd), bf16, 9)
    o, t = interleaved(
        cp,
        lambda: ops.call("attention", q, k, v, causal=True, device="cuda"),
        lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=True),
        args.rounds,
        3,
    )
    add(
        f"causal attention B={bsz} H={heads} N={seq} D={hd} bf16",
        o,
        t,
        flops=2.0 * 2 * bsz * heads * seq * seq * hd / 2,
    )

    name = cp.cuda.runtime.getDeviceProperties(0)["name"]
    print(
        f"device: {name.decode() if isinstance(name, bytes) else name}; CuPy {cp.__version__}, torch {torch.__version__}"
    )
    print(f"d2d copy bandwidth (read + write): {copy_gbs:.0f} GB/s")
    print("| case | ours ms | torch ms | ours / torch | ours GB/s (of copy) | TFLOP/s ours / torch |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        gbs = f"{r['ours_gbs']:.0f} ({r['ours_gbs'] / copy_gbs:.0%})" if "ours_gbs" in r else ""
        tf = f"{r['ours_tflops']:.0f} / {r['torch_tflops']:.0f}" if "ours_tflops" in r else ""
        print(
            f"| {r['case']} | {r['ours_ms']:.4f} | {r['torch_ms']:.4f} | {r['ratio']:.2f}x | {gbs} | {tf} |"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"device": str(name), "copy_gbs": copy_gbs, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
