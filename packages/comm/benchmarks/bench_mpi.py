"""all_reduce over MPI: opstrata's algorithms on the mpi transport vs MPI's own Allreduce vs opstrata shm.

One ``mpiexec -n N`` launch per world size. Inside, every rank holds a default group on backend 'mpi' and a
second group on backend 'shm' over the same processes, so four variants run interleaved in one job (the
order rotates every iteration): mpi4py ``Allreduce`` straight on a communicator (the baseline), opstrata
``algorithm='native'`` (the same MPI call behind opstrata's checks and worker thread), opstrata's own
algorithm on the mpi transport (table choice) and opstrata on shm. Each figure is the median over
iterations of the slowest rank's time; busbw = bytes * 2(n-1)/n / time (NCCL's definition).

Run: python packages/comm/benchmarks/bench_mpi.py --quick
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

MiB = 1 << 20
VARIANTS = ("mpi4py Allreduce", "opstrata native", "opstrata mpi", "opstrata shm")


def _iters(nbytes: int, quick: bool) -> int:
    if quick:
        return 8 if nbytes <= MiB else (4 if nbytes <= 16 * MiB else 3)
    return 30 if nbytes <= MiB else (10 if nbytes <= 16 * MiB else 6)


def _child(sizes: list[int], quick: bool) -> None:
    """One rank: time every variant, interleaved, and print rank 0's rows."""
    from mpi4py import MPI

    from opstrata import comm
    from opstrata.comm import _algorithms as alg

    comm.init_process_group("mpi", timeout=600)
    shm = comm.new_group(backend="shm")
    raw = MPI.COMM_WORLD.Dup()
    world, rank = raw.Get_size(), raw.Get_rank()

    def run(variant: str, x: np.ndarray) -> None:
        if variant == "mpi4py Allreduce":
            raw.Allreduce(MPI.IN_PLACE, x, MPI.SUM)
        elif variant == "opstrata native":
            comm.all_reduce(x, algorithm="native")
        elif variant == "opstrata mpi":
            comm.all_reduce(x)
        else:
            comm.all_reduce(x, group=shm)

    for nbytes in sizes:
        x = np.ones(nbytes // 4, np.float32)
        for v in VARIANTS:  # warm-up: page faults, staging buffers, slot rings
            run(v, x)
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for i in range(_iters(nbytes, quick)):
            k = i % len(VARIANTS)
            for v in VARIANTS[k:] + VARIANTS[:k]:  # rotate which variant goes first
                x.fill(1.0)
                raw.Barrier()
                t0 = time.perf_counter()
                run(v, x)
                times[v].append(raw.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        if rank == 0:
            base = statistics.median(times[VARIANTS[0]])
            for v in VARIANTS:
                t = statistics.median(times[v])
                algo = {
                    "mpi4py Allreduce": "MPI_Allreduce",
                    "opstrata native": "native",
                    "opstrata mpi": alg.select("all_reduce", nbytes, world, None)[0],
                    "opstrata shm": alg.select("all_reduce", nbytes, world, None)[0],
                }[v]
                bus = nbytes * 2 * (world - 1) / world / t / 1e9
                print(
                    f"| {v:<16} | {world} | {nbytes // MiB:>3} MiB | {algo:<16} | {t * 1e3:9.2f} | "
                    f"{bus:10.2f} | {base / t:8.2f}x |",
                    flush=True,
                )
    comm.destroy_process_group()
    raw.Free()


def _mpiexec() -> str | None:
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.is_file() else shutil.which("mpiexec")


def main(argv: list[str] | None = None) -> int:
    """Launch one mpiexec job per world size and print a markdown table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations")
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--sizes-mib", default="1,16,64")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    sizes = [int(s) * MiB for s in a.sizes_mib.split(",")]
    if a.child:
        _child(sizes, a.quick)
        return 0
    exe = _mpiexec()
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        exe = None
    if exe is None:
        print(
            'needs mpi4py and mpiexec: pip install "opstrata-comm[mpi]" mpich (or: pip install mpich mpi4py)'
        )
        return 1
    print(f"mpiexec: {exe}; busbw = bytes*2(n-1)/n/time; 'vs mpi4py' = mpi4py Allreduce time / this time\n")
    print("| variant          | n | size    | algorithm        | time (ms) | busbw GB/s | vs mpi4py |")
    print("|------------------|---|---------|------------------|-----------|------------|-----------|")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("OPSTRATA_COMM_ALGO", None)
    for world in (int(w) for w in a.worlds.split(",")):
        cmd = [exe, "-n", str(world), sys.executable, __file__, "--child", "--sizes-mib", a.sizes_mib]
        if a.quick:
            cmd.append("--quick")
        p = subprocess.run(cmd, env=env, timeout=1800)
        if p.returncode:
            print(f"mpiexec -n {world} failed with exit code {p.returncode}")
            return p.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
