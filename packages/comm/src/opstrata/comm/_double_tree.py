"""Double binary tree (NCCL 2.4): two complementary binary trees each carry half the buffer, chunked.

Tree 0 is NCCL's in-order binary tree of ranks 0..n-1 (``ncclGetBtree``); tree 1 mirrors it (n even) or
shifts it by one (n odd), so most ranks are interior in one tree and a leaf in the other and both halves
keep every rank's links busy. Reduce flows up, broadcast flows down, in chunks pipelined along the tree.

Chunks move on a global step clock: every message is sent and received at the same step number on both
sides (a node at depth d of a tree of height D sends chunk j up at step j + D - d). Steps of the two
trees and both directions therefore share exchanges without any wait cycle, so nothing can deadlock.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Callable

import numpy as np

from ._transport import ReduceFn

MAX_CHUNK_BYTES, MIN_CHUNK_BYTES = 1 << 20, 64 << 10


def chunk_bytes_for(nbytes: int) -> int:
    """Pipeline chunk: about a quarter of a tree's half, between 64 KiB and 1 MiB (NCCL-like granularity).

    ``OPSTRATA_COMM_TREE_CHUNK`` (bytes) fixes it, e.g. to pipeline small arrays in tests.
    """
    env = os.environ.get("OPSTRATA_COMM_TREE_CHUNK")
    if env:
        return max(1, int(env))
    return min(MAX_CHUNK_BYTES, max(MIN_CHUNK_BYTES, nbytes // 8))


def btree(n: int, r: int) -> tuple[int | None, list[int]]:
    """(parent, children) of rank ``r`` in NCCL's in-order binary tree over ``0..n-1`` (root 0)."""
    if n <= 1:
        return None, []
    if r == 0:
        return None, [1 << (n - 1).bit_length() - 1]  # the largest power of two below n
    bit = r & -r
    parent = (r ^ bit) | (bit << 1)
    if parent >= n:
        parent = r ^ bit
    low = bit >> 1
    children = []
    if low:
        children.append(r - low)
        while low and r + low >= n:
            low >>= 1
        if low:
            children.append(r + low)
    return parent, children


def tree_of(n: int, r: int, which: int) -> tuple[int | None, list[int]]:
    """(parent, children) of ``r`` in tree 0 (btree) or tree 1 (mirror for even n, shift by one for odd n)."""
    if which == 0:
        return btree(n, r)
    if n % 2 == 0:
        p, ch = btree(n, n - 1 - r)
        return (None if p is None else n - 1 - p), [n - 1 - c for c in ch]
    p, ch = btree(n, (r - 1) % n)
    return (None if p is None else (p + 1) % n), [(c + 1) % n for c in ch]


def depths(n: int, which: int) -> list[int]:
    """Depth of every rank in tree ``which`` (the root has depth 0)."""
    parent = [tree_of(n, r, which)[0] for r in range(n)]
    out = []
    for r in range(n):
        d, p = 0, parent[r]
        while p is not None:
            d, p = d + 1, parent[p]
            if d > n:
                raise AssertionError(f"double tree: tree {which} of {n} ranks has a cycle at rank {r}")
        out.append(d)
    return out


def root_of(n: int, which: int) -> int:
    """The root rank of tree ``which``."""
    return depths(n, which).index(0)


# one scheduled message: (step, order key, send?, peer, view, reduce fn)
_Event = tuple[int, tuple, bool, int, np.ndarray, "ReduceFn | None"]


class _Plan:
    """Messages of one rank keyed by step; run in step order, split so each round has one message per peer."""

    def __init__(self) -> None:
        self.events: list[_Event] = []

    def send(self, step: int, key: tuple, peer: int, view: np.ndarray) -> None:
        self.events.append((step, key, True, peer, view, None))

    def recv(self, step: int, key: tuple, peer: int, view: np.ndarray, fn: ReduceFn | None) -> None:
        self.events.append((step, key, False, peer, view, fn))

    def run(self, ex: Callable[[list, list], None]) -> None:
        by_step: dict[int, list[_Event]] = collections.defaultdict(list)
        for e in self.events:
            if e[4].size:
                by_step[e[0]].append(e)
        for step in sorted(by_step):
            # sender and receiver order a step's messages by the same key, so the k-th message between a
            # pair lands in round k on both sides (the transports allow one message per peer and direction)
            rounds: list[tuple[list, list]] = []
            seen: dict[tuple[bool, int], int] = collections.defaultdict(int)
            for _, _, is_send, peer, view, fn in sorted(by_step[step], key=lambda e: e[1]):
                k = seen[(is_send, peer)]
                seen[(is_send, peer)] += 1
                while len(rounds) <= k:
                    rounds.append(([], []))
                if is_send:
                    rounds[k][0].append((peer, view))
                else:
                    rounds[k][1].append((peer, view, fn))
            for sends, recvs in rounds:
                ex(sends, recvs)


def _chunks(buf: np.ndarray, chunk_bytes: int) -> list[np.ndarray]:
    step = max(1, chunk_bytes // max(buf.itemsize, 1))
    return [buf[i : i + step] for i in range(0, buf.size, step)]


def _halves(buf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mid = (buf.size + 1) // 2
    return buf[:mid], buf[mid:]


def _virtual(n: int, rank: int, root: int, which: int) -> tuple[int, int | None, list[int], int, int]:
    """Tree ``which`` relabelled so tree 0's root is ``root``: (depth, parent, children, height, tree root)."""
    v = (rank - root) % n
    p, ch = tree_of(n, v, which)
    ds = depths(n, which)

    def real(x: int) -> int:
        return (x + root) % n

    return ds[v], (None if p is None else real(p)), [real(c) for c in ch], max(ds), real(ds.index(0))


def plan(
    n: int,
    rank: int,
    buf: np.ndarray,
    fn: ReduceFn | None,
    *,
    root: int,
    up: bool,
    down: bool,
    chunk_bytes: int | None = None,
) -> _Plan:
    """The messages of ``rank`` for reduce (up), broadcast (down) or all-reduce (both) rooted at ``root``."""
    pl = _Plan()
    chunk_bytes = chunk_bytes or chunk_bytes_for(buf.nbytes)
    for which, half in enumerate(_halves(buf)):
        if not half.size:
            continue
        d, parent, children, height, troot = _virtual(n, rank, root, which)
        chunks = _chunks(half, chunk_bytes)
        hop = 1 if troot != root and not up else 0  # broadcast: root hands tree 1's root its half first
        for j, ch in enumerate(chunks):
            if up:
                for c in children:
                    pl.recv(j + height - d - 1, (which, 0, j), c, ch, fn)
                if parent is not None:
                    pl.send(j + height - d, (which, 0, j), parent, ch)
                if not down and troot != root:  # reduce: tree 1's root hands its finished half to root
                    if rank == troot:
                        pl.send(j + height, (which, 1, j), root, ch)
                    elif rank == root:
                        pl.recv(j + height, (which, 1, j), troot, ch, None)
            if down:
                base = j + (height if up else 0) + hop
                if hop and rank == root:
                    pl.send(j, (which, 1, j), troot, ch)
                elif hop and rank == troot:
                    pl.recv(j, (which, 1, j), root, ch, None)
                if parent is not None and not (hop and rank == root):
                    pl.recv(base + d - 1, (which, 2, j), parent, ch, None)
                for c in children:
                    if not (hop and c == root):  # root already holds the data
                        pl.send(base + d, (which, 2, j), c, ch)
    return pl
