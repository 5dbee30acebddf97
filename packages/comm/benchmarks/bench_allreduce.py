"""all_reduce bus bandwidth: opstrata shm (and tcp) vs torch.distributed gloo and mpi4py, in one run.

busbw = bytes * 2(n-1)/n / time (NCCL's definition: comparable across world sizes). Per run, a figure is the
median over iterations of the slowest rank's time; runs of the peers alternate which goes first, round
after round, and the table shows the median over rounds. Ratios compare busbw measured in the same run.
Run: python packages/comm/benchmarks/bench_allreduce.py --quick
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # torch's OpenMP threads must not spin against the ranks

import numpy as np

MiB = 1 << 20


def _iters(nbytes: int, quick: bool) -> int:
    if quick:
        return 8 if nbytes <= MiB else (4 if nbytes <= 16 * MiB else 3)
    return 20 if nbytes <= MiB else 8


def _opstrata_rank(
    rank: int, world: int, sizes: list[int], quick: bool, algos: list[str | None]
) -> list[tuple[int, str, str, float]]:
    """(bytes, label, algorithm used, median s) per size and algorithm; algorithms interleave per iteration."""
    from opstrata import comm
    from opstrata.comm._api import _default

    group = _default("bench")
    rows = []
    for nbytes in sizes:
        x = np.ones(nbytes // 4, np.float32)
        times: dict[str | None, list[float]] = collections.defaultdict(list)
        for a in algos:
            comm.all_reduce(x, algorithm=a)  # warm-up (page faults, slot rings)
        for it in range(_iters(nbytes, quick)):
            for a in algos if it % 2 == 0 else algos[::-1]:
                x[:] = 1.0
                comm.barrier()
                t0 = time.perf_counter()
                comm.all_reduce(x, algorithm=a)
                t = np.array([time.perf_counter() - t0])
                comm.all_reduce(t, op="max", algorithm="direct")
                times[a].append(float(t[0]))
        for a in algos:
            used, _why = group.select("all_reduce", nbytes, a)
            rows.append((nbytes, "auto" if a is None else a, used, statistics.median(times[a])))
    return rows


def _gloo_rank(
    rank: int, world: int, sizes: list[int], quick: bool, port: int
) -> list[tuple[int, str, str, float]]:
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
        rows.append((nbytes, "gloo", "gloo ring", statistics.median(times)))
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


def _mpi_run(world: int, sizes_mib: str, quick: bool) -> list[tuple[int, str, str, float]]:
    cmd = ["mpiexec", "-n", str(world), sys.executable, os.path.abspath(__file__), "--mpi-child"]
    cmd += ["--sizes-mib", sizes_mib] + (["--quick"] if quick else [])
    out = subprocess.run(cmd, capture_output=True, text=True, env=os.environ, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"mpiexec failed ({out.returncode}): {out.stderr[-500:]}")
    rows = []
    for line in out.stdout.splitlines():
        if line.startswith("MPIROW"):
            _, nb, t = line.split()
            rows.append((int(nb), "mpi4py", "MPI_Allreduce", float(t)))
    return rows


def _memcpy(nbytes: int) -> float:
    a, b = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
    np.copyto(b, a)
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(b, a)
        ts.append(time.perf_counter() - t0)
    return nbytes / statistics.median(ts) / 1e9


def _busbw(world: int, nbytes: int, t: float) -> float:
    return nbytes * 2 * (world - 1) / world / t / 1e9


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print a markdown table."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer iterations")
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--sizes-mib", default="1,16,64")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of alternating peer order (median)")
    ap.add_argument("--tcp", action="store_true", help="also measure opstrata over tcp")
    ap.add_argument("--algos", default="ring,double_tree", help="explicit opstrata algorithms besides auto")
    ap.add_argument("--mpi-child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    sizes = [int(s) * MiB for s in a.sizes_mib.split(",")]
    if a.mpi_child:
        _mpi_child(sizes, a.quick)
        return 0
    from opstrata.comm.testing import free_port, run_ranks

    algos: list[str | None] = [None, *[x for x in a.algos.split(",") if x]]
    peers: dict[str, object] = {}
    for backend in ("shm", "tcp") if a.tcp else ("shm",):
        peers[f"opstrata {backend}"] = lambda w, b=backend: (
            run_ranks(
                _opstrata_rank, w, backend=b, args=(sizes, a.quick, algos), timeout=900, comm_timeout=300
            )[0].value
        )
    skipped = []
    if importlib.util.find_spec("torch") is not None:
        peers["torch gloo"] = lambda w: (
            run_ranks(_gloo_rank, w, backend=None, args=(sizes, a.quick, free_port()), timeout=900)[0].value
        )
    else:
        skipped.append("torch gloo: torch not installed")
    if importlib.util.find_spec("mpi4py") is not None and shutil.which("mpiexec"):
        peers["mpi4py"] = lambda w: _mpi_run(w, a.sizes_mib, a.quick)
    else:
        skipped.append("mpi4py: mpi4py or mpiexec not installed")

    print(f"memcpy (64 MiB np.copyto, median of 5): {_memcpy(64 * MiB):.2f} GB/s; {os.cpu_count()} cores")
    print(f"rounds={a.rounds} (peer order alternates), OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}\n")
    print("| peer | n | size | algorithm | ms | busbw GB/s | shm auto vs this |")
    print("|---|---|---|---|---|---|---|")
    for world in (int(w) for w in a.worlds.split(",")):
        samples: dict[tuple[str, int, str], list[float]] = collections.defaultdict(list)
        used: dict[tuple[str, int, str], str] = {}
        names = list(peers)
        for rd in range(a.rounds):
            for name in names if rd % 2 == 0 else names[::-1]:
                for nbytes, label, algo, t in peers[name](world):  # type: ignore[operator]
                    samples[(name, nbytes, label)].append(t)
                    used[(name, nbytes, label)] = algo
        for nbytes in sizes:
            ref = statistics.median(samples[("opstrata shm", nbytes, "auto")])
            for (name, nb, label), ts in samples.items():
                if nb != nbytes:
                    continue
                t = statistics.median(ts)
                algo = used[(name, nb, label)]
                shown = f"auto: {algo}" if label == "auto" else algo
                ratio = "" if (name, label) == ("opstrata shm", "auto") else f"{t / ref:.2f}x"
                print(
                    f"| {name} | {world} | {nbytes // MiB} MiB | {shown} | {t * 1e3:.2f} | "
                    f"{_busbw(world, nbytes, t):.2f} | {ratio} |",
                    flush=True,
                )
    for s in skipped:
        print(f"skipped: {s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
