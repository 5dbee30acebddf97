"""Data-parallel step time: gradients all-reduced in async buckets during backward vs after backward.

Both variants run the same model (a stack of ``--layers`` linear+GELU layers of ``--width``, fp32, ops
training kernels) and the same ``GradientBucketer`` buckets; only *when* the buckets are handed to the
communication thread differs (the optimizer update, identical in both, is left out of the timed step):

- ``overlap``: each gradient is added as backward produces it, so a bucket's all-reduce runs while
  backward computes the earlier layers (PyTorch DDP's scheme);
- ``after``: ``GradientBucketer(overlap=False)``: gradients are copied into the same buckets as they
  are produced but every all-reduce starts in ``wait()``, when backward is done (all-reduce after
  backward, with the same buffers and memory traffic).

Each step time is the slowest rank's; the variants are interleaved within one run (in a fresh random
order every round) and the table shows medians, the ratio after / overlap (> 1: overlap is faster) and how much
of the all-reduce time each variant leaves exposed (step minus the compute-only step, over the
communication-only step; both reference steps are measured in the same interleaved rounds).

    python packages/comm/benchmarks/bench_overlap.py            # --quick for a smoke run
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

MiB = 1 << 20


def _rank(rank: int, world: int, layers: int, width: int, batch: int, cap_mb: float, rounds: int) -> dict:
    import opstrata.ops as ops
    from opstrata import comm

    rng = np.random.default_rng(0)
    params = {}
    for i in range(layers):
        params[f"w{i}"] = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        params[f"b{i}"] = np.zeros(width, np.float32)
    eager = comm.GradientBucketer(params, bucket_cap_mb=cap_mb)  # launches each bucket as it fills
    held = comm.GradientBucketer(params, bucket_cap_mb=cap_mb, overlap=False)  # launches all in wait()
    x0 = np.random.default_rng(1 + rank).standard_normal((batch, width)).astype(np.float32)

    sink = {k: np.empty_like(p) for k, p in params.items()}  # the compute-only variant's gradient copies

    def step(overlap: bool | None) -> float:
        comm.barrier()
        t0 = time.perf_counter()
        acts, pre = [x0], []
        for i in range(layers):  # forward
            a = ops.linear(acts[-1], params[f"w{i}"], params[f"b{i}"])
            pre.append(a)
            acts.append(ops.gelu(a))
        g = acts[-1] * (1.0 / acts[-1].size)  # d(mean(out)) / d out
        bucketer = eager if overlap else held
        for i in reversed(range(layers)):  # backward, last layer first
            g = ops.gelu_backward(pre[i], g)
            g, dw, db = ops.linear_backward(acts[i], params[f"w{i}"], g)
            if overlap is None:  # compute only: the same copies, no communication
                np.copyto(sink[f"b{i}"], db)
                np.copyto(sink[f"w{i}"], dw)
                continue
            bucketer.add_grad(f"b{i}", db)  # copied into its bucket either way: same memory traffic
            bucketer.add_grad(f"w{i}", dw)
        if overlap is not None:
            bucketer.wait(timeout=300)
        t = np.array([time.perf_counter() - t0])
        comm.all_reduce(t, op="max")
        return float(t[0])

    zeros = [(n, np.zeros_like(p)) for n, p in reversed(params.items())]

    def comm_only() -> float:
        comm.barrier()
        t0 = time.perf_counter()
        for name, grad in zeros:
            held.add_grad(name, grad)
        held.wait(timeout=300)
        t = np.array([time.perf_counter() - t0])
        comm.all_reduce(t, op="max")
        return float(t[0])

    runs = {
        "overlap": lambda: step(True),
        "after": lambda: step(False),
        "compute": lambda: step(None),
        "comm": comm_only,
    }
    for fn in runs.values():  # warm-up: page faults, slot rings, BLAS buffers
        fn()
    times: dict[str, list[float]] = {k: [] for k in runs}
    # a fresh random order every round (the same on every rank): which variant goes first *and* which
    # one precedes each variant vary — a fixed rotation lets one variant always follow the light
    # communication-only step, which biases it by more than the effect measured here
    order_rng = np.random.default_rng(12345)
    for _ in range(rounds):
        for k in order_rng.permutation(list(runs)):
            times[str(k)].append(runs[str(k)]())
    return {
        "times": times,
        "buckets": len(eager.buckets),
        "nbytes": sum(b.nbytes for b in eager.buckets),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8, help="per-rank batch")
    ap.add_argument("--bucket-cap-mb", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="smoke run: 3 rounds, 4 layers")
    a = ap.parse_args(argv)
    if a.quick:
        a.rounds, a.layers = 3, 4
    # one BLAS thread per rank: the ranks already fill the cores; set before the ranks import numpy
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from opstrata.comm.testing import run_ranks

    res = run_ranks(
        _rank,
        a.world,
        args=(a.layers, a.width, a.batch, a.bucket_cap_mb, a.rounds),
        timeout=1800,
        comm_timeout=300,
    )
    r0 = res[0].value
    ov, af, cp, co = (statistics.median(r0["times"][k]) for k in ("overlap", "after", "compute", "comm"))
    print(
        f"model: {a.layers} x linear({a.width}, {a.width}) + GELU, fp32, {r0['nbytes'] / MiB:.1f} MiB of gradients "
        f"in {r0['buckets']} buckets (cap {a.bucket_cap_mb} MB); per-rank batch {a.batch}; {a.world} ranks over shm; "
        f"{a.rounds} interleaved rounds"
    )
    print("| variant | median step ms |")
    print("|---|---|")
    print(f"| all-reduce after backward | {af * 1e3:.2f} |")
    print(f"| bucketed async during backward | {ov * 1e3:.2f} |")
    print(f"| (forward + backward alone, no communication) | {cp * 1e3:.2f} |")
    print(f"| (gradient all-reduce alone, no compute) | {co * 1e3:.2f} |")
    print(
        f"ratio after / overlap: {af / ov:.2f}x; exposed communication (step - compute alone) as a share of the "
        f"all-reduce alone: after backward {(af - cp) / co:.0%}, bucketed async {(ov - cp) / co:.0%}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
