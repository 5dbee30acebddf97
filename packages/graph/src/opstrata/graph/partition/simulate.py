"""In-process tensor-parallel simulator: run k rank graphs in lockstep, reducing where AllReduce nodes stand.

A test utility for :func:`opstrata.graph.partition` (Megatron-LM tensor parallelism, Shoeybi et al.
2019): each rank runs :func:`run_graph` in its own thread with a collective backend whose
``all_reduce`` exchanges tensors through a barrier, so the partitioned model is checked against the
unpartitioned one without processes. opstrata.comm replaces it with real processes behind the same
:class:`~opstrata.graph.partition.collective.Collectives` hook. A collective that a rank never reaches, or a
different collective per rank, is an error naming both — never a hang (barrier timeout).
"""

from __future__ import annotations

import contextvars
import functools
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .._errors import GraphError
from .._execute import run_graph
from .._ir import OPSTRATA_DOMAIN, Graph, Node
from .collective import ALL_REDUCE, use_collectives

__all__ = ["simulate_tensor_parallel"]

_END = "<end of graph>"
_REDUCE = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum}


class _Group:
    """A lockstep exchange between ``size`` rank threads (two barrier phases per collective)."""

    def __init__(self, size: int, timeout: float) -> None:
        self.size, self.timeout = size, timeout
        self.barrier = threading.Barrier(size, timeout=timeout)
        self.slots: list[tuple[str, Any]] = [("", None)] * size

    def _wait(self, rank: int, tag: str) -> None:
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError:
            raise GraphError(
                f"simulate_tensor_parallel rank {rank}",
                f"collective '{tag}' was abandoned: another rank failed or did not arrive within "
                f"{self.timeout} s",
                "see the other rank's error; rank graphs must run the same collectives in the same order",
            ) from None

    def exchange(self, rank: int, tag: str, x: Any) -> list[Any]:
        """Deposit ``x`` under ``tag``; returns every rank's deposit once all ranks arrived at ``tag``."""
        self.slots[rank] = (tag, x)
        self._wait(rank, tag)
        entries = list(self.slots)
        self._wait(rank, tag)  # nobody deposits the next collective before everyone has read this one
        tags = [t for t, _ in entries]
        if len(set(tags)) > 1:
            raise GraphError(
                f"simulate_tensor_parallel rank {rank}",
                "ranks disagree on the next collective: "
                + ", ".join(f"rank {r} is at '{t}'" for r, t in enumerate(tags)),
                "partition every rank graph from the same graph (partition(graph, tp=k))",
            )
        return [e for _, e in entries]


class _SimRank:
    """One rank's collective backend on a shared :class:`_Group`."""

    def __init__(self, group: _Group, rank: int) -> None:
        self.group, self.rank = group, rank

    def all_reduce(self, x: np.ndarray, *, op: str, node: Node) -> np.ndarray:
        """Every rank's ``x`` reduced in rank order (so all ranks get bit-identical results)."""
        xs = self.group.exchange(self.rank, f"{node.name} ({node.qualified_type} op={op})", np.asarray(x))
        bad = [
            (r, a.shape, a.dtype)
            for r, a in enumerate(xs)
            if a.shape != xs[0].shape or a.dtype != xs[0].dtype
        ]
        if bad:
            raise GraphError(
                f"node '{node.name}' ({node.qualified_type})",
                f"ranks reduce different tensors: rank 0 has {xs[0].dtype}{list(xs[0].shape)}, "
                + ", ".join(f"rank {r} has {d}{list(s)}" for r, s, d in bad),
                "partition every rank graph from the same graph and feed every rank the same inputs",
            )
        out = functools.reduce(_REDUCE[op], xs)
        if op == "avg":
            out = out / np.asarray(len(xs), out.dtype)
        return np.asarray(out, xs[0].dtype)


def _group_size(g: Graph, k: int) -> None:
    for n in g.nodes:
        if n.op_type == ALL_REDUCE and n.domain == OPSTRATA_DOMAIN and n.attrs.get("group_size", 1) != k:
            raise GraphError(
                f"node '{n.name}' ({n.qualified_type}) of graph '{g.name}'",
                f"group_size={n.attrs.get('group_size', 1)} but {k} rank graphs were given",
                "pass all the rank graphs that partition() returned",
            )


def simulate_tensor_parallel(
    rank_graphs: Sequence[Graph],
    feeds: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    device: str | None = None,
    *,
    outputs: Sequence[str] | None = None,
    timeout: float = 300.0,
) -> list[dict[str, np.ndarray]]:
    """Run the rank graphs of ``partition(graph, tp=k)`` together in one process; one output dict per rank.

    ``feeds`` is one mapping given to every rank (tensor parallelism replicates the inputs) or one
    mapping per rank. Where an ``ai.opstrata::AllReduce`` stands, the k ranks' tensors are reduced
    (summed in rank order) and the result is fed to every rank. Outputs are replicated, so
    ``simulate_tensor_parallel(ranks, feeds)[0]`` equals ``run_graph(graph, feeds)``.
    ``timeout`` bounds the wait at each collective (seconds).
    """
    graphs = list(rank_graphs)
    if not graphs or not all(isinstance(g, Graph) for g in graphs):
        raise GraphError(
            "simulate_tensor_parallel",
            f"rank_graphs must be a non-empty sequence of Graph, got {type(rank_graphs).__name__} "
            f"of {sorted({type(g).__name__ for g in graphs})}",
            "pass the list partition(graph, tp=k) returned",
        )
    k = len(graphs)
    if isinstance(feeds, Mapping):
        per_rank: list[Mapping[str, Any]] = [feeds] * k
    else:
        per_rank = list(feeds)
        if len(per_rank) != k:
            raise GraphError(
                "simulate_tensor_parallel",
                f"got {len(per_rank)} feed mappings for {k} rank graphs",
                "pass one mapping for all ranks or exactly one per rank",
            )
    for g in graphs:
        _group_size(g, k)
    group = _Group(k, timeout)
    results: list[dict[str, np.ndarray] | None] = [None] * k
    errors: list[BaseException | None] = [None] * k

    def work(rank: int) -> None:
        try:
            with use_collectives(_SimRank(group, rank)):
                results[rank] = run_graph(graphs[rank], per_rank[rank], device, outputs=outputs)
            group.exchange(rank, _END, None)  # a rank with fewer collectives is caught here, not hung
        except BaseException as exc:  # reported below, with the rank
            errors[rank] = exc
            group.barrier.abort()  # release the ranks waiting on this one

    threads = [
        threading.Thread(
            target=contextvars.copy_context().run,  # each rank sees the caller's ops device / policy
            args=(work, r),
            name=f"opstrata-tp-rank{r}",
            daemon=True,
        )
        for r in range(k)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = [(r, e) for r, e in enumerate(errors) if e is not None]
    if failed:
        # the root cause is the first error that is not another rank's abandoned collective
        root = next(((r, e) for r, e in failed if "was abandoned" not in str(e)), failed[0])
        r, exc = root
        if isinstance(exc, GraphError) and exc.where.startswith("simulate_tensor_parallel"):
            raise exc
        raise GraphError(f"simulate_tensor_parallel rank {r}", str(exc)) from exc
    return [res for res in results if res is not None]
