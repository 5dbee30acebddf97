"""InferenceSession latency vs onnxruntime and torch eager (same thread count), and the caching allocator.

Ratios of interleaved medians from one process run (opstrata.ops.benchtools.compare, rotating which
candidate goes first); absolute times on a shared machine are noise. Every runtime gets the same
thread count (``--threads``, default 1): ``OMP_NUM_THREADS`` / ``OPENBLAS_NUM_THREADS`` /
``MKL_NUM_THREADS`` / ``OPSTRATA_NUM_THREADS`` are set before numpy is imported (numpy's BLAS reads
them at load), onnxruntime gets ``intra_op_num_threads``, torch ``set_num_threads``, and
``OMP_WAIT_POLICY=PASSIVE`` keeps torch's and onnxruntime's idle threads from spinning.
The torch module is built from the ONNX model's own initializers and checked against onnxruntime.

    PYTHONPATH=packages/ops/src:packages/graph/src:packages/runtime/src \
        python packages/runtime/benchmarks/bench_session.py [--quick] [--threads N] [--no-allocator]
"""

from __future__ import annotations

import os
import sys


def _pin_threads(argv: list[str]) -> int:
    """``--threads N`` from argv, exported to every BLAS / OpenMP runtime before numpy loads."""
    n = 1
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            n = int(argv[i + 1])
        elif a.startswith("--threads="):
            n = int(a.split("=", 1)[1])
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OPSTRATA_NUM_THREADS"):
        os.environ[var] = str(n)
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return n


THREADS = _pin_threads(sys.argv[1:])

import argparse  # noqa: E402
import math  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from opstrata.graph.testing import bert_block_model, gpt_block_model, mlp_model, random_feeds  # noqa: E402
from opstrata.ops.benchtools import compare, format_table  # noqa: E402
from opstrata.runtime import CachingAllocator, InferenceSession, SessionOptions  # noqa: E402


def _models(quick: bool) -> list[tuple[str, str, Any, dict[str, int]]]:
    """(label, kind, ModelProto, symbolic dims): realistic small sizes, or tiny ones with ``--quick``."""
    if quick:
        return [
            ("MLP 64-256-64, batch 16", "mlp", mlp_model(d_in=64, hidden=256, d_out=64), {"batch": 16}),
            ("BERT block h128, b2 s32", "bert", bert_block_model(hidden=128, heads=4, ffn=512), {"batch": 2, "seq": 32}),
            ("GPT block h128, b2 s32", "gpt", gpt_block_model(hidden=128, heads=4, vocab=500, max_pos=64), {"batch": 2, "seq": 32}),
        ]  # fmt: skip
    return [
        ("MLP 512-2048-512, batch 64", "mlp", mlp_model(d_in=512, hidden=2048, d_out=512), {"batch": 64}),
        ("BERT block h256 ffn1024, b4 s128", "bert", bert_block_model(hidden=256, heads=4, ffn=1024), {"batch": 4, "seq": 128}),
        ("GPT block h256 v2000, b4 s128", "gpt", gpt_block_model(hidden=256, heads=4, vocab=2000, max_pos=128), {"batch": 4, "seq": 128}),
    ]  # fmt: skip


# --------------------------------------------------------------------------- torch eager peers


def _weights(model: Any, prefixes: tuple[str, ...]) -> list[np.ndarray]:
    """The model's weight initializers in creation order (ModelBuilder names them ``<hint>_<n>``)."""
    from onnx import numpy_helper

    return [numpy_helper.to_array(t) for t in model.graph.initializer if t.name.rsplit("_", 1)[0] in prefixes]


def _torch_forward(kind: str, model: Any, dims: dict[str, int], threads: int) -> Callable[..., Any] | None:
    """The same model written in torch eager (as nn.Linear / F.* calls) on the ONNX model's weights."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    torch.set_num_threads(threads)
    ws = [
        torch.from_numpy(np.array(w))
        for w in _weights(model, ("w", "b", "gamma", "beta", "wte", "wpe", "lm_head"))
    ]
    lin = lambda x, w, b: F.linear(x, w, b)  # noqa: E731
    t = lambda w: w.T.contiguous()  # noqa: E731  ONNX MatMul weights are (in, out); nn.Linear stores (out, in)

    if kind == "mlp":
        w1, b1, w2, b2 = ws

        def mlp(x: Any) -> Any:
            return torch.softmax(lin(torch.relu(lin(x, w1, b1)), w2, b2), dim=-1)

        return mlp
    if kind == "bert":
        wq, bq, wk, bk, wv, bv, wo, bo, g1, be1, wf1, bf1, wf2, bf2, g2, be2 = ws
        wq, wk, wv, wo, wf1, wf2 = map(t, (wq, wk, wv, wo, wf1, wf2))
        h = wq.shape[0]
        heads = 4
        d = h // heads

        def bert(x: Any, mask: Any) -> Any:
            b, s, _ = x.shape
            add_mask = (1.0 - mask[:, None, None, :]) * -10000.0
            q, k, v = (
                lin(x, w, bb).view(b, s, heads, d).transpose(1, 2) for w, bb in ((wq, bq), (wk, bk), (wv, bv))
            )
            p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d) + add_mask, dim=-1)
            ctx = (p @ v).transpose(1, 2).reshape(b, s, h)
            h1 = F.layer_norm(lin(ctx, wo, bo) + x, (h,), g1, be1, 1e-5)
            f = lin(F.gelu(lin(h1, wf1, bf1)), wf2, bf2)
            return F.layer_norm(f + h1, (h,), g2, be2, 1e-5)

        return bert
    wte, wpe, g1, be1, wqkv, bqkv, wo, bo, g2, be2, wf1, bf1, wf2, bf2, gf, bef, lm = ws
    wqkv, wo, wf1, wf2, lm = map(t, (wqkv, wo, wf1, wf2, lm))
    h = wte.shape[1]
    heads = 4
    d = h // heads

    def gpt(ids: Any) -> Any:
        b, s = ids.shape
        x = wte[ids] + wpe[torch.arange(s)]
        q, k, v = (
            u.view(b, s, heads, d).transpose(1, 2)
            for u in lin(F.layer_norm(x, (h,), g1, be1, 1e-5), wqkv, bqkv).split(h, dim=-1)
        )
        scores = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(d))
        causal = torch.ones(s, s).triu(1).bool()
        p = torch.softmax(scores.masked_fill(causal, float("-inf")), dim=-1)
        x = x + lin((p @ v).transpose(1, 2).reshape(b, s, h), wo, bo)
        m = lin(F.gelu(lin(F.layer_norm(x, (h,), g2, be2, 1e-5), wf1, bf1), approximate="tanh"), wf2, bf2)
        return F.linear(F.layer_norm(x + m, (h,), gf, bef, 1e-5), lm)

    return gpt


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
    """Latency of opstrata (levels 2 and 3), onnxruntime and torch eager per model; ratios to both peers."""
    rows = []
    repeats, number = (5, 3) if quick else (21, 5)
    for name, kind, model, dims in _models(quick):
        feeds = random_feeds(model, dims)
        cands: dict[str, Callable[[], object]] = {}
        for lvl in (2, 3):
            sess = InferenceSession(model, SessionOptions(graph_optimization_level=lvl))
            cands[f"opstrata L{lvl}"] = lambda s=sess, f=feeds: s.run(None, f)
        ort_run = _ort_session(model, threads)
        expected = ort_run(feeds)[0] if ort_run is not None else None
        if ort_run is not None:
            cands["onnxruntime"] = lambda r=ort_run, f=feeds: r(f)
        fwd = _torch_forward(kind, model, dims, threads)
        if fwd is not None:
            import torch

            targs = [torch.from_numpy(feeds[x.name]) for x in model.graph.input]
            with torch.inference_mode():
                got = fwd(*targs).numpy()
            if expected is not None and not np.allclose(got, expected, rtol=1e-3, atol=1e-4):
                raise AssertionError(f"{name}: torch eager disagrees with onnxruntime: the peer is wrong")

            def torch_run(f: Callable[..., Any] = fwd, a: list[Any] = targs) -> object:
                with torch.inference_mode():
                    return f(*a)

            cands["torch eager"] = torch_run
        for lvl in (2, 3):
            got = cands[f"opstrata L{lvl}"]()[0]  # type: ignore[index]
            if expected is not None and not np.allclose(got, expected, rtol=1e-3, atol=1e-4):
                raise AssertionError(f"{name}: opstrata L{lvl} disagrees with onnxruntime")
        # above one thread, turns settle and warm first: onnxruntime's idle workers spin ~25 ms after a
        # run and held a core through the next candidate's turn (the MLP at two threads: 2.31 vs 1.15 ms)
        turns = {"settle_s": 0.05, "warm_s": 0.03} if THREADS > 1 else {}
        t = compare(cands, repeats=repeats, number=number, warmup=2, **turns)
        base = t["onnxruntime"].median if "onnxruntime" in t else None
        peer = t["torch eager"].median if "torch eager" in t else None
        for cand, tm in t.items():
            ratio = f"{tm.median / base:.2f}x" if base else "n/a"
            vs_torch = f"{tm.median / peer:.2f}x" if peer else "n/a"
            rows.append((name, cand, f"{tm.median * 1e3:.3f}", ratio, vs_torch))
    return format_table(("model", "runtime", "median ms", "vs onnxruntime", "vs torch eager"), rows)


def _per_node_run(sess: InferenceSession, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The previous arena run path on the same session: full feed checks, a fresh value list, then
    ``Schedule.run_arena`` (every node's arguments built, its path chosen and its kernel dispatched per run)."""
    import opstrata.ops as ops

    fs = sess._check_feeds_full(feeds)
    sch = sess._schedule
    with sess._lock, sess._policy(), ops.device(sess.device):
        arena, template = sess._program(tuple(f.shape for f in fs))
        vals = list(template)
        for s, f in zip(sch.input_slots, fs, strict=True):
            vals[s] = f
        sch.run_arena(vals, arena, None, 0)  # type: ignore[arg-type]
        return [np.array(vals[s], copy=True) for s in sch.output_slots]


def bench_per_node_overhead(quick: bool) -> str:
    """Bound per-shape calls (``run``) against the per-node loop (``Schedule.run_arena``), same session."""
    rows = []
    repeats, number = (5, 20) if quick else (21, 50)
    cases = [
        ("BERT block h32 ffn64, b1 s8 (L3: 16 steps; L0: 64)", bert_block_model(hidden=32, heads=4, ffn=64), {"batch": 1, "seq": 8}),
        ("MLP 16-32-16, batch 4", mlp_model(d_in=16, hidden=32, d_out=16), {"batch": 4}),
    ]  # fmt: skip
    if not quick:
        cases.append(("BERT block h256 ffn1024, b4 s128", bert_block_model(hidden=256, heads=4, ffn=1024), {"batch": 4, "seq": 128}))  # fmt: skip
    for name, model, dims in cases:
        feeds = random_feeds(model, dims)
        for lvl in (0, 3):
            sess = InferenceSession(model, SessionOptions(graph_optimization_level=lvl))
            for a, b in zip(sess.run(None, feeds), _per_node_run(sess, feeds), strict=True):
                np.testing.assert_array_equal(a, b)  # the two paths agree bit for bit
            t = compare(
                {"bound calls": lambda s=sess, f=feeds: s.run(None, f),
                 "per-node loop": lambda s=sess, f=feeds: _per_node_run(s, f)},
                repeats=repeats, number=number, warmup=2,
            )  # fmt: skip
            base = t["per-node loop"].median
            for cand, tm in t.items():
                rows.append((name, f"L{lvl}", cand, f"{tm.median * 1e6:.1f}", f"{tm.median / base:.2f}x"))
    return format_table(("model", "level", "arena run path", "median us", "vs per-node loop"), rows)


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
    p.add_argument(
        "--threads", type=int, default=1, help="threads for every runtime (set before numpy loads)"
    )
    p.add_argument("--no-allocator", action="store_true", help="skip the allocator section")
    args = p.parse_args()
    print(
        f"# InferenceSession vs onnxruntime vs torch eager ({THREADS} thread(s) each: OMP/OPENBLAS/MKL/"
        f"OPSTRATA_NUM_THREADS={THREADS}, onnxruntime intra_op_num_threads={THREADS}, "
        f"torch.set_num_threads({THREADS}), OMP_WAIT_POLICY=PASSIVE)\n"
    )
    print(bench_sessions(args.quick, THREADS))
    print("\n# Per-node overhead: bound per-shape calls vs the per-node loop (same session, interleaved)\n")
    print(bench_per_node_overhead(args.quick))
    if not args.no_allocator:
        print("\n# CachingAllocator vs np.empty\n")
        print(bench_allocator(args.quick))


if __name__ == "__main__":
    main()
