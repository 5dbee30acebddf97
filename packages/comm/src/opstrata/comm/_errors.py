"""Exceptions raised by opstrata.comm: each names the collective, its sequence number, this rank and the peer."""

from __future__ import annotations


class CommError(RuntimeError):
    """Base class of every communication failure (a group that raised it is aborted)."""


class CommTimeoutError(CommError, TimeoutError):
    """A wait on a peer exceeded the group's timeout (``OPSTRATA_COMM_TIMEOUT`` or ``timeout=``)."""


class CommPeerError(CommError):
    """A peer rank died or closed its connection while this rank depended on it."""


class CommDesyncError(CommError):
    """Ranks called different collectives, sizes or dtypes at the same sequence number."""


#: Abort codes shared between ranks (written into shared memory or the store).
ABORT_CODES: dict[int, type[CommError]] = {1: CommPeerError, 2: CommDesyncError, 3: CommTimeoutError}
CODE_OF: dict[type[CommError], int] = {v: k for k, v in ABORT_CODES.items()}
