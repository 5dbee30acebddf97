"""The ``comm`` suite: opstrata.comm all_reduce across local rank processes, over message sizes.

Ranks are real processes (``opstrata.comm.testing.run_ranks``: spawned, joined with a deadline,
killed past it) on the shared-memory transport. The ranks time themselves: every round visits the
sizes in a seeded shuffled order (the same on every rank), and a sample is the time per call of a
fixed number of back-to-back all_reduce calls after a barrier, taken as the slowest rank's time
(an all_reduce of the times with op max). So sample i of each size comes from round i, as in
``interleave``, and the gate reads the samples alike. Each benchmark carries ``bytes`` and ``ranks``;
bus bandwidth is NCCL-tests' ``busbw = bytes * 2(n-1)/n / time``, algorithm bandwidth ``bytes / time``.
"""

from __future__ import annotations

import os
import random
import re
import time
from typing import Any

import numpy as np

from ._bench_suites import BenchError, BenchOptions, SuiteRun

__all__ = ["DEFAULT_SIZES", "MAX_RANKS", "algbw", "busbw", "format_size", "parse_sizes", "run_comm"]

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
#: 4 KiB .. 16 MiB, x4 apart.
DEFAULT_SIZES = tuple(4 * KiB * 4**i for i in range(7))
MAX_RANKS = 64
_MAX_BYTES = GiB
_UNITS = {
    "": 1,
    "b": 1,
    "k": KiB,
    "kib": KiB,
    "kb": KiB,
    "m": MiB,
    "mib": MiB,
    "mb": MiB,
    "g": GiB,
    "gib": GiB,
    "gb": GiB,
}
_WARMUP = 2
_SEED = 0


def parse_sizes(text: str) -> list[int]:
    """``"4K,64K,1M"`` -> bytes; each a positive multiple of 4 (float32) up to 1 GiB; BenchError otherwise."""
    sizes = []
    for token in (t.strip() for t in text.split(",")):
        m = re.fullmatch(r"(\d+)\s*([A-Za-z]*)", token)
        unit = m.group(2).lower() if m else ""
        if not m or unit not in _UNITS:
            raise BenchError(
                f"--sizes: cannot read {token!r}; expected comma-separated sizes like 4K,64K,1M,16M "
                "(bytes, or K/KiB, M/MiB, G/GiB)"
            )
        n = int(m.group(1)) * _UNITS[unit]
        if n <= 0 or n % 4 or n > _MAX_BYTES:
            raise BenchError(
                f"--sizes: {token!r} is {n} bytes; expected a positive multiple of 4 bytes (float32 elements) "
                f"up to 1 GiB"
            )
        sizes.append(n)
    if len(set(sizes)) != len(sizes):
        raise BenchError(f"--sizes: {text!r} names a size twice; give each size once")
    return sizes


def format_size(n: int) -> str:
    """4096 -> '4KiB', 16777216 -> '16MiB', 100 -> '100B' (exact units only)."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


def busbw(nbytes: int, ranks: int, seconds: float) -> float:
    """Bus bandwidth in GB/s (1e9 bytes): ``bytes * 2(n-1)/n / time``, comparable across rank counts."""
    return nbytes * 2 * (ranks - 1) / ranks / seconds / 1e9


def algbw(nbytes: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s: ``bytes / time``."""
    return nbytes / seconds / 1e9


def calls_per_sample(nbytes: int) -> int:
    """Back-to-back calls in one sample: about 1 MiB moved, 1 to 64 calls (the same on every rank)."""
    return max(1, min(64, MiB // nbytes))


def _rank(rank: int, world: int, sizes: list[int], rounds: int) -> dict[int, list[float]] | None:
    """One rank's loop (spawned by run_ranks after init_process_group); rank 0 returns the samples."""
    from opstrata import comm

    bufs = {n: np.zeros(n // 4, np.float32) for n in sizes}  # zeros: a sum of zeros stays finite
    t = np.zeros(1, np.float64)
    samples: dict[int, list[float]] = {n: [] for n in sizes}
    order = list(sizes)
    rng = random.Random(_SEED)
    for r in range(_WARMUP + rounds):
        rng.shuffle(order)
        for n in order:
            x, calls = bufs[n], calls_per_sample(n)
            comm.barrier()
            t0 = time.perf_counter()
            for _ in range(calls):
                comm.all_reduce(x)
            t[0] = (time.perf_counter() - t0) / calls
            comm.all_reduce(t, op="max")  # the slowest rank's time is the collective's time
            if r >= _WARMUP:
                samples[n].append(float(t[0]))
    return samples if rank == 0 else None


def _remove_leftovers(job: str) -> None:
    """Remove this job's shared-memory segments a killed rank left in /dev/shm."""
    from opstrata.comm.testing import shm_leftovers

    for name in shm_leftovers(job):
        try:
            os.unlink(os.path.join("/dev/shm", name))
        except OSError:
            pass


def run_comm(opts: BenchOptions) -> SuiteRun:
    """all_reduce (float32, sum) across ``opts.ranks`` local processes at each size of ``opts.sizes``."""
    if opts.models is not None:
        raise BenchError("--models selects models of the models and zoo suites; the comm suite has none")
    ranks = opts.ranks
    if isinstance(ranks, bool) or not isinstance(ranks, int) or not 2 <= ranks <= MAX_RANKS:
        raise BenchError(f"--ranks must be an int in 2..{MAX_RANKS} (local processes), got {ranks!r}")
    sizes = list(DEFAULT_SIZES if opts.sizes is None else opts.sizes)
    if not sizes or any(isinstance(n, bool) or not isinstance(n, int) or n <= 0 or n % 4 for n in sizes):
        raise BenchError(f"sizes must be positive multiples of 4 bytes, got {sizes!r}")
    from opstrata.comm.testing import run_ranks

    notes = []
    cores = os.cpu_count() or 1
    if ranks > cores:
        notes.append(f"{ranks} ranks on {cores} cores: ranks share cores, expect lower and noisier bandwidth")
    job = f"bench{os.getpid()}x{time.monotonic_ns() % 10**9}"
    # generous deadlines: a hang ends as an error naming the rank, never as a stuck benchmark
    moved = sum(n * calls_per_sample(n) for n in sizes) * (opts.rounds + _WARMUP)
    timeout = 120.0 + moved / (50 * MiB) * ranks
    opts.say(f"bench comm: all_reduce on {ranks} ranks, {len(sizes)} sizes x {opts.rounds} rounds")
    try:
        results = run_ranks(
            _rank, ranks, backend="shm", args=(sizes, opts.rounds), timeout=timeout, comm_timeout=60.0,
            env={"OPSTRATA_COMM_JOB_ID": job, "OMP_NUM_THREADS": "1"}, check=False,
        )  # fmt: skip
    finally:
        _remove_leftovers(job)
    bad = [r for r in results if not r.ok]
    if bad:
        first = bad[0]
        tail = first.error.strip().splitlines()[-1] if first.error.strip() else "no error text"
        raise BenchError(
            f"bench comm: rank {first.rank} failed (exit code {first.exitcode}): {tail}; "
            f"{len(bad)} of {ranks} ranks failed within {timeout:.0f} s. Fix: rerun with fewer --ranks or "
            "smaller --sizes, or set OPSTRATA_COMM_DEBUG=1 for the ranks' logs"
        )
    got: dict[int, list[float]] = results[0].value
    samples: dict[str, list[float]] = {}
    meta: dict[str, dict[str, Any]] = {}
    for n in sizes:
        name = f"all_reduce/{format_size(n)}"
        samples[name] = got[n]
        meta[name] = {"op": "all_reduce", "dtype": "float32", "backend": "shm", "bytes": n, "ranks": ranks,
                      "calls_per_sample": calls_per_sample(n)}  # fmt: skip
    return SuiteRun(samples, meta, notes)
