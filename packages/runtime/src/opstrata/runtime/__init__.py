"""opstrata.runtime — InferenceSession, arena execution, caching allocator, stream scheduler, profiler, KV cache."""

from __future__ import annotations

from opstrata.ops.compat import check_compatible as _check_compatible

__version__: str = _check_compatible("opstrata-runtime")

from ._allocator import Block as Block, CachingAllocator as CachingAllocator
from ._arena import Arena as Arena
from ._decoder import DecoderLayer as DecoderLayer, DecoderWeights as DecoderWeights
from ._device_arena import DeviceArenaStats as DeviceArenaStats
from ._device_exec import HostNode as HostNode
from ._errors import (
    ExecutionError as ExecutionError,
    InvalidArgument as InvalidArgument,
    InvalidModel as InvalidModel,
    OutOfMemoryError as OutOfMemoryError,
    RuntimeFailure as RuntimeFailure,
)
from ._flops import node_flops as node_flops
from ._generate import DecoderRunner as DecoderRunner, GenerateOutput as GenerateOutput, generate as generate
from ._int8_kernels import SlowKernelWarning as SlowKernelWarning
from ._kv_cache import KVCacheFullError as KVCacheFullError, PagedKVCache as PagedKVCache
from ._options import SessionOptions as SessionOptions
from ._profiler import NodeEvent as NodeEvent, Profiler as Profiler
from ._providers import PROVIDER_DEVICES as PROVIDER_DEVICES
from ._session import InferenceSession as InferenceSession, NodeArg as NodeArg
from ._threads import (
    ThreadSettings as ThreadSettings,
    physical_cores as physical_cores,
    thread_info as thread_info,
)

__all__ = [
    "PROVIDER_DEVICES",
    "Arena",
    "Block",
    "CachingAllocator",
    "DecoderLayer",
    "DecoderRunner",
    "DecoderWeights",
    "DeviceArenaStats",
    "ExecutionError",
    "GenerateOutput",
    "HostNode",
    "InferenceSession",
    "InvalidArgument",
    "InvalidModel",
    "KVCacheFullError",
    "NodeArg",
    "NodeEvent",
    "OutOfMemoryError",
    "PagedKVCache",
    "Profiler",
    "RuntimeFailure",
    "SessionOptions",
    "SlowKernelWarning",
    "ThreadSettings",
    "__version__",
    "generate",
    "node_flops",
    "physical_cores",
    "thread_info",
]
