"""Device graphs (onnxruntime's enable_cuda_graph) on the stand-in device, whose capture records kernel calls
and whose replay re-runs only those, as a CUDA graph replays only the kernels it captured.

A signature runs eagerly once, is recorded on its second run and replayed after: outputs must follow
the feeds' current values on every replay (nothing baked but shape work), new shapes get their own
graph, index checks fail the run after a replay, and plans a graph cannot hold are refused at creation.
"""

from __future__ import annotations

import numpy as np
import pytest

import opstrata.ops as ops
import opstrata.ops.testing as ot
from opstrata.graph.testing import (
    ModelBuilder,
    bert_block_model,
    cnn_model,
    gpt_block_model,
    gpt_gqa_model,
    mlp_model,
    random_feeds,
)
from opstrata.runtime import ExecutionError, InferenceSession, InvalidArgument, SessionOptions

if not hasattr(ops, "capturing") or not hasattr(ot, "StandInGraph"):
    pytest.skip("opstrata-ops < 0.4.75 records no device graphs", allow_module_level=True)

DEV = "_graphs"


def _device_windows() -> bool:
    try:
        from opstrata.graph.opdefs.conv import conv_geometry  # noqa: F401
    except ImportError:
        return False
    return True


GRAPHS = SessionOptions(enable_device_graph=True)


@pytest.fixture(autouse=True)
def stand_in():
    ot.register_standin_device(DEV)
    ops.reset_fallback_report()


@pytest.mark.parametrize(
    ("model", "dims"),
    [
        (mlp_model(), {"batch": 3}),
        (cnn_model(), {"batch": 2}),
        (bert_block_model(), {"batch": 2, "seq": 5}),
        (gpt_block_model(), {"batch": 2, "seq": 6}),
        (gpt_gqa_model(), {"batch": 1, "seq": 7}),
    ],
    ids=["mlp", "cnn", "bert", "gpt", "gqa"],
)
def test_replays_follow_the_feeds_values(model, dims):
    if model.graph.name == "cnn" and not _device_windows():
        pytest.skip("this opstrata-graph has no conv_geometry: the convolutions run on the host")
    sess = InferenceSession(model, GRAPHS, device=DEV)
    cpu = InferenceSession(model)
    prog = sess._device_program
    for seed in range(4):  # eager, recorded, then two replays: each with other values, same shapes
        feeds = random_feeds(model, dims, seed=seed)
        for g, w in zip(sess.run(None, feeds), cpu.run(None, feeds), strict=True):
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)
        assert len(prog.recorded_signatures()) == (0 if seed == 0 else 1)
    (rec,) = prog._recorded.values()
    assert rec.graph.calls  # the replays ran recorded kernels, not the Python plan


def test_each_shape_gets_its_own_graph_and_outputs_are_copies():
    model = gpt_block_model()
    sess = InferenceSession(model, GRAPHS, device=DEV)
    cpu = InferenceSession(model)
    kept = []
    for seq in (3, 5, 3, 5, 3):
        feeds = random_feeds(model, {"batch": 1, "seq": seq}, seed=seq * 7 + len(kept))
        (got,) = sess.run(None, feeds)
        np.testing.assert_allclose(got, cpu.run(None, feeds)[0], rtol=2e-5, atol=2e-5)
        kept.append((got, got.copy()))
    assert sorted(sess._device_program.recorded_signatures()) == [((1, 3),), ((1, 5),)]
    for got, copy in kept:  # a later replay did not rewrite an output already returned
        np.testing.assert_array_equal(got, copy)


def test_run_on_device_replays_with_device_feeds_and_returns_device_copies():
    model = mlp_model()
    sess = InferenceSession(model, GRAPHS, device=DEV)
    cpu = InferenceSession(model)
    outs = []
    for seed in range(3):
        feeds = random_feeds(model, {"batch": 2}, seed=seed)
        (out,) = sess.run_on_device(None, {k: v.view(ot.StandInArray) for k, v in feeds.items()})
        assert isinstance(out, ot.StandInArray)
        outs.append((out, cpu.run(None, feeds)[0]))
    for out, want in outs:
        np.testing.assert_allclose(np.asarray(out), want, rtol=2e-5, atol=2e-6)


def test_an_index_out_of_range_fails_the_replayed_run_naming_the_node():
    model = gpt_block_model(vocab=50)
    sess = InferenceSession(model, GRAPHS, device=DEV)
    feeds = random_feeds(model, {"batch": 1, "seq": 4})
    sess.run(None, feeds)
    sess.run(None, feeds)  # recorded
    bad = {"ids": np.array([[1, 2, 50, 3]], np.int64)}
    with pytest.raises(ExecutionError, match=r"node '.*' \((embedding|gather)\).*values in \[0, 50\)"):
        sess.run(None, bad)
    np.testing.assert_allclose(  # the graph is still good for the next run
        sess.run(None, feeds)[0], InferenceSession(model).run(None, feeds)[0], rtol=2e-5, atol=2e-5
    )


def _ids_plus_one_model():
    """Token ids shifted by one on the host (integer work on the feed's values), then an embedding."""
    b = ModelBuilder("shifted", 17, 0)
    ids = b.input("ids", ["batch", "seq"], np.int64)
    shifted = b.op("Add", [ids, b.const(np.array(1, np.int64))])
    b.nodes.append(
        b.onnx.helper.make_node("Gather", [b.weight([20, 8], "wte", 0.5), shifted], ["emb"], axis=0)
    )
    b.output("emb")
    return b.build()


def test_plans_a_graph_cannot_hold_are_refused_at_creation():
    model = _ids_plus_one_model()
    with pytest.raises(InvalidArgument, match=r"cannot be recorded as one device graph: node '.*' \(Add\) computes on the host from the values of the feeds \('ids'\)"):  # fmt: skip
        InferenceSession(model, GRAPHS, device=DEV)
    sess = InferenceSession(model, device=DEV)  # without graphs it runs, Add on the host
    feeds = {"ids": np.array([[0, 5, 18]], np.int64)}
    np.testing.assert_allclose(sess.run(None, feeds)[0], InferenceSession(model).run(None, feeds)[0])
    with pytest.raises(InvalidArgument, match="enable_device_graph needs a device with its own memory"):
        InferenceSession(mlp_model(), GRAPHS)
    with pytest.raises(InvalidArgument, match="enable_device_graph must be True or False"):
        InferenceSession(mlp_model(), SessionOptions(enable_device_graph=1), device=DEV)


def test_the_onnxruntime_provider_option_turns_graphs_on():
    on = InferenceSession(mlp_model(), providers=[(DEV, {"enable_cuda_graph": "1"})])
    off = InferenceSession(mlp_model(), providers=[(DEV, {"enable_cuda_graph": "0"})])
    assert on._device_program.device_graph and not off._device_program.device_graph


def test_profiling_times_device_nodes_with_queue_marks_and_one_sync_per_run():
    import dataclasses

    mem = ops.device_memory(DEV)
    syncs = []
    ops.register_memory(DEV, dataclasses.replace(mem, synchronize=lambda: syncs.append(1)))
    model = bert_block_model()
    feeds = random_feeds(model, {"batch": 2, "seq": 5})
    sess = InferenceSession(model, SessionOptions(enable_profiling=True), device=DEV)
    sess.run(None, feeds)  # uploads the initializers (a sync each)
    syncs.clear()
    sess.run(None, feeds)
    prof = sess._profiler
    events = [e for e in prof.events if e.run == 1]
    assert len(events) == len(sess.graph.nodes) and {e.device for e in events} <= {DEV, "cpu"}
    assert all(e.dur_ns >= 0 for e in events)
    starts = [e.start_ns for e in events]
    assert starts == sorted(starts)  # device marks placed on the run's clock, in order
    host = sum(1 for e in events if e.device == "cpu")
    assert len(syncs) <= 1 + 2 * host + len(sess.graph.inputs)  # not two per device node


def test_outputs_that_are_feeds_shapes_or_initializers_replay_too():
    b = ModelBuilder("passthrough", 17, 0)
    x = b.input("x", ["batch", 4])
    for op, out in (("Relu", "y"), ("Shape", "s"), ("Identity", "z")):
        b.nodes.append(b.onnx.helper.make_node(op, [x], [out], name=out))
    b.nodes.append(b.onnx.helper.make_node("Identity", [b.weight([3], "w")], ["w_out"], name="w_id"))
    for out, dt in (("y", np.float32), ("s", np.int64), ("z", np.float32), ("w_out", np.float32)):
        b.output(out, dt)
    model = b.build()
    sess = InferenceSession(model, GRAPHS, device=DEV)
    cpu = InferenceSession(model)
    for seed in range(4):
        feeds = random_feeds(model, {"batch": 2}, seed=seed)
        for g, w in zip(sess.run(None, feeds), cpu.run(None, feeds), strict=True):
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)
    assert sess._device_program.recorded_signatures() == [((2, 4),)]


def test_graphs_are_kept_for_plan_cache_size_signatures_least_recently_used_first():
    model = gpt_block_model()
    sess = InferenceSession(model, SessionOptions(enable_device_graph=True, plan_cache_size=1), device=DEV)
    cpu = InferenceSession(model)
    prog = sess._device_program
    kept = []
    for i, seq in enumerate((3, 3, 3, 5, 5, 5, 3, 3)):
        feeds = random_feeds(model, {"batch": 1, "seq": seq}, seed=i)
        np.testing.assert_allclose(sess.run(None, feeds)[0], cpu.run(None, feeds)[0], rtol=2e-5, atol=2e-5)
        kept.append(prog.recorded_signatures())
    assert kept == [
        [],
        [((1, 3),)],
        [((1, 3),)],
        [((1, 3),)],
        [((1, 5),)],
        [((1, 5),)],
        [((1, 3),)],
        [((1, 3),)],
    ]
