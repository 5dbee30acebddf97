"""Interleaved latency measurement: two callables timed in alternating turns, medians compared."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

__all__ = ["interleaved_medians"]


def interleaved_medians(
    first: Callable[[], object],
    second: Callable[[], object],
    *,
    repeats: int = 30,
    warmup: int = 2,
    budget_s: float = 5.0,
    block: int = 1,
    settle_s: float = 0.0,
    warm_s: float = 0.0,
) -> tuple[float, float]:
    """Median seconds of `first` and `second`, run in turns (A B, B A, ...) so drift hits both alike.

    Each turn runs `block` timed calls; with `block` > 1 the turn waits `settle_s` first and then makes
    untimed calls for `warm_s` seconds (at least one), so that a runtime whose idle workers spin after a
    run (onnxruntime's pool spins ~25 ms) neither slows the other side's turn nor loses its own
    back-to-back speed, and both are timed at their steady state. Stops after
    `repeats` turns each or once `budget_s` is spent (at least 3 turns either way).
    """
    for _ in range(warmup):
        first()
        second()
    times: tuple[list[float], list[float]] = ([], [])
    pair = (first, second)
    start = time.perf_counter()
    for i in range(max(repeats, 3)):
        order = (0, 1) if i % 2 == 0 else (1, 0)
        for k in order:
            if block > 1:
                if settle_s > 0:
                    time.sleep(settle_s)
                warm_until = time.perf_counter() + warm_s
                pair[k]()  # the turn's first call: the pool wakes, caches refill
                while time.perf_counter() < warm_until:
                    pair[k]()
            for _ in range(block):
                t0 = time.perf_counter()
                pair[k]()
                times[k].append(time.perf_counter() - t0)
        if i >= 2 and time.perf_counter() - start > budget_s:
            break
    return statistics.median(times[0]), statistics.median(times[1])
