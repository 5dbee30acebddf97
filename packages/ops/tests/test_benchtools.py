"""Interleaved timing helper used by every benchmark."""

from __future__ import annotations

import statistics

from opstrata.ops.benchtools import compare, format_table


def test_compare_rotates_order_and_reports_medians() -> None:
    order: list[str] = []
    cands = {n: (lambda n=n: order.append(n)) for n in "abc"}
    timings = compare(cands, repeats=3, warmup=0)
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    for name, t in timings.items():
        assert t.name == name and len(t.samples) == 3
        assert t.median == statistics.median(t.samples)


def test_format_table_is_markdown() -> None:
    text = format_table(["op", "x"], [["add", 1.5]])
    assert text.splitlines() == ["| op | x |", "|---|---|", "| add | 1.5 |"]
