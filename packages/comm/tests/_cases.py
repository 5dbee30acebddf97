"""Rank-side test bodies (module-level so spawned ranks can import them)."""

from __future__ import annotations

import functools
import os
import signal
import threading
import time

import ml_dtypes
import numpy as np

DTYPES = [np.dtype(np.float32), np.dtype(np.float64), np.dtype(ml_dtypes.bfloat16), np.dtype(np.int32)]
UFUNC = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply, "avg": np.add}


def data(rank: int, n: int, dtype: np.dtype, op: str = "sum", seed: int = 0) -> np.ndarray:
    """Integer-valued inputs: every reduction order gives exact results (bool: 0/1, so or/and both occur)."""
    rng = np.random.default_rng(1000 * seed + rank)
    if np.dtype(dtype) == np.bool_:
        return rng.integers(0, 2, n).astype(bool)
    vals = rng.choice([-1, 1, 2], n) if op == "prod" else rng.integers(-3, 4, n)
    return vals.astype(dtype)


def reference(world: int, n: int, dtype: np.dtype, op: str, seed: int = 0) -> np.ndarray:
    """Rank-order fold in the accumulation dtype, cast back once."""
    from opstrata import ops

    acc = np.float32 if dtype in ops.LOW_PRECISION_DTYPES else dtype
    xs = [data(r, n, dtype, op, seed).astype(acc) for r in range(world)]
    out = functools.reduce(UFUNC[op], xs)
    if op == "avg":
        out = out / world
    return np.asarray(out).astype(dtype)


def op_is_valid(op: str, dtype: np.dtype) -> bool:
    """comm's rule: avg needs a floating dtype (float8 / bf16 / fp16 included); the other ops take any."""
    from opstrata import ops

    return op != "avg" or np.dtype(dtype).kind == "f" or dtype in ops.LOW_PRECISION_DTYPES


def sizes_for(dtype: np.dtype) -> tuple[int, ...]:
    """float32 gets every size; the 4 main dtypes single- and multi-slot; the rest one small size (time budget)."""
    if dtype == np.float32:
        return (1, 37, 3001)
    return (1, 3001) if dtype in DTYPES else (37,)


def all_cases(rank: int, world: int) -> list[str]:
    """Every collective x algorithm x ops dtype x op on this world against the numpy reference; returns failures.

    Integer-valued inputs make the float32 accumulation of low-precision floats exact, so every
    comparison is exact; ``low_precision_cases`` checks real-valued low-precision inputs.
    """
    from opstrata import comm, ops
    from opstrata.comm._algorithms import SUPPORTED

    bad: list[str] = []

    def check(name: str, got: np.ndarray, want: np.ndarray) -> None:
        if got.dtype != want.dtype or not np.array_equal(got, want):
            bad.append(f"rank {rank}: {name}: got {got.ravel()[:6]} want {want.ravel()[:6]}")

    for dtype in ops.ALL_DTYPES:
        for n in sizes_for(dtype):
            for algo in SUPPORTED["all_reduce"]:
                x = data(rank, n, dtype)
                comm.all_reduce(x, algorithm=algo)
                check(f"all_reduce {algo} {dtype} n={n}", x, reference(world, n, dtype, "sum"))
            for algo in SUPPORTED["reduce"]:
                root = world - 1
                x = data(rank, n, dtype)
                orig = x.copy()
                comm.reduce(x, root, algorithm=algo)
                check(
                    f"reduce {algo} {dtype} n={n}",
                    x,
                    reference(world, n, dtype, "sum") if rank == root else orig,
                )
            for algo in SUPPORTED["broadcast"]:
                root = world // 2
                y = data(rank, n, dtype, seed=5) if rank == root else np.zeros(n, dtype)
                comm.broadcast(y, root, algorithm=algo)
                check(f"broadcast {algo} {dtype} n={n}", y, data(root, n, dtype, seed=5))
            for algo in SUPPORTED["all_gather"]:
                x = data(rank, n, dtype)
                out = np.zeros((world, n), dtype)
                comm.all_gather(out, x, algorithm=algo)
                check(
                    f"all_gather {algo} {dtype} n={n}",
                    out,
                    np.stack([data(r, n, dtype) for r in range(world)]),
                )
            for algo in SUPPORTED["reduce_scatter"]:
                xs = data(rank, world * n, dtype)
                keep = xs.copy()
                o = np.zeros(n, dtype)
                comm.reduce_scatter(o, xs, algorithm=algo)
                check(
                    f"reduce_scatter {algo} {dtype} n={n}",
                    o,
                    reference(world, world * n, dtype, "sum")[rank * n : (rank + 1) * n],
                )
                check(f"reduce_scatter {algo} {dtype} n={n} input unchanged", xs, keep)
            # all_to_all: part j of rank r holds data(r, seed=j)
            src = np.concatenate([data(rank, n, dtype, seed=j) for j in range(world)])
            dst = np.zeros_like(src)
            comm.all_to_all(dst, src)
            want = np.concatenate([data(j, n, dtype, seed=rank) for j in range(world)])
            check(f"all_to_all direct {dtype} n={n}", dst, want)
            if world > 1:  # send / recv around the ring
                nxt, prv = (rank + 1) % world, (rank - 1) % world
                got = np.zeros(n, dtype)
                if rank % 2 == 0:
                    comm.send(data(rank, n, dtype, seed=3), nxt)
                    comm.recv(got, prv)
                else:
                    comm.recv(got, prv)
                    comm.send(data(rank, n, dtype, seed=3), nxt)
                check(f"send/recv {dtype} n={n}", got, data(prv, n, dtype, seed=3))
    # op avg/max/min/prod x every dtype x every reducing collective: float32 through every algorithm, the
    # other dtypes each through one algorithm, rotating so every (op, algorithm) and (op, dtype) pair runs
    # (the op and its dtype handling are shared by every algorithm; sum ran the full product above).
    # Invalid pairs (avg on integers / bool) must raise on every algorithm.
    n = 19
    for k, op in enumerate(("avg", "max", "min", "prod")):
        for i, dtype in enumerate(ops.ALL_DTYPES):

            def algos(name: str, i: int = i, k: int = k, dtype: np.dtype = dtype) -> tuple[str, ...]:
                every = SUPPORTED[name]
                return every if dtype == np.float32 else (every[(i + k) % len(every)],)

            if not op_is_valid(op, dtype):
                for name in ("all_reduce", "reduce", "reduce_scatter"):
                    for algo in SUPPORTED[name]:
                        err = _rejected(name, algo, op, dtype, rank, world, n)
                        if err is None:
                            bad.append(f"rank {rank}: {name} op={op} {algo} {dtype} did not raise")
                        elif name not in err or "avg" not in err or str(dtype) not in err:
                            bad.append(f"rank {rank}: {name} op={op} {dtype}: unhelpful error {err}")
                continue
            want = reference(world, n, dtype, op)
            for algo in algos("all_reduce"):
                x = data(rank, n, dtype, op)
                comm.all_reduce(x, op, algorithm=algo)
                check(f"all_reduce op={op} {algo} {dtype}", x, want)
            for algo in algos("reduce"):
                x = data(rank, n, dtype, op)
                orig = x.copy()
                comm.reduce(x, 0, op, algorithm=algo)
                check(f"reduce op={op} {algo} {dtype}", x, want if rank == 0 else orig)
            for algo in algos("reduce_scatter"):
                o = np.zeros(n, dtype)
                comm.reduce_scatter(o, data(rank, world * n, dtype, op), op, algorithm=algo)
                full = reference(world, world * n, dtype, op)
                check(f"reduce_scatter op={op} {algo} {dtype}", o, full[rank * n : (rank + 1) * n])
    bad += low_precision_cases(rank, world)
    # lists instead of arrays
    x = data(rank, 5, DTYPES[0])
    outs = [np.zeros(5, np.float32) for _ in range(world)]
    comm.all_gather(outs, x)
    check("all_gather list", np.stack(outs), np.stack([data(r, 5, DTYPES[0]) for r in range(world)]))
    # all_to_all: part j of rank r holds 100*r + j
    src = np.repeat(100 * rank + np.arange(world), 3).astype(np.int32)
    dst = np.zeros_like(src)
    comm.all_to_all(dst, src)
    check("all_to_all", dst, np.repeat(100 * np.arange(world) + rank, 3).astype(np.int32))
    comm.barrier()
    return bad


def _rejected(name: str, algo: str, op: str, dtype: np.dtype, rank: int, world: int, n: int) -> str | None:
    """Call a reducing collective that must refuse ``op`` on ``dtype``; its ValueError text, or None."""
    from opstrata import comm

    try:
        if name == "all_reduce":
            comm.all_reduce(data(rank, n, dtype, op), op, algorithm=algo)
        elif name == "reduce":
            comm.reduce(data(rank, n, dtype, op), 0, op, algorithm=algo)
        else:
            comm.reduce_scatter(np.zeros(n, dtype), data(rank, world * n, dtype, op), op, algorithm=algo)
    except ValueError as e:
        return str(e)
    return None


def low_precision_cases(rank: int, world: int) -> list[str]:
    """float16 / bfloat16 / float8 reduce in float32 and are cast back once, on every reducing algorithm.

    Rank 0 contributes 2**(mantissa bits + 1) and every other rank 1: accumulating in the dtype itself
    would round each +1 away, float32 keeps them (exact check). Real-valued inputs are then compared
    with the float32 rank-order fold within one ulp of the dtype (float32 rounding differs per order).
    """
    from opstrata import comm, ops
    from opstrata.comm._algorithms import SUPPORTED

    bad: list[str] = []
    n = 23
    for dtype in ops.LOW_PRECISION_DTYPES:
        fi = ml_dtypes.finfo(dtype)
        big = float(2 ** (fi.nmant + 1))
        mine = np.full(n, big if rank == 0 else 1.0, np.float32).astype(dtype)
        exact = np.full(n, big + (world - 1), np.float32).astype(dtype)
        rng = [np.random.default_rng(77 + r) for r in range(world)]
        xs = [g.standard_normal(n).astype(np.float32).astype(dtype) for g in rng]
        fold = functools.reduce(np.add, [v.astype(np.float32) for v in xs])
        near = fold.astype(dtype).astype(np.float64)

        def close(got: np.ndarray, fold=fold, near=near, fi=fi) -> bool:
            tol = float(fi.eps) * np.abs(near) + float(fi.smallest_subnormal) + 1e-5
            return bool(np.all(np.abs(got.astype(np.float64) - near) <= tol))

        for name in ("all_reduce", "reduce", "reduce_scatter"):
            for algo in SUPPORTED[name]:
                if name == "reduce_scatter":
                    o = np.zeros(n, dtype)
                    comm.reduce_scatter(o, np.tile(mine, world), algorithm=algo)
                    got_big = o
                    o2 = np.zeros(n, dtype)
                    comm.reduce_scatter(o2, np.tile(xs[rank], world), algorithm=algo)
                    got_real = o2
                else:
                    got_big, got_real = mine.copy(), xs[rank].copy()
                    if name == "all_reduce":
                        comm.all_reduce(got_big, algorithm=algo)
                        comm.all_reduce(got_real, algorithm=algo)
                    else:
                        comm.reduce(got_big, 0, algorithm=algo)
                        comm.reduce(got_real, 0, algorithm=algo)
                        if rank != 0:
                            continue
                if not np.array_equal(got_big, exact):
                    bad.append(
                        f"rank {rank}: {name} {algo} {dtype}: {big:g} + {world - 1} ones gave "
                        f"{got_big[:2]}, want {exact[:2]} (not accumulated in float32?)"
                    )
                if not close(got_real):
                    bad.append(
                        f"rank {rank}: {name} {algo} {dtype} real values: {got_real[:4]} want {near[:4]}"
                    )
    return bad


def deterministic_cases(rank: int, world: int) -> list[str]:
    """deterministic=True gives the same bits for every algorithm, equal to the rank-order fold."""
    from opstrata import comm
    from opstrata.comm._algorithms import SUPPORTED

    bad = []
    for dtype in (np.float32, ml_dtypes.bfloat16):
        for n in (33, 40000):
            rng = [np.random.default_rng(r) for r in range(world)]
            xs = [g.standard_normal(n).astype(np.float32) * 10.0 ** g.integers(-3, 4, n) for g in rng]
            want = functools.reduce(np.add, [x.astype(dtype).astype(np.float32) for x in xs]).astype(dtype)
            for algo in SUPPORTED["all_reduce"]:
                x = xs[rank].astype(dtype)
                comm.all_reduce(x, algorithm=algo, deterministic=True)
                if x.tobytes() != want.tobytes():
                    bad.append(
                        f"rank {rank}: deterministic all_reduce {algo} {np.dtype(dtype)} n={n} differs"
                    )
                for ralgo in SUPPORTED["reduce"]:
                    y = xs[rank].astype(dtype)
                    comm.reduce(y, 0, algorithm=ralgo, deterministic=True)
                    if rank == 0 and y.tobytes() != want.tobytes():
                        bad.append(f"rank 0: deterministic reduce {ralgo} differs")
            # reduce_scatter: rank r's part is block r of the same rank-order fold
            m = n // world
            for salgo in SUPPORTED["reduce_scatter"]:
                o = np.zeros(m, dtype)
                comm.reduce_scatter(
                    o, xs[rank][: m * world].astype(dtype), algorithm=salgo, deterministic=True
                )
                if o.tobytes() != want[rank * m : (rank + 1) * m].tobytes():
                    bad.append(
                        f"rank {rank}: deterministic reduce_scatter {salgo} {np.dtype(dtype)} n={n} differs"
                    )
    # the group-wide switch: new_group(deterministic=True) makes every call on it deterministic
    det_group = comm.new_group(list(range(world)), deterministic=True)
    xs = [np.random.default_rng(50 + r).standard_normal(4000).astype(np.float32) * 1e3 for r in range(world)]
    want = functools.reduce(np.add, xs)
    for algo in SUPPORTED["all_reduce"]:
        x = xs[rank].copy()
        comm.all_reduce(x, algorithm=algo, group=det_group)
        if x.tobytes() != want.tobytes():
            bad.append(f"rank {rank}: all_reduce {algo} on a deterministic=True group differs")
    return bad


def groups_and_p2p(rank: int, world: int) -> list[str]:
    """new_group on a subset, send/recv ring, async Work."""
    from opstrata import comm

    bad = []
    g = comm.new_group([0, 2]) if world >= 3 else comm.new_group([0])
    if rank in ([0, 2] if world >= 3 else [0]):
        x = np.full(4, rank + 1.0, np.float32)
        comm.all_reduce(x, group=g)
        want = 4.0 if world >= 3 else 1.0
        if not np.all(x == want):
            bad.append(f"rank {rank}: subgroup all_reduce got {x}")
        if comm.get_world_size(g) != (2 if world >= 3 else 1):
            bad.append("subgroup size")
    elif g is not comm.NON_GROUP_MEMBER:
        bad.append(f"rank {rank}: expected NON_GROUP_MEMBER, got {g}")
    if world > 1:
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        buf = np.zeros(1000, np.float64)
        if rank % 2 == 0:
            comm.send(np.arange(1000, dtype=np.float64) + rank, nxt)
            comm.recv(buf, prv)
        else:
            comm.recv(buf, prv)
            comm.send(np.arange(1000, dtype=np.float64) + rank, nxt)
        if not np.array_equal(buf, np.arange(1000) + prv):
            bad.append(f"rank {rank}: recv got {buf[:3]}")
    # multi-MiB messages on the default slot / socket chunk sizes
    for algo in ("direct", "ring", "tree", "halving_doubling", "double_tree", "hierarchical"):
        x = data(rank, 700_001, np.dtype(np.float32), seed=3)
        comm.all_reduce(x, algorithm=algo)
        if not np.array_equal(x, reference(world, 700_001, np.dtype(np.float32), "sum", seed=3)):
            bad.append(f"rank {rank}: large all_reduce {algo} wrong")
    y = data(0, 600_000, np.dtype(np.float64), seed=4) if rank == 0 else np.zeros(600_000)
    comm.broadcast(y, 0, algorithm="ring")
    if not np.array_equal(y, data(0, 600_000, np.dtype(np.float64), seed=4)):
        bad.append(f"rank {rank}: large ring broadcast wrong")
    works = []
    arrays = [np.full(20000, float(i + rank), np.float32) for i in range(4)]
    for a in arrays:
        works.append(comm.all_reduce(a, async_op=True))
    if not all(isinstance(w, comm.Work) for w in works):
        bad.append("async_op=True must return Work")
    for w in works:
        w.wait(timeout=30)
    if not all(w.is_completed() for w in works):
        bad.append("Work not completed after wait")
    for i, a in enumerate(arrays):
        if not np.all(a == sum(i + r for r in range(world))):
            bad.append(f"rank {rank}: async result {i} wrong: {a[:2]}")
    return bad


def _error_log() -> list[str]:
    """Collect this rank's opstrata.comm ERROR records (the flight-recorder dump on failure)."""
    import logging

    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logging.getLogger("opstrata.comm").addHandler(Keep(level=logging.ERROR))
    return records


def die_mid_all_reduce(rank: int, world: int, victim: int) -> dict:
    """The victim SIGKILLs itself while all_reduces are running; the others time how long they take to raise."""
    from opstrata import comm

    x = np.ones(200000, np.float32)
    log = _error_log()
    if rank == victim:
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    t_kill = time.monotonic() + 0.5
    try:
        for _ in range(100000):
            comm.all_reduce(x, algorithm="ring")
            x[:] = 1.0
    except comm.CommError as e:
        after = time.monotonic() - t_kill
        return {"error": type(e).__name__, "msg": str(e), "after": after, "log": log}
    return {"error": None}


def desync(rank: int, world: int, kind: str) -> dict:
    """Rank 1 calls a different size (or collective) than the others."""
    from opstrata import comm

    try:
        comm.all_reduce(np.ones(4, np.float32))
        if kind == "shape":
            comm.all_reduce(np.ones(5 if rank == 1 else 4, np.float32))
        elif rank == 1:
            comm.broadcast(np.ones(4, np.float32), 0)
        else:
            comm.all_reduce(np.ones(4, np.float32))
    except comm.CommError as e:
        return {"error": type(e).__name__, "msg": str(e)}
    return {"error": None}


def late_peer(rank: int, world: int) -> dict:
    """Rank 1 sleeps past rank 0's timeout."""
    from opstrata import comm

    log = _error_log()
    comm.barrier()  # one completed collective for the flight recorder to show
    if rank == 1:
        time.sleep(4.0)
        return {"error": None}
    t0 = time.monotonic()
    try:
        comm.all_reduce(np.ones(4, np.float32))
    except comm.CommError as e:
        return {"error": type(e).__name__, "msg": str(e), "after": time.monotonic() - t0, "log": log}
    return {"error": None}


def _init_on_host(rank: int, world: int, hosts: list[str], port: int, timeout: float = 30.0) -> None:
    """Join a tcp group as if this rank ran on ``hosts[rank]`` (OPSTRATA_COMM_HOST simulates hosts)."""
    from opstrata import comm

    os.environ["OPSTRATA_COMM_HOST"] = hosts[rank]
    comm.init_process_group(
        "tcp", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}", timeout=timeout
    )


def multi_host_cases(rank: int, world: int, hosts: list[str], port: int) -> list[str]:
    """Simulated hosts: hierarchical is selected by topology, matches the reference, and says why in the log."""
    import logging

    from opstrata import comm

    _init_on_host(rank, world, hosts, port)
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger = logging.getLogger("opstrata.comm")
    logger.addHandler(Keep())
    logger.setLevel(logging.DEBUG)
    bad: list[str] = []
    try:
        for dtype in (np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16), np.dtype(np.int32)):
            for n in (1, 1000, 300_001):
                for op in ("sum", "max"):
                    x = data(rank, n, dtype, op)
                    comm.all_reduce(x, op)
                    if not np.array_equal(x, reference(world, n, dtype, op)):
                        bad.append(f"rank {rank}: hierarchical all_reduce {op} {dtype} n={n}: {x[:4]}")
                for root in range(world):
                    y = data(rank, n, dtype, seed=7) if rank == root else np.zeros(n, dtype)
                    comm.broadcast(y, root)
                    if not np.array_equal(y, data(root, n, dtype, seed=7)):
                        bad.append(f"rank {rank}: hierarchical broadcast root={root} {dtype} n={n}")
        x = data(rank, 64, np.dtype(np.float32))
        comm.all_reduce(x, op="avg")
        if not np.allclose(x, reference(world, 64, np.dtype(np.float32), "avg")):
            bad.append(f"rank {rank}: hierarchical avg")
        # deterministic mode gives the rank-order fold's bits, whatever the topology
        vs = []
        for r in range(world):
            gr = np.random.default_rng(r)
            vs.append((gr.standard_normal(5000) * 10.0 ** gr.integers(-3, 4, 5000)).astype(np.float32))
        v = vs[rank].copy()
        comm.all_reduce(v, deterministic=True)
        if v.tobytes() != functools.reduce(np.add, vs).tobytes():
            bad.append(f"rank {rank}: deterministic all_reduce on {len(set(hosts))} hosts differs")
        # all_gather is hierarchical too (hosts' blocks are not contiguous when hosts interleave)
        for n in (3, 70_001):
            for dtype in (np.dtype(np.float32), np.dtype(np.int64)):
                out = np.zeros((world, n), dtype)
                comm.all_gather(out, data(rank, n, dtype, seed=11))
                if not np.array_equal(out, np.stack([data(r, n, dtype, seed=11) for r in range(world)])):
                    bad.append(f"rank {rank}: hierarchical all_gather {dtype} n={n}")
        # reduce_scatter has no hierarchical algorithm: it runs flat over tcp
        o = np.zeros(5, np.float32)
        comm.reduce_scatter(o, data(rank, 5 * world, np.dtype(np.float32)))
        if not np.array_equal(
            o, reference(world, 5 * world, np.dtype(np.float32), "sum")[5 * rank : 5 * rank + 5]
        ):
            bad.append(f"rank {rank}: reduce_scatter on simulated hosts")
    finally:
        comm.destroy_process_group()
    if not any("all_gather" in m and "algo=hierarchical" in m for m in records):
        bad.append(f"rank {rank}: all_gather was not hierarchical on {len(set(hosts))} hosts")
    hier = [m for m in records if "all_reduce" in m and "algo=hierarchical" in m]
    if not hier or f"group spans {len(set(hosts))} hosts" not in hier[0] or "time=" not in hier[0]:
        bad.append(f"rank {rank}: debug log lacks the hierarchical choice and its reason: {records[:3]}")
    if not any("hierarchical:" in m and "inter-host tcp" in m for m in hier):
        bad.append(f"rank {rank}: debug log lacks the hierarchical layout note: {hier[:2]}")
    return bad


def multi_host_dies(rank: int, world: int, hosts: list[str], port: int, victim: int) -> dict:
    """A rank of a simulated 2-host group SIGKILLs itself mid hierarchical all_reduce."""
    from opstrata import comm

    _init_on_host(rank, world, hosts, port, timeout=20.0)
    x = np.ones(100_000, np.float32)
    if rank == victim:
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    t_kill = time.monotonic() + 0.5
    try:
        for _ in range(100000):
            comm.all_reduce(x, algorithm="hierarchical")
            x[:] = 1.0
    except comm.CommError as e:
        return {"error": type(e).__name__, "msg": str(e), "after": time.monotonic() - t_kill}
    finally:
        comm.destroy_process_group()
    return {"error": None}


def tuned_selection(rank: int, world: int, cache_dirs: list[str], port: int) -> dict:
    """Each rank gets its own OPSTRATA_CACHE_DIR; every rank must still select from rank 0's table."""
    import logging

    from opstrata import comm

    os.environ["OPSTRATA_CACHE_DIR"] = cache_dirs[rank]
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    comm.init_process_group(
        "shm", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}", timeout=30
    )
    logger = logging.getLogger("opstrata.comm")
    logger.addHandler(Keep())
    logger.setLevel(logging.DEBUG)
    try:
        group = comm._api._default("test")
        picks = {nb: group.select("all_reduce", nb, None) for nb in (1024, 8 << 20)}
        x = np.full(1000, rank + 1.0, np.float32)
        comm.all_reduce(x)  # must not desync: every rank uses rank 0's table
        ok = bool(np.all(x == world * (world + 1) / 2))
        comm.all_reduce(x, algorithm="double_tree")
        os.environ["OPSTRATA_COMM_ALGO"] = "tree"
        comm.broadcast(x, 0)
        del os.environ["OPSTRATA_COMM_ALGO"]
    finally:
        comm.destroy_process_group()
    return {"picks": picks, "ok": ok, "log": [m for m in records if "seq=" in m]}


def stopped_peer(rank: int, world: int, victim: int, algorithm: str = "ring") -> dict:
    """The victim SIGSTOPs itself mid all_reduce; survivors time their error, then one SIGKILLs the victim."""
    from opstrata import comm
    from opstrata.comm import _api

    x = np.ones(200000, np.float32)
    comm.barrier()
    if rank == victim:
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGSTOP)).start()
    t_stop = time.monotonic() + 0.5
    try:
        for _ in range(100000):
            comm.all_reduce(x, algorithm=algorithm)
            x[:] = 1.0
    except comm.CommError as e:
        out = {"error": type(e).__name__, "msg": str(e), "after": time.monotonic() - t_stop}
    else:
        return {"error": None}
    store, group = _api._S.store, _api._S.default
    assert store is not None and group is not None
    store.add("hb_test/raised", 1)
    if rank == min(set(range(world)) - {victim}):  # every survivor raised: now the frozen rank may go
        store.wait_count("hb_test/raised", world - 1, 30.0, what="stopped_peer")
        os.kill(group.transport.pids[victim], signal.SIGKILL)
    return out


def stopped_store_host(rank: int, world: int) -> dict:
    """Rank 0, which hosts the TCP store, SIGSTOPs itself mid all_reduce; survivors must not stall on the store."""
    from opstrata import comm
    from opstrata.comm import _api

    x = np.ones(200000, np.float32)
    comm.barrier()
    if rank == 0:
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGSTOP)).start()
    t_stop = time.monotonic() + 0.5
    try:
        for _ in range(100000):
            comm.all_reduce(x)
            x[:] = 1.0
    except comm.CommError as e:
        out = {"error": type(e).__name__, "msg": str(e), "after": time.monotonic() - t_stop}
    else:
        return {"error": None}
    group = _api._S.default
    assert group is not None
    if (
        rank == 1
    ):  # no store to agree through (its host is frozen): give rank 2 time to raise, then end rank 0
        time.sleep(2.0)
        os.kill(group.transport.pids[0], signal.SIGKILL)
    return out


def multi_host_stopped(rank: int, world: int, hosts: list[str], port: int, victim: int) -> dict:
    """``stopped_peer`` on a simulated multi-host tcp group running the hierarchical algorithm.

    Only rank 0 keeps the short heartbeat timeout, so the diagnosis comes from its intra-host wait.
    """
    from opstrata import comm

    if rank != 0:
        os.environ["OPSTRATA_COMM_HEARTBEAT_TIMEOUT"] = "60"
    _init_on_host(rank, world, hosts, port, timeout=300.0)
    try:
        return stopped_peer(rank, world, victim, "hierarchical")
    finally:
        comm.destroy_process_group()


def slow_but_alive(rank: int, world: int, delay: float) -> dict:
    """Rank 1 sleeps past the heartbeat timeout before joining (its heartbeat thread keeps beating)."""
    from opstrata import comm

    x = np.full(1000, float(rank + 1), np.float32)
    if rank == 1:
        time.sleep(delay)
    t0 = time.monotonic()
    comm.all_reduce(x)
    waited = time.monotonic() - t0
    comm.destroy_process_group()
    left = [t.name for t in threading.enumerate() if t.name.startswith("opstrata-comm")]
    return {"sum": float(x[0]), "waited": waited, "threads": left}


def timeout_with_dump(rank: int, world: int, before: int) -> dict:
    """``before`` barriers, then rank 1 sleeps past rank 0's timeout: rank 0's error names the dump file."""
    from opstrata import comm

    for _ in range(before):
        comm.barrier()
    if rank == 1:
        time.sleep(3.0)
        return {"error": None}
    try:
        comm.all_reduce(np.ones(4, np.float32))
    except comm.CommError as e:
        return {"error": type(e).__name__, "msg": str(e)}
    return {"error": None}
