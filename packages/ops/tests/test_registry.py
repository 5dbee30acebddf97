"""Registry: registration, listing, dispatch by device and dtype, priority, the kernel cache."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import opstrata.ops as ops
from opstrata.ops import _registry
from opstrata.ops.testing import isolated_registry

FLOATS = [np.float32, np.float64, ops.bfloat16, np.float16]


def _tagged(tag: str):
    """A kernel that returns ``(tag, x)`` so a test can see which one ran."""

    def kernel(x, *, scale=1):
        x = np.asarray(x)
        # scale in x's dtype: numpy < 2 promotes a 0-d float32 times a Python int to float64
        return tag, x * np.asarray(scale, x.dtype)

    kernel.__name__ = f"kernel_{tag}"
    return kernel


@pytest.fixture
def two_devices():
    ops.register("_test_id", device="ref")(_tagged("ref"))
    ops.register("_test_id", device="cpu")(_tagged("cpu"))


def test_listing(two_devices):
    assert "_test_id" in ops.list_ops()
    assert "_test_id" in ops.list_ops("ref") and "_test_id" in ops.list_ops("cpu")
    assert {"ref", "cpu"} <= set(ops.list_devices())
    assert [(k.device, k.fn.__name__) for k in ops.kernels("_test_id")] == [
        ("cpu", "kernel_cpu"),
        ("ref", "kernel_ref"),
    ]


def test_dispatch_to_each_device(two_devices):
    x = np.ones(3, np.float32)
    assert ops.call("_test_id", x)[0] == "cpu"  # default device
    assert ops.call("_test_id", x, device="ref")[0] == "ref"
    assert ops.call("_test_id", x, device="cpu", scale=2)[1].tolist() == [2, 2, 2]
    with ops.device("ref"):
        assert ops.get_default_device() == "ref"
        assert ops.call("_test_id", x)[0] == "ref"
        assert ops.call("_test_id", x, device="cpu")[0] == "cpu"  # explicit beats context
    ops.set_default_device("ref")
    assert ops.call("_test_id", x)[0] == "ref"
    assert len(ops.fallback_report()) == 0


def test_unknown_device_is_clear(two_devices):
    with pytest.raises(ops.UnknownDeviceError, match=r"unknown device 'cdu'; did you mean 'cpu'"):
        ops.call("_test_id", np.ones(2), device="cdu")
    with pytest.raises(ops.UnknownDeviceError, match="Known devices: cpu, ref"):
        ops.set_default_device("tpu")


def test_dtype_selects_kernel():
    ops.register("_test_dt", device="cpu", dtypes=[np.float32])(_tagged("f32"))
    ops.register("_test_dt", device="cpu", dtypes=["float64", ops.bfloat16])(_tagged("wide"))
    assert ops.call("_test_dt", np.ones(2, np.float32))[0] == "f32"
    assert ops.call("_test_dt", np.ones(2, np.float64))[0] == "wide"
    assert ops.call("_test_dt", np.ones(2, ops.bfloat16))[0] == "wide"
    assert ops.call("_test_dt", 1.0)[0] == "wide"  # Python float -> float64


def test_priority_then_newest_wins():
    ops.register("_test_prio", device="cpu", priority=5)(_tagged("high"))
    ops.register("_test_prio", device="cpu")(_tagged("low"))
    assert ops.call("_test_prio", 1.0)[0] == "high"
    ops.register("_test_prio", device="cpu", priority=5)(_tagged("high2"))
    assert ops.call("_test_prio", 1.0)[0] == "high2"


def test_dtype_arg_picks_primary_argument():
    @ops.register("_test_where", device="cpu", dtypes=[np.float32], dtype_arg=1)
    def where32(cond, x, y):
        return "f32"

    assert ops.call("_test_where", np.ones(2, bool), np.ones(2, np.float32), np.ones(2, np.float32)) == "f32"
    with pytest.raises(ValueError, match=r"already uses dtype_arg=1.*Fix: register every kernel"):
        ops.register("_test_where", device="ref", dtype_arg=0)(where32)


def test_cache_hit_and_invalidation():
    runs = []

    @ops.register("_test_cache", device="cpu")
    def first(x):
        runs.append("first")
        return x

    x = np.ones(2, np.float32)
    ops.call("_test_cache", x)
    key = ("_test_cache", "cpu", np.dtype(np.float32))
    assert key in _registry._CACHE
    cached = _registry._CACHE[key]
    ops.call("_test_cache", x)
    assert _registry._CACHE[key] is cached  # second call took the cached path
    assert runs == ["first", "first"]

    @ops.register("_test_cache", device="cpu")
    def second(x):
        runs.append("second")
        return x

    assert key not in _registry._CACHE  # registering anything invalidates
    ops.call("_test_cache", x)
    assert runs[-1] == "second"


def test_register_validates_its_arguments():
    with pytest.raises(TypeError, match="non-empty str"):
        ops.register("")
    with pytest.raises(ValueError, match="dtypes is empty"):
        ops.register("_test_bad", dtypes=[])
    with pytest.raises(TypeError, match="expected a callable"):
        ops.register("_test_bad", device="cpu")(42)
    assert ops.register("_test_one", dtypes="float32")(_tagged("x"))  # a single dtype is accepted
    assert ops.kernels("_test_one")[0].dtypes == frozenset({np.dtype(np.float32)})


def test_unregister_and_isolated_registry(two_devices):
    with isolated_registry():
        assert ops.unregister("_test_id", device="cpu") == 1
        assert ops.list_ops("cpu").count("_test_id") == 0
        assert ops.unregister("_test_id") == 1
        assert "_test_id" not in ops.list_ops()
    assert ops.call("_test_id", 1.0)[0] == "cpu"  # restored on exit


def test_coverage_and_dispatch_path():
    ops.register("_test_cov", device="ref", dtypes=ops.FLOAT_DTYPES)(_tagged("ref"))
    ops.register("_test_cov", device="cpu", dtypes=[np.float32])(_tagged("cpu"))
    ops.register_decomposition("_test_covd", lambda x: x)
    table = ops.coverage(["_test_cov", "_test_covd"], ["cpu", "ref"], [np.float32, np.float16, np.int32])
    assert table["_test_cov"]["cpu"] == {"float32": "native", "float16": "fallback:ref", "int32": "missing"}
    assert table["_test_cov"]["ref"]["float16"] == "native"
    assert table["_test_covd"]["cpu"]["int32"] == "decomposed"
    assert ops.dispatch_path("_test_cov", "cpu", "float16") == "device:ref"
    assert ops.dispatch_path("_test_cov", "cpu", np.float32) == "native"
    assert len(ops.fallback_report()) == 0  # asking is not falling back


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(0, 4), min_size=0, max_size=3),
    dtype=st.sampled_from(FLOATS),
    device=st.sampled_from(["ref", "cpu"]),
)
def test_dispatch_matches_dtype_and_device(shape, dtype, device):
    with isolated_registry():
        for dt in FLOATS:
            for dev in ("ref", "cpu"):
                ops.register("_test_h", device=dev, dtypes=[dt])(_tagged(f"{dev}/{np.dtype(dt)}"))
        x = np.zeros(shape, dtype)
        for _ in range(2):  # cold, then cached
            tag, out = ops.call("_test_h", x, device=device)
            assert tag == f"{device}/{np.dtype(dtype)}"
            assert out.shape == tuple(shape) and out.dtype == np.dtype(dtype)


def test_sequence_primary_argument_keys_on_first_element_dtype() -> None:
    """concat-style ops take a list of differently shaped arrays; dispatch must not stack them."""
    import opstrata.ops as ops

    seen = []

    @ops.register("_test_seq", device="cpu", dtypes=[np.float32])
    def _seq(arrays):
        seen.append(len(arrays))
        return arrays[0]

    parts = [np.ones((2, 3), np.float32), np.ones((5, 3), np.float32)]
    ops.call("_test_seq", parts, device="cpu")
    ops.call("_test_seq", tuple(parts), device="cpu")
    assert seen == [2, 2]
    with pytest.raises(ops.NoKernelError):
        ops.call("_test_seq", [np.ones(2, np.int32), np.ones(3, np.int32)], device="cpu")


def test_resolve_kernel_is_what_call_runs_natively_and_generation_tracks_changes():
    with isolated_registry():
        cpu, ref = _tagged("cpu"), _tagged("ref")
        ops.register("_test_resolve", device="cpu", dtypes=[np.float32])(cpu)
        ops.register("_test_resolve", device="ref")(ref)
        assert ops.resolve_kernel("_test_resolve", np.float32, device="cpu") is cpu
        assert ops.resolve_kernel("_test_resolve", "float32", device="ref") is ref
        # float64 has no cpu kernel: call() would take the audited fallback to ref, so no native kernel
        assert ops.dispatch_path("_test_resolve", "cpu", np.float64) != "native"
        assert ops.resolve_kernel("_test_resolve", np.float64, device="cpu") is None
        assert ops.resolve_kernel("_test_no_such_op", np.float32) is None
        gen = ops.registry_generation()
        newer = _tagged("newer")
        ops.register("_test_resolve", device="cpu", dtypes=[np.float32], priority=1)(newer)
        assert ops.registry_generation() > gen  # a caller caching resolve_kernel must re-resolve
        assert ops.resolve_kernel("_test_resolve", np.float32, device="cpu") is newer
        gen = ops.registry_generation()
        ops.unregister("_test_resolve", device="cpu", kernel=newer)
        assert ops.registry_generation() > gen
        assert ops.resolve_kernel("_test_resolve", np.float32, device="cpu") is cpu
