"""Interleaved timing helper used by every benchmark."""

from __future__ import annotations

import statistics
import time

import numpy as np
import pytest

import opstrata.ops as ops
from opstrata.ops.benchtools import compare, format_table


def test_compare_rotates_order_and_reports_medians() -> None:
    order: list[str] = []
    cands = {n: (lambda n=n: order.append(n)) for n in "abc"}
    timings = compare(cands, repeats=3, warmup=0)
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    for name, t in timings.items():
        assert t.name == name and len(t.samples) == 3
        assert t.median == statistics.median(t.samples)


def test_compare_settles_and_warms_each_turn_untimed() -> None:
    """With warm_s, each turn runs its candidate untimed for that long before the timed block."""
    calls: dict[str, int] = {"a": 0, "b": 0}

    def run(n: str) -> None:
        calls[n] += 1
        time.sleep(0.002)

    timings = compare({n: (lambda n=n: run(n)) for n in "ab"}, repeats=2, warmup=0, number=1, warm_s=0.02)
    assert all(len(t.samples) == 2 for t in timings.values())
    assert all(c >= 2 * (1 + 5) for c in calls.values()), calls  # >= 20 ms of 2 ms calls per turn, + 1 timed


def test_format_table_is_markdown() -> None:
    text = format_table(["op", "x"], [["add", 1.5]])
    assert text.splitlines() == ["| op | x |", "|---|---|", "| add | 1.5 |"]


@pytest.mark.parametrize("groups", [1, 4])
def test_conv_peers_compute_the_same_convolution(groups: int) -> None:
    """Each installed peer (onnxruntime, torch) is a callable computing ops' convolution; a peer that is
    not installed is simply absent."""
    import importlib.util

    from opstrata.ops.benchtools import conv_peers

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 8, 9, 9)).astype(np.float32)
    w = rng.standard_normal((8, 8 // groups, 3, 3)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    peers = conv_peers(x, w, b, stride=2, pad=1, groups=groups)
    want = ops.conv2d(x, w, b, stride=2, padding=1, groups=groups, device="ref")
    expected = {
        n for n, mod in (("onnxruntime", "onnxruntime"), ("torch", "torch")) if importlib.util.find_spec(mod)
    }
    assert set(peers) == expected
    for name, run in peers.items():
        got = run()
        got = got[0] if isinstance(got, list) else got.numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=name)
