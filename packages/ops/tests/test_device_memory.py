"""Devices with their own memory: a fallback copies arrays across and back, and the audit counts it.

The device here is a stand-in with a memory of its own (arrays boxed in ``Boxed``), the way ``cuda``
holds CuPy arrays: a call on it that falls back to ``cpu`` must see host copies, return a boxed result,
fill a boxed ``out=`` in place, and record the bytes and time of those copies; with the ``error`` policy
nothing is copied or run.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import opstrata.ops as ops


class Boxed:
    """An array in the stand-in device's memory (not a numpy array: cpu kernels cannot take it)."""

    def __init__(self, a: np.ndarray) -> None:
        self.data = np.array(a)

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape


def _from_host(a: np.ndarray, out: Boxed | None = None) -> Boxed:
    if out is None:
        return Boxed(a)
    np.copyto(out.data, a)
    return out


BOX = ops.DeviceMemory("box:0", lambda x: isinstance(x, Boxed), lambda x: x.data.copy(), _from_host)


@pytest.fixture
def boxdev():
    """Device ``_box`` with its own memory, one native kernel and ``_test_add`` only on cpu."""
    ops.register_memory("_box", BOX)
    ops.register("_test_box_neg", device="_box")(lambda x: Boxed(-x.data))
    seen = []

    def add_cpu(a, b, *, out=None):
        assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray), "cpu kernel got a device array"
        seen.append((type(a), type(b), type(out)))
        return np.add(a, b, out=out)

    ops.register("_test_add", device="cpu", dtypes=ops.FLOAT_DTYPES)(add_cpu)
    ops.set_fallback_policy("allow")
    return seen


def test_fallback_copies_arguments_to_the_host_and_the_result_back(boxdev):
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.full((2, 3), 0.5, np.float32)
    got = ops.call("_test_add", Boxed(a), Boxed(b), device="_box")
    assert isinstance(got, Boxed)
    np.testing.assert_array_equal(got.data, a + b)
    (rec,) = ops.fallback_report().records
    assert (rec.op, rec.device, rec.path, rec.count) == ("_test_add", "_box", "device:cpu", 1)
    assert rec.bytes_copied == 3 * a.nbytes  # two arguments over, one result back
    assert rec.copy_seconds > 0
    assert "copied 72 B" in rec.line()
    table = ops.fallback_report().table()
    assert "copied" in table and "copy ms" in table and "72 B" in table


def test_out_on_the_device_is_filled_in_place(boxdev):
    a = np.ones((4,), np.float32)
    out = Boxed(np.zeros(4, np.float32))
    got = ops.call("_test_add", Boxed(a), Boxed(a), out=out, device="_box")
    assert got is out
    np.testing.assert_array_equal(out.data, 2 * a)
    assert boxdev[-1] == (np.ndarray, np.ndarray, np.ndarray)  # the cpu kernel wrote a host out
    assert ops.fallback_report().bytes_copied == 4 * a.nbytes  # a, a, out over; out back


def test_native_kernel_on_the_device_copies_nothing(boxdev):
    got = ops.call("_test_box_neg", Boxed(np.ones(3, np.float32)), device="_box")
    np.testing.assert_array_equal(got.data, -np.ones(3))
    assert ops.fallback_report().total == 0


def test_containers_and_scalars_are_walked(boxdev):
    ops.register("_test_cat", device="cpu")(lambda xs, *, axis=0: np.concatenate(xs, axis=axis))
    x = np.arange(3, dtype=np.float32)
    got = ops.call("_test_cat", [Boxed(x), Boxed(x)], axis=0, device="_box")
    assert isinstance(got, Boxed)
    np.testing.assert_array_equal(got.data, np.concatenate([x, x]))
    assert ops.fallback_report().bytes_copied == 4 * x.nbytes


def test_tuple_results_come_back_boxed(boxdev):
    ops.register("_test_split2", device="cpu")(lambda x: (x[:1].copy(), x[1:].copy()))
    got = ops.call("_test_split2", Boxed(np.arange(3, dtype=np.float32)), device="_box")
    assert isinstance(got, tuple) and all(isinstance(g, Boxed) for g in got)
    assert [g.data.tolist() for g in got] == [[0.0], [1.0, 2.0]]


def test_error_policy_refuses_before_copying(boxdev):
    with (
        ops.fallback_policy("error"),
        pytest.raises(ops.FallbackError, match=r"_test_add on _box .*device:cpu"),
    ):
        ops.call("_test_add", Boxed(np.ones(2, np.float32)), Boxed(np.ones(2, np.float32)), device="_box")
    assert boxdev == []  # the cpu kernel never ran
    assert ops.fallback_report().total == 0


@settings(max_examples=25, deadline=None)
@given(n=st.integers(0, 40), calls=st.integers(1, 4))
def test_bytes_counted_per_call_for_any_size(n, calls):
    ops.reset_fallback_report()
    ops.register_memory("_box", BOX)
    ops.register("_test_box_neg", device="_box")(lambda x: Boxed(-x.data))
    ops.register("_test_add", device="cpu", dtypes=ops.FLOAT_DTYPES)(lambda a, b, *, out=None: np.add(a, b))
    a = np.linspace(-1, 1, n, dtype=np.float32)
    with ops.fallback_policy("allow"):
        for _ in range(calls):
            got = ops.call("_test_add", Boxed(a), Boxed(a), device="_box")
            np.testing.assert_array_equal(got.data, a + a)
    rep = ops.fallback_report()
    assert rep.total == calls and rep.bytes_copied == calls * 3 * a.nbytes


def test_unavailable_device_names_the_reason():
    ops.mark_unavailable("_gone", "no GPU visible (cudaGetDeviceCount returned 0)")
    with pytest.raises(
        ops.DeviceUnavailableError, match=r"'_gone' is not available here: no GPU visible"
    ) as err:
        ops.call("relu", np.ones(1), device="_gone")
    assert isinstance(err.value, ops.UnknownDeviceError)  # callers catching the old error still do
    with pytest.raises(ops.DeviceUnavailableError, match="opstrata info"):
        with ops.device("_gone"):
            pass
    rows = {s.name: s for s in ops.device_status()}
    assert rows["_gone"].available is False and "no GPU" in rows["_gone"].reason
    assert rows["cpu"].available and rows["cpu"].memory == "host"


def test_registering_a_memory_makes_the_device_available_again():
    ops.mark_unavailable("_box", "not yet")
    ops.register_memory("_box", BOX)
    ops.register("_test_box_neg", device="_box")(lambda x: Boxed(-x.data))
    rows = {s.name: s for s in ops.device_status()}
    assert rows["_box"].available and rows["_box"].memory == "box:0"
    assert ops.device_memory("_box") is BOX and ops.device_memory("cpu") is None
    assert ops.is_device_array(Boxed(np.ones(1))) and not ops.is_device_array(np.ones(1))


def test_register_memory_rejects_other_objects():
    with pytest.raises(TypeError, match="expected a DeviceMemory"):
        ops.register_memory("_box", object())  # type: ignore[arg-type]


def test_standin_device_runs_cuda_kernels_and_refuses_host_arrays():
    import opstrata.ops.testing as ot

    dev = ot.register_standin_device("_st")
    x = ot.StandInArray((2, 5), np.float32)
    x[...] = np.arange(10, dtype=np.float32).reshape(2, 5)
    got = ops.call("softmax", x, device=dev)
    assert isinstance(got, ot.StandInArray)
    np.testing.assert_allclose(got, ops.softmax(np.asarray(x)), rtol=1e-6)
    with pytest.raises(AssertionError, match="a host array float32"):
        ops.call("softmax", np.ones((2, 5), np.float32), device=dev)
    assert ops.device_memory(dev).is_array(got) and not ops.device_memory(dev).is_array(np.ones(1))


def test_public_functions_take_device_arrays(boxdev):
    x = np.array([[0.0, 1.0, 2.0]], np.float32)
    got = ops.softmax(Boxed(x), device="_box")  # no softmax kernel on _box: the audited fallback copies
    assert isinstance(got, Boxed)
    np.testing.assert_allclose(got.data, ops.softmax(x), rtol=1e-6)
    assert ops.fallback_report().count("softmax", device="_box") == 1
