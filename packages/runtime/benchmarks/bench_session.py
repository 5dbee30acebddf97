"""InferenceSession latency vs onnxruntime (same thread count), and the caching allocator vs np.empty.

Ratios of interleaved medians from one process run (opstrata.ops.benchtools.compare); absolute
times on a shared machine are noise. BLAS and onnxruntime both run on one thread unless
``--threads`` says otherwise (threadpoolctl limits numpy's BLAS).

    PYTHONPATH=packages/ops/src:packages/graph/src:packages/runtime/src \
        python packages/runtime/benchmarks/bench_session.py [--quick] [--threads N]
"""

from __future__ import annotations

import argparse
import contextlib
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from opstrata.graph.testing import bert_block_model, gpt_block_model, mlp_model, random_feeds
from opstrata.ops.benchtools import compare, format_table
from opstrata.runtime import CachingAllocator, InferenceSession, SessionOptions


def _models(quick: bool) -> list[tuple[str, Any, dict[str, int]]]:
    if quick:
        return [
            ("MLP 64-256-64, batch 16", mlp_model(d_in=64, hidden=256, d_out=64), {"batch": 16}),
            ("BERT block h128, b2 s32", bert_block_model(hidden=128, heads=4, ffn=512), {"batch": 2, "seq": 32}),
            ("GPT block h128, b2 s32", gpt_block_model(hidden=128, heads=4, vocab=500, max_pos=64), {"batch": 2, "seq": 32}),
        ]  # fmt: skip
    return [
        ("MLP 256-1024-256, batch 32", mlp_model(d_in=256, hidden=1024, d_out=256), {"batch": 32}),
        ("BERT block h256, b4 s64", bert_block_model(hidden=256, heads=4, ffn=1024), {"batch": 4, "seq": 64}),
        ("GPT block h256, b4 s64", gpt_block_model(hidden=256, heads=4, vocab=1000, max_pos=128), {"batch": 4, "seq": 64}),
    ]  # fmt: skip


def _ort_session(model: Any, threads: int) -> Callable[[dict[str, np.ndarray]], Any] | None:
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    o = ort.SessionOptions()
    o.intra_op_num_threads = threads
    o.inter_op_num_threads = 1
    o.log_severity_level = 3
    s = ort.InferenceSession(model.SerializeToString(), o, providers=["CPUExecutionProvider"])
    return lambda feeds: s.run(None, feeds)


def bench_sessions(quick: bool, threads: int) -> str:
    """Latency of opstrata (levels 2 and 3) and onnxruntime per model; ratio to onnxruntime."""
    rows = []
    repeats, number = (5, 3) if quick else (21, 10)
    for name, model, dims in _models(quick):
        feeds = random_feeds(model, dims)
        cands: dict[str, Callable[[], object]] = {}
        for lvl in (2, 3):
            sess = InferenceSession(model, SessionOptions(graph_optimization_level=lvl))
            cands[f"opstrata L{lvl}"] = lambda s=sess, f=feeds: s.run(None, f)
        ort_run = _ort_session(model, threads)
        if ort_run is not None:
            cands["onnxruntime"] = lambda r=ort_run, f=feeds: r(f)
        t = compare(cands, repeats=repeats, number=number, warmup=2)
        base = t["onnxruntime"].median if "onnxruntime" in t else None
        for cand, tm in t.items():
            ratio = f"{tm.median / base:.2f}x" if base else "n/a"
            rows.append((name, cand, f"{tm.median * 1e3:.3f}", ratio))
    return format_table(("model", "runtime", "median ms", "vs onnxruntime"), rows)


def bench_allocator(quick: bool) -> str:
    """alloc+free pair cost against np.empty, and fragmentation after a randomized trace."""
    rows = []
    repeats, number = (5, 200) if quick else (15, 2000)
    for nbytes in (4 << 10, 256 << 10, 4 << 20):
        alloc = CachingAllocator()
        alloc.free(alloc.allocate(nbytes))  # warm: the segment is cached

        def pair(a: CachingAllocator = alloc, n: int = nbytes) -> None:
            a.free(a.allocate(n))

        def pair_array(a: CachingAllocator = alloc, n: int = nbytes) -> None:
            a.free(a.empty(n, np.uint8))

        t = compare(
            {"allocate+free": pair, "empty+free (array)": pair_array, "np.empty": lambda n=nbytes: np.empty(n, np.uint8)},
            repeats=repeats, number=number,
        )  # fmt: skip
        base = t["np.empty"].median
        for cand, tm in t.items():
            rows.append((f"{nbytes >> 10} KiB", cand, f"{tm.median * 1e6:.2f}", f"{tm.median / base:.2f}x"))
    table = format_table(("size", "operation", "median us", "vs np.empty"), rows)
    # randomized trace: log-uniform sizes 512 B .. 4 MiB, 60% allocs, frees of random live blocks
    rng = np.random.default_rng(0)
    alloc = CachingAllocator()
    live = []
    peak_live = 0
    for _ in range(500 if quick else 5000):
        if rng.random() < 0.6 or not live:
            live.append(alloc.allocate(int(math.exp(rng.uniform(math.log(512), math.log(4 << 20))))))
        else:
            alloc.free(live.pop(int(rng.integers(len(live)))))
        peak_live = max(peak_live, alloc.stats()["allocated_bytes"])
    s = alloc.stats()
    trace = (
        f"randomized trace ({s['num_alloc']} allocs, {s['num_free']} frees, log-uniform 512 B - 4 MiB): "
        f"fragmentation {s['fragmentation']:.3f}, allocated {s['allocated_bytes'] / 2**20:.1f} MiB, "
        f"reserved {s['reserved_bytes'] / 2**20:.1f} MiB (reserved / peak allocated "
        f"{s['peak_reserved_bytes'] / max(s['peak_allocated_bytes'], 1):.2f}), "
        f"cache hit rate {s['cache_hits'] / max(s['num_alloc'], 1):.3f}"
    )
    return table + "\n\n" + trace


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small models, few repeats (a smoke run)")
    p.add_argument("--threads", type=int, default=1, help="BLAS and onnxruntime intra-op threads (default 1)")
    args = p.parse_args()
    limit: Any = contextlib.nullcontext()
    try:
        from threadpoolctl import threadpool_limits

        limit = threadpool_limits(args.threads)
        note = f"numpy BLAS limited to {args.threads} thread(s) with threadpoolctl; onnxruntime intra_op_num_threads={args.threads}"
    except ImportError:
        note = f"threadpoolctl not installed: numpy BLAS uses its default threads; onnxruntime intra_op_num_threads={args.threads}"
    with limit:
        print(f"# InferenceSession vs onnxruntime ({note})\n")
        print(bench_sessions(args.quick, args.threads))
        print("\n# CachingAllocator vs np.empty\n")
        print(bench_allocator(args.quick))


if __name__ == "__main__":
    main()
