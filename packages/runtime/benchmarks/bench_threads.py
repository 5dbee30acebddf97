"""Threads: opstrata / onnxruntime latency at 1 and 2 intra-op threads on each side, the GEMM threshold, the limiter's cost.

Ratios of interleaved medians from one process run: every round times all candidates (opstrata and
onnxruntime at 1 and 2 threads) in an order that alternates between forward and reverse, so neither
side always follows the other. The session limits BLAS itself (``intra_op_num_threads``); onnxruntime
gets ``intra_op_num_threads`` and ``session.intra_op.allow_spinning=0`` (its own pool ignores
``OMP_WAIT_POLICY``; a spinning pool would steal a core from the candidate timed after it on a 2-core
machine; ``--ort-spinning`` keeps onnxruntime's default). ``OPSTRATA_NUM_THREADS`` is set to the
candidate's count before each of its runs: ops' tiled attention kernel reads it for its worker count
(the session cannot pass its count to kernels yet). ``OMP_WAIT_POLICY=PASSIVE`` and
``OPENBLAS_THREAD_TIMEOUT=4`` are set before numpy loads unless already set: OpenBLAS-pthreads' idle
workers otherwise spin ~2^28 cycles (~0.1 s) after each GEMM, the analogue of onnxruntime's spinning pool;
on a loaded machine that spin costs opstrata 2-4x at two threads (measured: BERT block 40-60 ms against
19 ms with the timeout at 4; equal when the machine is quiet).

    PYTHONPATH=packages/ops/src:packages/graph/src:packages/runtime/src \
        python packages/runtime/benchmarks/bench_threads.py [--quick] [--gemm] [--overhead] [--ort-spinning]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # OpenBLAS's idle workers sleep at once (see above)

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from opstrata.graph.testing import bert_block_model, gpt_block_model, mlp_model, random_feeds
from opstrata.ops.benchtools import format_table
from opstrata.runtime import InferenceSession, SessionOptions, thread_info
from opstrata.runtime._blas import BLAS

THREADS = (1, 2)


def _models(quick: bool) -> list[tuple[str, Any, dict[str, int]]]:
    """bench_session.py's bar-built models (tiny ones with ``--quick``)."""
    if quick:
        return [
            ("MLP 64-256-64, batch 16", mlp_model(d_in=64, hidden=256, d_out=64), {"batch": 16}),
            ("BERT block h128, b2 s32", bert_block_model(hidden=128, heads=4, ffn=512), {"batch": 2, "seq": 32}),
            ("GPT block h128, b2 s32", gpt_block_model(hidden=128, heads=4, vocab=500, max_pos=64), {"batch": 2, "seq": 32}),
        ]  # fmt: skip
    return [
        ("MLP 512-2048-512, batch 64", mlp_model(d_in=512, hidden=2048, d_out=512), {"batch": 64}),
        ("BERT block h256 ffn1024, b4 s128", bert_block_model(hidden=256, heads=4, ffn=1024), {"batch": 4, "seq": 128}),
        ("GPT block h256 v2000, b4 s128", gpt_block_model(hidden=256, heads=4, vocab=2000, max_pos=128), {"batch": 4, "seq": 128}),
    ]  # fmt: skip


def _interleaved(cands: dict[str, Callable[[], object]], rounds: int, number: int) -> dict[str, float]:
    """Median seconds per call; rounds alternate forward and reverse candidate order."""
    names = list(cands)
    for n in names:  # warm up: plans, arenas, BLAS pools, onnxruntime's first-run allocations
        cands[n]()
        cands[n]()
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for n in names if r % 2 == 0 else names[::-1]:
            fn = cands[n]
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            samples[n].append((time.perf_counter() - t0) / number)
    return {n: statistics.median(s) for n, s in samples.items()}


def _ort(model: Any, threads: int, spinning: bool) -> Callable[[dict[str, np.ndarray]], Any] | None:
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    o = ort.SessionOptions()
    o.intra_op_num_threads = threads
    o.inter_op_num_threads = 1
    o.log_severity_level = 3
    if not spinning:
        o.add_session_config_entry("session.intra_op.allow_spinning", "0")
    s = ort.InferenceSession(model.SerializeToString(), o, providers=["CPUExecutionProvider"])
    return lambda feeds: s.run(None, feeds)


def _with_env(n: int, run: Callable[[], object]) -> Callable[[], object]:
    def call() -> object:
        os.environ["OPSTRATA_NUM_THREADS"] = str(n)  # ops' attention workers (see the module docstring)
        return run()

    return call


def bench_models(quick: bool, spinning: bool) -> str:
    """opstrata / onnxruntime at each thread count, and how each side scales from 1 to 2 threads."""
    rows = []
    rounds, number = (6, 3) if quick else (20, 5)
    for name, model, dims in _models(quick):
        feeds = random_feeds(model, dims)
        cands: dict[str, Callable[[], object]] = {}
        ref = None
        for n in THREADS:
            sess = InferenceSession(model, SessionOptions(intra_op_num_threads=n))
            cands[f"opstrata {n}"] = _with_env(n, lambda s=sess, f=feeds: s.run(None, f))
            ort_run = _ort(model, n, spinning)
            if ort_run is not None:
                cands[f"onnxruntime {n}"] = lambda r=ort_run, f=feeds: r(f)
                ref = ort_run(feeds)[0] if ref is None else ref
            got = cands[f"opstrata {n}"]()[0]  # type: ignore[index]
            if ref is not None and not np.allclose(got, ref, rtol=1e-3, atol=1e-4):
                raise AssertionError(f"{name}: opstrata at {n} thread(s) disagrees with onnxruntime")
        t = _interleaved(cands, rounds, number)
        for n in THREADS:
            ours, peer = t[f"opstrata {n}"], t.get(f"onnxruntime {n}")
            rows.append((
                name, n, f"{ours * 1e3:.3f}", f"{peer * 1e3:.3f}" if peer else "n/a",
                f"{ours / peer:.2f}x" if peer else "n/a",
                f"{ours / t['opstrata 1']:.2f}x",
                f"{peer / t['onnxruntime 1']:.2f}x" if peer else "n/a",
            ))  # fmt: skip
    return format_table(
        (
            "model",
            "threads",
            "opstrata ms",
            "onnxruntime ms",
            "opstrata / ort",
            "opstrata vs 1 thr",
            "ort vs 1 thr",
        ),
        rows,
    )


def bench_gemm(quick: bool) -> str:
    """float32 GEMM at 1 and 2 BLAS threads by size: where two threads start to pay (the threshold)."""
    shapes = [(32, 64, 256), (64, 64, 256), (32, 128, 512), (32, 256, 256), (48, 256, 256), (64, 256, 256),
              (128, 256, 256), (64, 512, 2048), (512, 512, 512)]  # fmt: skip
    if quick:
        shapes = shapes[:4]
    rng = np.random.default_rng(0)
    rows = []
    found = BLAS.current()
    try:
        for m, k, n in shapes:
            a = rng.standard_normal((m, k), dtype=np.float32)
            b = rng.standard_normal((k, n), dtype=np.float32)
            out = np.empty((m, n), np.float32)
            flops = 2 * m * k * n
            number = max(3, min(400, int(2e9 / flops)))

            def at(
                threads: int, a: np.ndarray = a, b: np.ndarray = b, out: np.ndarray = out
            ) -> Callable[[], object]:
                def call() -> object:
                    BLAS.set(threads)
                    return np.matmul(a, b, out=out)

                return call

            t = _interleaved({"1": at(1), "2": at(2)}, 5 if quick else 11, number)
            rows.append((f"{m}x{k}x{n}", f"{flops / 1e6:.2f}", f"{t['1'] * 1e6:.1f}", f"{t['2'] * 1e6:.1f}",
                         f"{t['2'] / t['1']:.2f}x"))  # fmt: skip
    finally:
        if found is not None:
            BLAS.set(found)
    return format_table(("M x K x N", "MFLOP", "1 thread us", "2 threads us", "2 / 1"), rows)


def bench_overhead(quick: bool) -> str:
    """A tiny MLP's run with the per-run BLAS limit against the same run with the limiter switched off."""
    import opstrata.runtime._blas as blas_mod

    model = mlp_model()
    feeds = random_feeds(model, {"batch": 3})
    rows = []
    real_enter, real_exit = blas_mod.BlasThreads.enter, blas_mod.BlasThreads.exit
    for intra in (1, 2):
        sess = InferenceSession(model, SessionOptions(intra_op_num_threads=intra))

        def limited(s: InferenceSession = sess) -> object:
            return s.run(None, feeds)

        def unlimited(s: InferenceSession = sess) -> object:
            blas_mod.BlasThreads.enter = lambda self, n: ()  # type: ignore[method-assign,assignment,misc]
            blas_mod.BlasThreads.exit = lambda self, saved: None  # type: ignore[method-assign,assignment,misc]
            try:
                return s.run(None, feeds)
            finally:
                blas_mod.BlasThreads.enter, blas_mod.BlasThreads.exit = real_enter, real_exit  # type: ignore[method-assign]

        t = _interleaved({"limited": limited, "off": unlimited}, 7 if quick else 21, 200)
        plan = next(iter(sess._thread_plans.values()))
        rows.append((intra, plan.start, BLAS.current(), f"{t['limited'] * 1e6:.1f}", f"{t['off'] * 1e6:.1f}",
                     f"{(t['limited'] - t['off']) * 1e6:+.1f}"))  # fmt: skip
    headers = ("intra_op_num_threads", "run's BLAS count", "process count", "limited us", "limiter off us")
    table = format_table((*headers, "cost us"), rows)
    found = BLAS.current()
    if found is None:
        return table
    other = 1 if found != 1 else 2
    t = _interleaved(
        {"same": lambda: BLAS.exit(BLAS.enter(found)), "switched": lambda: BLAS.exit(BLAS.enter(other))},
        7 if quick else 21,
        2000,
    )
    return (
        f"{table}\n\nthe limiter alone (enter + exit, medians of 2000): count already right "
        f"{t['same'] * 1e6:.2f} us, switched and restored {t['switched'] * 1e6:.2f} us"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small models, few rounds (a smoke run)")
    p.add_argument("--gemm", action="store_true", help="also the GEMM 1-vs-2-thread sweep (the threshold)")
    p.add_argument("--overhead", action="store_true", help="also the per-run limiter's cost on a tiny MLP")
    p.add_argument("--ort-spinning", action="store_true", help="keep onnxruntime's spinning intra-op pool")
    args = p.parse_args()
    info = thread_info()
    blas = ", ".join(f"{b['internal_api']} {b['version']}" for b in info["blas"]) or "none found"
    print(
        f"# Threads: opstrata vs onnxruntime at 1 and 2 intra-op threads each (physical cores "
        f"{info['physical_cores']}, BLAS {blas}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, "
        f"OPENBLAS_THREAD_TIMEOUT={os.environ.get('OPENBLAS_THREAD_TIMEOUT')}, "
        f"onnxruntime spinning {'on' if args.ort_spinning else 'off'})\n"
    )
    print(bench_models(args.quick, args.ort_spinning))
    if args.gemm:
        print("\n# GEMM: 1 vs 2 BLAS threads by size (interleaved medians)\n")
        print(bench_gemm(args.quick))
    if args.overhead:
        print("\n# Per-run BLAS limit: cost on a tiny MLP (interleaved medians of 200 runs)\n")
        print(bench_overhead(args.quick))


if __name__ == "__main__":
    main()
