"""Every collective x algorithm x dtype x world size against the numpy reference, on shm and tcp."""

from __future__ import annotations

import pytest
from _cases import all_cases, deterministic_cases, groups_and_p2p

from opstrata.comm.testing import run_ranks

# multi-slot chunking and multi-chunk tree pipelines on small arrays
SMALL_SLOTS = {"OPSTRATA_COMM_SHM_SLOT": "4096", "OPSTRATA_COMM_TREE_CHUNK": "2048"}


@pytest.mark.parametrize("world", range(1, 9))
@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_all_collectives_match_reference(backend: str, world: int) -> None:
    """One spawn of ``world`` ranks runs the whole collective x algorithm x dtype x size matrix."""
    res = run_ranks(all_cases, world, backend=backend, env=SMALL_SLOTS, timeout=240)
    bad = [b for r in res for b in r.value]
    assert not bad, "\n".join(bad[:20])


@pytest.mark.parametrize(("backend", "world"), [("shm", 3), ("shm", 6), ("tcp", 4), ("tcp", 8)])
def test_deterministic_bit_identical_across_algorithms(backend: str, world: int) -> None:
    res = run_ranks(deterministic_cases, world, backend=backend, env=SMALL_SLOTS)
    bad = [b for r in res for b in r.value]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    ("backend", "world", "init"), [("shm", 3, "file"), ("tcp", 2, None), ("shm", 2, None)]
)
def test_groups_p2p_async(backend: str, world: int, init: str | None) -> None:
    res = run_ranks(groups_and_p2p, world, backend=backend, init_method=init)
    bad = [b for r in res for b in r.value]
    assert not bad, "\n".join(bad)
