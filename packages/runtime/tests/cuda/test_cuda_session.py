"""Sessions on the cuda device (a GPU): outputs equal the cpu session's, device feeds and outputs stay there.

Skipped where CuPy or a GPU is missing (CI, the development machines); run by ``tools/gpu_check.sh``.
"""

from __future__ import annotations

import numpy as np
import pytest

import opstrata.ops as ops
from opstrata.graph.testing import (
    bert_block_model,
    cnn_model,
    gpt_block_model,
    gpt_gqa_model,
    mlp_model,
    random_feeds,
)
from opstrata.runtime import InferenceSession

pytestmark = pytest.mark.skipif("cuda" not in ops.list_devices(), reason="no cuda device here")
cp = pytest.importorskip("cupy") if "cuda" in ops.list_devices() else None

MODELS = {
    "mlp": (mlp_model, {"batch": 8}),
    "cnn": (cnn_model, {"batch": 4}),
    "bert": (bert_block_model, {"batch": 4, "seq": 33}),
    "gpt": (gpt_block_model, {"batch": 2, "seq": 17}),
    "gqa": (gpt_gqa_model, {"batch": 2, "seq": 9}),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_session_equals_cpu(name):
    build, dims = MODELS[name]
    model = build()
    feeds = random_feeds(model, dims)
    with ops.fallback_policy("allow"):
        sess = InferenceSession(model, device="cuda")
        got = sess.run(None, feeds)
    want = InferenceSession(model).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        assert isinstance(g, np.ndarray) and g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=name)


def test_run_on_device_and_providers():
    model = mlp_model()
    feeds = random_feeds(model, {"batch": 3})
    sess = InferenceSession(model, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert sess.device == "cuda" and sess.device_fallbacks() == []
    (out,) = sess.run_on_device(None, {k: cp.asarray(v) for k, v in feeds.items()})
    assert isinstance(out, cp.ndarray)
    np.testing.assert_allclose(
        cp.asnumpy(out), InferenceSession(model).run(None, feeds)[0], rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize("name", sorted(MODELS))
def test_cuda_graph_replays_equal_cpu(name):
    from opstrata.runtime import SessionOptions

    build, dims = MODELS[name]
    model = build()
    with ops.fallback_policy("allow"):
        sess = InferenceSession(model, SessionOptions(enable_device_graph=True), device="cuda")
    cpu = InferenceSession(model)
    for seed in range(4):  # eager, recorded, replayed twice: other values each time
        feeds = random_feeds(model, dims, seed=seed)
        for g, w in zip(sess.run(None, feeds), cpu.run(None, feeds), strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=f"{name} run {seed}")
    assert len(sess._device_program.recorded_signatures()) == 1


def test_profiling_uses_cuda_events():
    from opstrata.runtime import SessionOptions

    model = gpt_block_model()
    feeds = random_feeds(model, {"batch": 2, "seq": 17})
    sess = InferenceSession(model, SessionOptions(enable_profiling=True), device="cuda")
    for _ in range(2):
        sess.run(None, feeds)
    events = [e for e in sess.profiler.events if e.run == 1]
    assert len(events) == len(sess.graph.nodes)
    assert all(e.dur_ns >= 0 for e in events) and sum(e.dur_ns for e in events if e.device == "cuda") > 0


@pytest.mark.parametrize("name", sorted(MODELS))
def test_device_arena_serves_runs_that_equal_cpu(name):
    """Eager runs on one planned cudaMalloc per shape: traced on the second run, served from the third;
    new feed values each run, the cpu session's outputs, nothing served off plan."""
    if not hasattr(InferenceSession, "device_arenas"):
        pytest.skip("opstrata-runtime < 0.5.61 plans no device arenas")
    build, dims = MODELS[name]
    model = build()
    with ops.fallback_policy("allow"):
        sess = InferenceSession(model, device="cuda")
        cpu = InferenceSession(model)
        for seed in range(5):
            feeds = random_feeds(model, dims, seed=seed)
            for g, w in zip(sess.run(None, feeds), cpu.run(None, feeds), strict=True):
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=name)
    (arena,) = sess.device_arenas.values()
    assert arena.state == "serving" and arena.runs_served == 3 and arena.unplanned == 0, arena.summary()
    assert 0 < arena.arena_bytes <= arena.traced_bytes
    print(f"{name}: {arena.summary()}")
