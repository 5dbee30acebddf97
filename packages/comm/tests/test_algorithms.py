"""double_tree and hierarchical: tree shapes, simulated multi-host groups, failure propagation across levels."""

from __future__ import annotations

import os

import pytest
from _cases import multi_host_cases, multi_host_dies

from opstrata.comm import _double_tree as dtree
from opstrata.comm.testing import free_port, run_ranks, shm_leftovers


@pytest.mark.parametrize("n", range(1, 33))
def test_double_tree_shapes(n: int) -> None:
    """Both trees span every rank with at most two children; few ranks are interior in both (NCCL's point)."""
    interior = [0] * n
    for which in (0, 1):
        ds = dtree.depths(n, which)
        assert ds.count(0) == 1 and max(ds) <= n.bit_length()
        for r in range(n):
            parent, children = dtree.tree_of(n, r, which)
            assert len(children) <= 2
            assert all(dtree.tree_of(n, c, which)[0] == r for c in children)
            assert (parent is None) == (ds[r] == 0)
            interior[r] += bool(children)
    if n % 2 == 0:
        assert max(interior) == 1  # mirror: every rank is a leaf in one of the two trees


@pytest.mark.parametrize(
    "hosts",
    [["a", "a", "b", "b"], ["a", "b", "a"], ["a", "a", "a", "b", "b"]],
    ids=["2x2", "interleaved-2+1", "3+2"],
)
def test_hierarchical_on_simulated_hosts(hosts: list[str]) -> None:
    job = f"hier{len(hosts)}x{os.getpid()}"
    res = run_ranks(
        multi_host_cases,
        len(hosts),
        backend=None,
        args=(hosts, free_port()),
        env={"OPSTRATA_COMM_JOB_ID": job, "OPSTRATA_COMM_TREE_CHUNK": "65536"},
        timeout=150,
    )
    bad = [b for r in res for b in r.value]
    assert not bad, "\n".join(bad[:20])
    assert shm_leftovers(job) == []


@pytest.mark.parametrize("victim", [3, 0])
def test_hierarchical_rank_killed_raises_on_both_hosts(victim: int) -> None:
    job = f"hierk{victim}x{os.getpid()}"
    hosts = ["a", "a", "b", "b"]
    res = run_ranks(
        multi_host_dies,
        4,
        backend=None,
        args=(hosts, free_port(), victim),
        env={"OPSTRATA_COMM_JOB_ID": job},
        check=False,
        timeout=60,
    )
    assert res[victim].exitcode == -9
    for r in sorted(set(range(4)) - {victim}):
        v = res[r].value
        assert res[r].ok and v["error"] == "CommPeerError", (r, res[r].error, v)
        assert v["after"] < 20 + 5, v
    assert shm_leftovers(job) == []
