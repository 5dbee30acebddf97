"""Side-by-side timing for benchmarks: interleaved A/B runs, alternating order, medians and ratios.

A shared 2-core machine makes absolute times noise; a ratio of medians measured in the same run,
with the candidates interleaved so drift hits both alike, is the figure worth reporting.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Timing", "compare", "format_table"]


@dataclass(frozen=True)
class Timing:
    """Median and all samples (seconds) of one candidate."""

    name: str
    median: float
    samples: tuple[float, ...]


def _time_once(fn: Callable[[], object], number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def compare(
    candidates: dict[str, Callable[[], object]], *, repeats: int = 7, number: int = 1, warmup: int = 1
) -> dict[str, Timing]:
    """Time each candidate ``repeats`` times, rotating which goes first each round; return medians."""
    names = list(candidates)
    for name in names:
        for _ in range(warmup):
            candidates[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(_time_once(candidates[name], number))
    return {n: Timing(n, statistics.median(s), tuple(s)) for n, s in samples.items()}


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub-flavoured markdown table (benchmarks print it; docs/benchmarks.md keeps it)."""
    cells = [[str(c) for c in row] for row in rows]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines)
