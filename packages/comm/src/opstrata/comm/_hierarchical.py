"""Hierarchical collectives for groups that span hosts: intra-host over shared memory, inter-host between leaders.

all_reduce: reduce to each host's leader over shm, all-reduce among the leaders over the group's own
transport (tcp across hosts), broadcast from each leader over shm. broadcast: the root sends to one leader
per host, each leader broadcasts on its host. all_gather: gather on each leader, ring of packed host
blocks between leaders, broadcast on each host. A rank's host is its hostname, or ``OPSTRATA_COMM_HOST``
(set per rank) to simulate several hosts on one machine. The per-host shm transport is created on the
first hierarchical call of a group (every rank makes that call, so its rendezvous cannot miss anyone).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import numpy as np

from . import _algorithms as alg, _double_tree as dtree
from ._algorithms import Ctx, _Sub
from ._errors import CommError
from ._store import PrefixStore, Store
from ._transport import ReduceFn, Transport
from ._transport_shm import ShmTransport

_SHARED_KEYS = ("abort", "abort_msg")  # failure flags stay group-wide so either level sees the other's abort


class _HostStore(PrefixStore):
    """A per-host namespace of the group store that shares the group's abort keys."""

    def _k(self, key: str) -> str:
        return key if key in _SHARED_KEYS else self.prefix + key

    def set(self, key: str, value: bytes) -> None:
        """Set a key (abort keys unprefixed)."""
        self.base.set(self._k(key), value)

    def try_get(self, key: str) -> bytes | None:
        """Get a key or None (abort keys unprefixed)."""
        return self.base.try_get(self._k(key))

    def add(self, key: str, amount: int) -> int:
        """Add to a counter."""
        return self.base.add(self._k(key), amount)


class _HostShm(ShmTransport):
    """Shared-memory transport of one host's ranks that also notices aborts raised over the group store."""

    name = "shm (host)"
    outer: Transport | None = None  # the group's transport: its heartbeat watches this host's ranks too
    members: tuple[int, ...] = ()  # group rank of each local rank

    def check_heartbeat(self, what: str, waiting_on: Sequence[int]) -> None:
        """The group's heartbeat check, with this host's waited-on ranks named as group ranks."""
        if self.outer is not None:
            self.outer.check_heartbeat(what, [self.members[p] for p in waiting_on])

    def _read_abort(self, force: bool = False) -> tuple[int, int, int] | None:
        return super()._read_abort(force) or Transport._read_abort(self, force)


class Topology:
    """Where the ranks of a group live: hosts in order of their first rank, one leader (lowest rank) per host."""

    def __init__(self, hosts: list[str], rank: int) -> None:
        self.hosts = hosts
        self.order = list(dict.fromkeys(hosts))
        self.host = self.order.index(hosts[rank])
        self.local = [j for j, h in enumerate(hosts) if h == hosts[rank]]
        self.leaders = [hosts.index(h) for h in self.order]

    @property
    def nhosts(self) -> int:
        """Number of distinct hosts."""
        return len(self.order)

    def describe(self) -> str:
        """A short layout such as '2 hosts x [2, 2] ranks'."""
        return f"{self.nhosts} hosts x {[self.hosts.count(h) for h in self.order]} ranks"


class Hierarchy:
    """The two levels of one group: its own transport between leaders and a shm transport per host."""

    def __init__(self, transport: Transport, store: Store, *, job: str, gid: int, timeout: float) -> None:
        self.t = transport
        self.topo = Topology(transport.hosts, transport.rank)
        self.link: Transport | _Sub | None = None
        local = self.topo.local
        if len(local) > 1:
            if isinstance(transport, ShmTransport):
                self.link = _Sub(transport, local)  # one host already: the group transport is shm
            else:
                self.link = _HostShm(
                    local.index(transport.rank),
                    len(local),
                    _HostStore(f"hier{self.topo.host}/", store),
                    pids=[transport.pids[j] for j in local],
                    hosts=[transport.hosts[j] for j in local],
                    prefix=f"opst_{job}_g{gid}h{self.topo.host}",
                    timeout=timeout,
                )
                self.link.outer, self.link.members = transport, tuple(local)

    def close(self) -> None:
        """Release the per-host transport."""
        if isinstance(self.link, Transport):
            self.link.close()
        self.link = None

    # -- the two levels ------------------------------------------------------------------------------------
    def _intra(self, c: Ctx) -> Ctx | None:
        return None if self.link is None else Ctx(self.link, f"{c.what} [intra-host]", c.deadline)

    def _inter(self, c: Ctx, leaders: list[int]) -> Ctx | None:
        if len(leaders) < 2 or c.rank not in leaders:
            return None
        return Ctx(_Sub(c.t, leaders), f"{c.what} [inter-host]", c.deadline)

    def _guard(self, err: CommError) -> None:
        """Stop this host's ranks too when the inter-host level failed (they wait on shm, not on sockets)."""
        if isinstance(self.link, Transport):
            with contextlib.suppress(Exception):
                self.link.abort(err, origin=self.topo.local.index(self.t.rank))

    def all_reduce(self, c: Ctx, buf: np.ndarray, fn: ReduceFn) -> str:
        """Reduce on each host, all-reduce between leaders, broadcast on each host."""
        intra, inter = self._intra(c), self._inter(c, self.topo.leaders)
        try:
            if intra is not None:
                _local_reduce(intra, buf, fn)
            if inter is not None:
                algo, _ = alg.select("all_reduce", buf.nbytes, inter.size, None)
                algo = "ring" if algo in ("hierarchical", "double_tree") else algo
                alg.all_reduce(inter, buf, fn, algo, False)
            if intra is not None:
                _local_broadcast(intra, buf, 0)
        except CommError as e:
            self._guard(e)
            raise
        return (
            f"hierarchical: {self.topo.describe()}, intra-host shm, inter-host {self.t.name} between leaders"
        )

    def broadcast(self, c: Ctx, buf: np.ndarray, root: int) -> str:
        """Root to one leader per host (the root leads its own host), then each leader on its host."""
        topo = self.topo
        leaders = list(topo.leaders)
        root_host = topo.order.index(topo.hosts[root])
        leaders[root_host] = root
        inter = self._inter(c, leaders)
        intra = self._intra(c)
        try:
            if inter is not None:
                _local_broadcast(inter, buf, leaders.index(root))
            if intra is not None:
                _local_broadcast(intra, buf, topo.local.index(leaders[topo.host]))
        except CommError as e:
            self._guard(e)
            raise
        return f"hierarchical: {topo.describe()}, inter-host {self.t.name} from the root, then intra-host shm"

    def all_gather(self, c: Ctx, blocks: alg.Blocks) -> str:
        """Gather on each host's leader, ring among leaders (one packed message per host), broadcast on hosts."""
        topo, r = self.topo, c.rank
        leader = topo.leaders[topo.host]
        intra, inter = self._intra(c), self._inter(c, topo.leaders)
        members = [[j for j, h in enumerate(topo.hosts) if h == name] for name in topo.order]
        try:
            if intra is not None:
                if r == leader:
                    intra.ex((), [(topo.local.index(j), blocks[j], None) for j in topo.local if j != r])
                else:
                    intra.ex([(topo.local.index(leader), blocks[r])])
            if inter is not None:
                packs = [np.concatenate([blocks[j] for j in m]) for m in members]
                h, k = len(members), topo.host
                for s in range(h - 1):  # ring: pass on the host pack received in the previous step
                    inter.ex(
                        [((k + 1) % h, packs[(k - s) % h])], [((k - 1) % h, packs[(k - s - 1) % h], None)]
                    )
                for m, pack in zip(members, packs, strict=True):
                    off = 0
                    for j in m:
                        blocks[j][...] = pack[off : off + blocks[j].size]
                        off += blocks[j].size
            if intra is not None:
                _local_broadcast(intra, blocks.buf, 0)
        except CommError as e:
            self._guard(e)
            raise
        return f"hierarchical: {topo.describe()}, gather on hosts, ring between leaders, broadcast on hosts"


def _local_reduce(c: Ctx, buf: np.ndarray, fn: ReduceFn) -> None:
    if buf.nbytes < 256 << 10:
        alg.tree_reduce(c, buf, fn, 0)
    else:
        dtree.plan(c.size, c.rank, buf, fn, root=0, up=True, down=False).run(c.ex)


def _local_broadcast(c: Ctx, buf: np.ndarray, root: int) -> None:
    if buf.nbytes < 256 << 10:
        alg.tree_broadcast(c, buf, root)
    else:
        dtree.plan(c.size, c.rank, buf, None, root=root, up=False, down=True).run(c.ex)
