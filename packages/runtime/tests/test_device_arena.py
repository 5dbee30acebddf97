"""Device arenas on the stand-in device: eager runs' intermediates in one allocation, laid out by the plan.

The stand-in copies each fresh kernel result into the bytes the session's arena hands out (as CuPy's
kernels allocate through a routed allocator), so a layout that let two live values share bytes would
corrupt results here. Checked: outputs equal the cpu session's run after run with new feeds; the arena
is between the trace's lower bound and its no-reuse total; a profiled run is served the same way; a run
whose allocations differ from the trace (size, or a value kept longer) gets pool memory, never shared
bytes, and traces again; a failed reservation turns the arena off with the reason.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import opstrata.ops as ops
import opstrata.ops.testing as ot
from opstrata.graph.testing import bert_block_model, cnn_model, gpt_block_model, mlp_model, random_feeds
from opstrata.runtime import InferenceSession, SessionOptions

if not hasattr(ops, "DeviceAllocations"):
    pytest.skip("opstrata-ops < 0.4.79 lets no executor lay out device allocations", allow_module_level=True)

from opstrata.runtime._device_arena import MAX_RETRACES, DeviceArena

DEV = "_arena"
MODELS = [
    (mlp_model(), {"batch": 3}),
    (cnn_model(), {"batch": 2}),
    (bert_block_model(), {"batch": 2, "seq": 5}),
    (gpt_block_model(), {"batch": 2, "seq": 6}),
]


@pytest.fixture(autouse=True)
def stand_in():
    with ot.isolated_registry():  # the registry, the memories and the fallback report restored after
        ot.register_standin_device(DEV)
        yield


@pytest.mark.parametrize(("model", "dims"), MODELS, ids=["mlp", "cnn", "bert", "gpt"])
def test_served_runs_equal_the_cpu_session_with_new_feeds_each_run(model, dims):
    dev, cpu = InferenceSession(model, device=DEV), InferenceSession(model)
    for r in range(5):
        feeds = random_feeds(model, dims, seed=r)
        for g, w in zip(dev.run(None, feeds), cpu.run(None, feeds), strict=True):
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)
    (st_,) = dev.device_arenas.values()
    assert st_.state == "serving", st_.summary()
    assert st_.runs_served == 3 and st_.unplanned == 0 and st_.traces == 1
    assert st_.planned > 0 and st_.escaped >= len(model.graph.output)
    assert 0 < st_.lower_bound_bytes <= st_.arena_bytes <= st_.traced_bytes
    assert st_.arena_bytes < st_.traced_bytes or st_.planned < 4  # bytes reused (a 2-layer MLP has 3)


def test_profiled_runs_are_served_and_arenas_follow_the_options_and_the_cache_size(tmp_path):
    model, dims = gpt_block_model(), {"batch": 2, "seq": 6}
    sess = InferenceSession(model, SessionOptions(enable_profiling=True, profile_file_prefix=str(tmp_path / "p")), device=DEV)  # fmt: skip
    for r in range(4):
        sess.run(None, random_feeds(model, dims, seed=r))
    (st_,) = sess.device_arenas.values()
    assert st_.runs_served == 2 and st_.unplanned == 0  # events keep shapes, not the arrays
    assert InferenceSession(model, SessionOptions(enable_mem_arena=False), device=DEV).device_arenas == {}
    small = InferenceSession(model, SessionOptions(plan_cache_size=2), device=DEV)
    for seq in (3, 4, 5, 4):
        small.run(None, random_feeds(model, {"batch": 1, "seq": seq}))
    assert [sig[0][1] for sig in small.device_arenas] == [5, 4]  # least recently used dropped
    assert InferenceSession(model).device_arenas == {}  # cpu sessions plan their own arenas


# ---------------------------------------------------------------------------- the arena itself


def _program(arena: DeviceArena, steps: list[tuple[str, int]], keep: set[int] = frozenset()):
    """Run an allocation program through the arena's routed function: ("alloc", nbytes) and ("free", i).

    Returns the allocations still held at the end and checks, at every allocation, that no two held
    allocations share bytes (what a served run must never do)."""
    fn = arena.begin()
    held: dict[int, object] = {}
    kept = []
    for op, v in steps:
        if op == "alloc":
            mem = fn(v) if fn is not None else ops.device_memory(DEV).allocations.fresh(v, None)
            for other in held.values():
                assert not np.shares_memory(mem.buf, other.buf), "two live allocations share bytes"
            held[len(held) + len(kept)] = mem
        elif v in held:
            if v in keep:
                kept.append(held.pop(v))  # lives on past its traced free (a profiler holding it, say)
            else:
                del held[v]
    arena.end()
    return held, kept


@st.composite
def _programs(draw):
    n = draw(st.integers(1, 14))
    steps, alive = [], []
    for i in range(n):
        steps.append(("alloc", draw(st.integers(1, 3000))))
        alive.append(i)
        for j in draw(st.lists(st.sampled_from(alive), max_size=2, unique=True)):
            steps.append(("free", j))
            alive.remove(j)
    return steps


@settings(max_examples=60, deadline=None)
@given(_programs(), st.data())
def test_a_served_program_never_shares_bytes_between_live_allocations(steps, data):
    arena = DeviceArena(ops.device_memory(DEV).allocations)
    _program(arena, steps)  # warm-up
    _program(arena, steps)  # traced
    assert arena.state == "serving"
    _program(arena, steps)  # served as traced
    s = arena.stats()
    assert s.unplanned == 0 and s.lower_bound_bytes <= s.arena_bytes <= s.traced_bytes
    assert s.planned + s.escaped == sum(1 for op, _ in steps if op == "alloc")
    frees = [v for op, v in steps if op == "free"]
    keep = set(data.draw(st.lists(st.sampled_from(frees), max_size=3))) if frees else set()
    _, kept = _program(arena, steps, keep)  # values kept longer: pool memory where the plan would clash
    del kept
    assert arena.stats().state == ("serving" if arena.stats().unplanned == 0 else "tracing")


def test_runs_that_keep_differing_turn_the_arena_off_and_a_failed_reservation_says_why():
    al = ops.device_memory(DEV).allocations
    arena = DeviceArena(al)
    _program(arena, [("alloc", 100), ("free", 0), ("alloc", 100)])
    for k in range(MAX_RETRACES):
        _program(arena, [("alloc", 100 + k), ("free", 0), ("alloc", 100)])  # traced
        assert arena.state == "serving"
        if k < MAX_RETRACES - 1:
            _program(arena, [("alloc", 999), ("free", 0), ("alloc", 100)])  # sizes differ: off plan
    with pytest.warns(RuntimeWarning, match="device arena off.*differed from the traced run"):
        _program(arena, [("alloc", 999), ("free", 0), ("alloc", 100)])
    s = arena.stats()
    assert s.state == "off" and "differed from the traced run" in s.reason and s.unplanned >= MAX_RETRACES
    assert arena.begin() is None  # off: the device allocates for itself

    def no_memory(n):
        raise MemoryError(f"cannot reserve {n} bytes")

    broke = DeviceArena(ops.DeviceAllocations(al.route, no_memory, al.carve, al.fresh))
    _program(broke, [("alloc", 100), ("free", 0), ("alloc", 100)])
    with pytest.warns(RuntimeWarning, match="reserving the 256-byte arena failed: MemoryError"):
        _program(broke, [("alloc", 100), ("free", 0), ("alloc", 100)])
    s = broke.stats()
    assert s.state == "off" and "reserving the 256-byte arena failed: MemoryError" in s.reason


def test_a_failing_carve_turns_the_arena_off_and_the_session_still_answers():
    """A device whose carve raises (an API the arena does not know, say): that request and the rest of the
    run come from the pool, the arena is off with the reason, and the outputs are right."""
    mem = ops.device_memory(DEV)

    def broken_carve(block, offset, nbytes, owner):
        raise TypeError("UnownedMemory() takes no owner")

    ops.register_memory(
        DEV, dataclasses.replace(mem, allocations=dataclasses.replace(mem.allocations, carve=broken_carve))
    )
    model, dims = gpt_block_model(), {"batch": 2, "seq": 6}
    dev, cpu = InferenceSession(model, device=DEV), InferenceSession(model)
    with pytest.warns(
        RuntimeWarning, match="the arena's allocation of [0-9]+ bytes failed: TypeError: UnownedMemory"
    ):
        for r in range(4):
            feeds = random_feeds(model, dims, seed=r)
            for g, w in zip(dev.run(None, feeds), cpu.run(None, feeds), strict=True):
                np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)
    (s,) = dev.device_arenas.values()
    assert s.state == "off" and "TypeError" in s.reason and s.arena_bytes == 0


def test_outputs_left_on_the_device_stay_intact_while_later_runs_are_served():
    """run_on_device hands out device arrays: they outlive their run, so they come from the pool, and the
    served runs after them (new feed values) never write over them."""
    model, dims = gpt_block_model(), {"batch": 2, "seq": 6}
    dev, cpu = InferenceSession(model, device=DEV), InferenceSession(model)
    mem = ops.device_memory(DEV)
    kept = []
    for r in range(5):
        feeds = random_feeds(model, dims, seed=r)
        kept.append(
            (dev.run_on_device(None, {k: mem.from_host(v) for k, v in feeds.items()}), cpu.run(None, feeds))
        )
    (st_,) = dev.device_arenas.values()
    assert st_.state == "serving" and st_.runs_served == 3 and st_.unplanned == 0, st_.summary()
    for got, want in kept:  # every run's outputs, read after all five ran
        for g, w in zip(got, want, strict=True):
            assert mem.is_array(g)
            np.testing.assert_allclose(mem.to_host(g), w, rtol=2e-5, atol=2e-5)
