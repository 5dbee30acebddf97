"""GradientBucketer: bucket layout, async bucketed averaging against numpy on 2 and 3 ranks, error paths."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _parallel_cases import DP_SHAPES, dp_grad, dp_params, dp_rank, dp_timeout_rank
from hypothesis import given, settings, strategies as st

from opstrata import comm
from opstrata.comm import GradientBucketer
from opstrata.comm.testing import run_ranks

MB = 1024 * 1024


# --------------------------------------------------------------------------- layout (no process group needed)


def _layout(b: GradientBucketer) -> list[list[str]]:
    return [bk.names for bk in b.buckets]


def test_buckets_fill_in_reverse_order_and_split_at_the_cap() -> None:
    p = {"a": np.zeros(100, np.float32), "b": np.zeros(100, np.float32), "c": np.zeros(100, np.float32)}
    assert _layout(GradientBucketer(p, bucket_cap_mb=800 / MB)) == [["c", "b"], ["a"]]  # 800 B: exactly two
    assert _layout(GradientBucketer(p, bucket_cap_mb=799 / MB)) == [["c"], ["b"], ["a"]]
    assert _layout(GradientBucketer(p, bucket_cap_mb=1200 / MB)) == [["c", "b", "a"]]
    big = {"a": np.zeros(10, np.float32), "big": np.zeros(1000, np.float32), "c": np.zeros(10, np.float32)}
    b = GradientBucketer(big, bucket_cap_mb=100 / MB)  # a parameter larger than the cap gets its own bucket
    assert _layout(b) == [["c"], ["big"], ["a"]] and b.buckets[1].nbytes == 4000
    mixed = {"a": np.zeros(4, np.float32), "b": np.zeros(4, np.float64), "c": np.zeros(4, np.float32)}
    assert _layout(GradientBucketer(mixed, bucket_cap_mb=1.0)) == [
        ["c"],
        ["b"],
        ["a"],
    ]  # one dtype per bucket
    assert _layout(GradientBucketer(dp_params(), bucket_cap_mb=25)) == [
        ["scale"],
        ["b2", "w2"],
        ["b1", "w1", "emb"],
    ]


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(
        st.tuples(st.integers(0, 300), st.sampled_from(["float32", "float64", "float16"])),
        min_size=1,
        max_size=12,
    ),
    cap=st.integers(1, 2000),
)
def test_layout_properties(sizes: list[tuple[int, str]], cap: int) -> None:
    params = {f"p{i}": np.zeros(n, d) for i, (n, d) in enumerate(sizes)}
    b = GradientBucketer(params, bucket_cap_mb=cap / MB)
    assert [n for bk in b.buckets for n in bk.names] == list(params)[::-1]
    for bk in b.buckets:
        assert all(params[n].dtype == bk.dtype for n in bk.names)
        assert bk.nbytes <= cap or len(bk.names) == 1
        assert bk.buffer.size == sum(params[n].size for n in bk.names)
    for prev, nxt in zip(b.buckets, b.buckets[1:], strict=False):  # a bucket closes only when it had to
        first = params[nxt.names[0]]
        assert first.dtype != prev.dtype or prev.nbytes + first.nbytes > cap


# --------------------------------------------------------------------------- error paths


def test_add_grad_errors_name_the_parameter_and_the_fix() -> None:
    b = GradientBucketer({"w": np.zeros((4, 3), np.float32), "bias": np.zeros(4, np.float32)})
    with pytest.raises(KeyError, match=r"unknown parameter 'bais'; did you mean 'bias'"):
        b.add_grad("bais", np.zeros(4, np.float32))
    with pytest.raises(
        ValueError, match=r"gradient of 'w' is float32\[3, 4\], expected the parameter's float32\[4, 3\]"
    ):
        b.add_grad("w", np.zeros((3, 4), np.float32))
    with pytest.raises(ValueError, match=r"gradient of 'w' is float64\[4, 3\].*astype\(np.float32\)"):
        b.add_grad("w", np.zeros((4, 3), np.float64))
    b.add_grad("bias", np.ones(4, np.float32))  # one bucket, still waiting for 'w': nothing launched
    with pytest.raises(ValueError, match=r"'bias' already has a gradient this step"):
        b.add_grad("bias", np.ones(4, np.float32))
    with pytest.raises(ValueError, match=r"no gradient this step for 1 parameter\(s\) \['w'\].*add zeros"):
        b.wait(timeout=1)
    assert b.launched == 0
    with pytest.raises(RuntimeError, match=r"GradientBucketer: the default process group is not initialised"):
        b.add_grad("bias", np.ones(4, np.float32))  # the step was reset: adding again is fine ...
        b.add_grad("w", np.ones((4, 3), np.float32))  # ... and completing the bucket needs a group


def test_constructor_errors() -> None:
    with pytest.raises(ValueError, match="bucket_cap_mb must be a positive number"):
        GradientBucketer({"a": np.zeros(2)}, bucket_cap_mb=0)
    with pytest.raises(ValueError, match="op must be 'avg' or 'sum'"):
        GradientBucketer({"a": np.zeros(2)}, op="max")
    with pytest.raises(TypeError, match="parameter 'a' has dtype int32; gradients need a float dtype"):
        GradientBucketer({"a": np.zeros(2, np.int32)})
    with pytest.raises(TypeError, match="parameter 'a' must be a numpy array"):
        GradientBucketer({"a": [1.0, 2.0]})
    with pytest.raises(ValueError, match="'a' appears twice"):
        GradientBucketer([("a", np.zeros(2)), ("a", np.zeros(2))])
    with pytest.raises(ValueError, match="no parameters"):
        GradientBucketer({})


# --------------------------------------------------------------------------- across processes


@pytest.mark.parametrize(
    ("world", "cap_mb", "overlap"),
    [(2, 25.0, True), (2, 2000 / MB, True), (3, 1000 / MB, True), (3, 1e-9, True), (2, 1e-9, False)],
)
def test_bucketed_average_matches_numpy(world: int, cap_mb: float, overlap: bool) -> None:
    steps = 2
    res = run_ranks(dp_rank, world, args=(cap_mb, steps, overlap), timeout=120)
    for step in range(steps):
        for name, _, dtype in DP_SHAPES:
            want = np.mean([dp_grad(name, step, r).astype(np.float64) for r in range(world)], axis=0)
            for r in res:
                got = r.value["grads"][step][name]
                assert got.dtype == np.dtype(dtype)
                np.testing.assert_allclose(got, want, rtol=1e-6 if dtype == "float32" else 1e-12, atol=1e-7)
    for r in res:
        assert r.value["synced"]  # broadcast_parameters gave every rank the last rank's values
        if r.rank % 2 == 0:  # overlap: the first bucket went out while later gradients were still to come
            assert r.value["early"] == [1 if overlap else 0] * steps


def test_wait_timeout_names_the_bucket_and_is_bounded(tmp_path: Path) -> None:
    res = run_ranks(dp_timeout_rank, 2, args=(str(tmp_path / "timed_out"),), timeout=90, comm_timeout=30)
    r0 = res[0].value
    assert "GradientBucketer.wait: bucket 0 of 3" in r0["msg"] and "within 0.5 s" in r0["msg"]
    assert r0["elapsed"] < 2.0
    assert res[1].value["msg"] == ""  # the late rank found its peer's buckets waiting


def test_world_of_one_is_the_identity() -> None:
    def body(rank: int, world: int) -> None:
        pass

    run_ranks(_single, 1)


def _single(rank: int, world: int) -> None:
    b = comm.GradientBucketer(dp_params(), bucket_cap_mb=1.0)
    for n, _, _ in DP_SHAPES[::-1]:
        b.add_grad(n, dp_grad(n, 0, 0))
    got = b.wait(timeout=10)
    for n, _, _ in DP_SHAPES:
        np.testing.assert_array_equal(got[n], dp_grad(n, 0, 0))
