"""Timing: candidates run interleaved, round by round in a seeded shuffled order, each sample calibrated.

Interleaving puts every candidate under the same background load (other processes, thermal and
frequency drift), so per-round ratios compare like with like on a noisy shared machine.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping

__all__ = ["calibrate", "interleave"]


def calibrate(fn: Callable[[], object], min_time: float = 2e-3) -> int:
    """Calls per sample so that one sample lasts at least ``min_time`` seconds (timeit's autorange)."""
    number = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        if time.perf_counter() - t0 >= min_time or number >= 1 << 20:
            return number
        number *= 2


def interleave(
    candidates: Mapping[str, Callable[[], object]], *, rounds: int = 20, warmup: int = 2,
    min_time: float = 2e-3, seed: int = 0, on_round: Callable[[int], None] | None = None,
) -> dict[str, list[float]]:  # fmt: skip
    """Seconds per call of each candidate, one sample per round; sample i of each is from round i.

    ``on_round(i)`` is called after each measured round (1-based), e.g. to advance a progress display.
    """
    if rounds < 3:
        raise ValueError(f"interleave: rounds must be >= 3 for a confidence interval, got {rounds}")
    numbers = {name: calibrate(fn, min_time) for name, fn in candidates.items()}
    order = list(candidates)
    rng = random.Random(seed)
    samples: dict[str, list[float]] = {name: [] for name in order}
    for r in range(warmup + rounds):
        rng.shuffle(order)
        for name in order:
            fn, n = candidates[name], numbers[name]
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            dt = (time.perf_counter() - t0) / n
            if r >= warmup:
                samples[name].append(dt)
        if r >= warmup and on_round is not None:
            on_round(r - warmup + 1)
    return samples
