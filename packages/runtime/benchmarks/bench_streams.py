"""Stream scheduler: run latency with num_streams=1 against 2 (and 4) on models with and without parallelism.

Ratios of interleaved medians from one process run (opstrata.ops.benchtools.compare, which rotates
which candidate goes first each round); absolute times on a shared machine are noise. numpy's BLAS
runs on one thread unless ``--threads`` says otherwise (threadpoolctl), so the streams, not BLAS,
are what can use the second core.

    PYTHONPATH=packages/ops/src:packages/graph/src:packages/runtime/src \
        python packages/runtime/benchmarks/bench_streams.py [--quick] [--threads N]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from opstrata.graph.testing import gpt_block_model, mlp_model, random_feeds
from opstrata.ops.benchtools import compare, format_table
from opstrata.runtime import InferenceSession, SessionOptions
from opstrata.runtime.testing import branches_model


def _models(quick: bool) -> list[tuple[str, Any, dict[str, np.ndarray]]]:
    size, batch = (256, 128) if quick else (512, 256)
    rng = np.random.default_rng(0)
    x = {"x": rng.standard_normal((batch, size), dtype=np.float32)}
    gpt = gpt_block_model(hidden=256, heads=4, vocab=1000, max_pos=128)
    mlp = mlp_model()
    return [
        (f"2 branches x 2 (MatMul {batch}x{size}x{size} + Tanh)", branches_model(branches=2, size=size, batch=batch), x),
        (f"4 branches x 2 (MatMul {batch}x{size}x{size} + Tanh)", branches_model(branches=4, size=size, batch=batch), x),
        ("small MLP 16-32-8, batch 4", mlp, random_feeds(mlp, {"batch": 4})),
        ("GPT block h256, b4 s64", gpt, random_feeds(gpt, {"batch": 4, "seq": 64})),
    ]  # fmt: skip


def bench_streams(quick: bool) -> str:
    """Median run time per stream count, and its ratio to num_streams=1 measured in the same rounds."""
    rows = []
    repeats, number = (5, 3) if quick else (21, 10)
    for name, model, feeds in _models(quick):
        cands: dict[str, Callable[[], object]] = {}
        sessions = []
        want = None
        for n in (1, 2, 4):
            sess = InferenceSession(model, SessionOptions(num_streams=n))
            got = sess.run(None, feeds)
            if want is None:
                want = got
            assert all(np.array_equal(a, b) for a, b in zip(want, got, strict=True)), "results differ"
            sessions.append(sess)
            cands[f"num_streams={n}"] = lambda s=sess, f=feeds: s.run(None, f)
        t = compare(cands, repeats=repeats, number=number, warmup=2)
        base = t["num_streams=1"].median
        for cand, tm in t.items():
            n = int(cand.split("=")[1])
            used = "1"
            if n > 1:
                (prog,) = sessions[[1, 2, 4].index(n)].stream_programs.values()
                used = str(prog.asg.streams_used)
            rows.append((name, cand, used, f"{tm.median * 1e3:.3f}", f"{tm.median / base:.2f}x"))
        for s in sessions:
            s.close()
    return format_table(("model", "session", "streams used", "median ms", "vs num_streams=1"), rows)


def bench_machine(quick: bool) -> str:
    """What the machine gives right now: the same MatMul+Tanh work in one thread vs two plain threads."""
    size, batch = (256, 128) if quick else (512, 256)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((batch, size), dtype=np.float32)
    w = rng.standard_normal((size, size), dtype=np.float32)

    def branch() -> None:
        np.tanh(np.tanh(a @ w) @ w)

    def two_threads() -> None:
        ts = [threading.Thread(target=branch) for _ in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)

    repeats, number = (5, 3) if quick else (21, 10)
    t = compare({"1 thread, 2 branches": lambda: (branch(), branch()), "2 threads, 1 branch each": two_threads},
                repeats=repeats, number=number, warmup=2)  # fmt: skip
    base = t["1 thread, 2 branches"].median
    rows = [(k, f"{v.median * 1e3:.3f}", f"{v.median / base:.2f}x") for k, v in t.items()]
    return format_table(("plain numpy, no runtime", "median ms", "vs 1 thread"), rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller models, few repeats (a smoke run)")
    p.add_argument("--threads", type=int, default=1, help="numpy BLAS threads (default 1)")
    args = p.parse_args()
    limit: Any = contextlib.nullcontext()
    try:
        from threadpoolctl import threadpool_limits

        limit = threadpool_limits(args.threads)
        note = f"numpy BLAS limited to {args.threads} thread(s) with threadpoolctl"
    except ImportError:
        note = "threadpoolctl not installed: numpy BLAS uses its default threads"
    with limit:
        print(f"# num_streams 1 vs 2 vs 4 ({note}; {os.cpu_count()} cores)\n")
        print(bench_streams(args.quick))
        print("\n# reference: the overlap two plain threads get on this machine now (the ceiling)\n")
        print(bench_machine(args.quick))


if __name__ == "__main__":
    main()
