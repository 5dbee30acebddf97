"""Recording device work for replay, on the stand-in device (whose capture records kernel calls).

What a CUDA graph relies on, checked without a GPU: a replay recomputes every recorded kernel into the
arrays it made when recorded, from whatever the input buffers hold now; nothing crosses memories while
recording; kernels with data checks (embedding, gather) defer them to a device flag and clamp instead
of reading the device back; the stand-in's queue timestamps give elapsed times.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import opstrata.ops as ops
import opstrata.ops.testing as ot
from opstrata.ops.testing import assert_close

DEV = "_capt"


@pytest.fixture(autouse=True)
def stand_in():
    ot.register_standin_device(DEV)


def _up(a: np.ndarray) -> ot.StandInArray:
    return ops.device_memory(DEV).from_host(a)


def test_the_memory_offers_capture_and_timestamps():
    mem = ops.device_memory(DEV)
    assert mem.capture is not None and mem.mark is not None and mem.elapsed_ms is not None
    a = mem.mark()
    b = mem.mark()
    assert mem.elapsed_ms(a, b) >= 0.0


@settings(max_examples=15, deadline=None)
@given(m=st.integers(1, 6), k=st.integers(1, 9), n=st.integers(1, 7), replays=st.integers(1, 3))
def test_a_replay_recomputes_into_the_recorded_arrays_from_the_current_inputs(m, k, n, replays):
    rng = np.random.default_rng(m * 100 + k * 10 + n)
    x, w = _up(rng.standard_normal((m, k), np.float32)), _up(rng.standard_normal((k, n), np.float32))

    def work():
        with ops.device(DEV):
            return ops.softmax(ops.relu(ops.matmul(x, w)), axis=-1)

    g = ops.device_memory(DEV).capture(work)
    out = g.result
    for _ in range(replays):
        fresh = rng.standard_normal((m, k), np.float32)
        x[...] = fresh  # the graph's input buffer gets new data, as a session stages a feed
        g.replay()
        assert g.result is out  # same buffer, rewritten
        want = ops.softmax(ops.relu(ops.matmul(fresh, np.asarray(w))), axis=-1, device="ref")
        assert_close(np.asarray(out), want, rtol=1e-5, atol=1e-6)


def test_nothing_crosses_memories_while_recording():
    mem = ops.device_memory(DEV)
    x = _up(np.ones((2, 2), np.float32))
    with pytest.raises(RuntimeError, match="device-to-host copy while a device graph is recorded"):
        mem.capture(lambda: mem.to_host(x))
    with pytest.raises(RuntimeError, match="host-to-device copy while a device graph is recorded"):
        mem.capture(lambda: mem.from_host(np.ones(2, np.float32)))
    with pytest.raises(RuntimeError, match="synchronisation while a device graph is recorded"):
        mem.capture(mem.synchronize)
    np.testing.assert_array_equal(mem.to_host(x), 1.0)  # and all is allowed again afterwards


def test_index_checks_are_eager_outside_a_capture():
    w = _up(np.arange(12, dtype=np.float32).reshape(4, 3))
    with ops.device(DEV), pytest.raises(ops.OpError, match=r"embedding.*values in \[0, 4\).*\[0, 4\]"):
        ops.embedding(_up(np.array([0, 4])), w)
    assert ops.capture_checks() is None


@pytest.mark.parametrize(("op", "bad"), [("embedding", [1, 5]), ("gather", [-5, 0])])
def test_index_checks_are_deferred_to_a_device_flag_while_recording(op, bad):
    w = _up(np.arange(12, dtype=np.float32).reshape(4, 3))
    idx = _up(np.array([0, 3]))

    def work():
        with ops.device(DEV):
            if op == "embedding":
                return ops.embedding(idx, w)
            return ops.gather(w, idx, axis=0)

    mem = ops.device_memory(DEV)
    with ops.capturing() as checks:
        g = mem.capture(work)
    (check,) = checks
    assert (check.op, check.input) == (op, "indices")
    assert not bool(mem.to_host(check.flag))
    np.testing.assert_array_equal(mem.to_host(g.result), np.asarray(w)[[0, 3]])
    idx[...] = np.array(bad)  # out of range: the replay clamps and raises the flag, reads nothing back
    g.replay()
    assert bool(mem.to_host(check.flag))
    check.node = "emb"
    assert "node 'emb'" in check.message() and check.expected in check.message()
    np.testing.assert_array_equal(
        mem.to_host(g.result),
        np.asarray(w)[np.clip(np.where(np.array(bad) < 0, np.array(bad) + 4, bad), 0, 3)],
    )
