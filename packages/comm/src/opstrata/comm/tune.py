"""``opstrata-comm-tune`` / ``python -m opstrata.comm.tune``: measure which algorithm wins per message size.

For each backend and world size it spawns the ranks once; they time every algorithm of every collective
at every size (rounds alternate the algorithm order; the median of the slowest rank's time counts).
Winners become thresholds at the geometric mean between measured sizes, written atomically to this
machine's thresholds file (see ``_tuning``), which every process group then reads.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from ._algorithms import SUPPORTED
from ._tuning import Rule, save, thresholds_path

TUNED = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter")
KiB = 1 << 10


def _call(comm, coll: str, algo: str, nbytes: int, world: int, bufs: dict) -> None:
    """One timed collective on zero-filled buffers (repeated sums stay finite)."""
    n = max(1, nbytes // 4)
    if coll == "all_reduce":
        comm.all_reduce(bufs.setdefault(("x", n), np.zeros(n, np.float32)), algorithm=algo)
    elif coll == "reduce":
        comm.reduce(bufs.setdefault(("x", n), np.zeros(n, np.float32)), 0, algorithm=algo)
    elif coll == "broadcast":
        comm.broadcast(bufs.setdefault(("x", n), np.zeros(n, np.float32)), 0, algorithm=algo)
    else:  # all_gather / reduce_scatter: nbytes is the whole gathered / scattered buffer
        part = max(1, n // world)
        big = bufs.setdefault(("big", part), np.zeros(part * world, np.float32))
        small = bufs.setdefault(("small", part), np.zeros(part, np.float32))
        if coll == "all_gather":
            comm.all_gather(big, small, algorithm=algo)
        else:
            comm.reduce_scatter(small, big, algorithm=algo)


def _algos(coll: str, world: int) -> list[str]:
    """Candidates: hierarchical needs several hosts (chosen by topology); gather-side halving needs 2^k."""
    pow2 = world & (world - 1) == 0
    return [
        a
        for a in SUPPORTED[coll]
        if a != "hierarchical" and (pow2 or a != "halving_doubling" or coll in ("all_reduce",))
    ]


def measure_rank(rank: int, world: int, sizes: list[int], colls: list[str], rounds: int, iters: int) -> dict:
    """Rank body: {(coll, algo, bytes): median seconds of the slowest rank} (run by ``run_ranks``)."""
    from opstrata import comm

    cases = [(c, a, s) for c in colls for s in sizes for a in _algos(c, world)]
    bufs: dict = {}
    times = np.zeros((rounds, len(cases)))
    for rd in range(rounds):
        for s in sizes:
            for c in colls:
                algos = _algos(c, world)
                for a in algos if rd % 2 == 0 else algos[::-1]:  # alternate who goes first
                    _call(comm, c, a, s, world, bufs)  # warm-up: page faults, slot rings
                    comm.barrier()
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        _call(comm, c, a, s, world, bufs)
                    times[rd, cases.index((c, a, s))] = (time.perf_counter() - t0) / iters
    comm.all_reduce(times, op="max")  # the slowest rank's time is the collective's time
    return {case: float(statistics.median(times[:, i])) for i, case in enumerate(cases)}


def rules_from(
    backend: str, world: int, timings: dict, sizes: list[int], tolerance: float = 0.05
) -> list[Rule]:
    """Winner per size, merged into [(max bytes, algo)] with bounds at geometric means between sizes.

    The previous size's winner is kept while it is within ``tolerance`` of the fastest, so timing noise
    between near-equal algorithms does not fragment the table.
    """
    rules = []
    for coll in sorted({c for c, _, _ in timings}):
        winners: list[str] = []
        for s in sorted(sizes):
            opts = {a: t for (c, a, sz), t in timings.items() if c == coll and sz == s}
            best = min(opts, key=opts.__getitem__)
            prev = winners[-1] if winners else None
            keep = prev in opts and opts[prev] <= opts[best] * (1 + tolerance)
            winners.append(prev if keep and prev is not None else best)
        upto: list[tuple[int | None, str]] = []
        for i, w in enumerate(winners):
            if i + 1 < len(winners) and winners[i + 1] == w:
                continue
            bound = None if i + 1 == len(winners) else int((sorted(sizes)[i] * sorted(sizes)[i + 1]) ** 0.5)
            upto.append((bound, w))
        rules.append(Rule(backend, coll, world, tuple(upto)))
    return rules


def main(argv: list[str] | None = None) -> int:
    """Measure, print the table and write the thresholds file."""
    from .testing import run_ranks

    ap = argparse.ArgumentParser(prog="opstrata-comm-tune", description=__doc__)
    ap.add_argument("--backends", default="shm,tcp", help="comma list (default shm,tcp)")
    ap.add_argument("--worlds", default="2,3,4", help="world sizes to measure (default 2,3,4)")
    ap.add_argument("--sizes-kib", default="4,32,256,1024,4096,16384", help="message sizes in KiB")
    ap.add_argument("--collectives", default=",".join(TUNED))
    ap.add_argument("--rounds", type=int, default=3, help="alternating-order rounds (median)")
    ap.add_argument("--iters", type=int, default=3, help="calls per timing")
    ap.add_argument("--quick", action="store_true", help="2 ranks, shm, 4/256/4096 KiB, 1 round")
    ap.add_argument("--output", help="write here instead of the machine's cache file")
    ap.add_argument("--dry-run", action="store_true", help="measure and print, write nothing")
    a = ap.parse_args(argv)
    if a.quick:
        a.backends, a.worlds, a.sizes_kib, a.rounds = "shm", "2", "4,256,4096", 1
    colls = a.collectives.split(",")
    for c in colls:
        if c not in TUNED:
            ap.error(f"--collectives: {c!r} is not tunable; choose from {TUNED}")
    sizes = sorted(int(s) * KiB for s in a.sizes_kib.split(","))
    rules: list[Rule] = []
    t_start = time.monotonic()
    for backend in a.backends.split(","):
        for world in (int(w) for w in a.worlds.split(",")):
            res = run_ranks(
                measure_rank,
                world,
                backend=backend,
                args=(sizes, colls, a.rounds, a.iters),
                timeout=1800,
                comm_timeout=300,
                env={"OPSTRATA_COMM_ALGO": ""},
            )
            timings = res[0].value
            new = rules_from(backend, world, timings, sizes)
            rules += new
            for r in new:
                spans = ", ".join(f"{'inf' if b is None else f'<= {b} B'}: {al}" for b, al in r.upto)
                print(f"{backend:>3} world {world} {r.collective:<14} {spans}", flush=True)
    took = time.monotonic() - t_start
    if a.dry_run:
        print(f"measured in {took:.0f}s (dry run: nothing written)")
        return 0
    from pathlib import Path

    path = save(
        rules,
        Path(a.output) if a.output else thresholds_path(),
        extra={"command": " ".join(["opstrata-comm-tune", *(argv if argv is not None else sys.argv[1:])])},
    )
    print(f"measured in {took:.0f}s; thresholds written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
