"""The cuda memory's ``allocations``: CuPy's allocator routed per thread, one ``cudaMalloc`` block carved by
an executor's plan, and the default memory pool for what the plan leaves out.

Every allocation handed out is an ``UnownedMemory`` whose owner is ``(backing memory, owner)``: CuPy
keeps it alive as long as any array or view uses the memory, so the executor's owner is freed exactly
when the memory is (and the pool's block goes back to the pool then, too).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from .._devices import DeviceAllocations

__all__ = ["cupy_allocations"]


def cupy_allocations(cp: ModuleType) -> DeviceAllocations:
    """``DeviceAllocations`` over CuPy on the current GPU."""
    device_id = cp.cuda.runtime.getDevice()
    pool = cp.get_default_memory_pool()

    def reserve(nbytes: int) -> Any:
        return cp.cuda.Memory(nbytes)  # one cudaMalloc, freed with the object

    def carve(block: Any, offset: int, nbytes: int, owner: Any) -> Any:
        if offset < 0 or offset + nbytes > block.size:
            raise ValueError(
                f"carve: bytes [{offset}, {offset + nbytes}) lie outside the {block.size}-byte block"
            )
        return cp.cuda.MemoryPointer(
            cp.cuda.UnownedMemory(block.ptr + offset, nbytes, (block, owner), device_id), 0
        )

    def fresh(nbytes: int, owner: Any) -> Any:
        ptr = pool.malloc(nbytes)
        if nbytes == 0 or owner is None:
            return ptr  # nothing to keep alive: the pool's own pointer
        return cp.cuda.MemoryPointer(cp.cuda.UnownedMemory(ptr.ptr, nbytes, (ptr, owner), device_id), 0)

    return DeviceAllocations(cp.cuda.using_allocator, reserve, carve, fresh)
