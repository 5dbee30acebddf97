"""Cost of the heartbeat: all_reduce time with each group's heartbeat thread running vs stopped.

Both variants run the same all_reduce on the same group; between rounds every rank stops (or restarts) the
group's heartbeat thread, so the only difference is the liveness machinery (a thread beating through the
store every ``--interval`` s, and a dict lookup in blocked waits). Rounds alternate which variant goes
first; the table shows medians of the slowest rank's per-call time and the ratio on / off (1.00: free).
The interval is shortened (default 0.05 s, 20x the default rate) to make any cost visible.

    python packages/comm/benchmarks/bench_heartbeat.py            # --quick for a smoke run
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

KiB = 1 << 10


def _rank(rank: int, world: int, sizes: list[int], iters: int, rounds: int) -> dict:
    from opstrata import comm
    from opstrata.comm import _api, _heartbeat

    g = _api._S.default
    assert g is not None
    interval, timeout = _heartbeat.settings()

    def set_heartbeat(on: bool) -> None:
        if g.transport.heartbeat is not None:
            g.transport.heartbeat.stop()
            g.transport.heartbeat = None
        if on:
            g.transport.heartbeat = _heartbeat.Heartbeat(
                g.store, g.rank, g.size, interval=interval, timeout=timeout, name="bench-hb"
            )

    times: dict[str, list[float]] = {}
    for n in sizes:
        x = np.zeros(n // 4, np.float32)  # stays finite however many calls
        for r in range(rounds):
            for on in (True, False) if r % 2 == 0 else (False, True):
                set_heartbeat(on)
                comm.barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    comm.all_reduce(x)
                times.setdefault(f"{n}/{'on' if on else 'off'}", []).append(
                    (time.perf_counter() - t0) / iters
                )
    set_heartbeat(True)
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--interval", type=float, default=0.05)
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 rounds of 20 calls")
    a = ap.parse_args(argv)
    if a.quick:
        a.rounds, a.iters = 2, 20
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ["OPSTRATA_COMM_HEARTBEAT_INTERVAL"] = str(a.interval)
    os.environ["OPSTRATA_COMM_HEARTBEAT_TIMEOUT"] = str(max(10.0, 3 * a.interval))
    from opstrata.comm.testing import run_ranks

    sizes = [4 * KiB, 1024 * KiB]
    res = run_ranks(_rank, a.world, args=(sizes, a.iters, a.rounds), timeout=1800, comm_timeout=300)
    print(
        f"{a.world} ranks over shm, heartbeat every {a.interval} s, {a.rounds} alternating rounds x {a.iters} calls"
    )
    print("| message | heartbeat on us/call | off us/call | on / off |")
    print("|---|---|---|---|")
    for n in sizes:
        med = {}
        for v in ("on", "off"):
            per_round = zip(*(r.value[f"{n}/{v}"] for r in res), strict=True)  # slowest rank per round
            med[v] = statistics.median(max(t) for t in per_round)
        print(
            f"| {n // KiB} KiB | {med['on'] * 1e6:.1f} | {med['off'] * 1e6:.1f} | {med['on'] / med['off']:.3f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
