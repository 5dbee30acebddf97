"""The all_reduce op: a world of one is the identity, more ranks need a registered collective kernel."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import opstrata.ops as ops
from opstrata.ops import OpError


@settings(max_examples=25, deadline=None)
@given(
    shape=st.lists(st.integers(0, 4), max_size=3),
    dtype=st.sampled_from(ops.ALL_DTYPES),
    op=st.sampled_from(["sum", "avg", "max", "min", "prod"]),
    device=st.sampled_from(["ref", "cpu"]),
)
def test_group_of_one_is_a_copy(shape: list[int], dtype: np.dtype, op: str, device: str) -> None:
    x = (np.arange(int(np.prod(shape)), dtype=np.float64) % 3).reshape(shape).astype(dtype)
    y = ops.all_reduce(x, op=op, group_size=1, device=device)
    assert y.dtype == x.dtype and y.shape == x.shape
    np.testing.assert_array_equal(y.astype(np.float64), x.astype(np.float64))
    assert not np.shares_memory(x, y)  # a new array, like every other op result


@pytest.mark.parametrize("device", ["ref", "cpu"])
def test_more_ranks_without_comm_name_the_fix(device: str) -> None:
    with pytest.raises(
        OpError, match=r"all_reduce: argument 'group_size' .* got 2.*init_process_group first"
    ):
        ops.all_reduce(np.ones(3, np.float32), group_size=2, device=device)


def test_bad_arguments() -> None:
    with pytest.raises(OpError, match=r"argument 'op' expected one of"):
        ops.all_reduce(np.ones(3), op="mean")
    for bad in (0, -1, 1.5, True):
        with pytest.raises(OpError, match=r"argument 'group_size' expected an int >= 1"):
            ops.all_reduce(np.ones(3), group_size=bad)
    with pytest.raises(OpError, match=r"argument 'x'"):
        ops.all_reduce(np.array(["a"]))


def test_a_registered_kernel_overrides_and_unregisters_alone() -> None:
    """What opstrata.comm does: a higher-priority cpu kernel, later removed without touching the others."""
    seen: list[tuple[str, int]] = []

    def fake_collective(x: np.ndarray, *, op: str = "sum", group_size: int = 1) -> np.ndarray:
        seen.append((op, group_size))
        return np.asarray(x) * group_size

    ops.register("all_reduce", device="cpu", priority=10)(fake_collective)
    np.testing.assert_array_equal(ops.all_reduce(np.ones(2, np.float32), op="max", group_size=3), [3, 3])
    assert seen == [("max", 3)] and ops.dispatch_path("all_reduce", "cpu", np.float32) == "native"
    assert ops.unregister("all_reduce", device="cpu", kernel=fake_collective) == 1
    assert ops.unregister("all_reduce", device="cpu", kernel=fake_collective) == 0
    with pytest.raises(OpError, match="init_process_group"):
        ops.all_reduce(np.ones(2, np.float32), group_size=3)
    assert [k.device for k in ops.kernels("all_reduce")] == ["cpu", "ref"]  # the ops kernels stayed
