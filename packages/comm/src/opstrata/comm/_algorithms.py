"""Collective algorithms on flat buffers, and the table that chooses one by message size and world size.

direct: every rank talks to every rank in one round (small messages). ring: reduce-scatter + all-gather
around the ring, chunks pipelined through the transport's slots (Patarasuk & Yuan 2009). tree: binomial
tree reduce / broadcast. halving_doubling: recursive halving reduce-scatter + recursive doubling
all-gather (Rabenseifner 2004; Thakur, Rabenseifner & Gropp 2005) with the MPICH fix-up for world sizes
that are not a power of two. Deterministic mode folds every element in rank order (x0 op x1 op ...). double_tree (NCCL's two
complementary binary trees, chunked) lives in _double_tree.py, hierarchical (multi-host) in _hierarchical.py.
Selection order: per-call ``algorithm=``, ``OPSTRATA_COMM_ALGO``, hierarchical for groups spanning hosts,
thresholds measured by ``opstrata-comm-tune`` on this machine (_tuning.py), then the built-in table.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from . import _double_tree
from ._transport import ReduceFn, Transport

if TYPE_CHECKING:
    from ._tuning import TunedTable

ALGORITHMS = ("direct", "ring", "tree", "halving_doubling", "double_tree", "hierarchical")
KiB, MiB = 1 << 10, 1 << 20

#: Which algorithms each collective implements.
SUPPORTED: dict[str, tuple[str, ...]] = {
    "all_reduce": ALGORITHMS,
    "reduce": ("direct", "ring", "tree", "double_tree"),
    "broadcast": ("direct", "ring", "tree", "double_tree", "hierarchical"),
    "all_gather": ("direct", "ring", "halving_doubling", "hierarchical"),
    "reduce_scatter": ("direct", "ring", "halving_doubling"),
    "all_to_all": ("direct",),
    "barrier": ("direct",),
}

#: The selection table: first row whose byte bound holds (and whose world-size condition holds) wins.
#: (collective, max bytes, world condition, algorithm, why)
THRESHOLDS: tuple[tuple[str, float, str, str, str], ...] = (
    (
        "all_reduce",
        32 * KiB,
        "any",
        "direct",
        "small message: one latency-bound round beats log/linear rounds",
    ),
    (
        "all_reduce",
        1 * MiB,
        "pow2",
        "halving_doubling",
        "medium message, power-of-two world: 2log2(n) rounds, bandwidth-optimal",
    ),
    ("all_reduce", 256 * KiB, "any", "tree", "medium message, non-power-of-two world: log2(n) rounds"),
    (
        "all_reduce",
        float("inf"),
        "any",
        "ring",
        "large message: bandwidth-optimal 2(n-1)/n traffic, chunks pipelined",
    ),
    ("reduce", 64 * KiB, "any", "direct", "small message: one round"),
    ("reduce", 1 * MiB, "any", "tree", "medium message: binomial tree, log2(n) rounds"),
    ("reduce", float("inf"), "any", "ring", "large message: ring reduce-scatter then gather at the root"),
    ("broadcast", 64 * KiB, "any", "direct", "small message: root sends to all in one round"),
    ("broadcast", 4 * MiB, "any", "tree", "medium message: binomial tree, log2(n) rounds"),
    ("broadcast", float("inf"), "any", "ring", "large message: chunked pipeline along the ring"),
    ("all_gather", 32 * KiB, "any", "direct", "small message: one round"),
    ("all_gather", 1 * MiB, "pow2", "halving_doubling", "medium message, power-of-two world: log2(n) rounds"),
    ("all_gather", float("inf"), "any", "ring", "large message: bandwidth-optimal ring"),
    ("reduce_scatter", 32 * KiB, "any", "direct", "small message: one round"),
    (
        "reduce_scatter",
        1 * MiB,
        "pow2",
        "halving_doubling",
        "medium message, power-of-two world: log2(n) rounds",
    ),
    ("reduce_scatter", float("inf"), "any", "ring", "large message: bandwidth-optimal ring"),
    ("all_to_all", float("inf"), "any", "direct", "pairwise exchange is the only all_to_all"),
    ("barrier", float("inf"), "any", "direct", "barrier is a one-round exchange of tokens"),
)


def _pow2(n: int) -> bool:
    return n & (n - 1) == 0


#: Collectives that have a hierarchical algorithm, chosen for groups that span hosts.
HIERARCHICAL = ("all_reduce", "broadcast", "all_gather")


def select(
    collective: str,
    nbytes: int,
    world: int,
    requested: str | None,
    *,
    backend: str = "shm",
    hosts: list[int] | None = None,
    tuned: TunedTable | None = None,
) -> tuple[str, str]:
    """Return (algorithm, reason) for a call; ``requested`` (per call or OPSTRATA_COMM_ALGO) wins if valid.

    ``hosts`` is the number of ranks on each host of the group; ``tuned`` the measured thresholds.
    """
    env = os.environ.get("OPSTRATA_COMM_ALGO") or None
    for source, algo in (("per-call algorithm=", requested), ("OPSTRATA_COMM_ALGO", env)):
        if algo is None:
            continue
        if algo not in ALGORITHMS:
            raise ValueError(
                f"{collective}: unknown algorithm {algo!r} from {source}; expected one of {ALGORITHMS}"
            )
        if algo in SUPPORTED[collective]:
            return algo, f"requested by {source}"
        if source.startswith("per-call"):
            raise ValueError(
                f"{collective}: algorithm {algo!r} is not implemented for this collective; "
                f"choose one of {SUPPORTED[collective]}"
            )
        # an env override for all collectives falls through to the table for those that lack it
    if hosts and len(hosts) > 1 and max(hosts) > 1 and collective in HIERARCHICAL:
        return "hierarchical", (
            f"group spans {len(hosts)} hosts with {hosts} ranks: intra-host shm, then inter-host between "
            f"leaders ({nbytes} B, world {world})"
        )
    if tuned:
        got = tuned.lookup(collective, nbytes, world, backend)
        if got is not None and got[0] in SUPPORTED[collective] and got[0] != "hierarchical":
            return got
    for coll, bound, cond, algo, why in THRESHOLDS:
        if coll == collective and nbytes <= bound and (cond == "any" or _pow2(world)):
            return algo, f"{why} ({nbytes} B, world {world})"
    raise AssertionError(f"no table row for {collective}")


@dataclass
class Ctx:
    """The transport plus the error context of one collective call."""

    t: Transport | _Sub
    what: str
    deadline: float

    @property
    def rank(self) -> int:
        """This rank in the (possibly virtual) group."""
        return self.t.rank

    @property
    def size(self) -> int:
        """Group size."""
        return self.t.size

    def ex(self, sends: Sequence[tuple[int, np.ndarray]] = (), recvs: Sequence = ()) -> None:
        """Run one exchange round."""
        self.t.exchange(sends, recvs, what=self.what, deadline=self.deadline)


class _Sub:
    """A virtual group of ``members`` (real ranks) used by the non-power-of-two fix-up."""

    def __init__(self, t: Transport | _Sub, members: list[int]) -> None:
        self.t, self.members = t, members
        self.rank, self.size = members.index(t.rank), len(members)

    def exchange(self, sends, recvs, *, what: str, deadline: float) -> None:
        """Exchange with virtual ranks mapped to real ones."""
        m = self.members
        self.t.exchange(
            [(m[p], a) for p, a in sends], [(m[p], a, f) for p, a, f in recvs], what=what, deadline=deadline
        )


class Blocks:
    """A flat buffer cut into ``n`` near-equal contiguous blocks (np.array_split boundaries)."""

    def __init__(self, buf: np.ndarray, n: int) -> None:
        self.buf = buf
        q, rem = divmod(buf.size, n)
        self.bounds = [i * q + min(i, rem) for i in range(n + 1)]

    def __getitem__(self, i: int) -> np.ndarray:
        return self.buf[self.bounds[i] : self.bounds[i + 1]]

    def span(self, i: int, j: int) -> np.ndarray:
        """Blocks i..j-1 as one contiguous view (one message instead of several)."""
        return self.buf[self.bounds[i] : self.bounds[j]]


def blocks_of(buf: np.ndarray, n: int) -> Blocks:
    """Split a flat buffer into ``n`` blocks."""
    return Blocks(buf, n)


def fold(rows: Sequence[np.ndarray], fn: ReduceFn, out: np.ndarray) -> None:
    """out = rows[0] op rows[1] op ... in this order (the deterministic reduction)."""
    acc = np.array(rows[0], copy=True)
    for r in rows[1:]:
        fn(acc, r)
    out[...] = acc


# -- reduce-scatter on blocks: afterwards blocks[rank] holds the reduction of everyone's blocks[rank] ------
def rs_direct(c: Ctx, blocks: Blocks, fn: ReduceFn) -> None:
    """Every rank sends block j to rank j; the owner folds contributions in rank order (deterministic)."""
    r, n = c.rank, c.size
    mine = blocks[r]
    stage = [mine if j == r else np.empty_like(mine) for j in range(n)]
    c.ex([(j, blocks[j]) for j in range(n) if j != r], [(j, stage[j], None) for j in range(n) if j != r])
    fold(stage, fn, mine)


def rs_ring(c: Ctx, blocks: Blocks, fn: ReduceFn) -> None:
    """Ring reduce-scatter: n-1 steps, each forwards one partial block to the right neighbour."""
    r, n = c.rank, c.size
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):
        c.ex([(right, blocks[(r - s - 1) % n])], [(left, blocks[(r - s - 2) % n], fn)])


def rs_halving(c: Ctx, blocks: Blocks, fn: ReduceFn) -> None:
    """Recursive halving over block ranges (power-of-two group)."""
    r, n = c.rank, c.size
    lo, hi = 0, n
    mask = n >> 1
    while mask:
        partner, mid = r ^ mask, (lo + hi) // 2
        keep, give = ((mid, hi), (lo, mid)) if r & mask else ((lo, mid), (mid, hi))
        c.ex([(partner, blocks.span(*give))], [(partner, blocks.span(*keep), fn)])
        lo, hi = keep
        mask >>= 1


# -- all-gather on blocks: afterwards every rank holds every block -----------------------------------------
def ag_direct(c: Ctx, blocks: Blocks) -> None:
    """Every rank sends its block to every rank in one round."""
    r, n = c.rank, c.size
    c.ex([(j, blocks[r]) for j in range(n) if j != r], [(j, blocks[j], None) for j in range(n) if j != r])


def ag_ring(c: Ctx, blocks: Blocks) -> None:
    """Ring all-gather: n-1 steps, each passes the block received last step to the right."""
    r, n = c.rank, c.size
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):
        c.ex([(right, blocks[(r - s) % n])], [(left, blocks[(r - s - 1) % n], None)])


def ag_doubling(c: Ctx, blocks: Blocks) -> None:
    """Recursive doubling (power-of-two group): the held range doubles each step."""
    r, n = c.rank, c.size
    mask = 1
    while mask < n:
        partner = r ^ mask
        mine = r & ~(mask - 1)
        theirs = partner & ~(mask - 1)
        c.ex(
            [(partner, blocks.span(mine, mine + mask))], [(partner, blocks.span(theirs, theirs + mask), None)]
        )
        mask <<= 1


# -- whole-buffer trees ------------------------------------------------------------------------------------
def tree_reduce(c: Ctx, buf: np.ndarray, fn: ReduceFn, root: int) -> None:
    """Binomial tree reduce into ``buf`` on ``root`` (other ranks' buffers hold partial sums after)."""
    n = c.size
    vr = (c.rank - root) % n
    mask = 1
    while mask < n:
        if vr & mask:
            c.ex([((vr - mask + root) % n, buf)])
            return
        if vr + mask < n:
            c.ex((), [((vr + mask + root) % n, buf, fn)])
        mask <<= 1


def tree_broadcast(c: Ctx, buf: np.ndarray, root: int) -> None:
    """Binomial tree broadcast of ``buf`` from ``root``."""
    n = c.size
    vr = (c.rank - root) % n
    mask = 1
    while mask < n:
        if vr & mask:
            c.ex((), [((vr - mask + root) % n, buf, None)])
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:
        if vr + mask < n:
            c.ex([((vr + mask + root) % n, buf)])
        mask >>= 1


def ring_broadcast(c: Ctx, buf: np.ndarray, root: int, chunk_bytes: int = 1 << 20) -> None:
    """Chunked pipeline root -> root+1 -> ...: each rank forwards chunk i-1 while receiving chunk i."""
    n = c.size
    vr = (c.rank - root) % n
    nxt, prv = (c.rank + 1) % n, (c.rank - 1) % n
    step = max(1, chunk_bytes // max(buf.itemsize, 1))
    chunks = [buf[i : i + step] for i in range(0, buf.size, step)] or [buf]
    for i in range(len(chunks) + 1):
        sends, recvs = [], []
        if vr == 0 and i < len(chunks):
            sends.append((nxt, chunks[i]))
        if vr != 0 and vr != n - 1 and i >= 1:
            sends.append((nxt, chunks[i - 1]))
        if vr != 0 and i < len(chunks):
            recvs.append((prv, chunks[i], None))
        if sends or recvs:
            c.ex(sends, recvs)


def direct_broadcast(c: Ctx, buf: np.ndarray, root: int) -> None:
    """Root sends the whole buffer to every rank."""
    if c.rank == root:
        c.ex([(j, buf) for j in range(c.size) if j != root])
    else:
        c.ex((), [(root, buf, None)])


# -- all-reduce ------------------------------------------------------------------------------------------------
def all_reduce(c: Ctx, buf: np.ndarray, fn: ReduceFn, algo: str, deterministic: bool) -> str:
    """In-place all-reduce of a flat buffer; returns a note on any substitution (logged in debug)."""
    n = c.size
    if n == 1:
        return ""
    if deterministic or algo == "direct":
        blocks = blocks_of(buf, n)
        rs_direct(c, blocks, fn)  # folds in rank order: the bits do not depend on the algorithm
        if algo == "halving_doubling" and _pow2(n):
            ag_doubling(c, blocks)
        elif algo != "direct":
            ag_ring(c, blocks)
        else:
            ag_direct(c, blocks)
        return "deterministic: rank-order fold at block owners" if deterministic else ""
    if algo == "ring":
        blocks = blocks_of(buf, n)
        rs_ring(c, blocks, fn)
        ag_ring(c, blocks)
        return ""
    if algo == "tree":
        tree_reduce(c, buf, fn, 0)
        tree_broadcast(c, buf, 0)
        return ""
    if algo == "halving_doubling":
        return _all_reduce_hd(c, buf, fn)
    if algo == "double_tree":
        _double_tree.plan(n, c.rank, buf, fn, root=0, up=True, down=True).run(c.ex)
        return ""
    raise ValueError(f"all_reduce: unknown algorithm {algo!r}")


def _all_reduce_hd(c: Ctx, buf: np.ndarray, fn: ReduceFn) -> str:
    n, r = c.size, c.rank
    p = 1 << (n.bit_length() - 1)
    rem = n - p
    if rem == 0:
        blocks = blocks_of(buf, n)
        rs_halving(c, blocks, fn)
        ag_doubling(c, blocks)
        return ""
    # MPICH fix-up: the first 2*rem ranks pair up, evens hand their data to odds, p ranks run the core.
    if r < 2 * rem:
        if r % 2 == 0:
            c.ex([(r + 1, buf)])
            c.ex((), [(r + 1, buf, None)])
            return f"non-power-of-two world {n}: fix-up to {p} ranks"
        c.ex((), [(r - 1, buf, fn)])
    members = [2 * v + 1 for v in range(rem)] + list(range(2 * rem, n))
    sub = Ctx(_Sub(c.t, members), c.what, c.deadline)
    blocks = blocks_of(buf, p)
    rs_halving(sub, blocks, fn)
    ag_doubling(sub, blocks)
    if r < 2 * rem:
        c.ex([(r - 1, buf)])
    return f"non-power-of-two world {n}: fix-up to {p} ranks"
