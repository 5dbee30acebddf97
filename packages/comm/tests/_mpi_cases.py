"""Rank-side bodies of the MPI tests (run by _mpi_main.py under mpiexec)."""

from __future__ import annotations

import functools
import os
import time

import numpy as np
from _cases import UFUNC, all_cases, data, deterministic_cases, groups_and_p2p

from opstrata import ops


def _last(name: str) -> str:
    """The flight-recorder line of this rank's last collective (proves which path ran)."""
    from opstrata.comm import _api

    assert _api._S.default is not None
    return str(_api._S.default.recorder[-1])


def reference(world: int, n: int, dtype: np.dtype, op: str, seed: int = 0) -> np.ndarray:
    """Rank-order fold, low-precision floats (bf16, fp16, fp8) in float32, cast back once."""
    acc = np.float32 if dtype in ops.LOW_PRECISION_DTYPES else dtype
    out = functools.reduce(UFUNC[op], [data(r, n, dtype, op, seed).astype(acc) for r in range(world)])
    return np.asarray(out / world if op == "avg" else out).astype(dtype)


def native_cases(rank: int, world: int) -> list[str]:
    """Every collective with algorithm='native' (MPI's own) x every ops dtype against the numpy reference."""
    from opstrata import comm

    bad: list[str] = []

    def check(name: str, got: np.ndarray, want: np.ndarray, exact: bool = True) -> None:
        ok = (
            np.array_equal(got, want)
            if exact
            else np.allclose(got.astype(np.float64), want.astype(np.float64), atol=1e-2)
        )
        if not ok:
            bad.append(f"rank {rank}: native {name}: got {got.ravel()[:6]} want {want.ravel()[:6]}")
        if "algo=native" not in _last(name):
            bad.append(f"rank {rank}: native {name} did not run natively: {_last(name)}")

    root = world - 1
    for dtype in ops.ALL_DTYPES:
        for n in (1, 37, 3001):
            x = data(rank, n, dtype)
            comm.all_reduce(x, algorithm="native")
            check(f"all_reduce {dtype} n={n}", x, reference(world, n, dtype, "sum"))
            x = data(rank, n, dtype)
            orig = x.copy()
            comm.reduce(x, root, algorithm="native")
            check(f"reduce {dtype} n={n}", x, reference(world, n, dtype, "sum") if rank == root else orig)
            y = data(rank, n, dtype, seed=5) if rank == root else np.zeros(n, dtype)
            comm.broadcast(y, root, algorithm="native")
            check(f"broadcast {dtype} n={n}", y, data(root, n, dtype, seed=5))
            out = np.zeros((world, n), dtype)
            comm.all_gather(out, data(rank, n, dtype), algorithm="native")
            check(f"all_gather {dtype} n={n}", out, np.stack([data(r, n, dtype) for r in range(world)]))
            xs = data(rank, world * n, dtype)
            keep = xs.copy()
            o = np.zeros(n, dtype)
            comm.reduce_scatter(o, xs, algorithm="native")
            want = reference(world, world * n, dtype, "sum")[rank * n : (rank + 1) * n]
            check(f"reduce_scatter {dtype} n={n}", o, want)
            if not np.array_equal(xs, keep):
                bad.append(f"rank {rank}: native reduce_scatter modified its input")
    for op in ("sum", "avg", "max", "min", "prod"):
        for dtype in (np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int32), np.dtype(np.bool_)):
            if op == "avg" and dtype.kind != "f":
                continue
            x = data(rank, 50, dtype, op)
            comm.all_reduce(x, op, algorithm="native")
            check(f"all_reduce op={op} {dtype}", x, reference(world, 50, dtype, op), exact=op != "avg")
            x = data(rank, 50, dtype, op)
            comm.reduce(x, 0, op, algorithm="native")
            if rank == 0:
                check(f"reduce op={op} {dtype}", x, reference(world, 50, dtype, op), exact=op != "avg")
            xs, o = data(rank, 50 * world, dtype, op), np.zeros(50, dtype)
            comm.reduce_scatter(o, xs, op, algorithm="native")
            want = reference(world, 50 * world, dtype, op)[rank * 50 : (rank + 1) * 50]
            check(f"reduce_scatter op={op} {dtype}", o, want, exact=op != "avg")
    # list forms, async, and the env switch for collectives without an algorithm argument
    outs = [np.zeros(5, np.float32) for _ in range(world)]
    comm.all_gather(outs, data(rank, 5, np.dtype(np.float32)), algorithm="native")
    check(
        "all_gather list", np.stack(outs), np.stack([data(r, 5, np.dtype(np.float32)) for r in range(world)])
    )
    parts = [data(rank, 7, np.dtype(np.float64), seed=j) for j in range(world)]
    o = np.zeros(7)
    comm.reduce_scatter(o, parts, algorithm="native")
    check("reduce_scatter list", o, reference(world, 7, np.dtype(np.float64), "sum", seed=rank))
    arrays = [np.full(20000, float(i + rank), np.float32) for i in range(3)]
    works = [comm.all_reduce(a, algorithm="native", async_op=True) for a in arrays]
    for w in works:
        w.wait(timeout=30)
    for i, a in enumerate(arrays):
        if not np.all(a == sum(i + r for r in range(world))):
            bad.append(f"rank {rank}: native async all_reduce {i} got {a[:2]}")
    os.environ["OPSTRATA_COMM_ALGO"] = "native"
    try:
        src = np.repeat(100 * rank + np.arange(world), 3).astype(np.int32)
        dst = np.zeros_like(src)
        comm.all_to_all(dst, src)
        check(
            "all_to_all (OPSTRATA_COMM_ALGO)",
            dst,
            np.repeat(100 * np.arange(world) + rank, 3).astype(np.int32),
        )
        lst = [np.zeros(2, np.int64) for _ in range(world)]
        comm.all_to_all(lst, [np.full(2, 10 * rank + j, np.int64) for j in range(world)])
        check("all_to_all list", np.stack(lst), np.stack([np.full(2, 10 * j + rank) for j in range(world)]))
        x = np.full(9, rank + 1.0)
        comm.all_reduce(x)
        check("all_reduce (OPSTRATA_COMM_ALGO)", x, np.full(9, world * (world + 1) / 2))
        comm.barrier()
        if "barrier" not in _last("barrier") or "algo=native" not in _last("barrier"):
            bad.append(f"rank {rank}: barrier did not run natively: {_last('barrier')}")
    finally:
        del os.environ["OPSTRATA_COMM_ALGO"]
    try:
        comm.all_reduce(np.ones(3, np.float32), algorithm="native", deterministic=True)
        bad.append(f"rank {rank}: native + deterministic=True did not raise")
    except ValueError as e:
        if "deterministic" not in str(e) or "native" not in str(e):
            bad.append(f"rank {rank}: unhelpful native+deterministic error: {e}")
    return bad


def random_shapes(rank: int, world: int) -> list[str]:
    """Seeded random shapes (0-d, empty, multi-dim, sizes not divisible by the world) on every path."""
    from opstrata import comm

    bad = []
    rng = np.random.default_rng(1234)  # the same draws on every rank
    for case in range(12):
        shape = tuple(int(d) for d in rng.integers(0, 9, rng.integers(0, 4)))
        dtype = [np.dtype(np.float32), np.dtype(np.int64), np.dtype(np.float16)][case % 3]
        n = int(np.prod(shape))
        for algo in ("direct", "ring", "tree", "halving_doubling", "native"):
            x = data(rank, n, dtype, seed=case).reshape(shape)
            comm.all_reduce(x, algorithm=algo)
            want = reference(world, n, dtype, "sum", seed=case).reshape(shape)
            if x.shape != shape or not np.array_equal(x, want):
                bad.append(f"rank {rank}: all_reduce {algo} {dtype}{list(shape)} differs from the reference")
        for algo in ("ring", "native"):
            out = np.zeros((world, *shape), dtype)
            comm.all_gather(out, data(rank, n, dtype, seed=case).reshape(shape), algorithm=algo)
            want = np.stack([data(r, n, dtype, seed=case).reshape(shape) for r in range(world)])
            if not np.array_equal(out, want):
                bad.append(f"rank {rank}: all_gather {algo} {dtype}{list(shape)} differs from the reference")
    return bad


def mpi_matrix(rank: int, world: int) -> list[str]:
    """The shm/tcp matrix (every collective x algorithm x dtype), determinism, groups/p2p/async, and native."""
    from opstrata import comm

    bad = []
    if comm.get_backend() != "mpi" or type(comm._api._S.default.transport).__name__ != "MpiTransport":
        bad.append(f"rank {rank}: default group is not on the MPI transport")
    for fn in (all_cases, deterministic_cases, groups_and_p2p, native_cases, random_shapes):
        bad += [f"{fn.__name__}: {b}" for b in fn(rank, world)]
    return bad


def native_late_peer(rank: int, world: int) -> dict:
    """Rank 2 sleeps; rank 1 passes its header check with rank 0 and times out inside MPI_Iallreduce."""
    from opstrata import comm

    if rank == 2:
        time.sleep(5.0)
        return {"error": None}
    t0 = time.monotonic()
    try:
        comm.all_reduce(np.ones(4, np.float32), algorithm="native")
    except comm.CommError as e:
        return {"error": type(e).__name__, "msg": str(e), "after": time.monotonic() - t0}
    return {"error": None}
