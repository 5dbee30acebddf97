"""DeviceAllocations on the stand-in device: an executor routes the kernels' allocations and sees the frees.

What a planned device arena relies on, checked without a GPU: inside ``route`` every fresh kernel result
lands in the bytes the routed function hands out (carved from one reserved block, or fresh), a view
result keeps its base's memory (and owner) alive, and the owner is released exactly when the last array
on that memory goes.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import opstrata.ops as ops
import opstrata.ops.testing as ot
from opstrata.ops.testing import assert_close

DEV = "_alloc"


@pytest.fixture(autouse=True)
def stand_in():
    ot.register_standin_device(DEV)


class _Owner:
    pass


def _up(a: np.ndarray) -> ot.StandInArray:
    return ops.device_memory(DEV).from_host(a)


def test_routed_results_land_in_carved_bytes_and_free_their_owner_with_the_last_view():
    al = ops.device_memory(DEV).allocations
    assert al is not None and al.alignment == 256
    block = al.reserve(4096)
    owners: list[weakref.ref] = []
    asked: list[int] = []

    def alloc(n: int):
        owner = _Owner()
        owners.append(weakref.ref(owner))
        asked.append(n)
        return al.carve(block, 1024 * (len(asked) - 1), n, owner)

    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    dx, five = _up(x), _up(np.float32(5.0))
    with ops.device(DEV), al.route(alloc):
        y = ops.relu(ops.sub(dx, five))  # two kernels: two results, each in its own carved slice
        v = ops.reshape(y, shape=(4, 3))  # a view: no allocation, keeps y's memory
    assert asked == [48, 48]
    assert np.shares_memory(y, block) and np.shares_memory(v, block)
    assert_close(np.asarray(v), np.maximum(x - 5.0, 0.0).reshape(4, 3))
    gc.collect()
    assert owners[0]() is None  # the intermediate (dx - 5) is gone: its owner with it
    assert owners[1]() is not None
    del y
    assert owners[1]() is not None  # the view still uses the memory
    del v
    assert owners[1]() is None


def test_outside_route_results_are_the_devices_own_and_fresh_memory_is_counted():
    al = ops.device_memory(DEV).allocations
    seen: list[int] = []

    def alloc(n: int):
        seen.append(n)
        return al.fresh(n, _Owner())

    dx = _up(np.ones((2, 5), np.float64))
    with ops.device(DEV):
        a = ops.exp(dx)
        with al.route(alloc):
            b = ops.exp(dx)
    assert seen == [80]
    assert_close(np.asarray(a), np.asarray(b))
    assert getattr(a, "_mem", None) is None and b._mem is not None


def test_carving_outside_the_block_is_refused():
    al = ops.device_memory(DEV).allocations
    block = al.reserve(512)
    with pytest.raises(ValueError, match="outside the 512-byte block"):
        al.carve(block, 256, 512, _Owner())
