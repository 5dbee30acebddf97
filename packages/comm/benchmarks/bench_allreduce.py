"""all_reduce bus bandwidth: opstrata shm and tcp vs torch gloo / mpi4py (when installed), with a memcpy ceiling.

busbw = bytes * 2(n-1)/n / time (NCCL's definition: comparable across world sizes). Each figure is the
median over iterations of the slowest rank's time. Run: python packages/comm/benchmarks/bench_allreduce.py --quick
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

MiB = 1 << 20


def _iters(nbytes: int, quick: bool) -> int:
    if quick:
        return 10 if nbytes <= MiB else (4 if nbytes <= 16 * MiB else 3)
    return 30 if nbytes <= MiB else 10


def _opstrata_rank(rank: int, world: int, sizes: list[int], quick: bool) -> list[tuple[int, str, float]]:
    from opstrata import comm
    from opstrata.comm import _algorithms as alg

    rows = []
    for nbytes in sizes:
        x = np.ones(nbytes // 4, np.float32)
        comm.all_reduce(x)  # warm-up (page faults, slot rings)
        times = []
        for _ in range(_iters(nbytes, quick)):
            comm.barrier()
            t0 = time.perf_counter()
            comm.all_reduce(x)
            t = np.array([time.perf_counter() - t0])
            comm.all_reduce(t, op="max")
            times.append(float(t[0]))
        rows.append((nbytes, alg.select("all_reduce", nbytes, world, None)[0], statistics.median(times)))
    return rows


def _gloo_rank(
    rank: int, world: int, sizes: list[int], quick: bool, port: int
) -> list[tuple[int, str, float]]:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")
    rows = []
    for nbytes in sizes:
        x = torch.ones(nbytes // 4, dtype=torch.float32)
        dist.all_reduce(x)
        times = []
        for _ in range(_iters(nbytes, quick)):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            times.append(float(t[0]))
        rows.append((nbytes, "gloo", statistics.median(times)))
    dist.destroy_process_group()
    return rows


def _mpi_child(sizes: list[int], quick: bool) -> None:
    from mpi4py import MPI

    c = MPI.COMM_WORLD
    for nbytes in sizes:
        x = np.ones(nbytes // 4, np.float32)
        y = np.empty_like(x)
        c.Allreduce(x, y)
        times = []
        for _ in range(_iters(nbytes, quick)):
            c.Barrier()
            t0 = time.perf_counter()
            c.Allreduce(x, y)
            times.append(c.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        if c.rank == 0:
            print(f"MPIROW {nbytes} {statistics.median(times)}", flush=True)


def _memcpy(nbytes: int) -> float:
    a, b = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
    np.copyto(b, a)
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(b, a)
        ts.append(time.perf_counter() - t0)
    return nbytes / min(ts) / 1e9


def _line(name: str, world: int, nbytes: int, algo: str, t: float) -> str:
    bus = nbytes * 2 * (world - 1) / world / t / 1e9
    return f"| {name:<14} | {world} | {nbytes // MiB:>4} MiB | {algo:<16} | {t * 1e3:9.2f} | {bus:7.2f} |"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print a markdown table."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer iterations")
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--sizes-mib", default="1,16,64")
    ap.add_argument("--mpi-child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    sizes = [int(s) * MiB for s in a.sizes_mib.split(",")]
    if a.mpi_child:
        _mpi_child(sizes, a.quick)
        return 0
    from opstrata.comm.testing import free_port, run_ranks

    print(f"memcpy ceiling (64 MiB np.copyto): {_memcpy(64 * MiB):.2f} GB/s\n")
    print("| transport      | n | size     | algorithm        | time (ms) | busbw GB/s |")
    print("|----------------|---|----------|------------------|-----------|------------|")
    base: dict[tuple[int, int], float] = {}
    for world in (int(w) for w in a.worlds.split(",")):
        for backend in ("shm", "tcp"):
            res = run_ranks(
                _opstrata_rank, world, backend=backend, args=(sizes, a.quick), timeout=900, comm_timeout=300
            )
            for nbytes, algo, t in res[0].value:
                print(_line(f"opstrata {backend}", world, nbytes, algo, t), flush=True)
                if backend == "shm":
                    base[(world, nbytes)] = t
        if importlib.util.find_spec("torch") is not None:
            res = run_ranks(_gloo_rank, world, backend=None, args=(sizes, a.quick, free_port()), timeout=900)
            for nbytes, algo, t in res[0].value:
                ratio = t / base[(world, nbytes)]
                print(_line("torch gloo", world, nbytes, algo, t) + f" shm is {ratio:.1f}x gloo", flush=True)
        else:
            print(f"| torch gloo     | {world} | (torch not installed: skipped) |")
        if importlib.util.find_spec("mpi4py") is not None and shutil.which("mpiexec"):
            cmd = [
                "mpiexec",
                "-n",
                str(world),
                sys.executable,
                __file__,
                "--mpi-child",
                "--sizes-mib",
                a.sizes_mib,
            ]
            out = subprocess.run(
                cmd + (["--quick"] if a.quick else []), capture_output=True, text=True, env=os.environ
            )
            for line in out.stdout.splitlines():
                if line.startswith("MPIROW"):
                    _, nb, t = line.split()
                    print(_line("mpi4py", world, int(nb), "MPI_Allreduce", float(t)), flush=True)
        else:
            print(f"| mpi4py         | {world} | (mpi4py/mpiexec not installed: skipped) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
