"""opstrata.comm — process groups, transports, collective algorithms, launcher, data-parallel helpers."""

from __future__ import annotations

from opstrata.ops.compat import check_compatible as _check_compatible

__version__: str = _check_compatible("opstrata-comm")

from ._algorithms import ALGORITHMS as ALGORITHMS, THRESHOLDS as THRESHOLDS
from ._api import (
    all_gather as all_gather,
    all_reduce as all_reduce,
    all_to_all as all_to_all,
    barrier as barrier,
    broadcast as broadcast,
    destroy_process_group as destroy_process_group,
    get_backend as get_backend,
    get_rank as get_rank,
    get_world_size as get_world_size,
    init_process_group as init_process_group,
    is_initialized as is_initialized,
    new_group as new_group,
    recv as recv,
    reduce as reduce,
    reduce_scatter as reduce_scatter,
    send as send,
)
from ._data_parallel import (
    Bucket as Bucket,
    GradientBucketer as GradientBucketer,
    broadcast_parameters as broadcast_parameters,
)
from ._errors import (
    CommDesyncError as CommDesyncError,
    CommError as CommError,
    CommPeerError as CommPeerError,
    CommTimeoutError as CommTimeoutError,
)
from ._group import NON_GROUP_MEMBER as NON_GROUP_MEMBER, ProcessGroup as ProcessGroup
from ._store import FileStore as FileStore, TCPStore as TCPStore
from ._tensor_parallel import (
    get_tensor_parallel_group as get_tensor_parallel_group,
    set_tensor_parallel_group as set_tensor_parallel_group,
)
from ._tuning import CommTuningWarning as CommTuningWarning
from ._work import Work as Work

__all__ = [
    "ALGORITHMS",
    "NON_GROUP_MEMBER",
    "THRESHOLDS",
    "Bucket",
    "CommDesyncError",
    "CommError",
    "CommPeerError",
    "CommTimeoutError",
    "CommTuningWarning",
    "FileStore",
    "GradientBucketer",
    "ProcessGroup",
    "TCPStore",
    "Work",
    "__version__",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "barrier",
    "broadcast",
    "broadcast_parameters",
    "destroy_process_group",
    "get_backend",
    "get_rank",
    "get_tensor_parallel_group",
    "get_world_size",
    "init_process_group",
    "is_initialized",
    "new_group",
    "recv",
    "reduce",
    "reduce_scatter",
    "send",
    "set_tensor_parallel_group",
]
